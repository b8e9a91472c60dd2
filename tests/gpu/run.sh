#!/usr/bin/env bash
# Tessera on NVIDIA GPUs, in one command, offline, inside one ~540 s device call on 16 cores. Not
# registered with ctest (tests/CMakeLists.txt skips tests/gpu); run by hand or through the device
# tool (carry [".gpu-deps"], timeout_s >= 540):
#
#   bash tests/gpu/run.sh                      # results in $OUT (else ./): gpu_results.txt, gpu_logs.tar.gz
#   TESSERA_GPU_STEPS=conformance,tessera_train bash tests/gpu/run.sh    # a rerun of some steps
#   TESSERA_GPU_STEPS=tessera_train TESSERA_GPU_TRAIN_SET=model.fused_kernels=false bash tests/gpu/run.sh
#       # an A/B rerun: the 1.1B run (tessera_train, kernel_profile) with these keys too (space-separated
#       # key=value; model.fused_kernels=false: LibTorch's composites instead of Tessera's kernels); the
#       # record's tessera_settings names them
#   TESSERA_GPU_STEPS=tessera_train TESSERA_GPU_TRAIN_SET="comm.emulate_ranks=8 comm.emulate_gbps=370" bash tests/gpu/run.sh
#       # the same 1.1B run with its collectives timed as 8 ranks over NVLink (runtime/comm/emulation.h):
#       # the report prints the gather and reduce waits, and how much communication was not overlapped
#   bash tests/gpu/run.sh --plan [LEFT_S [GPUS]]   # the step order and limits only; nothing runs
#
# Needs: nvidia-smi, python3 with a CUDA PyTorch 2.x (its LibTorch is what Tessera builds against)
# and NCCL (pip's nvidia-nccl-*, or the CUDA toolkit's or the system's: CMake finds it, see
# cmake/cuda_nccl.cmake), nvcc, cmake, a C++17 compiler (C++20 for PyTorch >= 2.14), and Tessera's C++
# dependencies (Open MPI, nlohmann-json, Boost.Program_options, yaml-cpp, GTest, PCRE2, utf8proc). Where the
# machine lacks those, make the folder .gpu-deps here first with `bash tests/gpu/pack_deps.sh`
# (Debian 12 packages, ~20 MB, need glibc >= 2.36) and carry it (or point TESSERA_GPU_DEBS at such
# a folder): its packages are unpacked into a private root under the work folder, never into /, and
# the build, mpirun and the runs use that root (OPAL_PREFIX, LD_LIBRARY_PATH, CMake package folders).
# On a machine whose glibc is older than 2.36 the script says so and builds against the machine's
# own packages instead. Every MPI start runs with OMPI_MCA_plm=isolated (tests/gpu/deps.bash:
# mpi_local_env): without ssh or rsh, Open MPI 4.1 aborts even `mpirun -np 1` and a singleton start.
#
# Rehearsal on a machine without a GPU (checks this script, the carried dependencies and the build
# plumbing, nothing about CUDA): TESSERA_GPU_REHEARSAL=1 bash tests/gpu/run.sh builds against the
# CPU LibTorch found by CMake (TESSERA_WITH_CUDA=AUTO, so the NCCL backend only compiles and links),
# runs the probe and the test steps on the CPU (each step's limit x TESSERA_GPU_STEP_SCALE, default
# 5, against a budget of 4 h, for shared machines), skips the GPU-only steps, saying so, and at the
# end checks that the steps ran in the GPU order and that the GPU-mode limits after the build fit
# the budget (the --plan check). tests/gpu/rehearse.sh does that with this machine's own copies of
# the carried packages, and ssh and rsh, hidden.
#
# Steps, in this order (by value: what a short call must not miss comes first), each under its own
# `timeout`, each limit computed from what is left of the global budget (TESSERA_GPU_BUDGET_S, 500 s
# of the 540 s call; 10 s stay for the report): a step gets min(its nominal limit, budget left - 10)
# and is SKIPPED, saying so, when that is less than the least it needs. Each is reported PASS, FAIL,
# TIMEOUT or SKIPPED (with the reason) the moment it ends, and gpu_results.txt and gpu_logs.tar.gz in
# $OUT are rewritten then: whatever ends the call, what ran is there. Nothing is claimed that did
# not run.
#   env            GPU, driver, torch, CUDA, NCCL from pip
#   deps           the carried C++ dependencies unpacked (glibc checked first; too old: the machine's own)
#   configure      toolchain (ssh, glibc, nvcc, cmake, compiler, LibTorch) printed, CMake configure of
#                  the CUDA variant (TESSERA_WITH_CUDA=ON) through scripts/build.sh --configure; CMake's
#                  one status line says which LibTorch, ABI, NCCL, cudart and nvcc it found
#   build          tessera and the test binaries, niced, while
#   eager          the PyTorch eager reference runs on the GPU: the ~1.1B Llama step (bf16 autocast,
#                  seq 2048) -> tokens/s, MFU, memory; then 2 more steps under torch.profiler -> the
#                  Chrome trace of their kernels (run/traces/eager-kernels.json)
#   probe          a 2-step run of the tiny preset that must report a CUDA device, then
#   init_model     the 1.1B model written once (bf16), and
#   tessera_train  the same 1.1B step as eager -> tokens/s, MFU, memory (the throughput measurement)
#   kernel_profile 4 steps of the same run, steps 3-4 profiled (train.profile_steps: Kineto's trace of
#                  their kernels), and benchmarks/kernel_table.py: device time per step by category
#                  (GEMM, attention, glue, copies, loss, optimizer, communication), Tessera next to
#                  eager, and the SDPA backend each ran. The traces go back in gpu_traces.tar.gz
#   shared_gpu     `tessera train` at W = 2 and 4 on the one GPU (comm.device_backend=staged: collectives
#                  through host memory over MPI), each against the same run on the CPU over MPI
#                  (tests/gpu/staged.sh: losses within 2e-4 relative, checkpoints verify on the CPU)
#   compile        the eager step again under torch.compile(model) (the peer a torchtitan user picks):
#                  the same batch and optimizer -> tokens/s, MFU, memory, and its compile time
#   fp16_bf16      the tiny preset 60 steps in bf16 and in fp16 (dynamic loss scaling): the fp16 losses
#                  track bf16's within a stated tolerance (see the step)
#   conformance    communicator conformance at world size 1, the test cases that run on the NCCL
#                  communicator only (--gtest_filter; NCCL_DEBUG=VERSION's line shows NCCL initialised)
#   fsdp_train     DeviceKernels (own kernels vs their CPU references), FsdpDevice (FSDP on the GPU vs the CPU)
#   optim_bench    `tessera bench optim --device cuda`: AdamW's step alone, each path and moment dtype
#   nccl_timeout   NCCL watchdog: a collective that cannot start ends in a one-line Timeout error
#                  within its timeout + slack (test_nccl_timeout)
#   nccl_stall     with >= 2 GPUs: `tessera train` on 2 GPUs, rank 1 SIGSTOPped; every rank ends
#                  within comm.timeout_s + 10 s with one line naming rank, host, device (stall.sh)
#   hf_parity      tiny random Llama, Qwen2 and Qwen3 models written by the image's transformers
#                  (save_pretrained, fp32): `tessera eval` per-sequence losses within 1e-4 of
#                  transformers' forward (hf_parity.py; needs python3 with transformers, else skipped;
#                  last by value, so a full run rarely reaches it: TESSERA_GPU_STEPS=hf_parity runs it
#                  after the build alone)
#   report         tokens/s, MFU, peak memory, Tessera / eager and / torch.compile; cuDNN, NCCL, the SDPA
#                  backends that ran; the run's record (gpu_record.json in $OUT: one line for
#                  benchmarks/results/gpu.jsonl)
# TESSERA_GPU_STEPS (comma-separated names from this list, probe and init_model coming with
# tessera_train and kernel_profile; default: all) selects steps for a rerun; deps, configure and
# build run whenever a selected step needs the binaries. (kernel_profile's eager side comes from
# the eager step: select both for a table with both columns.)
set -uo pipefail

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
REHEARSAL=${TESSERA_GPU_REHEARSAL:-0}
GPU_BUDGET=500  # seconds for all steps of a GPU run (the report follows: a 540 s call)
DEADLINE=${TESSERA_GPU_BUDGET_S:-$GPU_BUDGET}
RESERVE=10      # seconds of the budget kept for the report and the summary
KILL_GRACE=5    # a step gets SIGTERM at limit - KILL_GRACE and SIGKILL at its limit
BUILD_CAP=0     # 0: the build may use what is left of the budget
BUILD_NICE=(nice -n 10)  # the build yields to the eager reference, which runs meanwhile
STEP_SCALE=1
# A rehearsal builds on whatever CPU it finds, maybe shared (about 10 minutes on 2 idle cores from
# nothing, over an hour when other builds share them): a 4 h budget, and no eager to yield to. Every
# step's nominal limit is sized for the GPU machine; a rehearsal on a loaded shared machine multiplies
# them (a niced rehearsal there once spent over 60 s unpacking the 3-second deps step).
if ((REHEARSAL)); then
  DEADLINE=${TESSERA_GPU_BUDGET_S:-14400}
  BUILD_CAP=12000
  BUILD_NICE=()
  STEP_SCALE=${TESSERA_GPU_STEP_SCALE:-5}
