#!/usr/bin/env bash
# Tessera on NVIDIA GPUs, in one command, offline, inside one 9-minute call on 16 cores. Not
# registered with ctest (tests/CMakeLists.txt skips tests/gpu); run by hand or through the device
# tool (carry [".gpu-deps"], timeout_s >= 540):
#
#   bash tests/gpu/run.sh                      # results in $OUT (else ./): gpu_results.txt, gpu_logs.tar.gz
#   TESSERA_GPU_STEPS=conformance,tessera_train bash tests/gpu/run.sh    # a rerun of some steps
#
# Needs: nvidia-smi, python3 with a CUDA PyTorch 2.x (its LibTorch is what Tessera builds against)
# and the pip NCCL (nvidia-nccl-*), nvcc, cmake, a C++17 compiler (C++20 for PyTorch >= 2.14), and
# Tessera's C++ dependencies (Open MPI, nlohmann-json, Boost.Program_options, yaml-cpp, GTest, PCRE2). Where the
# machine lacks those, make the folder .gpu-deps here first with `bash tests/gpu/pack_deps.sh`
# (Debian 12 packages, ~18 MB, need glibc >= 2.36) and carry it (or point TESSERA_GPU_DEBS at such
# a folder): its packages are unpacked into a private root under the work folder, never into /, and
# the build, mpirun and the runs use that root (OPAL_PREFIX, LD_LIBRARY_PATH, CMake package folders).
# Every MPI start runs with OMPI_MCA_plm=isolated (tests/gpu/deps.bash: mpi_local_env): without ssh
# or rsh, Open MPI 4.1 aborts even `mpirun -np 1` and a singleton start otherwise.
#
# Rehearsal on a machine without a GPU (checks this script, the carried dependencies and the build
# plumbing, nothing about CUDA): TESSERA_GPU_REHEARSAL=1 bash tests/gpu/run.sh builds against the
# CPU LibTorch found by CMake (TESSERA_WITH_CUDA=AUTO, so the NCCL backend only compiles and links),
# runs the test steps on the CPU (each step's limit x TESSERA_GPU_STEP_SCALE, default 5, for shared
# machines), and skips the GPU-only steps, saying so. tests/gpu/rehearse.sh does that with this
# machine's own copies of the carried packages, and ssh and rsh, hidden.
#
# Steps, each under its own `timeout` and a global deadline (TESSERA_GPU_BUDGET_S, default 500 s).
# Each is reported PASS, FAIL, TIMEOUT or SKIPPED (with the reason) the moment it ends, and
# gpu_results.txt and gpu_logs.tar.gz in $OUT are rewritten then: whatever ends the call, what ran
# is there. Nothing is claimed that did not run.
#   env            GPU, driver, torch, CUDA, NCCL from pip
#   deps           the carried C++ dependencies unpacked (glibc checked first)
#   configure      toolchain (ssh, glibc, nvcc, cmake, compiler, LibTorch, NCCL) printed, CMake configure
#                  of the CUDA variant (TESSERA_WITH_CUDA=ON, CMAKE_CUDA_COMPILER)
#   build          tessera and the test binaries, niced, while
#   eager          the PyTorch eager reference runs on the GPU: the ~1.1B Llama step (bf16 autocast,
#                  seq 2048) -> tokens/s, MFU, memory
#   conformance    communicator conformance at world size 1 (the NCCL backend on the GPU included;
#                  NCCL_DEBUG=VERSION's line shows NCCL initialised)
#   fsdp_train     FSDP equivalence at world size 1, FsdpDevice.CudaMatchesCpuAndCheckpointsThroughHost
#   nccl_timeout   NCCL watchdog: a collective that cannot start ends in a one-line Timeout error
#                  within its timeout + slack (test_nccl_timeout)
#   nccl_stall     with >= 2 GPUs: `tessera train` on 2 GPUs, rank 1 SIGSTOPped; every rank ends
#                  within comm.timeout_s + 10 s with one line naming rank, host, device (stall.sh)
#   tessera_train  a 2-step probe must report a CUDA device, then the same 1.1B step as eager
#   fp16_bf16      the tiny preset 60 steps in bf16 and in fp16 (dynamic loss scaling): the fp16 losses
#                  track bf16's within a stated tolerance (see the step)
#   report         tokens/s, MFU, peak memory, Tessera / eager
# TESSERA_GPU_STEPS (comma-separated names from this list; default: all) selects steps for a rerun;
# deps, configure and build run whenever a selected step needs the binaries.
set -uo pipefail

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
RESULTS_DIR=${OUT:-$PWD}
RES=$RESULTS_DIR/gpu_results.txt
WORK=${TESSERA_GPU_WORK:-/tmp/tessera-gpu}
BUILD=$WORK/build
LOGS=$WORK/logs
STATUS_DIR=$WORK/status
REHEARSAL=${TESSERA_GPU_REHEARSAL:-0}
DEADLINE=${TESSERA_GPU_BUDGET_S:-500}  # seconds for all steps; the report follows (a 540 s call)
BUILD_LIMIT=300
BUILD_NICE=(nice -n 10)  # the build yields to the eager reference, which runs meanwhile
# A rehearsal builds on whatever CPU it finds, maybe shared (about 5 minutes on 2 idle cores from
# nothing, over an hour when other builds share them): practically no limits, and no eager to yield to.
((REHEARSAL)) && DEADLINE=${TESSERA_GPU_BUDGET_S:-14400} && BUILD_LIMIT=12000 && BUILD_NICE=()
# Every step's own limit is sized for the GPU machine; a rehearsal on a loaded shared machine
# multiplies them (a niced rehearsal there once spent over 60 s unpacking the 3-second deps step).
STEP_SCALE=1
((REHEARSAL)) && STEP_SCALE=${TESSERA_GPU_STEP_SCALE:-5}
SEQ=2048
BATCH=${TESSERA_GPU_BATCH:-4}
JOBS=$(nproc 2>/dev/null || echo 4)

