# LibTorch's libtorch_cpu without the libraries it names but takes no symbol from (included by the
# top CMakeLists.txt after find_package(Torch)).
#
# Debian's libtorch_cpu.so.1.13 names OpenCV, FFmpeg, LevelDB, LMDB, ZeroMQ and OpenCL among its
# DT_NEEDED entries and uses none of them; they bring 246 more libraries, and every process that
# loads LibTorch spends ~0.19 of its ~0.42 CPU-seconds of start-up loading, relocating and
# initialising them. The build puts a copy without those entries in build/lib
# (scripts/lean_libtorch.sh: the entries that define none of its undefined symbols, nothing else
# changed), and every executable's build RUNPATH names build/lib first, so the build's binaries
# load the copy: `tessera` starts with 50 libraries instead of 296. unit.lean_libtorch checks
# both, and with glibc's own account of every binding (LD_DEBUG=bindings, LD_BIND_NOW) that the
# loader bound none of libtorch_cpu's symbols to a library left out, and that of the 67,964
# (library, symbol) pairs both starts bind only 2 move: weak C++ template instantiations
# (std::vector<int>::reserve, std::map<string, string>::find) whose first copy sat in OpenCV, now
# bound to another copy of the same code. (Reordering the loader's search instead moved strong
# symbols too (measurements: docs/PERFORMANCE.md#build-suite-and-start-up-measurements).) Where the
# script makes no copy (a LibTorch with a RUNPATH of its own, as pip's; nothing unused; no
# patchelf) they load LibTorch's own file. An installed binary (no build RUNPATH) loads LibTorch's
# own file too: the same code, a slower start and 44 MiB more resident (runtime/planner's
# kHostBaseBytes assumes the copy).

set(TESSERA_LEAN_LIBTORCH_DIR ${CMAKE_BINARY_DIR}/lib)
list(PREPEND CMAKE_BUILD_RPATH ${TESSERA_LEAN_LIBTORCH_DIR})

# tessera_lean_libtorch(): the target that makes the copy (or removes a stale one).
function(tessera_lean_libtorch)
  if(NOT TARGET torch_cpu)
    add_custom_target(tessera_lean_libtorch)
    return()
  endif()
  set(_stamp ${TESSERA_LEAN_LIBTORCH_DIR}/lean_libtorch.stamp)
  add_custom_command(OUTPUT ${_stamp}
                     COMMAND bash ${CMAKE_SOURCE_DIR}/scripts/lean_libtorch.sh $<TARGET_FILE:torch_cpu>
                             ${TESSERA_LEAN_LIBTORCH_DIR}
                     COMMAND ${CMAKE_COMMAND} -E touch ${_stamp}
                     DEPENDS $<TARGET_FILE:torch_cpu> ${CMAKE_SOURCE_DIR}/scripts/lean_libtorch.sh
                     COMMENT "libtorch_cpu without the libraries it never uses (build/lib)" VERBATIM)
  add_custom_target(tessera_lean_libtorch ALL DEPENDS ${_stamp})
endfunction()

# tessera_lean_libtorch_for_executables(DIR...): every executable target defined in DIRs waits for
# the copy (the build scripts name the targets they build; ALL alone would not make it).
function(tessera_lean_libtorch_for_executables)
  foreach(_dir ${ARGN})
    get_property(_targets DIRECTORY ${_dir} PROPERTY BUILDSYSTEM_TARGETS)
    foreach(_t ${_targets})
      get_target_property(_type ${_t} TYPE)
      if(_type STREQUAL "EXECUTABLE")
        add_dependencies(${_t} tessera_lean_libtorch)
      endif()
    endforeach()
  endforeach()
endfunction()
