#!/usr/bin/env bash
# A YAML run config trains exactly as its JSON twin, and a translated Accelerate config trains,
# under real mpirun (np 2, tiny preset, 3 steps each):
#  - run.yaml and run.json (the same keys) give bit-identical losses and gradient norms;
#  - `tessera config --from-accelerate` of the use_cpu fixture (FSDP2, reshard_after_forward false
#    -> shard_grad_op, fp32, cpu) plus the same model/data/train keys by --set gives them too, and
#    the run says shard_grad_op.
set -euo pipefail
BIN=${TESSERA_BIN:?}/tessera
FIX=${TESSERA_SRC:?}/tests/unit/fixtures/accelerate
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"
cd "$T"
cat > run.yaml <<'Y'
# the same run as run.json
model: {preset: tiny, seed: 11}
data:
  seq_len: 32
train:
  steps: 3
  micro_batch: 1
  warmup_steps: 1
  lr: 1e-3
  device: cpu
fsdp:
  strategy: shard_grad_op
  mixed_precision: fp32
  reduce_dtype: fp32
log: {dir: yaml, every: 10}
Y
cat > run.json <<'J'
{"model": {"preset": "tiny", "seed": 11}, "data": {"seq_len": 32},
 "train": {"steps": 3, "micro_batch": 1, "warmup_steps": 1, "lr": 0.001, "device": "cpu"},
 "fsdp": {"strategy": "shard_grad_op", "mixed_precision": "fp32", "reduce_dtype": "fp32"},
 "log": {"dir": "json", "every": 10}}
J
"$BIN" config --from-accelerate "$FIX/cpu.yaml" --out acc.json 2>/dev/null
"${MPIRUN[@]}" -np 2 "$BIN" train --config run.yaml > yaml.log
"${MPIRUN[@]}" -np 2 "$BIN" train --config run.json > json.log
"${MPIRUN[@]}" -np 2 "$BIN" train --config acc.json --set model.preset=tiny --set model.seed=11 --set data.seq_len=32 \
  --set train.steps=3 --set train.micro_batch=1 --set train.warmup_steps=1 --set train.lr=1e-3 --set log.dir=acc \
  --set log.every=10 > acc.log
grep -q "2 rank(s) on 1 node(s), shard_grad_op, fp32 on cpu" acc.log || { echo "FAIL: acc.json run: $(head -1 acc.log)"; exit 1; }
python3 - <<'PY'
import json
runs = {name: [json.loads(l) for l in open(f"{name}/metrics.jsonl")] for name in ("yaml", "json", "acc")}
key = lambda r: [(x["step"], x["loss"], x["grad_norm"], x["lr"]) for x in r]
assert len(runs["yaml"]) == 3, runs["yaml"]
assert key(runs["yaml"]) == key(runs["json"]), (key(runs["yaml"]), key(runs["json"]))
assert key(runs["acc"]) == key(runs["json"]), (key(runs["acc"]), key(runs["json"]))
print("ok: YAML, JSON and translated-Accelerate runs:", [round(x[1], 5) for x in key(runs["yaml"])])
PY
echo "1 passed, 0 failed"