fi

# ---- the plan: order, nominal limits, least worth starting (seconds, GPU mode) --------------------
# (conformance's limit: docs/PERFORMANCE.md#build-suite-and-start-up-measurements.)
# Before the build: env, deps, configure; then the build, with eager beside it; then, by value:
# (fsdp_train right after the throughput: the GPU-against-CPU check of the fused optimizer.)
PLAN_AFTER_BUILD=(probe init_model tessera_train kernel_profile fsdp_train optim_bench shared_gpu compile fp16_bf16 conformance nccl_timeout nccl_stall hf_parity)
ORDER_ALL=(env deps configure build eager "${PLAN_AFTER_BUILD[@]}")
declare -A NOMINAL=([env]=30 [deps]=40 [configure]=90 [eager]=150
  [probe]=45 [init_model]=45 [tessera_train]=120 [kernel_profile]=75 [shared_gpu]=60 [compile]=150 [fp16_bf16]=60 [conformance]=90 [fsdp_train]=45 [optim_bench]=40 [nccl_timeout]=30 [nccl_stall]=60 [hf_parity]=40)
declare -A LEAST=([env]=5 [deps]=5 [configure]=20 [build]=30 [eager]=45
  [probe]=15 [init_model]=15 [tessera_train]=45 [kernel_profile]=35 [shared_gpu]=30 [compile]=60 [fp16_bf16]=25 [conformance]=20 [fsdp_train]=15 [optim_bench]=15 [nccl_timeout]=15 [nccl_stall]=30 [hf_parity]=20)
# Which step a selection name brings (tessera_train brings its probe and the model it trains).
declare -A SELECTED_BY=([probe]=tessera_train [init_model]=tessera_train)
# What the rest of a chain needs at least: the probe and the model are only worth their time when
# tessera_train can still run after them.
declare -A FOLLOW=([probe]=$((LEAST[init_model] + LEAST[tessera_train])) [init_model]=${LEAST[tessera_train]})
declare -A DEPENDS=([init_model]=probe [tessera_train]=init_model [kernel_profile]=init_model)  # runs only after that one

# step_limit NAME LEFT: the limit NAME gets with LEFT seconds of the budget left: its nominal limit
# (x STEP_SCALE) capped by LEFT - RESERVE - what the rest of its chain needs (FOLLOW); empty when
# that is below its least (x STEP_SCALE).
step_limit() {
  local name=$1 left=$(($2 - RESERVE - ${FOLLOW[$1]:-0} * STEP_SCALE)) limit least
  if [[ $name == build ]]; then
    limit=$left
    ((BUILD_CAP > 0 && BUILD_CAP < limit)) && limit=$BUILD_CAP
  else
    limit=$((NOMINAL[$name] * STEP_SCALE))
    ((limit > left)) && limit=$left
  fi
  least=$((LEAST[$name] * STEP_SCALE))
  ((limit >= least)) && echo "$limit"
}

