#!/usr/bin/env bash
# Tessera on one NVIDIA GPU, in one call, offline, in under 8 minutes. Not registered with ctest
# (tests/CMakeLists.txt skips tests/gpu); run by hand or through the device tool:
#
#   bash tests/gpu/run.sh            # results in $OUT/gpu_results.txt, else ./gpu_results.txt
#
# Needs: nvidia-smi, python3 with a CUDA PyTorch 2.x (its LibTorch is what Tessera builds against)
# and the pip NCCL (nvidia-nccl-*), cmake, a C++17 compiler (C++20 for PyTorch >= 2.14), and Tessera's C++ dependencies (Open
# MPI, nlohmann-json, Boost.Program_options, yaml-cpp, GTest). Where the machine lacks those, make the folder
# .gpu-deps here first with `bash tests/gpu/pack_deps.sh` (Debian 12 packages, ~18 MB) and carry it
# (device tool: carry [".gpu-deps"]; or point TESSERA_GPU_DEBS at such a folder): its packages are
# unpacked into a private root under the work folder, never into /, and the build, mpirun and the
# runs use that root (OPAL_PREFIX, LD_LIBRARY_PATH, the CMake package folders).
#
# Rehearsal on a machine without a GPU (checks this script, the carried dependencies and the build
# plumbing, nothing about CUDA): TESSERA_GPU_REHEARSAL=1 bash tests/gpu/run.sh builds against the
# CPU LibTorch found by CMake (TESSERA_WITH_CUDA=AUTO, so the NCCL backend only compiles and links),
# runs steps 3-5 on the CPU, and skips the GPU-only steps, saying so. tests/gpu/rehearse.sh does that
# with this machine's own copies of the carried packages hidden.
#
# Steps, each under its own `timeout` and a global deadline; every step is reported PASS, FAIL,
# TIMEOUT or SKIPPED with the reason, nothing is claimed that did not run:
#   1. environment: GPU, driver, torch, CUDA, NCCL from pip
#   2. PyTorch eager reference: the ~1.1B Llama step (bf16 autocast, seq 2048) -> tokens/s, MFU, memory
#   3. configure + build the CUDA variant (TESSERA_WITH_CUDA=ON): tessera, test_comm_conformance,
#      test_fsdp_train
#   4. communicator conformance at world size 1 (includes the NCCL backend on the GPU)
#   5. FSDP equivalence test at world size 1
#   6. Tessera throughput: `tessera train --set train.device=cuda` on the same model and step, only
#      when a 2-step probe reports that it ran on a CUDA device (its metrics.jsonl carries
#      "device": "cuda:N"); else SKIPPED with the probe's reason.
#   7. report: tokens/s, MFU, peak memory, Tessera / eager ratio
set -uo pipefail

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
RESULTS_DIR=${OUT:-$PWD}
RES=$RESULTS_DIR/gpu_results.txt
WORK=${TESSERA_GPU_WORK:-/tmp/tessera-gpu}
BUILD=$WORK/build
LOGS=$WORK/logs
REHEARSAL=${TESSERA_GPU_REHEARSAL:-0}
DEADLINE=${TESSERA_GPU_BUDGET_S:-460}  # seconds for all steps (< 8 minutes)
BUILD_LIMIT=240
# A rehearsal builds on whatever CPU it finds (about 5 minutes on 2 cores from nothing, here).
((REHEARSAL)) && DEADLINE=${TESSERA_GPU_BUDGET_S:-3600} && BUILD_LIMIT=3000
SEQ=2048
BATCH=${TESSERA_GPU_BATCH:-4}
JOBS=$(nproc 2>/dev/null || echo 4)
mkdir -p "$RESULTS_DIR" "$LOGS" "$WORK/run"
: >"$RES"

T0=$SECONDS
say() { echo "$*" | tee -a "$RES"; }
say_lines() { sed 's/^/  | /' | tee -a "$RES"; }  # stdin, indented, to the terminal and the results
remaining() { echo $((DEADLINE - (SECONDS - T0))); }

