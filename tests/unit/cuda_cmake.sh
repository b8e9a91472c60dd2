#!/usr/bin/env bash
# cmake/cuda_nccl.cmake decides whether the CUDA/NCCL path is built. With TESSERA_WITH_CUDA=ON, a
# missing piece (CUDA runtime, NCCL, CUDA LibTorch) must fail the configure naming it; AUTO turns
# the path off instead. Each case configures a small probe project that includes the real module on
# a fake CUDA tree (empty files where the headers and libraries go): CMAKE_FIND_ROOT_PATH with mode
# ONLY re-roots every search, the module's /usr/local/cuda hint included, into that tree, so the
# machine's own CUDA is not seen. A CUDA LibTorch is stood in for by the target its config defines.
set -uo pipefail
SRC=${TESSERA_SRC:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

# fake_cuda DIR PIECE...: a CUDA tree with the named pieces (nccl, cudart, cudart-headers)
fake_cuda() {
  local root=$1/usr/local/cuda
  shift
  mkdir -p "$root/include" "$root/lib64"
  for piece in "$@"; do
    case $piece in
      nccl) touch "$root/include/nccl.h" "$root/lib64/libnccl.so" ;;
      cudart) touch "$root/include/cuda_runtime_api.h" "$root/lib64/libcudart.so" ;;
      cudart-headers) touch "$root/include/cuda_runtime_api.h" ;;
    esac
  done
}
fake_cuda "$T/full" nccl cudart
fake_cuda "$T/no-cudart" nccl cudart-headers  # headers present, library missing
fake_cuda "$T/no-nccl" cudart

mkdir -p "$T/probe"
cat >"$T/probe/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.18)
project(cuda_probe LANGUAGES C)
if(PROBE_TORCH_CUDA)
  add_library(torch_cuda INTERFACE)  # what a CUDA-enabled LibTorch's config defines
endif()
include($SRC/cmake/cuda_nccl.cmake)
CMAKE

# expect DESCRIPTION WITH_CUDA TORCH_CUDA TREE OUTCOME TEXT: configures the probe on the fake TREE;
# the configure must end as OUTCOME (ok or error) and its output, whitespace-normalised (CMake wraps
# long errors), must hold TEXT.
failures=0 n=0
expect() {
  local log=$T/$((++n)).log rc
  env -u CUDA_HOME -u NCCL_HOME cmake -S "$T/probe" -B "$T/build-$n" -DTESSERA_WITH_CUDA="$2" -DPROBE_TORCH_CUDA="$3" \
    -DCMAKE_FIND_ROOT_PATH="$T/$4" -DCMAKE_FIND_ROOT_PATH_MODE_LIBRARY=ONLY -DCMAKE_FIND_ROOT_PATH_MODE_INCLUDE=ONLY \
    >"$log" 2>&1
  rc=$?
  if [[ ($5 == ok && $rc -eq 0) || ($5 == error && $rc -ne 0) ]] && tr -s ' \n' ' ' <"$log" | grep -qF -- "$6"; then
    echo "ok   $1"
  else
    echo "FAIL $1 (exit $rc; wanted $5 and: $6)"
    grep -E -A3 'Tessera:|CMake Error' "$log" | head -8
    failures=1
  fi
}
expect "ON with everything: configures, CUDA path on, cudart from the tree" ON ON full ok \
  "cudart=$T/full/usr/local/cuda/lib64/libcudart.so -> TESSERA_WITH_CUDA=ON"
expect "ON without libcudart: the configure fails naming the CUDA runtime and libcudart" ON ON no-cudart error \
  "TESSERA_WITH_CUDA=ON but missing: the CUDA runtime (cuda_runtime_api.h: $T/no-cudart/usr/local/cuda/include, libcudart: CUDART_LIBRARY-NOTFOUND"
expect "ON without NCCL: fails naming NCCL" ON ON no-nccl error "TESSERA_WITH_CUDA=ON but missing: NCCL"
expect "ON with a CPU-only LibTorch: fails naming LibTorch" ON OFF full error \
  "TESSERA_WITH_CUDA=ON but missing: a CUDA-enabled LibTorch"
expect "AUTO without libcudart: configures, CUDA path off" AUTO ON no-cudart ok "-> TESSERA_WITH_CUDA=OFF"
expect "AUTO with everything: CUDA path on" AUTO ON full ok "-> TESSERA_WITH_CUDA=ON"
exit $failures
