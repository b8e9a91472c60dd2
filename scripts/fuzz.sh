#!/usr/bin/env bash
# libFuzzer harnesses of Tessera's parsers (tests/fuzz/README.md). Needs clang and libclang-rt
# (scripts/deps.sh installs them).
#
#   scripts/fuzz.sh build  [BUILD]             configure + build the harnesses with clang (ASan+UBSan+libFuzzer)
#   scripts/fuzz.sh replay [BUILD]             run every committed corpus and regression input once (ctest sanitize.fuzz_replay)
#   scripts/fuzz.sh run HARNESS SECONDS [BUILD] fuzz one harness (one process); findings -> BUILD/artifacts/HARNESS/
#   scripts/fuzz.sh merge HARNESS [BUILD]      minimise corpus + work corpus (every edge kept) into tests/fuzz/corpus/HARNESS
#
# BUILD defaults to build/fuzz. HARNESS is one of: fuzz_hostlist fuzz_config fuzz_token_file
# fuzz_checkpoint fuzz_safetensors fuzz_yaml fuzz_tokenizer fuzz_tokenizer_config fuzz_jinja. FUZZ_OPT (e.g. -O0) sets BUILD's optimisation level when given
# (otherwise it keeps the one it has; a new folder gets -O1): ctest's sanitize.fuzz_build and
# sanitize.fuzz_replay build -O0 into their own folder, which compiles in 60% of the CPU time.
set -euo pipefail
SRC="$(cd "$(dirname "$0")/.." && pwd)"
FUZZ="$SRC/tests/fuzz"
HARNESSES=(fuzz_hostlist fuzz_config fuzz_token_file fuzz_checkpoint fuzz_safetensors)
HARNESSES+=(fuzz_yaml fuzz_tokenizer fuzz_tokenizer_config fuzz_jinja)  # issue 58
cmd="${1:-}"; shift || true

# The sanitizers' settings for every run: leaks are not checked (LibTorch and Open MPI keep
# process-lifetime allocations that LeakSanitizer would report at exit), every UBSan report is
# fatal with a stack.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1:allocator_may_return_null=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

build() {
  local b="$1"
  command -v clang++ >/dev/null || { echo "fuzz: clang++ not found (bash scripts/deps.sh)"; exit 1; }
  local args=()  # a new folder gets Ninja where it is installed (as scripts/build.sh); an old one keeps its generator
  [[ ! -f $b/CMakeCache.txt ]] && command -v ninja >/dev/null && args=(-G Ninja)
  [[ -n ${FUZZ_OPT:-} ]] && args+=("-DTESSERA_FUZZ_OPT=$FUZZ_OPT")
  cmake -S "$FUZZ" -B "$b" "${args[@]}" -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ >/dev/null
  cmake --build "$b" -j "$(getconf _NPROCESSORS_ONLN)"  # not nproc: it obeys OMP_NUM_THREADS
}

max_len() {  # inputs of these harnesses hold several small files
  case "$1" in
    fuzz_safetensors|fuzz_checkpoint|fuzz_jinja) echo 16384 ;;
    fuzz_tokenizer) echo 16384 ;;  # a vocabulary of 256 bytes is 4 KB
    *) echo 4096 ;;
  esac
}

case "$cmd" in
  build)
    build "${1:-$SRC/build/fuzz}" ;;
  replay)
    b="${1:-$SRC/build/fuzz}"
    build "$b" >/dev/null
    total=0
    for h in "${HARNESSES[@]}"; do
      mapfile -t inputs < <(find "$FUZZ/corpus/$h" "$FUZZ/regressions/$h" -type f 2>/dev/null | sort)
      [ ${#inputs[@]} -gt 0 ] || { echo "fuzz replay: no inputs for $h"; exit 1; }
      start=$(date +%s%N)
      if ! "$b/$h" -timeout=10 -rss_limit_mb=2048 "${inputs[@]}" >"$b/$h.replay.log" 2>&1; then
        tail -n 40 "$b/$h.replay.log"; echo "fuzz replay: $h FAILED (log: $b/$h.replay.log)"; exit 1
      fi
      ms=$((($(date +%s%N) - start) / 1000000))
      printf 'fuzz replay: %-17s %4d inputs ok in %d.%03d s\n' "$h" "${#inputs[@]}" $((ms / 1000)) $((ms % 1000))
      total=$((total + ${#inputs[@]}))
    done
    echo "fuzz replay: $total inputs, no crash, no sanitizer report" ;;
  run)
    h="$1"; secs="$2"; b="${3:-$SRC/build/fuzz}"
    build "$b" >/dev/null
    mkdir -p "$b/work/$h" "$b/artifacts/$h"
    "$b/$h" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len="$(max_len "$h")" \
      -dict="$FUZZ/dict/$h.dict" -artifact_prefix="$b/artifacts/$h/" -print_final_stats=1 \
      "$b/work/$h" $(ls -d "$FUZZ/corpus/$h" "$FUZZ/regressions/$h" 2>/dev/null) 2>&1 | tee "$b/work/$h.log" | grep -E "^#[0-9]+ *(DONE|NEW)|pulse|ERROR|SUMMARY|FINDING|stat::|Test unit written" | grep -v "NEW " || true ;;
  merge)
    h="$1"; b="${2:-$SRC/build/fuzz}"
    rm -rf "$b/merged/$h"; mkdir -p "$b/merged/$h"
    # -use_counters=0: keep one input per coverage edge (not per hit-count bucket): ~5x fewer files.
    "$b/$h" -merge=1 -use_counters=0 -timeout=10 -rss_limit_mb=2048 -max_len="$(max_len "$h")" "$b/merged/$h" \
      "$FUZZ/corpus/$h" "$b/work/$h" 2>&1 | grep -E "MERGE-OUTER: [0-9]+ new files" || true
    rm -rf "$FUZZ/corpus/$h"; mkdir -p "$FUZZ/corpus/$h"; cp "$b/merged/$h"/* "$FUZZ/corpus/$h/"
    echo "fuzz merge: $h corpus $(ls "$FUZZ/corpus/$h" | wc -l) files, $(du -sk "$FUZZ/corpus/$h" | cut -f1) KiB" ;;
  *)
    sed -n '2,12p' "$0"; exit 2 ;;
esac