declare -A STATUS=()
ORDER=()
# step NAME LIMIT_S CMD...: runs CMD under timeout (capped by the global deadline), logs to
# $LOGS/NAME.log and copies it next to the results; records PASS / FAIL (rc) / TIMEOUT.
step() {
  local name=$1 limit=$2
  shift 2
  local left
  left=$(remaining)
  ORDER+=("$name")
  if ((left < 15)); then
    STATUS[$name]="SKIPPED (global deadline of ${DEADLINE}s reached)"
    say "[$name] ${STATUS[$name]}"
    return 99
  fi
  ((limit > left)) && limit=$left
  local t=$SECONDS rc
  say "[$name] running (limit ${limit}s): $*"
  timeout --kill-after=10 "$limit" "$@" >"$LOGS/$name.log" 2>&1
  rc=$?
  case $rc in
    0) STATUS[$name]="PASS" ;;
    124 | 137) STATUS[$name]="TIMEOUT after ${limit}s" ;;
    *) STATUS[$name]="FAIL (exit $rc)" ;;
  esac
  say "[$name] ${STATUS[$name]} in $((SECONDS - t))s; log $LOGS/$name.log"
  if ((rc != 0)); then
    say "  --- last lines of $name.log ---"
    tail -n 15 "$LOGS/$name.log" | say_lines
  fi
  return $rc
}
skip() {
  ORDER+=("$1")
  STATUS[$1]="SKIPPED: $2"
  say "[$1] ${STATUS[$1]}"
}

say "tessera GPU run $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), source $SRC"

((REHEARSAL)) && say "REHEARSAL (TESSERA_GPU_REHEARSAL=1): CPU LibTorch, no GPU steps; nothing here measures the GPU path"

# ---- 1. environment ----------------------------------------------------------------------------
((REHEARSAL)) && skip env "rehearsal" || step env 30 bash -c 'nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader &&
  python3 -c "import torch; print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"gpu\", torch.cuda.is_available() and torch.cuda.get_device_name())"'
[[ -f $LOGS/env.log ]] && say_lines <"$LOGS/env.log"
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
say "  visible GPUs: ${GPUS:-0} (one rank per GPU: world size 1 here)"

# ---- model: ~1.1B Llama (TinyLlama shape), HF config.json shared by both sides --------------------
MODEL_CFG=$WORK/run/config.json
cat >"$MODEL_CFG" <<'JSON'
{
  "architectures": ["LlamaForCausalLM"],
  "model_type": "llama",
  "vocab_size": 32000,
  "hidden_size": 2048,
  "intermediate_size": 5632,
  "num_hidden_layers": 22,
  "num_attention_heads": 32,
  "num_key_value_heads": 4,
  "max_position_embeddings": 4096,
  "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0,
  "tie_word_embeddings": false,
  "hidden_act": "silu",
  "torch_dtype": "bfloat16",
  "bos_token_id": 1,
  "eos_token_id": 2
}
JSON

# ---- 2. PyTorch eager reference -----------------------------------------------------------------
EAGER_JSON=$WORK/run/eager.json
((REHEARSAL)) && skip eager "rehearsal (no GPU)" || step eager 120 env PYTHONUNBUFFERED=1 python3 "$SRC/tests/gpu/bench_gpu.py" eager --config "$MODEL_CFG" \
  --seq "$SEQ" --batch "$BATCH" --warmup 3 --steps 10 --out "$EAGER_JSON"

# ---- C++ dependencies carried as Debian packages (tests/gpu/pack_deps.sh) --------------------------
source "$SRC/tests/gpu/deps.bash"
DEPS_DIR=${TESSERA_GPU_DEBS:-$SRC/.gpu-deps}
DEPS_ROOT=$WORK/deps
CMAKE_DEPS=()
if compgen -G "$DEPS_DIR/*.deb" >/dev/null; then
  if step deps 60 bash -c 'source "$0" && deps_unpack "$1" "$2"' "$SRC/tests/gpu/deps.bash" "$DEPS_DIR" "$DEPS_ROOT" &&
    deps_use "$DEPS_ROOT"; then
    say "  C++ dependencies from $DEPS_DIR ($(ls "$DEPS_DIR"/*.deb | wc -l) packages) unpacked into $DEPS_ROOT"
  fi
else
  say "  no carried C++ dependencies ($DEPS_DIR/*.deb): using the machine's own"
fi

# ---- 3. configure + build the CUDA variant ------------------------------------------------------
if ((REHEARSAL)); then
  # This machine's CPU LibTorch and the NCCL of its CUDA toolkit: the NCCL backend compiles and links.
  WITH_CUDA=AUTO
  TORCH_PREFIX=${TESSERA_GPU_TORCH_PREFIX:-/usr/lib/x86_64-linux-gnu/cmake}
  NCCL_HOME=${TESSERA_GPU_NCCL_HOME:-/usr/local/cuda}
  NCCL_FOUND=$([[ -f $NCCL_HOME/include/nccl.h ]] && echo "$NCCL_HOME/include")
