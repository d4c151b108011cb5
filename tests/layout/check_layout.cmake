# The dependency rule of the layout (docs/architecture.md), checked on every header:
#
#   core <- model <- concepts <- {prefix, memory, tiered, attention} <- stores <- compose <- sim
#
# A header may include headers of its own folder and of the layers below it, never above
# and never a sibling part (prefix, memory, tiered and attention do not know each other:
# they meet in stores/). A `<part>/cuda/` folder belongs to its part. Nothing under
# include/ may include the simulation harness (sim/). The harness's tokenizer
# (sim/tokenizer/) includes of the harness only its own folder and the JSON reader.
#
# The opt-in Redis tier: only headers in a `redis/` folder may include hiredis
# (<hiredis/...>), and only headers in a `redis/` folder may include one of them, so a
# runtime that does not link hybridcache::redis never reaches hiredis.
#
# Namespaces follow folders (docs/architecture.md, "Namespaces"): every namespace a header
# opens is its folder's namespace or nested in it. core/, model/ and concepts/ (and the
# umbrella header) are the shared vocabulary: `hybridcache`. Every other folder X directly
# under include/hybridcache/ is `hybridcache::X`, whatever subfolder (cuda/, redis/,
# detail/) the header is in; the harness sim/include/hybridcache/sim/ is `hybridcache::sim`.
# A nested group (detail, presets, kernels, data, ...) may be any name but a part's: a
# header never opens another part's namespace, nor one at file scope. The check reads the
# namespaces with a small lexer (comments, string and character literals skipped; braces
# counted), so `namespace a { namespace b {` and `namespace a::b {` are the same.
# Usage: cmake -DSOURCE_DIR=<repo> -P check_layout.cmake
cmake_minimum_required(VERSION 3.25)
set(rank_core 0)
set(rank_model 1)
set(rank_concepts 2)
set(rank_prefix 3)
set(rank_memory 3)
set(rank_tiered 3)
set(rank_attention 3)
set(rank_stores 4)
set(rank_compose 5)
set(rank_sim 6)
set(part_names prefix memory tiered attention stores compose sim)

# The namespaces a header opens, as full names (`hybridcache::prefix::detail`); an
# anonymous one is `<outer>::(anonymous)`, or `(anonymous)` at file scope.
set(ns_lexer "//[^\n]*|/[*]([^*]|[*]+[^*/])*[*]+/|R\"[(]([^)]|[)][^\"])*[)]\"|\"([^\"\\\\\n]|\\\\.)*\"|'([^'\\\\\n]|\\\\.)*'|namespace[ \t\n]+[A-Za-z_:]*[ \t\n]*{|{|}")
function(opened_namespaces path out)
  file(READ "${path}" text)
  # Keep the token list a CMake list: no ';' or brackets inside a token.
  string(REPLACE ";" "," text "${text}")
  string(REPLACE "[" "<" text "${text}")
  string(REPLACE "]" ">" text "${text}")
  string(REGEX MATCHALL "${ns_lexer}" tokens "${text}")
  set(stack "")
  set(opened "")
  foreach(tok IN LISTS tokens)
    if(tok MATCHES "^namespace[ \t\n]+([A-Za-z_:]*)[ \t\n]*{$")
      set(name "${CMAKE_MATCH_1}")
      if(name STREQUAL "")
        set(name "(anonymous)")
      endif()
      set(outer "")
      list(LENGTH stack depth)
      if(depth GREATER 0)
        list(GET stack -1 outer)
      endif()
      if(outer STREQUAL "")
        set(full "${name}")
      else()
        set(full "${outer}::${name}")
      endif()
      list(APPEND stack "${full}")
      list(APPEND opened "${full}")
    elseif(tok STREQUAL "{")
      list(LENGTH stack depth)
      if(depth GREATER 0)
        list(GET stack -1 outer)
        list(APPEND stack "${outer}")  # a class or function body: still in that namespace
      else()
        list(APPEND stack "")
      endif()
    elseif(tok STREQUAL "}")
      list(LENGTH stack depth)
      if(depth GREATER 0)
        list(POP_BACK stack)
      endif()
    endif()
  endforeach()
  list(REMOVE_DUPLICATES opened)
  set(${out} "${opened}" PARENT_SCOPE)
endfunction()

file(GLOB_RECURSE headers RELATIVE "${SOURCE_DIR}"
     "${SOURCE_DIR}/include/hybridcache/*.hpp" "${SOURCE_DIR}/include/hybridcache/*.cuh"
     "${SOURCE_DIR}/sim/include/hybridcache/*.hpp")
