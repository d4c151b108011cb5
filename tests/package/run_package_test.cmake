# Builds and runs tests/package/consumer against hybridcache, either through
# add_subdirectory(<source>) or through find_package(hybridcache) on an install prefix.
# Usage: cmake -DMODE=find_package|add_subdirectory -DSOURCE_DIR=... -DWORK_DIR=... -P this
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set(common -G "${GENERATOR}" -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_BUILD_TYPE=Release)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
endfunction()

if(MODE STREQUAL "find_package")
  # Install the library alone (no tests, no CUDA) into a private prefix.
  run(${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${WORK_DIR}/lib" ${common}
      -DHYBRIDCACHE_BUILD_TESTS=OFF -DHYBRIDCACHE_BUILD_BENCH=OFF -DHYBRIDCACHE_BUILD_TOOLS=OFF
      -DHYBRIDCACHE_BUILD_EXAMPLES=OFF -DHYBRIDCACHE_ENABLE_CUDA=OFF -DHYBRIDCACHE_INSTALL=ON)
  run(${CMAKE_COMMAND} --install "${WORK_DIR}/lib" --prefix "${WORK_DIR}/prefix")
  # Only the runtime is installed: no harness headers, no sim target.
  file(GLOB_RECURSE sim_headers "${WORK_DIR}/prefix/include/hybridcache/sim/*")
  if(sim_headers OR EXISTS "${WORK_DIR}/prefix/include/hybridcache/sim")
    message(FATAL_ERROR "the install holds the simulation harness (include/hybridcache/sim)")
  endif()
  file(GLOB_RECURSE sim_exports "${WORK_DIR}/prefix/*hybridcacheSimTargets*.cmake")
  if(sim_exports)
    message(FATAL_ERROR "the install exports hybridcache::sim without HYBRIDCACHE_INSTALL_SIM")
  endif()
  run(${CMAKE_COMMAND} -S "${SOURCE_DIR}/tests/package/consumer" -B "${WORK_DIR}/consumer" ${common}
      -DCONSUMER_MODE=find_package -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
elseif(MODE STREQUAL "add_subdirectory")
  run(${CMAKE_COMMAND} -S "${SOURCE_DIR}/tests/package/consumer" -B "${WORK_DIR}/consumer" ${common}
      -DCONSUMER_MODE=add_subdirectory -DHYBRIDCACHE_SOURCE_DIR=${SOURCE_DIR})
else()
  message(FATAL_ERROR "MODE must be find_package or add_subdirectory")
endif()
run(${CMAKE_COMMAND} --build "${WORK_DIR}/consumer")
run("${WORK_DIR}/consumer/consumer")
message(STATUS "consumer built and ran via ${MODE}")