ALL_STEPS="env deps configure build eager conformance fsdp_train nccl_timeout nccl_stall tessera_train fp16_bf16"
STEPS=${TESSERA_GPU_STEPS:-all}
if [[ $STEPS != all ]]; then
  for s in ${STEPS//,/ }; do
    [[ " $ALL_STEPS " == *" $s "* ]] || { echo "run.sh: TESSERA_GPU_STEPS: unknown step '$s' (steps: ${ALL_STEPS// /,})" >&2; exit 2; }
  done
fi
wanted() { [[ $STEPS == all || ",$STEPS," == *",$1,"* ]]; }
BUILD_TARGETS=()
wanted conformance && BUILD_TARGETS+=(test_comm_conformance)
wanted fsdp_train && BUILD_TARGETS+=(test_fsdp_train)
wanted nccl_timeout && BUILD_TARGETS+=(test_nccl_timeout)
{ wanted nccl_stall || wanted tessera_train || wanted fp16_bf16 || wanted build; } && BUILD_TARGETS+=(tessera)
wanted build && BUILD_TARGETS=(tessera test_comm_conformance test_fsdp_train test_nccl_timeout)
NEED_BUILD=$((${#BUILD_TARGETS[@]} > 0))

mkdir -p "$RESULTS_DIR" "$LOGS" "$WORK/run"
rm -rf "$STATUS_DIR" && mkdir -p "$STATUS_DIR"
: >"$RES"

T0=$SECONDS
say() { echo "$*" | tee -a "$RES"; }
say_lines() { sed 's/^/  | /' | tee -a "$RES"; }  # stdin, indented, to the terminal and the results
remaining() { echo $((DEADLINE - (SECONDS - T0))); }

# Logs, statuses and the eager result into $OUT now (the device tool brings back what is there
# whenever the call ends). Atomic per writer: the build, in the background, publishes too.
publish() {
  [[ -n ${OUT:-} ]] || return 0
  local tmp=$OUT/.gpu_logs.$BASHPID.tmp
  tar -czf "$tmp" --warning=no-file-changed -C "$WORK" logs status \
    $(cd "$WORK" && ls run/*.json run/*/metrics.jsonl run/stall/out.log 2>/dev/null) 2>/dev/null
  mv -f "$tmp" "$OUT/gpu_logs.tar.gz" 2>/dev/null || rm -f "$tmp"
}
trap 'say "run.sh: terminated (SIGTERM) after $((SECONDS - T0))s"; publish; exit 143' TERM
trap 'publish' EXIT

ORDER=()
status_of() { cat "$STATUS_DIR/$1" 2>/dev/null || echo "NOT FINISHED"; }
# run_step NAME LIMIT_S CMD...: runs CMD under timeout (capped by the global deadline), logs to
# $LOGS/NAME.log; records PASS / FAIL (rc) / TIMEOUT in $STATUS_DIR/NAME and publishes.
run_step() {
  local name=$1 limit=$2
  shift 2
  local left
  left=$(remaining)
  if ((left < 15)); then
    echo "SKIPPED (global deadline of ${DEADLINE}s reached)" >"$STATUS_DIR/$name"
    say "[$name] $(status_of "$name")"
    publish
    return 99
  fi
  limit=$((limit * STEP_SCALE))
  ((limit > left)) && limit=$left
  local t=$SECONDS rc
  say "[$name] running (limit ${limit}s): $*"
  timeout --kill-after=10 "$limit" "$@" >"$LOGS/$name.log" 2>&1
  rc=$?
  case $rc in
    0) echo "PASS" ;;
    124 | 137) echo "TIMEOUT after ${limit}s" ;;
    *) echo "FAIL (exit $rc)" ;;
  esac >"$STATUS_DIR/$name"
  say "[$name] $(status_of "$name") in $((SECONDS - t))s; log $LOGS/$name.log"
  if ((rc != 0)); then
    say "  --- last lines of $name.log ---"
    tail -n 15 "$LOGS/$name.log" | say_lines
  fi
  publish
  return $rc
}
step() {
  ORDER+=("$1")
  run_step "$@"
}
skip() {
  ORDER+=("$1")
  echo "SKIPPED: $2" >"$STATUS_DIR/$1"
  say "[$1] SKIPPED: $2"
  publish
}

say "tessera GPU run $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), source $SRC, steps: $STEPS"
((REHEARSAL)) && say "REHEARSAL (TESSERA_GPU_REHEARSAL=1): CPU LibTorch, no GPU steps; nothing here measures the GPU path"

source "$SRC/tests/gpu/deps.bash"
mpi_local_env  # every MPI start below, mpirun or singleton: no ssh/rsh needed
export NCCL_DEBUG=${NCCL_DEBUG:-VERSION}  # NCCL prints its version line once it initialises

# ---- env ----------------------------------------------------------------------------------------
if ((REHEARSAL)); then
  skip env "rehearsal"
else
  step env 45 bash -c 'nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader &&
    python3 -c "import torch; print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"nccl\", torch.cuda.nccl.version() if torch.cuda.is_available() else None, \"gpu\", torch.cuda.is_available() and torch.cuda.get_device_name())"'
  say_lines <"$LOGS/env.log"
fi
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
GPUS=${GPUS:-0}
say "  visible GPUs: $GPUS (one rank per GPU: world size 1 for the single-GPU steps)"

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
CORPUS=$WORK/run/corpus.txt
python3 -c 'import random, sys; random.seed(0); w=[random.choice(["tessera","shard","gather","reduce","scatter","llama","token","layer"]) for _ in range(400000)]; open(sys.argv[1],"w").write(" ".join(w))' "$CORPUS"

# ---- deps: C++ dependencies carried as Debian packages (tests/gpu/pack_deps.sh) ------------------
DEPS_DIR=${TESSERA_GPU_DEBS:-$SRC/.gpu-deps}
DEPS_ROOT=$WORK/deps
CMAKE_DEPS=()
DEPS_OK=1
if ((!NEED_BUILD)); then
  skip deps "no selected step needs a build"
elif compgen -G "$DEPS_DIR/*.deb" >/dev/null; then
  if step deps 60 bash -c 'source "$0" && deps_glibc_ok && deps_unpack "$1" "$2"' "$SRC/tests/gpu/deps.bash" "$DEPS_DIR" "$DEPS_ROOT" &&
    deps_use "$DEPS_ROOT"; then
    say "  C++ dependencies from $DEPS_DIR ($(ls "$DEPS_DIR"/*.deb | wc -l) packages) unpacked into $DEPS_ROOT"
  else
    DEPS_OK=0
  fi
else
  say "  no carried C++ dependencies ($DEPS_DIR/*.deb): using the machine's own"
fi

# ---- configure: toolchain, LibTorch, NCCL, CMake ------------------------------------------------
NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
[[ -n $NVCC && -z ${CUDA_HOME:-} ]] && export CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$NVCC")")")
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
NCCL_LIB=$NCCL_HOME/lib/libnccl.so
[[ -e $NCCL_LIB ]] || NCCL_LIB=$NCCL_HOME/lib64/libnccl.so
BUILT=0
if ((!NEED_BUILD)); then
  skip configure "no selected step needs a build"
  skip build "no selected step needs a build"
