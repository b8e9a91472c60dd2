#!/usr/bin/env bash
# Quality of 8-bit AdamW moments (optim.state_dtype = int8) against fp32 moments on the 58M Llama
# (hidden 512, 8 layers, 8 heads, intermediate 1376, vocab 32000; the model of bench step / bench
# memory), trained from the same initialisation on the same batches: two `tessera train` runs under
# mpirun that differ only in optim.state_dtype. Prints both loss curves' final values (the last
# step's loss and the mean of the last 20 steps) and their ratio, and fails (exit 1) when the int8
# run's mean of the last 20 steps is more than TOL (relative) above or below the fp32 run's.
# Too slow for the test suite (about 2 x 10 minutes on 2 cores): a benchmark, run by hand.
#
#   benchmarks/int8_quality.sh            # STEPS=300 NP=2 TOL=0.02 BIN=build/bin/tessera
#   STEPS=500 NP=4 benchmarks/int8_quality.sh
set -euo pipefail
STEPS=${STEPS:-300}
TOL=${TOL:-0.02}
DATA=${DATA:-/usr/share/common-licenses}
QUALITY_NAME=int8 source "$(dirname "$0")/quality_runs.bash"  # SRC, BIN, NP, WORK, $WORK/init, train()

for state in fp32 int8; do
  train "$state" "$WORK/init" "$DATA" "$STEPS" 1e-3 fp32 ", \"optim\": {\"state_dtype\": \"$state\"}"
done

python3 - "$WORK" "$TOL" "$STEPS" "$NP" <<'PY'
import json, sys
work, tol, steps, np_ = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
def curve(state):
    return [json.loads(l)["loss"] for l in open(f"{work}/{state}/metrics.jsonl") if '"loss"' in l]
fp32, int8 = curve("fp32"), curve("int8")
assert len(fp32) == len(int8) == int(steps), (len(fp32), len(int8))
tail = lambda c: sum(c[-20:]) / 20
print(f"58M Llama, {steps} steps, {np_} ranks, seq 128 x micro-batch 4 per rank, lr 1e-3 cosine")
print(f"{'step':>6} {'fp32 loss':>10} {'int8 loss':>10} {'ratio':>7}")
for s in [0, 9, 49, 99, 149, 199, 249, len(fp32) - 1]:
    if s < len(fp32):
        print(f"{s + 1:>6} {fp32[s]:>10.4f} {int8[s]:>10.4f} {int8[s] / fp32[s]:>7.4f}")
r = tail(int8) / tail(fp32)
print(f"final loss: fp32 {fp32[-1]:.4f}, int8 {int8[-1]:.4f}, ratio {int8[-1] / fp32[-1]:.4f}")
print(f"mean of the last 20 steps: fp32 {tail(fp32):.4f}, int8 {tail(int8):.4f}, ratio {r:.4f} (tolerance {tol})")
sys.exit(0 if abs(r - 1) <= tol else 1)
PY
