#!/usr/bin/env bash
# Installs dependencies (idempotent) and builds Tessera into build/ (executables in build/bin/).
#
#   bash scripts/build.sh                            # deps, configure build/, build everything
#   TARGETS=tessera bash scripts/build.sh            # the same, building only the binary
#   DEPS=--main TARGETS=tessera bash scripts/build.sh  # ... with only the packages it needs (scripts/deps.sh --main)
#   bash scripts/build.sh --configure DIR [ARG...]   # only: cmake -S <repo> -B DIR ARG... (no deps, no build)
#
# Configuring goes through configure() below. CMake reports what Tessera's checks refuse
# (cmake/cuda_nccl.cmake: TESSERA_WITH_CUDA=ON with a CPU LibTorch or without NCCL, a CUDA LibTorch
# without nvcc, a C++ ABI mismatch, CUDA toolkit and LibTorch runtime of different major versions)
# inside its FATAL_ERROR boilerplate with exit code 1; here that is ONE line on stderr,
# "tessera: configure: ...", and exit code 2. Any failed configure leaves no build system behind
# that a later `cmake --build DIR` would use: a folder this configure created is removed; in a
# folder that existed, CMakeCache.txt and the top-level Makefile / build.ninja are (objects stay,
# for an incremental build once the input is fixed). Other CMake errors (a missing package) print
# CMake's own output and keep its exit code.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

configure() {
  local dir=$1 fresh=0 log rc=0
  shift
  if [[ ! -e $dir ]] || [[ -d $dir && -z $(ls -A "$dir") ]]; then fresh=1; fi
  log=$(mktemp)
  cmake -S "$ROOT" -B "$dir" "$@" >"$log" 2>&1 || rc=$?
  if ((rc == 0)); then
    cat "$log"
    rm -f "$log"
    return 0
  fi
  local err=$dir/CMakeFiles/tessera-configure-error.txt line=""
  [[ -f $err ]] && line=$(head -n 1 "$err")
  if ((fresh)); then
    rm -rf "$dir"
  else
    rm -f "$dir/CMakeCache.txt" "$dir/Makefile" "$dir/build.ninja" "$dir/CMakeFiles/Makefile.cmake" \
      "$dir/CMakeFiles/Makefile2" "$dir/CMakeFiles/cmake.check_cache" "$err"
  fi
  if [[ -n $line ]]; then
    echo "$line" >&2
    rm -f "$log"
    return 2
  fi
  cat "$log" >&2
  rm -f "$log"
  return "$rc"
}

if [[ ${1:-} == --configure ]]; then
  [[ $# -ge 2 ]] || { echo "usage: bash scripts/build.sh --configure DIR [CMAKE ARG...]" >&2; exit 2; }
  shift
  rc=0
  configure "$@" || rc=$?
  exit "$rc"
fi

cd "$ROOT"
bash scripts/deps.sh ${DEPS:-}
JOBS=${JOBS:-$(nproc)}
rc=0
out=$(mktemp)
# A new build folder gets Ninja (scripts/deps.sh installs it): it compiles a library's units while
# the libraries below it still build, where Make waits for each target in turn (faster on 2 cores:
# docs/PERFORMANCE.md#build-suite-and-start-up-measurements). An existing folder keeps the generator
# it was made with (CMake refuses another).
gen=()
[[ ! -f build/CMakeCache.txt ]] && command -v ninja >/dev/null && gen=(-G Ninja)
configure build "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$out" || rc=$?
grep '^-- Tessera: LibTorch .* -> TESSERA_WITH_CUDA=' "$out" || true  # what the build found, one line
rm -f "$out"
((rc == 0)) || exit "$rc"
# TARGETS (e.g. TARGETS=tessera, as scripts/quickstart.sh does): build only those; default: everything.
read -r -a targets <<<"${TARGETS:-all}"
cmake --build build -j"$JOBS" --target "${targets[@]}"