elif ((!DEPS_OK)); then
  skip configure "the carried dependencies could not be used (see deps above)"
  skip build "not configured"
elif [[ -z $TORCH_PREFIX ]]; then
  skip configure "python3 has no importable torch: no LibTorch to build against"
  skip build "not configured"
elif [[ -z $NCCL_FOUND ]]; then
  skip configure "no NCCL from pip (nvidia-nccl-*: nccl.h and libnccl.so* under the nvidia package)"
  skip build "not configured"
else
  say "  toolchain:"
  {
    p=$(command -v ssh)
    echo "command -v ssh: ${p:-(none)}$([[ -n $p && ! -x $p ]] && echo ' (not executable)')"
    echo "MPI starts: OMPI_MCA_plm=${OMPI_MCA_plm:-(unset)} ($(command -v mpirun || echo 'no mpirun: singleton starts'))"
    ldd --version 2>&1 | head -1
    if [[ -n $NVCC ]]; then "$NVCC" --version 2>&1 | tail -2; else echo "nvcc: not found"; fi
    echo "CUDA_HOME: ${CUDA_HOME:-(unset)}"
    cmake --version | head -1
    c++ --version 2>&1 | head -1
    tv=$(python3 -c 'import torch; print("torch", torch.__version__)' 2>/dev/null)
    echo "LibTorch: $TORCH_PREFIX${tv:+ ($tv)}"
    echo "NCCL: $NCCL_FOUND, version $(awk '/^#define NCCL_(MAJOR|MINOR|PATCH) /{v = v (v ? "." : "") $3} END {print v}' "$NCCL_FOUND/nccl.h"), library $(readlink -f "$NCCL_LIB")"
  } 2>&1 | say_lines
  GEN=()
  command -v ninja >/dev/null && GEN=(-G Ninja)
  CUDA_COMPILER=()
  [[ -n $NVCC ]] && CUDA_COMPILER=(-DCMAKE_CUDA_COMPILER="$NVCC")
  export NCCL_HOME LD_LIBRARY_PATH=$NCCL_HOME/lib:${LD_LIBRARY_PATH:-}
  if step configure 90 cmake -S "$SRC" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" -DTESSERA_WITH_CUDA=$WITH_CUDA -DNCCL_HOME="$NCCL_HOME" \
    -DNCCL_INCLUDE_DIR="$NCCL_HOME/include" -DNCCL_LIBRARY="$NCCL_LIB" "${CMAKE_DEPS[@]}" "${CUDA_COMPILER[@]}" \
    -DTORCH_CUDA_ARCH_LIST=9.0 -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DTESSERA_GLOO_BASELINE=OFF; then
    grep -E 'CMake Error|Could NOT find|TESSERA_WITH_CUDA' "$LOGS/configure.log" | say_lines
    # Which copies of the dependencies the build took (the carried root or the machine's own).
    grep -E '^(MPI_C_HEADER_DIR|MPI_mpi_LIBRARY|Boost_DIR|yaml-cpp_DIR|nlohmann_json_DIR|GTest_DIR|Torch_DIR|NCCL_LIBRARY|CUDART_LIBRARY|CMAKE_CUDA_COMPILER):' \
      "$BUILD/CMakeCache.txt" | say_lines
    ORDER+=(build)
    (run_step build "$BUILD_LIMIT" "${BUILD_NICE[@]}" cmake --build "$BUILD" -j "$JOBS" --target "${BUILD_TARGETS[@]}") &
    BUILD_PID=$!
  else
    say "  configure failed; missing packages named above (CMake Error / Could NOT find)"
    grep -E 'CMake Error|Could NOT find' "$LOGS/configure.log" | head -5 | say_lines
    skip build "not configured"
  fi
