#!/usr/bin/env bash
# cmake/cuda_nccl.cmake decides whether the CUDA/NCCL path is built. With TESSERA_WITH_CUDA=ON, a
# missing piece (CUDA runtime, NCCL, CUDA LibTorch) must fail the configure naming it; AUTO turns
# the path off instead. Each case configures a small probe project that includes the real module on
# a fake CUDA tree (empty files where the headers and libraries go): CMAKE_FIND_ROOT_PATH with mode
# ONLY re-roots every search, the module's /usr/local/cuda hint included, into that tree, so the
# machine's own CUDA is not seen. A CUDA LibTorch is stood in for by the target its config defines.
set -uo pipefail
SRC=${TESSERA_SRC:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail=0
check() {  # check NAME CONDITION-STATUS [detail]
  if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1 ${3:-}"; fail=1; fi
}

# fake_cuda DIR PIECE...: a CUDA tree with the named pieces (nccl, cudart)
fake_cuda() {
  local root=$1/usr/local/cuda
  shift
  mkdir -p "$root/include" "$root/lib64"
  for piece in "$@"; do
    case $piece in
      nccl) touch "$root/include/nccl.h" "$root/lib64/libnccl.so" ;;
      cudart) touch "$root/include/cuda_runtime_api.h" "$root/lib64/libcudart.so" ;;
    esac
  done
}
fake_cuda "$T/full" nccl cudart
fake_cuda "$T/no-cudart" nccl
touch "$T/no-cudart/usr/local/cuda/include/cuda_runtime_api.h"  # headers present, library missing
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

# probe NAME WITH_CUDA TORCH_CUDA TREE: configures; log in $T/NAME.log, exit status returned
probe() {
  env -u CUDA_HOME -u NCCL_HOME cmake -S "$T/probe" -B "$T/build-$1" -DTESSERA_WITH_CUDA="$2" -DPROBE_TORCH_CUDA="$3" \
    -DCMAKE_FIND_ROOT_PATH="$T/$4" -DCMAKE_FIND_ROOT_PATH_MODE_LIBRARY=ONLY -DCMAKE_FIND_ROOT_PATH_MODE_INCLUDE=ONLY \
    >"$T/$1.log" 2>&1
}
says() { tr -s ' \n' ' ' <"$T/$1.log" | grep -qF -- "$2"; }  # says NAME TEXT (CMake wraps long errors)

probe on-full ON ON full
check "ON with everything: configures" $? "$(tail -5 "$T/on-full.log")"
says on-full "cudart=$T/full/usr/local/cuda/lib64/libcudart.so -> TESSERA_WITH_CUDA=ON"
check "ON with everything: CUDA path on, cudart from the tree" $? "$(grep Tessera: "$T/on-full.log")"

probe on-no-cudart ON ON no-cudart
[ $? -ne 0 ]
check "ON without libcudart: the configure fails" $? "$(grep Tessera: "$T/on-no-cudart.log")"
says on-no-cudart "TESSERA_WITH_CUDA=ON but missing: the CUDA runtime" &&
  says on-no-cudart "libcudart: CUDART_LIBRARY-NOTFOUND"
check "ON without libcudart: the error names the CUDA runtime and libcudart" $? "$(grep -A3 'CMake Error' "$T/on-no-cudart.log")"

probe on-no-nccl ON ON no-nccl
[ $? -ne 0 ] && says on-no-nccl "missing: NCCL"
check "ON without NCCL: fails naming NCCL" $? "$(grep -A3 'CMake Error' "$T/on-no-nccl.log")"

probe on-cpu-torch ON OFF full
[ $? -ne 0 ] && says on-cpu-torch "missing: a CUDA-enabled LibTorch"
check "ON with a CPU-only LibTorch: fails naming LibTorch" $? "$(grep -A3 'CMake Error' "$T/on-cpu-torch.log")"

probe auto-no-cudart AUTO ON no-cudart
check "AUTO without libcudart: configures" $? "$(tail -5 "$T/auto-no-cudart.log")"
says auto-no-cudart "-> TESSERA_WITH_CUDA=OFF"
check "AUTO without libcudart: CUDA path off" $? "$(grep Tessera: "$T/auto-no-cudart.log")"

probe auto-full AUTO ON full
says auto-full "-> TESSERA_WITH_CUDA=ON"
check "AUTO with everything: CUDA path on" $? "$(grep Tessera: "$T/auto-full.log")"
exit $fail