# applies NAME GPUS MODE: whether NAME is part of a run in MODE (gpu or rehearsal) with GPUS GPUs;
# else prints why not.
applies() {
  local name=$1 gpus=$2 mode=$3
  if [[ $name == nccl_stall ]] && ((gpus < 2)); then
    echo "needs 2 GPUs (NCCL refuses two ranks on one GPU); $gpus visible"
    return 1
  fi
  if [[ $mode == rehearsal ]]; then
    case $name in
      env | eager | init_model | tessera_train | kernel_profile | shared_gpu | compile | nccl_stall) echo "rehearsal (no GPU)"; return 1 ;;
      fp16_bf16) echo "rehearsal (no GPU; fp16 compute is refused on CPU)"; return 1 ;;
      hf_parity) echo "rehearsal (no transformers here: the step compares with the device image's transformers)"; return 1 ;;
    esac
  fi
  return 0
}

# plan LEFT GPUS MODE [NAME...]: the steps after the build in order, each as the script would limit
# it if every earlier one used its whole limit; "NAME LIMIT" or "NAME SKIP reason" per line, then
# "sum S of LEFT". NAMEs: the selected steps (default: all).
plan() {
  local left=$1 gpus=$2 mode=$3 name limit sum=0 why skipped=" "
  shift 3
  local sel=" ${*:-${PLAN_AFTER_BUILD[*]}} "
  for name in "${PLAN_AFTER_BUILD[@]}"; do
    [[ $sel == *" $name "* ]] || continue
    if ! why=$(applies "$name" "$gpus" "$mode"); then
      echo "$name SKIP $why"
      skipped+="$name "
      continue
    fi
    if [[ -n ${DEPENDS[$name]:-} && $skipped == *" ${DEPENDS[$name]} "* ]]; then
      echo "$name SKIP ${DEPENDS[$name]} is skipped"
      skipped+="$name "
      continue
    fi
    limit=$(step_limit "$name" $((left - sum)))
    if [[ -z $limit ]]; then
      echo "$name SKIP $((left - sum - RESERVE))s left after the report's ${RESERVE}s, needs at least $(((LEAST[$name] + ${FOLLOW[$name]:-0}) * STEP_SCALE))s"
      skipped+="$name "
      continue
    fi
    echo "$name $limit"
    sum=$((sum + limit))
  done
  echo "sum $sum of $left"
}

# print_plan LEFT GPUS MODE [NAME...]: the plan, readable, and whether it fits (the return code).
print_plan() {
  local left=$1 gpus=$2 mode=$3 name what rest
  shift 3
  echo "plan after the build ($mode mode, ${left}s of the budget left, $gpus GPU(s), limits x$STEP_SCALE):"
  while read -r name what rest; do
    if [[ $name == sum ]]; then
      if ((what <= left - RESERVE)); then
        echo "  limits sum to ${what}s <= ${left}s - ${RESERVE}s for the report: fits"
      else
        echo "  limits sum to ${what}s > ${left}s - ${RESERVE}s for the report: DOES NOT FIT"
        return 1
      fi
    elif [[ $what == SKIP ]]; then
      printf '  %-14s skipped: %s\n' "$name" "$rest"
    else
      printf '  %-14s limit %4ss\n' "$name" "$what"
    fi
  done < <(plan "$left" "$gpus" "$mode" "$@")
}

if [[ ${1:-} == --plan ]]; then
  # The order and the GPU-mode limits, without running anything: the whole order, then the plan
  # after the build for LEFT seconds left (default: a few cases) and GPUS GPUs (default 1).
  STEP_SCALE=1
  echo "order: ${ORDER_ALL[*]} report"
  echo "before the build (GPU mode, ${GPU_BUDGET}s budget): env ${NOMINAL[env]}s, deps ${NOMINAL[deps]}s, configure ${NOMINAL[configure]}s; build: what is left - ${RESERVE}s, with eager ${NOMINAL[eager]}s beside it"
  rc=0
  for left in ${2:-350 250 150 60}; do
    print_plan "$left" "${3:-1}" gpu || rc=1
  done
  exit $rc
fi

RESULTS_DIR=${OUT:-$PWD}
RES=$RESULTS_DIR/gpu_results.txt
WORK=${TESSERA_GPU_WORK:-/tmp/tessera-gpu}
BUILD=$WORK/build
LOGS=$WORK/logs
STATUS_DIR=$WORK/status
SEQ=2048
BATCH=${TESSERA_GPU_BATCH:-4}
JOBS=$(nproc 2>/dev/null || echo 4)
MODE=gpu
((REHEARSAL)) && MODE=rehearsal