fi

# ---- eager: the PyTorch reference, on the GPU while the build uses the CPUs -----------------------
EAGER_JSON=$WORK/run/eager.json
if ! wanted eager; then
  skip eager "not selected (TESSERA_GPU_STEPS)"
elif ((REHEARSAL)); then
  skip eager "rehearsal (no GPU)"
else
  step eager 150 env PYTHONUNBUFFERED=1 python3 "$SRC/tests/gpu/bench_gpu.py" eager --config "$MODEL_CFG" \
    --seq "$SEQ" --batch "$BATCH" --warmup 3 --steps 10 --out "$EAGER_JSON"
  [[ -n ${BUILD_PID:-} ]] && say "  (measured while the build ran, niced, on the CPUs)"
  publish
fi
if [[ -n ${BUILD_PID:-} ]]; then
  wait "$BUILD_PID"
  if [[ $(status_of build) == PASS ]]; then
    BUILT=1
    [[ -x $BUILD/bin/tessera ]] && ldd "$BUILD/bin/tessera" | grep -E 'libmpi|boost|libtorch\.|libc10|nccl|cudart' | say_lines
  fi
fi

# ---- conformance, fsdp_train, nccl_timeout at world size 1 ---------------------------------------
# One rank, not bound to a core (mpirun binds a single rank to one core by default: LibTorch would
# then run one host thread); a singleton start where there is no mpirun.
NP1=(env)
if command -v mpirun >/dev/null; then
  NP1=(mpirun --oversubscribe --bind-to none -np 1 -x TESSERA_TEST_SRC="$SRC" -x LD_LIBRARY_PATH -x NCCL_DEBUG)
  [[ -n ${OPAL_PREFIX:-} ]] && NP1+=(-x OPAL_PREFIX)
