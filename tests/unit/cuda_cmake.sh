#!/usr/bin/env bash
# What the configure finds and refuses (cmake/cuda_nccl.cmake, through scripts/build.sh --configure):
# every refusal is ONE line "tessera: configure: ..." naming what was found and where it looked,
# exit code 2, and no build system left behind (a fresh folder is removed; in a configured one
# CMakeCache.txt and the Makefile are gone, so `cmake --build` refuses to run).
#
# Two kinds of cases:
# - the real top-level CMakeLists.txt with this machine's CPU LibTorch (Debian's 1.13): AUTO (the
#   status line), ON (refused, fresh folder and configured folder), an ABI-0 LibTorch (a fake prefix
#   whose TorchConfig.cmake loads Debian's and then declares -D_GLIBCXX_USE_CXX11_ABI=0, as pip
#   torch < 2.7's config does; the other side is real: the symbols of Debian's Boost, yaml-cpp and
#   GTest), a CUDA LibTorch (a fake prefix with a libtorch_cuda.so) with CMAKE_CUDA_COMPILER naming
#   a missing file;
# - a probe project (LANGUAGES NONE, ~0.1 s) that includes the real module with fabricated inputs in
#   place of find_package(Torch) (a CUDA LibTorch stands in as the targets and variables its config
#   defines, with real ELF files: a libtorch_cuda.so whose DT_NEEDED libcudart.so.13 resolves
#   through its RUNPATH into a pip-style nvidia/cu13/lib) on a fake machine: CMAKE_FIND_ROOT_PATH
#   with mode ONLY re-roots every search (the module's /usr/local/cuda, /usr/include, PATH, python's
#   nvidia folders), so this machine's own CUDA, NCCL and nvcc are not seen. Cases: pip's NCCL and
#   cudart preferred to the toolkit's, NCCL as NGC-style images have it (/usr/include,
#   /usr/lib/x86_64-linux-gnu/libnccl.so.2 only), the LibTorch archive's bundled hash-named cudart,
#   LibTorch's own cudart missing (the toolkit's, said so), no NCCL with ON (refused) and AUTO (off),
#   no nvcc anywhere (refused), a CUDA 12 toolkit with a CUDA 13 LibTorch (refused);
# - the real top-level once more with a CUDA LibTorch config as torch's is (Debian's LibTorch plus
#   enable_language(CUDA) with this machine's nvcc, FindCUDAToolkit's CUDA::cudart and a torch_cuda
#   target): the tessera binary's link line names LibTorch's own cudart only.
set -uo pipefail
SRC=${TESSERA_SRC:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
unset CUDA_HOME CUDA_PATH NCCL_HOME CUDACXX Torch_DIR CMAKE_PREFIX_PATH
T0=$SECONDS
source "$SRC/tests/expect.bash"  # ok, fail

# no_build_system DIR: nothing a later `cmake --build DIR` could use.
no_build_system() {
  [[ ! -e $1/CMakeCache.txt && ! -e $1/Makefile && ! -e $1/build.ninja ]] && ! cmake --build "$1" >/dev/null 2>&1
}

# refused NAME DIR TEXT... -- CMD...: CMD must exit 2 with exactly one line of output (stdout and
# stderr), starting "tessera: configure: " and holding every TEXT, and leave no build system in DIR.
refused() {
  local name=$1 dir=$2 texts=() out rc n t missing=""
  shift 2
  while [[ $1 != -- ]]; do texts+=("$1"); shift; done
  shift
  out=$("$@" 2>&1)
  rc=$?
  n=$(printf '%s' "$out" | grep -c '')
  for t in "${texts[@]}"; do [[ $out == *"$t"* ]] || missing+=" [$t]"; done
  if ((rc == 2 && n == 1)) && [[ $out == "tessera: configure: "* && -z $missing ]] && no_build_system "$dir"; then
    ok "$name"
    echo "     $out"
  else
    echo "${out:0:1500}"
    fail "$name: exit $rc (want 2), $n line(s) (want 1), missing:${missing:- none}, build system left: $(no_build_system "$dir" && echo no || echo yes)"
  fi
}

# ---- the real top-level CMakeLists.txt --------------------------------------------------------------
CONF=(bash "$SRC/scripts/build.sh" --configure)
out=$("${CONF[@]}" "$T/auto" -DTESSERA_BUILD_TESTS=ON 2>&1)
rc=$?
line=$(grep -m1 -- '^-- Tessera: LibTorch .* -> TESSERA_WITH_CUDA=' <<<"$out")
if ((rc == 0)) && [[ $line =~ ^"-- Tessera: LibTorch "[0-9.]+" CPU, C++ ABI 1 ".*"; NCCL ".*"; cudart ".*"; nvcc ".*" -> TESSERA_WITH_CUDA=OFF"$ ]]; then
  ok "AUTO with this machine's CPU LibTorch: configures, one status line says what it found"
  echo "     $line"
else
  tail -5 <<<"$out"
  fail "AUTO with this machine's CPU LibTorch: exit $rc, status line: ${line:-none}"
fi
TORCH_DIR=$(grep -m1 '^Torch_DIR:' "$T/auto/CMakeCache.txt" 2>/dev/null | cut -d= -f2-)
[[ -f $TORCH_DIR/TorchConfig.cmake ]] || fail "no Torch_DIR in the AUTO configure's cache: $TORCH_DIR"

refused "ON with a CPU LibTorch, fresh folder: refused, folder removed" "$T/on-fresh" \
  "TESSERA_WITH_CUDA=ON but LibTorch " " at $TORCH_DIR is CPU-only" -- "${CONF[@]}" "$T/on-fresh" -DTESSERA_WITH_CUDA=ON
[[ ! -e $T/on-fresh ]] || fail "the fresh folder of the refused configure is still there"
refused "ON with a CPU LibTorch on the configured AUTO folder: refused, its build system removed" "$T/auto" \
  "TESSERA_WITH_CUDA=ON but LibTorch " "is CPU-only" -- "${CONF[@]}" "$T/auto" -DTESSERA_WITH_CUDA=ON

# ABI 0: Debian's LibTorch, declared as built with the old ABI (what pip torch < 2.7's config says).
mkdir -p "$T/abi0/Torch"
cp "$TORCH_DIR/TorchConfigVersion.cmake" "$T/abi0/Torch/"
cat >"$T/abi0/Torch/TorchConfig.cmake" <<CMAKE
include("$TORCH_DIR/TorchConfig.cmake")
set(TORCH_CXX_FLAGS "-D_GLIBCXX_USE_CXX11_ABI=0")
set_property(TARGET torch PROPERTY INTERFACE_COMPILE_OPTIONS "\${TORCH_CXX_FLAGS}")
CMAKE
refused "a LibTorch with the old C++ ABI (0) against Debian's Boost, yaml-cpp, GTest (1): refused" "$T/abi" \
  "C++ ABI mismatch: LibTorch " " at $T/abi0/Torch is built with _GLIBCXX_USE_CXX11_ABI=0 (from TORCH_CXX_FLAGS) but Boost.Program_options (" \
  "yaml-cpp (" "GTest (" "with _GLIBCXX_USE_CXX11_ABI=1: use a cxx11-ABI LibTorch (the LibTorch archive's cxx11-abi build, or pip torch >= 2.7)" \
  -- "${CONF[@]}" "$T/abi" -DTorch_DIR="$T/abi0/Torch" -DTESSERA_BUILD_TESTS=ON

# ---- a fake GPU machine: pip-style torch + nvidia packages, a CUDA toolkit ----------------------------
command -v gcc >/dev/null || fail "gcc needed for the fake ELF libraries"
B=$T/base
mkdir -p "$B/site/torch/lib" "$B/site/torch/share/cmake/Torch" "$B/site/nvidia/cu13/lib" "$B/site/nvidia/nccl/include" \
  "$B/site/nvidia/nccl/lib" "$B/usr/local/cuda/include" "$B/usr/local/cuda/lib64" "$B/usr/local/cuda/bin"
echo 'int tessera_fake;' >"$T/empty.c"
gcc -shared -fPIC -Wl,-soname,libcudart.so.13 -o "$B/site/nvidia/cu13/lib/libcudart.so.13" "$T/empty.c"
gcc -shared -fPIC -Wl,-soname,libtorch_cuda.so -Wl,--no-as-needed -Wl,--enable-new-dtags -Wl,-rpath,'$ORIGIN/../../nvidia/cu13/lib' \
  -o "$B/site/torch/lib/libtorch_cuda.so" "$T/empty.c" "$B/site/nvidia/cu13/lib/libcudart.so.13"
echo 'set(PACKAGE_VERSION "2.9.0")' >"$B/site/torch/share/cmake/Torch/TorchConfigVersion.cmake"
echo 'message(FATAL_ERROR "the fake CUDA LibTorch config is not meant to be loaded")' >"$B/site/torch/share/cmake/Torch/TorchConfig.cmake"
printf '#define NCCL_MAJOR 2\n#define NCCL_MINOR 27\n#define NCCL_PATCH 7\n' >"$B/site/nvidia/nccl/include/nccl.h"
touch "$B/site/nvidia/nccl/lib/libnccl.so.2"  # pip ships libnccl.so.2 only
echo '#define CUDART_VERSION 13000' >"$B/usr/local/cuda/include/cuda_runtime_api.h"
printf '#define NCCL_MAJOR 2\n#define NCCL_MINOR 28\n#define NCCL_PATCH 9\n' >"$B/usr/local/cuda/include/nccl.h"
touch "$B/usr/local/cuda/lib64/libcudart.so" "$B/usr/local/cuda/lib64/libnccl.so"
printf '#!/bin/sh\necho fake nvcc\n' >"$B/usr/local/cuda/bin/nvcc"
chmod +x "$B/usr/local/cuda/bin/nvcc"
TORCH=$B/site/torch
TCFG=$TORCH/share/cmake/Torch

refused "a CUDA LibTorch with CMAKE_CUDA_COMPILER naming a missing nvcc (real top-level): refused before LibTorch is loaded" "$T/nvcc-missing" \
  "CMAKE_CUDA_COMPILER=$T/nowhere/nvcc does not exist, and LibTorch 2.9.0 at $TCFG is a CUDA build (libtorch_cuda.so), whose CMake config needs nvcc" \
  -- "${CONF[@]}" "$T/nvcc-missing" -DTorch_DIR="$TCFG" -DCMAKE_CUDA_COMPILER="$T/nowhere/nvcc"

# The probe: the module with fabricated find_package(Torch) results, through a copy of the wrapper.
P=$T/probe
mkdir -p "$P/scripts"
cp "$SRC/scripts/build.sh" "$P/scripts/build.sh"
cat >"$P/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.18)
project(cuda_probe LANGUAGES NONE)
set(CMAKE_LIBRARY_ARCHITECTURE x86_64-linux-gnu)
include($SRC/cmake/cuda_nccl.cmake)
tessera_find_cuda_compiler()
# What a CUDA LibTorch's config defines (pip layout: TORCH_INSTALL_PREFIX is site-packages/torch);
# its torch::cudart links the toolkit's libcudart, as torch's cuda.cmake does.
get_filename_component(TORCH_INSTALL_PREFIX "\${Torch_DIR}/../../.." ABSOLUTE)
set(Torch_VERSION 2.9.0)
set(TORCH_CXX_FLAGS "-D_GLIBCXX_USE_CXX11_ABI=1")
add_library(torch INTERFACE IMPORTED)
add_library(torch_cuda SHARED IMPORTED)
set_target_properties(torch_cuda PROPERTIES IMPORTED_LOCATION \${TORCH_INSTALL_PREFIX}/lib/libtorch_cuda.so)
add_library(torch::cudart INTERFACE IMPORTED)
set_property(TARGET torch::cudart PROPERTY INTERFACE_LINK_LIBRARIES \${PROBE_ROOT}/usr/local/cuda/lib64/libcudart.so)
set(TORCH_LIBRARIES torch torch_cuda \${PROBE_ROOT}/usr/local/cuda/lib64/libcudart.so)
set(CMAKE_CUDA_COMPILER_VERSION \${PROBE_CUDA_VERSION})  # what torch's enable_language(CUDA) found
tessera_check_dependencies()
get_target_property(_l torch::cudart INTERFACE_LINK_LIBRARIES)
message(STATUS "probe: torch::cudart links \${_l}; TORCH_LIBRARIES \${TORCH_LIBRARIES}")
CMAKE

# probe NAME ROOT WITH_CUDA CUDA_VERSION [CMAKE ARG...]: the probe configure on machine ROOT (a copy
# of the base tree); prints its output, returns the wrapper's exit code.
variant() {  # variant NAME: a copy of the base tree to change
  rm -rf "$T/m-$1" && cp -a "$B" "$T/m-$1" && echo "$T/m-$1"
}
MAKE_PROGRAM=$(command -v make)  # named: the re-rooted program search would not find it
probe() {
  local dir=$1 root=$2 with=$3 cuda=$4
  shift 4
  env -u CUDA_HOME PATH=/usr/bin:/bin bash "$P/scripts/build.sh" --configure "$dir" -DTESSERA_WITH_CUDA="$with" \
    -DTorch_DIR="$root/site/torch/share/cmake/Torch" -DPROBE_ROOT="$root" -DPROBE_CUDA_VERSION="$cuda" \
    -DCMAKE_FIND_ROOT_PATH="$root" -DCMAKE_FIND_ROOT_PATH_MODE_LIBRARY=ONLY -DCMAKE_FIND_ROOT_PATH_MODE_INCLUDE=ONLY \
    -DCMAKE_FIND_ROOT_PATH_MODE_PROGRAM=ONLY -DCMAKE_MAKE_PROGRAM="$MAKE_PROGRAM" "$@"
}
# found NAME OUTPUT TEXT...: OUTPUT holds every TEXT.
found() {
  local name=$1 out=$2 t missing=""
  shift 2
  for t in "$@"; do [[ $out == *"$t"* ]] || missing+=" [$t]"; done
  if [[ -z $missing ]]; then ok "$name"; grep -m1 -- '-- Tessera: LibTorch' <<<"$out" | sed 's/^/     /'; else echo "${out:0:2000}"; fail "$name: missing:$missing"; fi
}

R=$B
out=$(probe "$T/p-pip" "$R" ON 13.0.88 2>&1)
found "CUDA LibTorch, ON: pip's NCCL (libnccl.so.2 alone) before the toolkit's, LibTorch's own cudart (RUNPATH) replaces the toolkit's" "$out" \
  "-- Tessera: LibTorch 2.9.0 CUDA 13, C++ ABI 1 ($TCFG); NCCL 2.27.7 ($R/site/nvidia/nccl/include/nccl.h, $R/site/nvidia/nccl/lib/libnccl.so.2); cudart $R/site/nvidia/cu13/lib/libcudart.so.13 (LibTorch's own, libtorch_cuda.so's libcudart.so.13; replaces $R/usr/local/cuda/lib64/libcudart.so, which its CMake config linked); nvcc $R/usr/local/cuda/bin/nvcc (CUDA 13.0.88) -> TESSERA_WITH_CUDA=ON" \
  "-- probe: torch::cudart links $R/site/nvidia/cu13/lib/libcudart.so.13; TORCH_LIBRARIES torch;torch_cuda;$R/site/nvidia/cu13/lib/libcudart.so.13"

R=$(variant ngc)
rm -rf "$R/site/nvidia/nccl" "$R/usr/local/cuda/include/nccl.h" "$R/usr/local/cuda/lib64/libnccl.so"
mkdir -p "$R/usr/include" "$R/usr/lib/x86_64-linux-gnu"
printf '#define NCCL_MAJOR 2\n#define NCCL_MINOR 26\n#define NCCL_PATCH 2\n' >"$R/usr/include/nccl.h"
touch "$R/usr/lib/x86_64-linux-gnu/libnccl.so.2"
out=$(probe "$T/p-ngc" "$R" ON 13.0.88 2>&1)
found "NCCL where NGC-style images have it: /usr/include and /usr/lib/x86_64-linux-gnu/libnccl.so.2 (no libnccl.so)" "$out" \
  "NCCL 2.26.2 ($R/usr/include/nccl.h, $R/usr/lib/x86_64-linux-gnu/libnccl.so.2)" "-> TESSERA_WITH_CUDA=ON"

# The LibTorch archive's layout: a bundled, hash-named runtime beside libtorch_cuda.so (RUNPATH $ORIGIN).
R=$(variant archive)
rm -f "$R/site/torch/lib/libtorch_cuda.so"
gcc -shared -fPIC -Wl,-soname,libcudart-0a1b2c3d.so.13 -o "$R/site/torch/lib/libcudart-0a1b2c3d.so.13" "$T/empty.c"
gcc -shared -fPIC -Wl,--no-as-needed -Wl,--enable-new-dtags -Wl,-rpath,'$ORIGIN' -o "$R/site/torch/lib/libtorch_cuda.so" \
  "$T/empty.c" "$R/site/torch/lib/libcudart-0a1b2c3d.so.13"
out=$(probe "$T/p-archive" "$R" ON 13.0.88 2>&1)
found "the LibTorch archive's bundled libcudart-<hash>.so.13 is the one linked" "$out" \
  "cudart $R/site/torch/lib/libcudart-0a1b2c3d.so.13 (LibTorch's own, libtorch_cuda.so's libcudart-0a1b2c3d.so.13; replaces" \
  "-- probe: torch::cudart links $R/site/torch/lib/libcudart-0a1b2c3d.so.13;"
rm -f "$R/site/torch/lib/libcudart-0a1b2c3d.so.13"
out=$(probe "$T/p-archive-gone" "$R" ON 13.0.88 2>&1)
found "LibTorch's own runtime nowhere to be found: the toolkit's is linked, and the status line says two may load" "$out" \
  "cudart $R/usr/local/cuda/lib64/libcudart.so (the CUDA toolkit's: LibTorch's own libcudart-0a1b2c3d.so.13 is in none of " \
  "ldconfig -p, so two runtimes may load)" "-> TESSERA_WITH_CUDA=ON"

R=$(variant nonccl)
rm -rf "$R/site/nvidia/nccl" "$R/usr/local/cuda/include/nccl.h" "$R/usr/local/cuda/lib64/libnccl.so"
mkdir -p "$T/empty-nccl"
refused "ON without NCCL (NCCL_HOME an empty folder, pip, toolkit and system without it): refused, naming where it looked" "$T/p-nonccl" \
  "TESSERA_WITH_CUDA=ON but no NCCL (nccl.h with libnccl.so or libnccl.so.2) in NCCL_HOME=$T/empty-nccl, pip's nvidia package ($R/site/nvidia: nccl, cu*), the CUDA toolkit (" \
  "the system (/usr/include, /usr/lib/x86_64-linux-gnu, /usr/lib64, /usr/lib): set NCCL_HOME" \
  -- probe "$T/p-nonccl" "$R" ON 13.0.88 -DNCCL_HOME="$T/empty-nccl"
out=$(probe "$T/p-nonccl-auto" "$R" AUTO 13.0.88 -DNCCL_HOME="$T/empty-nccl" 2>&1)
found "AUTO without NCCL: configures with the CUDA path off, saying where it looked" "$out" \
  "NCCL not found (looked in NCCL_HOME=$T/empty-nccl, " "-> TESSERA_WITH_CUDA=OFF"

R=$(variant nonvcc)
rm -rf "$R/usr/local/cuda/bin"
refused "a CUDA LibTorch and no nvcc anywhere (PATH, CUDA_HOME unset, /usr/local/cuda/bin, pip): refused before LibTorch is loaded" "$T/p-nonvcc" \
  "LibTorch 2.9.0 at $R/site/torch/share/cmake/Torch is a CUDA build (libtorch_cuda.so), whose CMake config needs nvcc (enable_language(CUDA)), but there is no nvcc in CMAKE_CUDA_COMPILER (unset), PATH=/usr/bin:/bin, /usr/local/cuda/bin, $R/site/nvidia/cuda_nvcc/bin" \
  -- probe "$T/p-nonvcc" "$R" ON 13.0.88

R=$B
refused "a CUDA 12 toolkit with a LibTorch whose runtime is CUDA 13: refused (two runtimes would load)" "$T/p-major" \
  "CUDA mismatch: LibTorch 2.9.0 at $TCFG runs on CUDA 13 (libtorch_cuda.so loads $R/site/nvidia/cu13/lib/libcudart.so.13) but the CUDA toolkit found" \
  "is CUDA 12.4: two CUDA runtimes would load" -- probe "$T/p-major" "$R" AUTO 12.4

# The real top-level with a CUDA LibTorch that goes through a CUDA config as torch's does: Debian's
# LibTorch, plus enable_language(CUDA) (this machine's nvcc, found by the module although it is not on
# PATH), FindCUDAToolkit, a torch_cuda target (the fake libtorch_cuda.so) whose torch::cudart links
# CUDA::cudart, the toolkit's libcudart. The build must link LibTorch's own (pip-style) cudart only.
if [[ -x /usr/local/cuda/bin/nvcc ]]; then
  R=$(variant real)
  cat >"$R/site/torch/share/cmake/Torch/TorchConfig.cmake" <<CMAKE
include("$TORCH_DIR/TorchConfig.cmake")
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)
add_library(torch_cuda SHARED IMPORTED)
set_target_properties(torch_cuda PROPERTIES IMPORTED_LOCATION "$R/site/torch/lib/libtorch_cuda.so")
add_library(torch::cudart INTERFACE IMPORTED)
set_property(TARGET torch::cudart PROPERTY INTERFACE_LINK_LIBRARIES CUDA::cudart)
set_property(TARGET torch_cuda PROPERTY INTERFACE_LINK_LIBRARIES torch::cudart)
list(APPEND TORCH_LIBRARIES torch_cuda)
CMAKE
  out=$(env PATH=/usr/bin:/bin "${CONF[@]}" "$T/real-cuda" -DTorch_DIR="$R/site/torch/share/cmake/Torch" -DTESSERA_WITH_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DTESSERA_BUILD_TESTS=OFF 2>&1)
  found "real top-level, a CUDA LibTorch config (enable_language(CUDA), CUDA::cudart): nvcc found off PATH, LibTorch's own cudart linked" "$out" \
    "cudart $R/site/nvidia/cu13/lib/libcudart.so.13 (LibTorch's own, libtorch_cuda.so's libcudart.so.13; replaces " \
    "(CUDA::cudart), which its CMake config linked); nvcc /usr/local/cuda/bin/nvcc (CUDA 13." "-> TESSERA_WITH_CUDA=ON"
  links=$(cat "$T/real-cuda/CMakeFiles/tessera.dir/link.txt" "$T/real-cuda/build.ninja" 2>/dev/null | tr ' ' '\n' | grep -c 'libcudart')
  own=$(cat "$T/real-cuda/CMakeFiles/tessera.dir/link.txt" "$T/real-cuda/build.ninja" 2>/dev/null | tr ' ' '\n' | grep -c "^$R/site/nvidia/cu13/lib/libcudart.so.13$")
  if ((links > 0 && links == own)); then
    ok "the tessera binary's link line names LibTorch's own libcudart only ($links x)"
  else
    fail "the tessera binary's link line: libcudart entries: $links, of them LibTorch's own: $own"
  fi
else
  echo "skip the real CUDA-config case (no /usr/local/cuda/bin/nvcc here)"
fi

echo "$pass passed, 0 failed ($((SECONDS - T0)) s)"
