#!/usr/bin/env bash
# Several ranks on one GPU (issue 56, item 5): `tessera train` at W = 2 and 4 with every rank on the
# device DEVICE (tests/gpu/run.sh: cuda, one GPU; comm.device_backend=BACKEND, staged there: the
# collectives through host memory over MPI, runtime/comm/staged.h), against the same runs on the CPU
# over MPI. Tiny preset, fp32, 20 steps: the loss of every step within 2e-4 relative of the CPU's
# (the CPU-vs-GPU tolerance of mpi.test_fsdp_train's FsdpDevice is 1e-4 over fewer steps), every
# record on DEVICE; the device run's checkpoint verifies (`tessera ckpt verify`, every checksum) and
# consolidates on the CPU. MPI starts as run.sh's do (mpi_local_env: no ssh needed).
#
#   staged.sh TESSERA_BIN CORPUS WORKDIR DEVICE BACKEND     (cuda staged on a GPU; cpu nccl anywhere)
set -uo pipefail
BIN=$1 CORPUS=$2 DIR=$3 DEVICE=$4 BACKEND=$5
source "$(dirname "${BASH_SOURCE[0]}")/deps.bash"
source "$(dirname "${BASH_SOURCE[0]}")/../expect.bash"  # ok, fail, check
mpi_local_env
rm -rf "$DIR" && mkdir -p "$DIR"
COMMON=(--set model.preset=tiny --set train.steps=20 --set train.warmup_steps=2 --set train.lr=1e-3
        --set data.path="$CORPUS" --set data.tokenizer=bytes --set data.seq_len=128 --set train.micro_batch=4
        --set log.every=1 --set fsdp.mixed_precision=fp32 --set checkpoint.every=20)
train() {  # NP DEVICE BACKEND NAME
  local t0=$SECONDS
  mpirun --oversubscribe --bind-to none -np "$1" -x LD_LIBRARY_PATH "$BIN" train "${COMMON[@]}" --set train.device="$2" \
    --set comm.device_backend="$3" --set log.dir="$DIR/$4" --set checkpoint.dir="$DIR/$4/ckpt" >"$DIR/$4.log" 2>&1 ||
    { tail -5 "$DIR/$4.log"; fail "$4: tessera train exited $?"; }
  echo "staged: $4 trained in $((SECONDS - t0)) s"
}
for np in 2 4; do
  train "$np" cpu nccl "cpu-$np"
  train "$np" "$DEVICE" "$BACKEND" "dev-$np"
  check "W=$np on $DEVICE ($BACKEND): every step's loss within 2e-4 relative of the CPU's, every record on $DEVICE" \
    python3 - "$DIR/cpu-$np/metrics.jsonl" "$DIR/dev-$np/metrics.jsonl" "$DEVICE" <<'PY'
import json, sys
cpu, dev = ([json.loads(l) for l in open(p) if l.strip() and '"loss"' in l] for p in sys.argv[1:3])
assert len(cpu) == len(dev) == 20, (len(cpu), len(dev))
assert all(r["device"].startswith(sys.argv[3]) for r in dev), {r["device"] for r in dev}
worst = max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(cpu, dev))
print("staged: largest relative loss difference %.2e (first %.4f, last %.4f)" % (worst, dev[0]["loss"], dev[-1]["loss"]))
sys.exit(0 if worst <= 2e-4 else 1)
PY
  check "W=$np: the $DEVICE run's checkpoint verifies and consolidates on the CPU" bash -c \
    "'$BIN' ckpt verify '$DIR/dev-$np/ckpt/step-20' >/dev/null && '$BIN' ckpt consolidate --checkpoint '$DIR/dev-$np/ckpt/step-20' --out '$DIR/dev-$np/hf' >/dev/null"
done
echo "$pass passed, 0 failed"