fi
export TESSERA_TEST_SRC=$SRC
nccl_line() { grep -m1 -E 'NCCL version [0-9]' "$LOGS/$1.log" | sed 's/^.*NCCL version/NCCL version/'; }

# can_run NAME: true when step NAME is selected and the binaries exist; else records why it is skipped.
can_run() {
  if ! wanted "$1"; then
    skip "$1" "not selected (TESSERA_GPU_STEPS)"
  elif ((!BUILT)); then
    skip "$1" "not built"
  else
    return 0
  fi
  return 1
}
# gtest_verdict STEP TEST MEANING: says whether gtest TEST passed in STEP's log, and what that shows.
# gtest colours its lines when mpirun gives the rank a pty (seen in the rehearsal: "\e[0;32m[       OK ]
# \e[m"), so the escapes are stripped before matching; a skip is reported with gtest's reason line.
gtest_verdict() {
  local plain why
  plain=$(sed 's/\x1b\[[0-9;]*m//g' "$LOGS/$1.log")
  if grep -q "OK \] $2" <<<"$plain"; then
    say "  $2 PASSED: $3"
  else
    why=$(grep -m1 -E '^\[  (SKIPPED|FAILED) ' <<<"$plain" || echo 'see the log')
    [[ $why == *SKIPPED* ]] && why+=" ($(grep -m1 -A1 ': Skipped$' <<<"$plain" | tail -n1))"
    say "  NOTE: $2 did not pass: $why"
  fi
}

