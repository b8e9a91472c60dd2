# unit.torch26_syntax: every Tessera source compiled syntax-only against Debian 13's LibTorch 2.6
# headers (tests/unit/torch26_syntax.sh; tests/CMakeLists.txt's glob of tests/unit/*.sh registers it,
# and includes this file after that). Here: what the test needs from the build.
#   - TORCH26_FLAGS: a file with the include directories and definitions the sources compile with
#     (Open MPI, GTest, nlohmann-json, Boost, yaml-cpp, PCRE2, NCCL and the CUDA runtime as
#     cmake/cuda_nccl.cmake found them; the project's definitions), one argument a line (empty lines
#     ignored), LibTorch's left out (the test puts 2.6's in their place);
#   - TORCH26_DIR: where the 2.6 headers are fetched to and the precompiled header cached
#     (build/torch26, git-ignored);
#   - time for a first run (fetch + precompile). It is a filler (tests/CMakeLists.txt): at nice 19,
#     on the cores the other tests leave idle (measurements: docs/PERFORMANCE.md#build-suite-and-start-up-measurements).
if(NOT TEST unit.torch26_syntax)
  message(FATAL_ERROR "cmake/torch26_check.cmake: unit.torch26_syntax is not registered (tests/unit/torch26_syntax.sh missing?)")
endif()
set(_t26_args)
get_directory_property(_t26_defs DIRECTORY ${CMAKE_SOURCE_DIR} COMPILE_DEFINITIONS)
foreach(_d ${_t26_defs})
  list(APPEND _t26_args "-D${_d}")
endforeach()
set(_t26_dirs ${PCRE2_INCLUDE_DIR} ${TESSERA_NCCL_INCLUDE_DIR} ${TESSERA_CUDART_INCLUDE_DIR})
foreach(_t MPI::MPI_C GTest::gtest nlohmann_json::nlohmann_json Boost::program_options yaml-cpp tessera_gpu_check tessera_runtime_gpu)
  if(TARGET ${_t})
    get_target_property(_inc ${_t} INTERFACE_INCLUDE_DIRECTORIES)
    get_target_property(_def ${_t} INTERFACE_COMPILE_DEFINITIONS)
    if(_inc)
      list(APPEND _t26_dirs ${_inc})
    endif()
    foreach(_d ${_def})
      if(_def)  # a generator expression (nlohmann-json's) may come out empty: an empty line
        list(APPEND _t26_args "$<$<BOOL:${_d}>:-D${_d}>")
      endif()
    endforeach()
  endif()
endforeach()
list(REMOVE_DUPLICATES _t26_dirs)
list(REMOVE_ITEM _t26_dirs ${CMAKE_SOURCE_DIR})  # the test passes it as -I
foreach(_d ${_t26_dirs})
  if(_d AND NOT _d IN_LIST CMAKE_CXX_IMPLICIT_INCLUDE_DIRECTORIES)
    list(APPEND _t26_args "-isystem" "${_d}")
  endif()
endforeach()
list(JOIN _t26_args "\n" _t26_text)
file(GENERATE OUTPUT ${CMAKE_BINARY_DIR}/torch26_flags.txt CONTENT "${_t26_text}\n")
set_property(TEST unit.torch26_syntax APPEND PROPERTY ENVIRONMENT
             "TORCH26_FLAGS=${CMAKE_BINARY_DIR}/torch26_flags.txt" "TORCH26_DIR=${CMAKE_BINARY_DIR}/torch26")
set_tests_properties(unit.torch26_syntax PROPERTIES TIMEOUT 1800)