else
  WITH_CUDA=ON
  TORCH_PREFIX=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null || true)
  # The pip wheel ships libnccl.so.2 (no libnccl.so) under nvidia/nccl or nvidia/cu13; give CMake a
  # conventional NCCL_HOME with include/ and lib/ pointing at it.
  NCCL_HOME=$WORK/nccl
  NCCL_FOUND=$(python3 - "$NCCL_HOME" <<'PY' 2>/dev/null
import glob, os, sys
home = sys.argv[1]
try:
    import nvidia
except ImportError:
    sys.exit(1)
roots = list(getattr(nvidia, "__path__", []))
hdr = [h for r in roots for h in glob.glob(os.path.join(r, "**", "nccl.h"), recursive=True)]
lib = [l for r in roots for l in glob.glob(os.path.join(r, "**", "libnccl.so*"), recursive=True)]
if not hdr or not lib:
    sys.exit(1)
os.makedirs(os.path.join(home, "lib"), exist_ok=True)
link_inc = os.path.join(home, "include")
if not os.path.lexists(link_inc):
    os.symlink(os.path.dirname(hdr[0]), link_inc)
for name in ("libnccl.so", "libnccl.so.2"):
    dst = os.path.join(home, "lib", name)
    if not os.path.lexists(dst):
        os.symlink(sorted(lib)[0], dst)
print(os.path.dirname(hdr[0]))
PY
  )
fi
BUILT=0
if [[ -z $TORCH_PREFIX ]]; then
  skip configure "python3 has no importable torch: no LibTorch to build against"
elif [[ -z $NCCL_FOUND ]]; then
  skip configure "no NCCL from pip (nvidia-nccl-*: nccl.h and libnccl.so* under the nvidia package)"
else
  say "  LibTorch: $TORCH_PREFIX; NCCL: $NCCL_FOUND (as $NCCL_HOME)"
  GEN=()
  command -v ninja >/dev/null && GEN=(-G Ninja)
  export NCCL_HOME LD_LIBRARY_PATH=$NCCL_HOME/lib:${LD_LIBRARY_PATH:-}
  NCCL_LIB=$NCCL_HOME/lib/libnccl.so
  [[ -e $NCCL_LIB ]] || NCCL_LIB=$NCCL_HOME/lib64/libnccl.so
  if step configure 90 cmake -S "$SRC" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" -DTESSERA_WITH_CUDA=$WITH_CUDA -DNCCL_HOME="$NCCL_HOME" \
    -DNCCL_INCLUDE_DIR="$NCCL_HOME/include" -DNCCL_LIBRARY="$NCCL_LIB" "${CMAKE_DEPS[@]}" \
    -DTORCH_CUDA_ARCH_LIST=9.0 -DCMAKE_CUDA_ARCHITECTURES=90 -DTESSERA_BUILD_BENCHMARKS=ON \
    -DTESSERA_GLOO_BASELINE=OFF; then
    grep -E 'CMake Error|Could NOT find|TESSERA_WITH_CUDA' "$LOGS/configure.log" | say_lines
    # Which copies of the dependencies the build took (the carried root or the machine's own).
    grep -E '^(MPI_C_HEADER_DIR|MPI_mpi_LIBRARY|Boost_DIR|yaml-cpp_DIR|nlohmann_json_DIR|GTest_DIR|Torch_DIR):' "$BUILD/CMakeCache.txt" | say_lines
    if step build "$BUILD_LIMIT" cmake --build "$BUILD" -j "$JOBS" --target tessera test_comm_conformance test_fsdp_train; then
      BUILT=1
      ldd "$BUILD/bin/tessera" | grep -E 'libmpi|boost|libtorch\.|libc10|nccl|cudart' | say_lines
    fi
  else
    say "  configure failed; missing packages named above (CMake Error / Could NOT find)"
    grep -E 'CMake Error|Could NOT find' "$LOGS/configure.log" | head -5 | say_lines
  fi
fi

# ---- 4, 5. conformance and FSDP equivalence at world size 1 --------------------------------------
# Open MPI refuses root without these; a singleton start (no mpirun) is the fallback.
MPIRUN=()
if command -v mpirun >/dev/null; then
  MPIRUN=(mpirun --allow-run-as-root --oversubscribe -np 1 -x TESSERA_TEST_SRC="$SRC" -x LD_LIBRARY_PATH)
  [[ -n ${OPAL_PREFIX:-} ]] && MPIRUN+=(-x OPAL_PREFIX)