if can_run conformance; then
  step conformance 60 "${NP1[@]}" "$BUILD/bin/test_comm_conformance"
  if [[ -n $(nccl_line conformance) ]]; then
    say "  NCCL initialised ($(nccl_line conformance)): the nccl communicator is part of the conformance suite"
  else
    say "  NOTE: no 'NCCL version' line (NCCL_DEBUG=VERSION) in the conformance log: NCCL was not exercised"
  fi
fi
if can_run fsdp_train; then
  step fsdp_train 90 "${NP1[@]}" "$BUILD/bin/test_fsdp_train"
  say "  NOTE: test_fsdp_train checks FSDP against a single-process LibTorch reference on CPU tensors;"
  gtest_verdict fsdp_train FsdpDevice.CudaMatchesCpuAndCheckpointsThroughHost "FSDP on the GPU over NCCL matches the CPU run"
fi
if can_run nccl_timeout; then
  step nccl_timeout 60 "${NP1[@]}" "$BUILD/bin/test_nccl_timeout"
  gtest_verdict nccl_timeout NcclWatchdog.StalledCollectiveTimesOutWithOneLineError \
    "a stalled NCCL collective ended in a one-line Timeout within 2 s + slack"
fi

# ---- nccl_stall: one of two GPU ranks stopped ------------------------------------------------------
if ! can_run nccl_stall; then
  :
elif ((GPUS < 2)); then
  skip nccl_stall "needs 2 GPUs (NCCL refuses two ranks on one GPU); $GPUS visible"
else
  step nccl_stall 90 bash "$SRC/tests/gpu/stall.sh" "$BUILD/bin/tessera" "$CORPUS" "$WORK/run/stall" cuda 10
  grep '^stall:' "$LOGS/nccl_stall.log" | say_lines
fi

# ---- tessera_train: Tessera's throughput on the GPU ------------------------------------------------
TESSERA_METRICS=$WORK/run/tessera-log/metrics.jsonl
SKIP_REASON=""
if ! wanted tessera_train; then
  SKIP_REASON="not selected (TESSERA_GPU_STEPS)"
elif ((!BUILT)); then
  SKIP_REASON="tessera was not built (see configure/build above)"
elif ((REHEARSAL)); then
  SKIP_REASON="rehearsal (no GPU)"
else
  # Capability probe: a 2-step run of the tiny preset; the trainer must say it ran on CUDA.
  PROBE=$WORK/run/probe
  rm -rf "$PROBE" && mkdir -p "$PROBE"
  step probe 60 "${NP1[@]}" "$BUILD/bin/tessera" train \
    --set train.device=cuda --set model.preset=tiny --set train.steps=2 \
    --set data.path="$CORPUS" --set data.tokenizer=bytes --set log.dir="$PROBE" --set fsdp.mixed_precision=bf16
  DEVICE=$(python3 -c 'import json,sys; r=[json.loads(l) for l in open(sys.argv[1]) if l.strip()]; print(r[-1].get("device","")) if r else print("")' \
    "$PROBE/metrics.jsonl" 2>/dev/null || true)
  if [[ $DEVICE != cuda* ]]; then
    SKIP_REASON="the probe did not train on CUDA: its metrics.jsonl says '${DEVICE:-nothing (no record; see the probe log)}' - a 1B bf16 run on the CPU would not finish in the time box"
  else
    MODEL_DIR=$WORK/run/model-1b
    rm -rf "$MODEL_DIR" "$(dirname "$TESSERA_METRICS")"
    if step init_model 60 "$BUILD/bin/tessera" init-model --config "$MODEL_CFG" --out "$MODEL_DIR" --dtype bf16; then
      step tessera_train 150 "${NP1[@]}" "$BUILD/bin/tessera" train \
        --set train.device=cuda --set model.path="$MODEL_DIR" \
        --set data.path="$CORPUS" --set data.tokenizer=bytes --set data.seq_len=$SEQ --set train.micro_batch="$BATCH" \
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

