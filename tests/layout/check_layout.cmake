# The dependency rule of the layout (docs/architecture.md), checked on every header:
#
#   core <- model <- concepts <- {prefix, memory, tiered, attention} <- stores <- compose <- sim
#
# A header may include headers of its own folder and of the layers below it, never above
# and never a sibling part (prefix, memory, tiered and attention do not know each other:
# they meet in stores/). A `<part>/cuda/` folder belongs to its part. Nothing under
# include/ may include the simulation harness (sim/).
#
# The opt-in Redis tier: only headers in a `redis/` folder may include hiredis
# (<hiredis/...>), and only headers in a `redis/` folder may include one of them, so a
# runtime that does not link hybridcache::redis never reaches hiredis.
# Usage: cmake -DSOURCE_DIR=<repo> -P check_layout.cmake
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

file(GLOB_RECURSE headers RELATIVE "${SOURCE_DIR}"
     "${SOURCE_DIR}/include/hybridcache/*.hpp" "${SOURCE_DIR}/include/hybridcache/*.cuh"
     "${SOURCE_DIR}/sim/include/hybridcache/*.hpp")
set(violations "")
set(checked 0)
foreach(h IN LISTS headers)
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
endforeach()
if(checked LESS 50)
  message(FATAL_ERROR "layout check: only ${checked} headers found under ${SOURCE_DIR}: wrong SOURCE_DIR?")
endif()
if(violations)
  list(JOIN violations "\n  " text)
  message(FATAL_ERROR "layout check: dependency rule broken:\n  ${text}")
endif()
message(STATUS "layout check: ${checked} headers follow core <- model <- concepts <- parts <- stores <- compose <- sim")