set(violations "")
set(checked 0)
set(ns_checked 0)
foreach(h IN LISTS headers)
  # Namespaces follow folders.
  set(root "hybridcache")
  if(h MATCHES "^sim/include/hybridcache/sim/")
    set(root "hybridcache::sim")
  elseif(h MATCHES "^include/hybridcache/([a-z_]+)/")
    set(folder "${CMAKE_MATCH_1}")
    if(NOT folder MATCHES "^(core|model|concepts)$")
      set(root "hybridcache::${folder}")
    endif()
  endif()
  opened_namespaces("${SOURCE_DIR}/${h}" opened)
  math(EXPR ns_checked "${ns_checked} + 1")
  foreach(ns IN LISTS opened)
    if(NOT (ns STREQUAL root OR ns MATCHES "^${root}::"))
      list(APPEND violations "${h}: opens namespace '${ns}', not '${root}' or a namespace nested in it (namespaces follow folders)")
      continue()
    endif()
    string(LENGTH "${root}" root_length)
    string(SUBSTRING "${ns}" ${root_length} -1 nested)
    string(REPLACE "::" ";" nested "${nested}")
    foreach(group IN LISTS nested)
      if(group IN_LIST part_names)
        list(APPEND violations "${h}: opens namespace '${ns}': '${group}' is a part's namespace, not a group nested in '${root}'")
      endif()
    endforeach()
  endforeach()
  # The opt-in Redis tier (checked for every header, the umbrella included).
  file(STRINGS "${SOURCE_DIR}/${h}" hiredis_lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]hiredis/")
  file(STRINGS "${SOURCE_DIR}/${h}" redis_lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]hybridcache/.*/redis/")
  if(NOT h MATCHES "/redis/[^/]+$")
    foreach(line IN LISTS hiredis_lines)
      list(APPEND violations "${h}: only headers in a redis/ folder may include hiredis (${line})")
    endforeach()
    foreach(line IN LISTS redis_lines)
      list(APPEND violations "${h}: includes the opt-in Redis tier outside a redis/ folder (${line})")
    endforeach()
  endif()
  if(NOT h MATCHES "hybridcache/([a-z_]+)/")
    continue()  # the umbrella header hybridcache.hpp may include any runtime part
  endif()
  set(from "${CMAKE_MATCH_1}")
  if(NOT DEFINED rank_${from})
    list(APPEND violations "${h}: folder '${from}' is not in the layout")
    continue()
  endif()
  math(EXPR checked "${checked} + 1")
  file(STRINGS "${SOURCE_DIR}/${h}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]hybridcache/")
  foreach(line IN LISTS lines)
    if(NOT line MATCHES "hybridcache/([a-z_]+)/")
      list(APPEND violations "${h}: includes an umbrella header (${line})")
      continue()
    endif()
    set(to "${CMAKE_MATCH_1}")
    if(NOT DEFINED rank_${to})
      list(APPEND violations "${h}: includes unknown folder '${to}' (${line})")
    elseif(h MATCHES "^include/" AND to STREQUAL "sim")
      list(APPEND violations "${h}: a runtime header includes the simulation harness (${line})")
    elseif(rank_${to} GREATER rank_${from})
      list(APPEND violations "${h}: '${from}' may not depend on '${to}' above it (${line})")
    elseif(rank_${to} EQUAL rank_${from} AND NOT to STREQUAL from)
      list(APPEND violations "${h}: sibling parts '${from}' and '${to}' must not depend on each other (${line})")
    endif()
  endforeach()
  # The tokenizer is its own target (hybridcache::tokenizer, which hybridcache::sim links):
  # of the harness it includes only its own folder and the JSON reader.
  if(h MATCHES "^sim/include/hybridcache/sim/tokenizer/")
    foreach(line IN LISTS lines)
      if(line MATCHES "hybridcache/sim/" AND NOT line MATCHES "hybridcache/sim/(tokenizer/|json[.]hpp|json_value[.]hpp)")
        list(APPEND violations "${h}: the tokenizer includes the harness beyond tokenizer/ and the JSON reader (${line})")
      endif()
    endforeach()
  endif()
endforeach()
if(checked LESS 50)
  message(FATAL_ERROR "layout check: only ${checked} headers found under ${SOURCE_DIR}: wrong SOURCE_DIR?")
endif()
if(violations)
  list(JOIN violations "\n  " text)
  message(FATAL_ERROR "layout check: layout rule broken:\n  ${text}")
endif()
message(STATUS "layout check: ${checked} headers follow core <- model <- concepts <- parts <- stores <- compose <- sim; "
               "${ns_checked} headers open only their folder's namespace")