# ---- fp16_bf16: fp16 with dynamic loss scaling tracks bf16 on the tiny model -----------------------
# The same 60 steps of the tiny preset (same seed, data and batches) on one GPU in bf16 and in fp16
# (fsdp.mixed_precision and reduce_dtype; the loss scaler of runtime/train/numerics.h: init 65536,
# backoff 0.5, growth 2 every 2000 steps). Tolerance, stated up front: over steps 11-60 the mean
# |fp16 - bf16| loss difference is <= 0.1 nats and the largest <= 0.3 (bf16 keeps 8 significand
# bits, fp16 11: the two runs differ by rounding, not by method); the fp16 run skipped at most 8
# steps (only the initial scale's overflow backoffs are expected), each with the scale halved, and
# every record says loss_scale. (CPU builds refuse fp16 compute: LibTorch 1.13 has no Half matmul.)
if ! can_run fp16_bf16; then
  :
elif ((REHEARSAL)); then
  skip fp16_bf16 "rehearsal (no GPU; fp16 compute is refused on CPU)"
else
  for dt in bf16 fp16; do
    rm -rf "$WORK/run/mp-$dt" && mkdir -p "$WORK/run/mp-$dt"
  done
  MP_COMMON=(--set train.device=cuda --set model.preset=tiny --set train.steps=60 --set train.warmup_steps=5
             --set train.lr=1e-3 --set data.path="$CORPUS" --set data.tokenizer=bytes --set data.seq_len=128
             --set train.micro_batch=8 --set log.every=20)
  step fp16_bf16 120 bash -c '
    set -e
    bin=$1; work=$2; shift 2
    for dt in bf16 fp16; do
      "$bin" train "$@" --set fsdp.mixed_precision=$dt --set fsdp.reduce_dtype=$dt --set log.dir="$work/mp-$dt"
    done
    python3 - "$work/mp-bf16/metrics.jsonl" "$work/mp-fp16/metrics.jsonl" <<"PY"
import json, math, sys
bf, fp = ([json.loads(l) for l in open(p) if l.strip()] for p in sys.argv[1:3])
assert len(bf) == len(fp) == 60, (len(bf), len(fp))
assert all(r["device"].startswith("cuda") for r in bf + fp), "not on CUDA"
assert all("loss_scale" in r for r in fp), "fp16 records without loss_scale"
skips = [r for r in fp if r["skipped"]]
assert len(skips) <= 8, "fp16 skipped %d steps" % len(skips)
for a, b in zip(fp, fp[1:]):
    if a["skipped"]:
        assert b["loss_scale"] == a["loss_scale"] / 2, (a, b)
d = [abs(a["loss"] - b["loss"]) for a, b in zip(fp[10:], bf[10:]) if not a["skipped"]]
mean, worst = sum(d) / len(d), max(d)
print("fp16_bf16: steps 11-60 |fp16 - bf16| loss: mean %.4f, max %.4f; fp16 skipped %d step(s), final scale %g; "
      "final loss bf16 %.4f fp16 %.4f" % (mean, worst, len(skips), fp[-1]["loss_scale"], bf[-1]["loss"], fp[-1]["loss"]))
assert mean <= 0.1 and worst <= 0.3, "fp16 does not track bf16 within the stated tolerance"
PY
  ' _ "$BUILD/bin/tessera" "$WORK/run" "${MP_COMMON[@]}"
  grep '^fp16_bf16:' "$LOGS/fp16_bf16.log" | say_lines
fi

# ---- report ---------------------------------------------------------------------------------------
say ""
say "== throughput (${SEQ}-token sequences, micro-batch $BATCH, one GPU) =="
python3 "$SRC/tests/gpu/bench_gpu.py" report --config "$MODEL_CFG" --seq "$SEQ" --batch "$BATCH" \
  --eager "$EAGER_JSON" --tessera-metrics "$([[ -z $SKIP_REASON ]] && echo "$TESSERA_METRICS")" \
  --skip-reason "$SKIP_REASON" 2>&1 | tee -a "$RES"
say ""
say "== summary ($((SECONDS - T0))s) =="
FAILED=0
for name in "${ORDER[@]}"; do
  say "$(printf '  %-14s %s' "$name" "$(status_of "$name")")"
  [[ $(status_of "$name") == FAIL* || $(status_of "$name") == TIMEOUT* || $(status_of "$name") == NOT* ]] && FAILED=1
done
exit $FAILED