SELECTABLE="env deps configure build eager tessera_train kernel_profile shared_gpu compile fp16_bf16 conformance fsdp_train optim_bench nccl_timeout nccl_stall hf_parity"
STEPS=${TESSERA_GPU_STEPS:-all}
if [[ $STEPS != all ]]; then
  for s in ${STEPS//,/ }; do
    [[ " $SELECTABLE " == *" $s "* ]] || { echo "run.sh: TESSERA_GPU_STEPS: unknown step '$s' (steps: ${SELECTABLE// /,})" >&2; exit 2; }
  done
fi
selected() { [[ $STEPS == all || ",$STEPS," == *",$1,"* ]]; }
# probe and init_model come with tessera_train and with kernel_profile (SELECTED_BY names the first).
wanted() {
  local s=${SELECTED_BY[$1]:-$1}
  selected "$s" || { [[ $s == tessera_train && $1 != tessera_train ]] && selected kernel_profile; }
}
BUILD_TARGETS=()
# The three gtest steps run tests of mpi_tests, the one binary of tests/mpi/test_*.cpp.
{ wanted conformance || wanted fsdp_train || wanted nccl_timeout; } && BUILD_TARGETS+=(mpi_tests)
{ wanted nccl_stall || wanted optim_bench || wanted shared_gpu || wanted tessera_train || wanted kernel_profile || wanted fp16_bf16 || wanted hf_parity || wanted build; } && BUILD_TARGETS+=(tessera)
wanted build && BUILD_TARGETS=(tessera mpi_tests)
NEED_BUILD=$((${#BUILD_TARGETS[@]} > 0))
SELECTED_AFTER_BUILD=()
for s in "${PLAN_AFTER_BUILD[@]}"; do wanted "$s" && SELECTED_AFTER_BUILD+=("$s"); done

# The device test cases (gtest names; tests/unit/gpu_deps.sh checks they exist): the conformance
# cases that run on the NCCL communicator too (the others are MPI-only or skip NCCL), the CUDA FSDP
# test, the NCCL watchdog test.
CONFORMANCE_TESTS=CommConformance.AllGatherUnevenAllDtypesInAndOutOfPlace:CommConformance.ReduceScatterPadsUnevenSizes:CommConformance.AllReduceAllDtypesAndOps:CommConformance.BroadcastFromFirstAndLastRank:CommConformance.WidenedReduceScatterInSegments:CommConformance.LargeUnevenMessagesEveryOp:CommConformance.AsyncOperationsCompleteInIssueOrder:CommConformance.SynchronousHelpers:CommConformance.BadArgumentsAreInputErrors:CommConformance.HostDuplicateHasTheSameRanksOnTheHost
FSDP_TESTS=DeviceKernels.FusedRmsNormEqualsItsReference:DeviceKernels.FusedSwigluEqualsItsReference:DeviceKernels.FusedRopeEqualsItsReference:DeviceKernels.FusedCrossEntropyEqualsItsReference:DeviceKernels.AdamWEqualsTheCpuLoopBitForBit:DeviceKernels.TorchFusedAdamWTakesTheDeviceClippingCoefficient:FsdpDevice.CudaMatchesCpuAndCheckpointsThroughHost:FsdpDevice.PackedRowsInBf16MatchTheCpu
NCCL_TIMEOUT_TESTS=NcclWatchdog.StalledCollectiveTimesOutWithOneLineError

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
# The kernel traces (tens of MB before compression) in a tarball of their own, when they change: a
# file over the device tool's 16 MiB limit does not come back, and that must not cost the logs.
publish_traces() {
  [[ -n ${OUT:-} ]] && compgen -G "$TRACES/*" >/dev/null || return 0
  local tmp=$OUT/.gpu_traces.$BASHPID.tmp
  tar -czf "$tmp" -C "$WORK/run" traces 2>/dev/null && mv -f "$tmp" "$OUT/gpu_traces.tar.gz" || rm -f "$tmp"
  [[ -f $OUT/gpu_traces.tar.gz ]] &&
    say "  kernel traces: gpu_traces.tar.gz, $(($(stat -c %s "$OUT/gpu_traces.tar.gz") / 1048576)) MiB (the device tool returns files up to 16 MiB)"
}
trap 'say "run.sh: terminated (SIGTERM) after $((SECONDS - T0))s"; publish; exit 143' TERM
trap 'publish' EXIT

ORDER=()
status_of() { cat "$STATUS_DIR/$1" 2>/dev/null || echo "NOT FINISHED"; }
# run_step NAME CMD...: runs CMD under timeout with the limit step_limit gives NAME now (SIGTERM at
# limit - KILL_GRACE, SIGKILL at the limit), logs to $LOGS/NAME.log; records PASS / FAIL (rc) /
# TIMEOUT / SKIPPED in $STATUS_DIR/NAME and publishes. Returns CMD's code (99 when skipped).
run_step() {
  local name=$1 left limit
  shift
  left=$(remaining)
  limit=$(step_limit "$name" "$left")
  if [[ -z $limit ]]; then
    echo "SKIPPED ($((left - RESERVE))s of the ${DEADLINE}s budget left after the report's ${RESERVE}s; the step needs at least $(((LEAST[$name] + ${FOLLOW[$name]:-0}) * STEP_SCALE))s)" >"$STATUS_DIR/$name"
    say "[$name] $(status_of "$name")"
    publish
    return 99
  fi
  local t=$SECONDS rc
  say "[$name] running (limit ${limit}s of ${left}s left): $*"
  local term=$((limit - KILL_GRACE))
  ((term < 1)) && term=1
  timeout --kill-after=$KILL_GRACE $term "$@" >"$LOGS/$name.log" 2>&1
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

say "tessera GPU run $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), source $SRC, steps: $STEPS, budget ${DEADLINE}s"
((REHEARSAL)) && say "REHEARSAL (TESSERA_GPU_REHEARSAL=1): CPU LibTorch, no GPU steps; nothing here measures the GPU path"

source "$SRC/tests/gpu/deps.bash"
mpi_local_env  # every MPI start below, mpirun or singleton: no ssh/rsh needed
export NCCL_DEBUG=${NCCL_DEBUG:-VERSION}  # NCCL prints its version line once it initialises

# ---- env ----------------------------------------------------------------------------------------
if ((REHEARSAL)); then
  skip env "rehearsal"
else
  step env bash -c 'nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader &&
    python3 -c "import torch; print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"nccl\", torch.cuda.nccl.version() if torch.cuda.is_available() else None, \"gpu\", torch.cuda.is_available() and torch.cuda.get_device_name(), \"cxx11 abi\", torch.compiled_with_cxx11_abi())"'
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
# The carried packages where they can load here (glibc >= 2.36), else this machine's own, saying so.
DEPS_DIR=${TESSERA_GPU_DEBS:-$SRC/.gpu-deps}
DEPS_ROOT=$WORK/deps
CMAKE_DEPS=()
if ((!NEED_BUILD)); then
  skip deps "no selected step needs a build"
elif ! why=$(deps_choice "$DEPS_DIR" 2>&1); then
  skip deps "$why"
elif step deps bash -c 'source "$0" && deps_unpack "$1" "$2"' "$SRC/tests/gpu/deps.bash" "$DEPS_DIR" "$DEPS_ROOT" &&
  deps_use "$DEPS_ROOT"; then
  say "  C++ dependencies: $why, unpacked into $DEPS_ROOT"
else
  CMAKE_DEPS=()
  say "  the carried C++ dependencies could not be used (see deps above): trying this machine's own instead"
fi

# ---- configure: toolchain, LibTorch, CMake (which finds NCCL, cudart and nvcc itself) -------------
if ((REHEARSAL)); then
  # This machine's CPU LibTorch; the NCCL of its CUDA toolkit: the NCCL backend compiles and links.
  WITH_CUDA=AUTO
  TORCH_PREFIX=${TESSERA_GPU_TORCH_PREFIX:-/usr/lib/x86_64-linux-gnu/cmake}
else
  WITH_CUDA=ON
  TORCH_PREFIX=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null || true)
fi
BUILT=0
if ((!NEED_BUILD)); then
  skip configure "no selected step needs a build"
  skip build "no selected step needs a build"
elif [[ -z $TORCH_PREFIX ]]; then
  skip configure "python3 has no importable torch: no LibTorch to build against"
  skip build "not configured"
else
  say "  toolchain:"
  {
    p=$(command -v ssh)
    echo "command -v ssh: ${p:-(none)}$([[ -n $p && ! -x $p ]] && echo ' (not executable)')"
    echo "MPI starts: OMPI_MCA_plm=${OMPI_MCA_plm:-(unset)} ($(command -v mpirun || echo 'no mpirun: singleton starts'))"
    ldd --version 2>&1 | head -1
    nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
    if [[ -n $nvcc ]]; then echo "nvcc $nvcc: $("$nvcc" --version 2>&1 | tail -1)"; else echo "nvcc: not on PATH nor in /usr/local/cuda/bin (CMake looks further)"; fi
    cmake --version | head -1
    c++ --version 2>&1 | head -1
    tv=$(python3 -c 'import torch; print("torch", torch.__version__)' 2>/dev/null)
    echo "LibTorch: $TORCH_PREFIX${tv:+ ($tv)}"
  } 2>&1 | say_lines
  GEN=()
  command -v ninja >/dev/null && GEN=(-G Ninja)
  # scripts/build.sh --configure: a refused configure is one line (in the log's last lines below),
  # exit code 2, and no build system left in $BUILD.
  if step configure bash "$SRC/scripts/build.sh" --configure "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" -DTESSERA_WITH_CUDA=$WITH_CUDA "${CMAKE_DEPS[@]}" \
    -DTORCH_CUDA_ARCH_LIST=9.0 -DCMAKE_CUDA_ARCHITECTURES=90 -DTESSERA_GLOO_BASELINE=OFF; then
    grep -E '^-- Tessera: LibTorch .* -> TESSERA_WITH_CUDA=|Could NOT find' "$LOGS/configure.log" | say_lines
    # Which copies of the dependencies the build took (the carried root or the machine's own).
    grep -E '^(MPI_C_HEADER_DIR|MPI_mpi_LIBRARY|Boost_DIR|yaml-cpp_DIR|nlohmann_json_DIR|GTest_DIR|Torch_DIR|CMAKE_CUDA_COMPILER):' \
      "$BUILD/CMakeCache.txt" | say_lines
    ORDER+=(build)
    # With Ninja the build keeps going past a failed unit (-k 0): one call shows every unit that fails.
    KEEP_GOING=()
    ((${#GEN[@]})) && KEEP_GOING=(-- -k 0)
    (run_step build "${BUILD_NICE[@]}" cmake --build "$BUILD" -j "$JOBS" --target "${BUILD_TARGETS[@]}" "${KEEP_GOING[@]}") &
    BUILD_PID=$!
  else
    say "  configure failed: what is missing is named above (tessera: configure: ... / CMake Error / Could NOT find)"
    skip build "not configured"
  fi
fi

# ---- eager: the PyTorch reference, on the GPU while the build uses the CPUs -----------------------
EAGER_JSON=$WORK/run/eager.json
TRACES=$WORK/run/traces  # the kernel traces: back in gpu_traces.tar.gz, apart from the logs (publish)
EAGER_TRACE=$TRACES/eager-kernels.json
mkdir -p "$TRACES"
if ! wanted eager; then
  skip eager "not selected (TESSERA_GPU_STEPS)"
elif ! why=$(applies eager "$GPUS" "$MODE"); then
  skip eager "$why"
else
  step eager env PYTHONUNBUFFERED=1 python3 "$SRC/tests/gpu/bench_gpu.py" eager --config "$MODEL_CFG" \
    --seq "$SEQ" --batch "$BATCH" --warmup 3 --steps 10 --out "$EAGER_JSON" --trace "$EAGER_TRACE" --profile-steps 2
  [[ -n ${BUILD_PID:-} ]] && say "  (measured while the build ran, niced, on the CPUs)"
  grep -E '^eager: kernel trace' "$LOGS/eager.log" | say_lines
  publish_traces
  publish
fi
if [[ -n ${BUILD_PID:-} ]]; then
  wait "$BUILD_PID"
  if [[ $(status_of build) == PASS ]]; then
    BUILT=1
    [[ -x $BUILD/bin/tessera ]] && ldd "$BUILD/bin/tessera" | grep -E 'libmpi|boost|libtorch\.|libc10|nccl|cudart' | say_lines
  fi
fi

# ---- the plan for what is left ---------------------------------------------------------------------
((BUILT && ${#SELECTED_AFTER_BUILD[@]})) && print_plan "$(remaining)" "$GPUS" "$MODE" "${SELECTED_AFTER_BUILD[@]}" | say_lines

# One rank, not bound to a core (mpirun binds a single rank to one core by default: LibTorch would
# then run one host thread); a singleton start where there is no mpirun.
NP1=(env)
if command -v mpirun >/dev/null; then
  NP1=(mpirun --oversubscribe --bind-to none -np 1 -x TESSERA_TEST_SRC="$SRC" -x LD_LIBRARY_PATH -x NCCL_DEBUG)
  [[ -n ${OPAL_PREFIX:-} ]] && NP1+=(-x OPAL_PREFIX)
fi
export TESSERA_TEST_SRC=$SRC
nccl_line() { grep -m1 -E 'NCCL version [0-9]' "$LOGS/$1.log" | sed 's/^.*NCCL version/NCCL version/'; }

# can_run NAME: true when step NAME is selected, part of this mode and the binaries exist; else
# records why it is skipped.
can_run() {
  local why
  if ! wanted "$1"; then
    skip "$1" "not selected (TESSERA_GPU_STEPS)"
  elif ((!BUILT)); then
    skip "$1" "not built"
  elif ! why=$(applies "$1" "$GPUS" "$MODE"); then
    skip "$1" "$why"
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
    why=$(grep -m1 -E "^\[  (SKIPPED|FAILED) \] $2 " <<<"$plain" || echo 'see the log')
    [[ $why == *SKIPPED* ]] && why+=" ($(grep -m1 -A1 ': Skipped$' <<<"$plain" | tail -n1))"
    say "  NOTE: $2 did not pass: $why"
  fi
}
# gtest_ran STEP FILTER: every test of FILTER ran (a renamed test would leave the filter matching
# nothing, and gtest passes an empty run); else the step's status becomes FAIL, saying so.
gtest_ran() {
  local plain n want
  plain=$(sed 's/\x1b\[[0-9;]*m//g' "$LOGS/$1.log")
  n=$(grep -c '^\[ RUN      \] ' <<<"$plain")
  want=$(tr ':' '\n' <<<"$2" | grep -c .)
  if ((n != want)) && [[ $(status_of "$1") == PASS ]]; then
    echo "FAIL (ran $n of the $want filtered tests)" >"$STATUS_DIR/$1"
    say "[$1] $(status_of "$1"): --gtest_filter=$2"
  fi
}

# ---- kernel_profile: where the device time of a step goes, Tessera next to eager --------------------
# 4 steps of the same 1.1B run as tessera_train, steps 3-4 traced (train.profile_steps: Kineto's
# trace of their kernels, log.dir/kernels-rank-0.json, with the step trace beside it), then
# benchmarks/kernel_table.py over it and eager's 2 profiled steps (the eager step's --trace). The
# table goes into gpu_results.txt; without Kineto in the LibTorch the warning that says so does.
kernel_profile() {
  local dir=$TRACES/tessera
  rm -rf "$dir" && mkdir -p "$dir"
  step kernel_profile bash -c '
    set -o pipefail
    table=$1 dir=$2 eager=$3 script=$4; shift 4
    "$@" --set train.steps=4 --set "train.profile_steps=[3,4]" --set log.dir="$dir" || exit
    sides=()
    [[ -s $dir/kernels-rank-0.json ]] && sides+=(--trace "tessera=$dir/kernels-rank-0.json")
    [[ -s $eager ]] && sides+=(--trace "eager=$eager")
    ((${#sides[@]})) || { echo "kernel_profile: no kernel trace from either side"; exit 1; }
    python3 "$script" "${sides[@]}" --json "$table" --top 12' _ \
    "$KERNEL_TABLE" "$dir" "$EAGER_TRACE" "$SRC/benchmarks/kernel_table.py" "${TRAIN_1B[@]}"
  publish_traces
  grep -E '^(kernel trace|tessera: warning: kernel trace)' "$LOGS/kernel_profile.log" | say_lines
  sed -n '/^device kernel time per training step/,$p' "$LOGS/kernel_profile.log" | say_lines
}

# ---- probe, init_model, tessera_train: Tessera's throughput on the GPU ----------------------------
TESSERA_METRICS=$WORK/run/tessera-log/metrics.jsonl
KERNEL_TABLE=$WORK/run/kernel_table.json
SKIP_REASON=""
if ! wanted probe; then
  SKIP_REASON="not selected (TESSERA_GPU_STEPS)"
elif ((!BUILT)); then
  SKIP_REASON="tessera was not built (see configure/build above)"
else
  # Capability probe: a 2-step run of the tiny preset; the trainer must say it ran on CUDA. (In a
  # rehearsal on the CPU, saying so: it proves the launch, and tessera_train is skipped as on a
  # machine whose GPU does not work.)
  PROBE=$WORK/run/probe
  PROBE_DEVICE=cuda
  ((REHEARSAL)) && PROBE_DEVICE=cpu && say "  (rehearsal: the probe runs with train.device=cpu)"
  rm -rf "$PROBE" && mkdir -p "$PROBE"
  step probe "${NP1[@]}" "$BUILD/bin/tessera" train \
    --set train.device=$PROBE_DEVICE --set model.preset=tiny --set train.steps=2 \
    --set data.path="$CORPUS" --set data.tokenizer=bytes --set log.dir="$PROBE" --set fsdp.mixed_precision=bf16
  DEVICE=$(python3 -c 'import json,sys; r=[json.loads(l) for l in open(sys.argv[1]) if l.strip()]; print(r[-1].get("device","")) if r else print("")' \
    "$PROBE/metrics.jsonl" 2>/dev/null || true)
  if [[ $(status_of probe) != PASS ]]; then
    SKIP_REASON="the probe did not pass: $(status_of probe)"
  elif ((REHEARSAL)); then
    SKIP_REASON="rehearsal (no GPU): the probe trained on '${DEVICE:-nothing}', as asked"
  elif [[ $DEVICE != cuda* ]]; then
    SKIP_REASON="the probe did not train on CUDA: its metrics.jsonl says '${DEVICE:-nothing (no record; see the probe log)}' - a 1B bf16 run on the CPU would not finish in the time box"
  else
    MODEL_DIR=$WORK/run/model-1b
    rm -rf "$MODEL_DIR" "$(dirname "$TESSERA_METRICS")"
    if step init_model "$BUILD/bin/tessera" init-model --config "$MODEL_CFG" --out "$MODEL_DIR" --dtype bf16; then
      TRAIN_1B=("${NP1[@]}" "$BUILD/bin/tessera" train
        --set train.device=cuda --set model.path="$MODEL_DIR"
        --set data.path="$CORPUS" --set data.tokenizer=bytes --set data.seq_len=$SEQ --set train.micro_batch="$BATCH"
        --set train.warmup_steps=2 --set train.lr=1e-4
        --set fsdp.mixed_precision=bf16 --set fsdp.activation_checkpointing=false)
      for kv in ${TESSERA_GPU_TRAIN_SET:-}; do TRAIN_1B+=(--set "$kv"); done  # the A/B switches (header)
      if wanted tessera_train; then
        step tessera_train "${TRAIN_1B[@]}" --set train.steps=12 --set log.dir="$(dirname "$TESSERA_METRICS")" ||
          SKIP_REASON="tessera train did not pass: $(status_of tessera_train) (see its log above)"
      fi
      wanted kernel_profile && kernel_profile
    else
      SKIP_REASON="init-model did not pass: $(status_of init_model) (see its log above)"
    fi
  fi
fi
[[ -n $SKIP_REASON && ! -f $STATUS_DIR/tessera_train ]] && wanted tessera_train && skip tessera_train "$SKIP_REASON"
[[ ! -f $STATUS_DIR/kernel_profile ]] && wanted kernel_profile && skip kernel_profile "$SKIP_REASON"

# ---- fsdp_train at world size 1: FSDP on the GPU against the CPU (the fused optimizer's check) ------
if can_run fsdp_train; then
  step fsdp_train "${NP1[@]}" "$BUILD/bin/mpi_tests" --gtest_color=no --gtest_filter="$FSDP_TESTS"
  gtest_ran fsdp_train "$FSDP_TESTS"
  gtest_verdict fsdp_train DeviceKernels.FusedRmsNormEqualsItsReference "the fused RMSNorm kernel equals its CPU reference"
  gtest_verdict fsdp_train DeviceKernels.FusedSwigluEqualsItsReference "the fused SwiGLU kernel equals its CPU reference"
  gtest_verdict fsdp_train DeviceKernels.FusedRopeEqualsItsReference "the fused RoPE kernel equals its CPU reference"
  gtest_verdict fsdp_train DeviceKernels.FusedCrossEntropyEqualsItsReference "the head's row-wise cross entropy kernel equals its CPU reference"
  gtest_verdict fsdp_train DeviceKernels.AdamWEqualsTheCpuLoopBitForBit "Tessera's AdamW kernel (fp32, bf16, 8-bit moments) equals the CPU loop to the bit"
  gtest_verdict fsdp_train DeviceKernels.TorchFusedAdamWTakesTheDeviceClippingCoefficient "LibTorch's fused AdamW takes the device's clipping coefficient"
  gtest_verdict fsdp_train FsdpDevice.CudaMatchesCpuAndCheckpointsThroughHost "FSDP on the GPU over NCCL matches the CPU run"
  gtest_verdict fsdp_train FsdpDevice.PackedRowsInBf16MatchTheCpu "packed rows in bf16 (varlen flash where LibTorch >= 2.6) match the CPU"
  grep -h '^packed bf16 losses' "$LOGS/fsdp_train.log" | say_lines
fi

# ---- optim_bench: the optimizer's step alone on the GPU, each path and moment dtype ----------------
# `tessera bench optim --device cuda`: one flat shard of 128M elements (an eighth of the 1.1B model;
# 2.1 GB per case with fp32 moments, about 12 GB for all), each path (LibTorch's fused kernel, Tessera's
# kernel, the tensor-op path) and moment dtype in interleaved rounds: ns per element and ms per 1B
# parameters (the goal: optimizer_s <= 12 ms for the 1.1B model). A rehearsal runs it on the CPU.
if can_run optim_bench; then
  OPTIM_DEVICE=cuda OPTIM_NUMEL=134217728
  ((REHEARSAL)) && OPTIM_DEVICE=cpu OPTIM_NUMEL=1048576
  step optim_bench "$BUILD/bin/tessera" bench optim --device $OPTIM_DEVICE --numel $OPTIM_NUMEL --rounds 5
  grep -A12 '^AdamW step on' "$LOGS/optim_bench.log" | say_lines
fi

# ---- shared_gpu: several ranks on the one GPU (issue 56, item 5) ----------------------------------
if can_run shared_gpu; then
  step shared_gpu bash "$SRC/tests/gpu/staged.sh" "$BUILD/bin/tessera" "$CORPUS" "$WORK/run/shared" cuda staged
  grep '^staged:\|^ok:\|^FAIL:' "$LOGS/shared_gpu.log" | say_lines
fi

# ---- compile: the torch.compile peer (issue 56, item 6) -------------------------------------------
# bench_gpu.py's eager step with the model under torch.compile (inductor, default mode): the same
# batch, optimizer and clipping; its warm-up steps hold the compilation (compile_s). It needs no
# Tessera binary, but runs after the build: its compilation takes the CPUs.
COMPILE_JSON=$WORK/run/compile.json
if ! wanted compile; then
  skip compile "not selected (TESSERA_GPU_STEPS)"
elif ! why=$(applies compile "$GPUS" "$MODE"); then
  skip compile "$why"
else
  step compile env PYTHONUNBUFFERED=1 python3 "$SRC/tests/gpu/bench_gpu.py" eager --compile --config "$MODEL_CFG" \
    --seq "$SEQ" --batch "$BATCH" --warmup 3 --steps 10 --out "$COMPILE_JSON"
  publish
fi

# ---- fp16_bf16: fp16 with dynamic loss scaling tracks bf16 on the tiny model -----------------------
# The same 60 steps of the tiny preset (same seed, data and batches) on one GPU in bf16 and in fp16
# (fsdp.mixed_precision and reduce_dtype; the loss scaler of runtime/train/numerics.h: init 65536,
# backoff 0.5, growth 2 every 2000 steps). Tolerance, stated up front: over steps 11-60 the mean
# |fp16 - bf16| loss difference is <= 0.1 nats and the largest <= 0.3 (bf16 keeps 8 significand
# bits, fp16 11: the two runs differ by rounding, not by method); the fp16 run skipped at most 8
# steps (only the initial scale's overflow backoffs are expected), each with the scale halved, and
# every record says loss_scale. (CPU builds refuse fp16 compute: LibTorch 1.13 has no Half matmul.)
if can_run fp16_bf16; then
  for dt in bf16 fp16; do
    rm -rf "$WORK/run/mp-$dt" && mkdir -p "$WORK/run/mp-$dt"
  done
  MP_COMMON=(--set train.device=cuda --set model.preset=tiny --set train.steps=60 --set train.warmup_steps=5
             --set train.lr=1e-3 --set data.path="$CORPUS" --set data.tokenizer=bytes --set data.seq_len=128
             --set train.micro_batch=8 --set log.every=20)
  step fp16_bf16 bash -c '
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

# ---- conformance, nccl_timeout at world size 1: the device test cases only (fsdp_train: above) -----
if can_run conformance; then
  step conformance "${NP1[@]}" "$BUILD/bin/mpi_tests" --gtest_color=no --gtest_filter="$CONFORMANCE_TESTS"
  gtest_ran conformance "$CONFORMANCE_TESTS"
  if [[ -n $(nccl_line conformance) ]]; then
    say "  NCCL initialised ($(nccl_line conformance)): the nccl communicator is part of the conformance suite"
  else
    say "  NOTE: no 'NCCL version' line (NCCL_DEBUG=VERSION) in the conformance log: NCCL was not exercised"
  fi
fi
if can_run nccl_timeout; then
  step nccl_timeout "${NP1[@]}" "$BUILD/bin/mpi_tests" --gtest_color=no --gtest_filter="$NCCL_TIMEOUT_TESTS"
  gtest_ran nccl_timeout "$NCCL_TIMEOUT_TESTS"
  gtest_verdict nccl_timeout NcclWatchdog.StalledCollectiveTimesOutWithOneLineError \
    "a stalled NCCL collective ended in a one-line Timeout within 2 s + slack"
fi

# ---- nccl_stall: one of two GPU ranks stopped ------------------------------------------------------
if can_run nccl_stall; then
  step nccl_stall bash "$SRC/tests/gpu/stall.sh" "$BUILD/bin/tessera" "$CORPUS" "$WORK/run/stall" cuda 10
  grep '^stall:\|^ok:\|^FAIL:' "$LOGS/nccl_stall.log" | say_lines
fi

# ---- hf_parity: Tessera's forward against transformers' on models transformers wrote ---------------
if can_run hf_parity; then
  if ! python3 -c 'import transformers' 2>/dev/null; then
    skip hf_parity "python3 has no transformers"
  else
    rm -rf "$WORK/run/hf_parity"
    step hf_parity python3 "$SRC/tests/gpu/hf_parity.py" --tessera "$BUILD/bin/tessera" --work "$WORK/run/hf_parity"
    grep '^hf_parity:' "$LOGS/hf_parity.log" | say_lines
  fi
fi

# ---- report ---------------------------------------------------------------------------------------
say ""
say "== throughput (${SEQ}-token sequences, micro-batch $BATCH, one GPU) =="
TESSERA_NCCL=$(nccl_line tessera_train 2>/dev/null)
[[ -n $TESSERA_NCCL ]] || TESSERA_NCCL=$(nccl_line kernel_profile 2>/dev/null)
python3 "$SRC/tests/gpu/bench_gpu.py" report --config "$MODEL_CFG" --seq "$SEQ" --batch "$BATCH" \
  --eager "$EAGER_JSON" --compiled "$COMPILE_JSON" --tessera-metrics "$([[ -z $SKIP_REASON ]] && echo "$TESSERA_METRICS")" \
  --skip-reason "$SKIP_REASON" --kernel-table "$KERNEL_TABLE" --tessera-nccl "$TESSERA_NCCL" \
  --tessera-settings "${TESSERA_GPU_TRAIN_SET:-}" \
  --record "$RESULTS_DIR/gpu_record.json" 2>&1 |
  tee -a "$RES"
say ""
say "== summary ($((SECONDS - T0))s of the ${DEADLINE}s budget) =="
FAILED=0
for name in "${ORDER[@]}"; do
  say "$(printf '  %-14s %s' "$name" "$(status_of "$name")")"
  [[ $(status_of "$name") == FAIL* || $(status_of "$name") == TIMEOUT* || $(status_of "$name") == NOT* ]] && FAILED=1
done

# The steps ran in the GPU order (ORDER is a subsequence of ORDER_ALL), and, in a rehearsal, the
# GPU-mode limits after the build fit the GPU budget (the same plan as `run.sh --plan`).
i=0
for name in "${ORDER[@]}"; do
  while ((i < ${#ORDER_ALL[@]})) && [[ ${ORDER_ALL[i]} != "$name" ]]; do i=$((i + 1)); done
  if ((i == ${#ORDER_ALL[@]})); then
    say "ORDER: the steps ran as ${ORDER[*]}, not in the order ${ORDER_ALL[*]}"
    FAILED=1
    break
  fi
done
((i < ${#ORDER_ALL[@]})) && say "order: ${ORDER[*]} (the GPU order: ${ORDER_ALL[*]})"
if ((REHEARSAL)); then
  say "GPU-mode plan (what a GPU run with the ${GPU_BUDGET}s budget would give the steps after the build):"
  for left in 350 250 150 60; do
    (STEP_SCALE=1 && print_plan "$left" 1 gpu) | say_lines || FAILED=1
  done
fi
exit $FAILED
