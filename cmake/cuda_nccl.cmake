# TESSERA_WITH_CUDA: AUTO turns the CUDA/NCCL path on only when LibTorch was built with CUDA and NCCL
# is found. The NCCL communicator itself (runtime/comm/*_cuda.cpp) needs only the CUDA runtime and
# NCCL headers, so it always compiles and links when those exist (CI: /usr/local/cuda), as the
# separate library tessera_nccl, even with a CPU-only LibTorch. Every runtime/**/*_cuda.cpp goes into
# that library (the NCCL backend, runtime/device/device_cuda.cpp); what in them needs a CUDA LibTorch
# (c10/cuda) is under #ifdef TESSERA_WITH_CUDA.
# Where to look: CUDA_HOME, the toolkit a CUDA LibTorch's config found (CUDAToolkit / FindCUDA), and
# /usr/local/cuda; NCCL also under NCCL_HOME.
set(_cuda_hints $ENV{CUDA_HOME} ${CUDAToolkit_LIBRARY_ROOT} ${CUDA_TOOLKIT_ROOT_DIR} /usr/local/cuda)
find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_cuda_hints} $ENV{NCCL_HOME} PATH_SUFFIXES include)
find_library(NCCL_LIBRARY nccl HINTS ${_cuda_hints} $ENV{NCCL_HOME} PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu)
find_path(CUDART_INCLUDE_DIR cuda_runtime_api.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ${_cuda_hints} PATH_SUFFIXES include)
find_library(CUDART_LIBRARY cudart HINTS ${CUDAToolkit_LIBRARY_DIR} ${_cuda_hints} PATH_SUFFIXES lib64 lib)

set(_torch_has_cuda OFF)
if(TARGET torch_cuda OR TORCH_CUDA_LIBRARIES OR CAFFE2_USE_CUDA)
  set(_torch_has_cuda ON)
endif()
set(TESSERA_CUDA_ENABLED OFF)
if(TESSERA_WITH_CUDA STREQUAL "ON")
  # Everything the CUDA path needs, or the configure fails naming what is missing (without cudart,
  # tessera_add_cuda_sources below would build no NCCL backend at all while this said ON).
  set(_missing)
  if(NOT _torch_has_cuda)
    list(APPEND _missing "a CUDA-enabled LibTorch (this one is CPU-only)")
  endif()
  if(NOT NCCL_LIBRARY OR NOT NCCL_INCLUDE_DIR)
    list(APPEND _missing "NCCL (nccl.h: ${NCCL_INCLUDE_DIR}, libnccl: ${NCCL_LIBRARY}; set NCCL_HOME)")
  endif()
  if(NOT CUDART_LIBRARY OR NOT CUDART_INCLUDE_DIR)
    list(APPEND _missing "the CUDA runtime (cuda_runtime_api.h: ${CUDART_INCLUDE_DIR}, libcudart: ${CUDART_LIBRARY}; set CUDA_HOME)")
  endif()
  if(_missing)
    string(REPLACE ";" "; " _missing "${_missing}")
    message(FATAL_ERROR "TESSERA_WITH_CUDA=ON but missing: ${_missing}")
  endif()
  set(TESSERA_CUDA_ENABLED ON)
elseif(TESSERA_WITH_CUDA STREQUAL "AUTO" AND _torch_has_cuda AND NCCL_LIBRARY AND NCCL_INCLUDE_DIR AND CUDART_LIBRARY
       AND CUDART_INCLUDE_DIR)
  set(TESSERA_CUDA_ENABLED ON)
endif()
message(STATUS "Tessera: CUDA LibTorch=${_torch_has_cuda} NCCL=${NCCL_LIBRARY} cudart=${CUDART_LIBRARY} -> TESSERA_WITH_CUDA=${TESSERA_CUDA_ENABLED}")