fi
if ((BUILT)); then
  export TESSERA_TEST_SRC=$SRC
  step conformance 60 "${MPIRUN[@]}" "$BUILD/bin/test_comm_conformance"
  # The NCCL communicator is part of the suite only when it was compiled in and a GPU is visible.
  if grep -q 'nccl' "$LOGS/conformance.log"; then
    say "  NCCL backend exercised on the GPU (nccl communicator in the conformance suite)"
  else
    say "  NOTE: the conformance log never names the nccl backend: NCCL was not exercised"
  fi
  step fsdp_train 90 "${MPIRUN[@]}" "$BUILD/bin/test_fsdp_train"
  say "  NOTE: test_fsdp_train checks FSDP against a single-process LibTorch reference on CPU tensors;"
  if grep -q 'OK \] FsdpDevice.CudaMatchesCpuAndCheckpointsThroughHost' "$LOGS/fsdp_train.log"; then
    say "  FsdpDevice.CudaMatchesCpuAndCheckpointsThroughHost PASSED: FSDP on the GPU over NCCL matches the CPU run"
  else
    say "  NOTE: FsdpDevice.CudaMatchesCpuAndCheckpointsThroughHost did not pass (skipped or failed; see the log)"
  fi
else
  skip conformance "not built"
  skip fsdp_train "not built"
fi

# ---- 6. Tessera throughput on the GPU ------------------------------------------------------------
TESSERA_METRICS=$WORK/run/tessera-log/metrics.jsonl
SKIP_REASON=""
if ((!BUILT)); then
  SKIP_REASON="tessera was not built (see configure/build above)"
elif ((REHEARSAL)); then
  SKIP_REASON="rehearsal (no GPU)"
else
  # Capability probe: a 2-step run of the tiny preset; the trainer must say it ran on CUDA.
  PROBE=$WORK/run/probe
  rm -rf "$PROBE" && mkdir -p "$PROBE"
  python3 -c 'import random; random.seed(0); w=[random.choice(["tessera","shard","gather","reduce","scatter","llama","token","layer"]) for _ in range(400000)]; open("'"$WORK/run/corpus.txt"'","w").write(" ".join(w))'
  step probe 60 "${MPIRUN[@]}" "$BUILD/bin/tessera" train --set train.device=cuda --set model.preset=tiny --set train.steps=2 \
    --set data.path="$WORK/run/corpus.txt" --set log.dir="$PROBE" --set fsdp.mixed_precision=bf16
  DEVICE=$(python3 -c 'import json,sys; r=[json.loads(l) for l in open(sys.argv[1]) if l.strip()]; print(r[-1].get("device","")) if r else print("")' \
    "$PROBE/metrics.jsonl" 2>/dev/null || true)
  if [[ $DEVICE != cuda* ]]; then
    SKIP_REASON="the probe did not train on CUDA: its metrics.jsonl says '${DEVICE:-nothing (no record; see the probe log)}' - a 1B bf16 run on the CPU would not finish in the time box"
  else
    MODEL_DIR=$WORK/run/model-1b
    rm -rf "$MODEL_DIR" "$(dirname "$TESSERA_METRICS")"
    if step init_model 60 "$BUILD/bin/tessera" init-model --config "$MODEL_CFG" --out "$MODEL_DIR" --dtype bf16; then
      step tessera_train 150 "${MPIRUN[@]}" "$BUILD/bin/tessera" train --set train.device=cuda --set model.path="$MODEL_DIR" \
        --set data.path="$WORK/run/corpus.txt" --set data.tokenizer=bytes --set data.seq_len=$SEQ --set train.micro_batch="$BATCH" \
        --set train.steps=12 --set train.warmup_steps=2 --set train.lr=1e-4 \
        --set fsdp.mixed_precision=bf16 --set fsdp.activation_checkpointing=false \
        --set log.dir="$(dirname "$TESSERA_METRICS")" ||
        SKIP_REASON="tessera train failed (see its log above)"
    else
      SKIP_REASON="init-model failed (see its log above)"
    fi
  fi
fi
[[ -n $SKIP_REASON ]] && skip tessera_train "$SKIP_REASON"

# ---- 7. report ------------------------------------------------------------------------------------
say ""
say "== throughput (${SEQ}-token sequences, micro-batch $BATCH, one GPU) =="
python3 "$SRC/tests/gpu/bench_gpu.py" report --config "$MODEL_CFG" --seq "$SEQ" --batch "$BATCH" \
  --eager "$EAGER_JSON" --tessera-metrics "$([[ -z $SKIP_REASON ]] && echo "$TESSERA_METRICS")" \
  --skip-reason "$SKIP_REASON" 2>&1 | tee -a "$RES"
say ""
say "== summary ($((SECONDS - T0))s) =="
FAILED=0
for name in "${ORDER[@]}"; do
  say "$(printf '  %-14s %s' "$name" "${STATUS[$name]}")"
  [[ ${STATUS[$name]} == FAIL* || ${STATUS[$name]} == TIMEOUT* ]] && FAILED=1
done
# Logs travel with the results (the device tool brings back at most 8 files from $OUT).
if [[ -n ${OUT:-} ]]; then
  tar -czf "$OUT/gpu_logs.tar.gz" -C "$WORK" logs run/eager.json 2>/dev/null || true
fi
exit $FAILED