function(tessera_add_cuda_sources tgt)
  file(GLOB_RECURSE _cuda_src CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/runtime/*_cuda.cpp)
  if(NOT _cuda_src OR NOT NCCL_LIBRARY OR NOT NCCL_INCLUDE_DIR OR NOT CUDART_LIBRARY OR NOT CUDART_INCLUDE_DIR)
    return()  # only when TESSERA_CUDA_ENABLED is OFF (ON without these failed above)
  endif()
  # Always compile + link the NCCL backend when headers exist, so CI proves it builds.
  add_library(tessera_nccl STATIC ${_cuda_src})
  target_include_directories(tessera_nccl PUBLIC ${CMAKE_SOURCE_DIR} ${NCCL_INCLUDE_DIR} ${CUDART_INCLUDE_DIR})
  target_link_libraries(tessera_nccl PUBLIC ${TORCH_LIBRARIES} MPI::MPI_C ${NCCL_LIBRARY} ${CUDART_LIBRARY})
  tessera_use_pch(tessera_nccl)
  if(TESSERA_CUDA_ENABLED)
    target_compile_definitions(tessera_nccl PUBLIC TESSERA_WITH_CUDA=1)
    target_link_libraries(${tgt} PUBLIC tessera_nccl)
  else()
    # Link check: a tiny executable that references the backend's factory must link.
    add_executable(tessera_nccl_linkcheck ${CMAKE_SOURCE_DIR}/cmake/nccl_linkcheck.cpp)
    target_link_libraries(tessera_nccl_linkcheck PRIVATE tessera_nccl tessera_runtime)
    tessera_use_pch(tessera_nccl_linkcheck)
  endif()
endfunction()

# Where LibTorch is CPU-only but NCCL and the CUDA headers exist (CI), the code under
# #ifdef TESSERA_WITH_CUDA is still compiled, against LibTorch's c10/cuda headers (Debian's CPU
# package ships them) with TESSERA_WITH_CUDA=1, into objects that nothing links: a type error in the
# CUDA-only code then fails this build instead of waiting for a GPU machine. The one generated
# header a CPU build lacks (c10/cuda/impl/cuda_cmake_macros.h: export macros) is written into the
# build tree. The tests' CUDA parts (the conformance test's NCCL communicator) are checked too.
function(tessera_add_cuda_typecheck)
  if(TESSERA_CUDA_ENABLED OR NOT TARGET tessera_nccl)
    return()
  endif()
  set(_c10_cuda_dir)  # a plain search of LibTorch's include dirs (find_path's NO_CACHE needs CMake 3.21)
  foreach(d ${TORCH_INCLUDE_DIRS})
    if(EXISTS ${d}/c10/cuda/CUDAStream.h)
      set(_c10_cuda_dir ${d})
      break()
    endif()
  endforeach()
  if(NOT _c10_cuda_dir)
    message(STATUS "Tessera: LibTorch has no c10/cuda headers: CUDA-only code not type-checked")
    return()
  endif()
  set(_gen ${CMAKE_BINARY_DIR}/cuda_typecheck_include)
  if(NOT EXISTS ${_c10_cuda_dir}/c10/cuda/impl/cuda_cmake_macros.h)
    file(WRITE ${_gen}/c10/cuda/impl/cuda_cmake_macros.h
         "#pragma once\n// Written by Tessera's CMake for the CUDA type check (CPU-only LibTorch).\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
  endif()
  file(GLOB_RECURSE _src CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/runtime/*.cpp ${CMAKE_SOURCE_DIR}/launcher/*.cpp
       ${CMAKE_SOURCE_DIR}/benchmarks/*.cpp ${CMAKE_SOURCE_DIR}/tests/*.cpp)
  if(TESSERA_BUILD_TESTS)
    find_package(GTest REQUIRED)  # tests/ found it too, but imported targets stay in their directory
  else()
    list(FILTER _src EXCLUDE REGEX "^${CMAKE_SOURCE_DIR}/tests/")
  endif()
  set(_checked)  # every source with an #if/#ifdef on TESSERA_WITH_CUDA
  foreach(f ${_src})
    file(STRINGS ${f} _hits REGEX "^#if(def)? .*TESSERA_WITH_CUDA")
    if(_hits)
      list(APPEND _checked ${f})
    endif()
  endforeach()
  add_library(tessera_cuda_typecheck OBJECT ${_checked})
  target_compile_definitions(tessera_cuda_typecheck PRIVATE TESSERA_WITH_CUDA=1)
  target_include_directories(tessera_cuda_typecheck SYSTEM BEFORE PRIVATE ${_gen})
  target_link_libraries(tessera_cuda_typecheck PRIVATE tessera_nccl tessera_launcher $<$<BOOL:${TESSERA_BUILD_TESTS}>:GTest::gtest>)
  # Objects nobody links: only the front end matters, so no optimisation or debug info.
  target_compile_options(tessera_cuda_typecheck PRIVATE -O0 -g0 -Wall -Wno-unused-parameter -Wno-sign-compare)
  list(LENGTH _checked _n)
  message(STATUS "Tessera: type-checking the CUDA-only code of ${_n} files with TESSERA_WITH_CUDA=1")
endfunction()
