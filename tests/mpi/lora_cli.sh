#!/usr/bin/env bash
# LoRA through the real CLI under real mpirun (issue 59):
#  - bad lora.* input: one line naming the key, exit 2 on every rank, nothing written;
#  - a LoRA run at W=2 saves adapter-only checkpoints (no base tensor; the manifest names the base),
#    smaller than 2 x (adapter bytes + their AdamW state);
#  - it resumes at W=1 and W=2 (resharding) with the losses of the run that never stopped;
#  - resuming it without LoRA, a full checkpoint with LoRA, or against another base is refused;
#  - the run's end and `tessera lora export` write PEFT adapters (checked by a reader written here),
#    and the exported adapter on the base scores validation data as the trainer did;
#  - train --adapter starts from a PEFT adapter (its lora.* and its A, B).
set -euo pipefail
BIN=${TESSERA_BIN:?}/tessera
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"
source "$(dirname "${BASH_SOURCE[0]}")/../expect.bash"  # ok, check, expect_error

$BIN init-model --preset tiny --seed 7 --out "$T/model" >/dev/null
COMMON=(--set model.path="$T/model" --set data.seq_len=32 --set train.steps=6 --set train.micro_batch=1
        --set train.warmup_steps=1 --set train.lr=1e-2 --set log.every=100)
LORA=(--set lora.rank=4 --set lora.alpha=16 --set lora.targets=q_proj,v_proj,down_proj)
accum() { echo "--set train.grad_accum=$((4 / $1))"; }

# Bad input: exit 2 on every rank, one line naming the key, nothing written.
bad() {
  local want=$1; shift
  expect_error 2 "$want" "${MPIRUN[@]}" -np 2 $BIN train "${COMMON[@]}" --set checkpoint.dir="$T/bad" "$@"
  check "nothing written for: $want" test ! -e "$T/bad"
}
bad "lora.targets names 'qkv_proj'" --set lora.rank=4 --set lora.targets=q_proj,qkv_proj
bad "lora.alpha must be > 0" --set lora.rank=4 --set lora.alpha=0
bad "lora.alpha is set but lora.rank is 0" --set lora.alpha=32
bad "lora.rank 129 is above the smallest target dimension" --set lora.rank=129
bad "lora.double_quant needs lora.base_dtype=nf4" --set lora.rank=4 --set lora.double_quant=true

# The run that never stops, at W=2, saving step-3 on the way.
"${MPIRUN[@]}" -np 2 $BIN train "${COMMON[@]}" "${LORA[@]}" $(accum 2) --set checkpoint.dir="$T/ck" \
  --set checkpoint.every=3 --set checkpoint.keep=5 > "$T/train.log"
check "verify step-3" $BIN ckpt verify "$T/ck/step-3"
python3 - "$T/ck/step-3" <<'PY'
import json, os, sys
d = sys.argv[1]
m = json.load(open(os.path.join(d, "manifest.json")))
names = {t["name"] for t in m["tensors"]}
assert names and all(".lora_A." in n or ".lora_B." in n for n in names), sorted(names)[:5]
lora = m["state"]["lora"]
assert lora["rank"] == 4 and lora["base"]["path"].endswith("/model") and len(lora["base"]["hash"]) == 16, lora
params = sum(t["numel"] if "numel" in t else eval("*".join(map(str, t["shape"])) or "1")
             for t in m["tensors"] if t.get("kind") == "param")
files = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if f.endswith(".bin"))
assert files < 2 * params * 4 * 3, (files, params)  # adapters (fp32) + two fp32 moments
print("adapter elements", params, "checkpoint file bytes", files)
PY
ok "adapter-only checkpoint with the base's identity, smaller than 2 x (adapters + state)"

for np in 2 1; do
  "${MPIRUN[@]}" -np $np $BIN train "${COMMON[@]}" "${LORA[@]}" $(accum $np) --set checkpoint.dir="$T/r$np" \
    --set log.dir="$T/r$np" --resume "$T/ck/step-3" > "$T/r$np.log"
  grep -q "resumed from $T/ck/step-3 at step 3" "$T/r$np.log"
  check "W=2 -> W=$np LoRA resume matches the uninterrupted run" resumed_close 1e-5 "$T/ck/metrics.jsonl" "$T/r$np/metrics.jsonl"
done

# Refusals on resume.
expect_error 2 "it is a LoRA checkpoint" $BIN train "${COMMON[@]}" $(accum 1) --set checkpoint.dir="$T/x1" --resume "$T/ck/step-3"
# Another base: another config (the identity hashes config.json and the tensor index, not values).
$BIN init-model --preset tiny-llama3 --seed 7 --out "$T/other" >/dev/null
expect_error 2 "its adapters were trained on base model $T/model" $BIN train "${COMMON[@]}" "${LORA[@]}" $(accum 1) \
  --set model.path="$T/other" --set checkpoint.dir="$T/x2" --resume "$T/ck/step-3"
$BIN train "${COMMON[@]}" $(accum 1) --set train.steps=1 --set checkpoint.dir="$T/full" > /dev/null
expect_error 2 "it is a full fine-tuning checkpoint" $BIN train "${COMMON[@]}" "${LORA[@]}" $(accum 1) \
  --set train.steps=3 --set checkpoint.dir="$T/x3" --resume "$T/full/step-1"
# (checkpoint.dir and its flight/ are made before the resume point is chosen, as for every refused resume: no file.)
check "nothing written by the refused resumes" test -z "$(find "$T/x1" "$T/x2" "$T/x3" -type f 2>/dev/null)"
# Dropout: activation checkpointing recomputes a layer with the forward's random numbers, and the
# masks are a function of (train.seed, step, micro-batch, rank): the same losses with and without it.
DROP=(--set train.steps=3 --set lora.dropout=0.2 --set lora.rank=4 --set lora.targets=q_proj,up_proj)
$BIN train "${COMMON[@]}" $(accum 1) "${DROP[@]}" --set fsdp.activation_checkpointing=false --set log.dir="$T/d1" > /dev/null
$BIN train "${COMMON[@]}" $(accum 1) "${DROP[@]}" --set fsdp.activation_checkpointing=true --set log.dir="$T/d2" > /dev/null
$BIN train "${COMMON[@]}" $(accum 1) "${DROP[@]}" --set lora.dropout=0 --set log.dir="$T/d0" > /dev/null
same() { cmp -s <(python3 -c "import json,sys; print([json.loads(l)['loss'] for l in open(sys.argv[1])])" "$1") \
                <(python3 -c "import json,sys; print([json.loads(l)['loss'] for l in open(sys.argv[1])])" "$2"); }
check "dropout: the same losses with activation checkpointing" same "$T/d1/metrics.jsonl" "$T/d2/metrics.jsonl"
differs() { ! same "$@"; }
check "dropout changes the losses" differs "$T/d1/metrics.jsonl" "$T/d0/metrics.jsonl"
# PEFT export: the run's end wrote its last checkpoint's adapters as a PEFT adapter; `tessera lora
# export` writes any LoRA checkpoint's. A reader written here (not Tessera's) checks the files; the
# exported adapter applied to the base by `eval --adapter` scores a validation file exactly as the
# trainer's own validation did at that step.
check "the run's end wrote adapter-step-6" grep -q "^adapter: $T/ck/adapter-step-6 (PEFT LoRA, 6 adapted weights" "$T/train.log"
$BIN lora export --checkpoint "$T/ck/step-3" --out "$T/ad3" --dtype bf16 > /dev/null
peft_files() {  # DIR DTYPE
  python3 - "$1" "$2" "$T/model/config.json" <<'PY'
import json, os, struct, sys
d, dtype, cfg = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3]))
c = json.load(open(os.path.join(d, "adapter_config.json")))
assert (c["peft_type"], c["task_type"], c["bias"], c["r"], c["lora_alpha"]) == ("LORA", "CAUSAL_LM", "none", 4, 16), c
assert sorted(c["target_modules"]) == ["down_proj", "q_proj", "v_proj"] and c["base_model_name_or_path"].endswith("/model"), c
raw = open(os.path.join(d, "adapter_model.safetensors"), "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
h = {k: v for k, v in json.loads(raw[8:8 + n]).items() if k != "__metadata__"}
H, I = cfg["hidden_size"], cfg["intermediate_size"]
KV = cfg["num_key_value_heads"] * (H // cfg["num_attention_heads"])
want = {}
for i in range(cfg["num_hidden_layers"]):
    for m, o, inp in (("self_attn.q_proj", H, H), ("self_attn.v_proj", KV, H), ("mlp.down_proj", H, I)):
        p = f"base_model.model.model.layers.{i}.{m}"
        want[p + ".lora_A.weight"], want[p + ".lora_B.weight"] = [4, inp], [o, 4]
assert {k: v["shape"] for k, v in h.items()} == want, sorted(h)[:4]
assert all(v["dtype"] == dtype for v in h.values()), {v["dtype"] for v in h.values()}
PY
}
check "adapter-step-6 is a PEFT adapter (config fields, keys, shapes; fp32)" peft_files "$T/ck/adapter-step-6" F32
check "lora export of step-3 is one too (bf16)" peft_files "$T/ad3" BF16
printf '256 72 101\n' > "$T/p.txt"
expect_error 2 "is a LoRA checkpoint (adapters only, no base): generate from its base with its adapter" \
  $BIN generate --checkpoint "$T/ck/step-3" --prompt-ids "$T/p.txt"
expect_error 2 "is not a LoRA checkpoint" $BIN lora export --checkpoint "$T/full/step-1" --out "$T/x4"
check "nothing written by the refused export" test ! -e "$T/x4"
# train --adapter: a run starts from a PEFT adapter (lora.* taken from its adapter_config.json). At
# lr 0 one step later its checkpoint holds exactly the adapter's A and B (exported again: the same
# bytes); a --set that contradicts the adapter is refused.
"${MPIRUN[@]}" -np 2 $BIN train "${COMMON[@]}" $(accum 2) --adapter "$T/ck/adapter-step-6" --set train.steps=1 \
  --set train.lr=0 --set train.min_lr=0 --set train.warmup_steps=0 --set checkpoint.dir="$T/a0" > "$T/a0.log"
check "the run says where its adapters start" grep -q "LoRA adapters start from $T/ck/adapter-step-6" "$T/a0.log"
check "the run took lora.* from the adapter" python3 -c "
import json; l = json.load(open('$T/a0/step-1/manifest.json'))['state']['lora']
assert (l['rank'], l['alpha'], sorted(l['targets'])) == (4, 16, ['down_proj', 'q_proj', 'v_proj']), l"
check "lr 0: its checkpoint's adapters are the adapter's, bit for bit" \
  cmp "$T/ck/adapter-step-6/adapter_model.safetensors" "$T/a0/adapter-step-1/adapter_model.safetensors"
expect_error 2 "--adapter $T/ck/adapter-step-6: its r is 4, lora.rank 8" $BIN train "${COMMON[@]}" $(accum 1) \
  --adapter "$T/ck/adapter-step-6" --set lora.rank=8 --set checkpoint.dir="$T/x5"
VAL=/usr/share/common-licenses/Apache-2.0
"${MPIRUN[@]}" -np 2 $BIN train "${COMMON[@]}" "${LORA[@]}" $(accum 2) --set train.steps=3 --set data.val_path=$VAL \
  --set checkpoint.dir="$T/v" > "$T/v.log"
$BIN eval --model "$T/model" --adapter "$T/v/adapter-step-3" --data $VAL --set data.seq_len=32 > "$T/v.eval"
check "eval --adapter of the exported adapter = the trainer's validation loss at that step" python3 -c "
import json; v = [json.loads(l) for l in open('$T/v/metrics.jsonl')][-1]['val_loss']
e = json.load(open('$T/v.eval'))['mean_loss']
assert abs(v - e) <= 1e-5 * abs(v), (v, e)"
# QLoRA: lora.base_dtype nf4 stores the decoder's projections as NF4 bytes (all-gathered as bytes,
# decoded per unit when gathered), the rest of the base in the compute dtype: the same losses at 1
# and 2 ranks (a block never spans two ranks' chunks), a first loss near the unquantized base's
# (B = 0: only the base's quantization error), and with double quantization too.
Q=(--set train.steps=3 --set lora.base_dtype=nf4)
"${MPIRUN[@]}" -np 1 $BIN train "${COMMON[@]}" "${LORA[@]}" $(accum 1) "${Q[@]}" --set log.dir="$T/q1" > /dev/null
"${MPIRUN[@]}" -np 2 $BIN train "${COMMON[@]}" "${LORA[@]}" $(accum 2) "${Q[@]}" --set data.val_path=$VAL \
  --set checkpoint.dir="$T/q2" > /dev/null
"${MPIRUN[@]}" -np 2 $BIN train "${COMMON[@]}" "${LORA[@]}" $(accum 2) "${Q[@]}" --set lora.double_quant=true \
  --set log.dir="$T/qd" > /dev/null
check "QLoRA: the same losses at 1 and 2 ranks, near the unquantized base's first loss; double quant too" python3 -c "
import json, math
L = lambda d: [json.loads(l)['loss'] for l in open(d + '/metrics.jsonl')]
q1, q2, qd, full = L('$T/q1'), L('$T/q2'), L('$T/qd'), L('$T/ck')
assert all(abs(a - b) <= 1e-5 * abs(a) for a, b in zip(q1, q2)), (q1, q2)
assert 0 < abs(q1[0] - full[0]) < 0.05, (q1[0], full[0])
assert all(math.isfinite(x) for x in qd) and abs(qd[0] - q1[0]) < 0.05, (qd, q1)"
# eval --set lora.base_dtype=nf4 scores the model as QLoRA trains it: the QLoRA run's exported adapter
# on the NF4 base gives the trainer's validation loss; merged into the unquantized base it does not.
E=(--model "$T/model" --adapter "$T/q2/adapter-step-3" --data $VAL --set data.seq_len=32)
$BIN eval "${E[@]}" --set lora.base_dtype=nf4 > "$T/q.eval"
$BIN eval "${E[@]}" > "$T/qm.eval"
check "eval --set lora.base_dtype=nf4 = the QLoRA trainer's validation loss; the merged fp32 base's differs" python3 -c "
import json; v = [json.loads(l) for l in open('$T/q2/metrics.jsonl')][-1]['val_loss']
q, m = json.load(open('$T/q.eval')), json.load(open('$T/qm.eval'))
assert abs(v - q['mean_loss']) <= 1e-5 * abs(v), (v, q)
assert q['lora'] == {'rank': 4, 'base_dtype': 'nf4'}, q
assert abs(v - m['mean_loss']) > 1e-4 and 'lora' not in m, (v, m)"
expect_error 2 "lora.base_dtype is set but lora.rank is 0" $BIN eval --model "$T/model" --data $VAL --set lora.base_dtype=nf4
expect_error 2 "without --data eval takes only lora.* keys" $BIN eval --model "$T/model" --tokens "$T/model/config.json" \
  --set data.seq_len=8
echo "$pass passed, 0 failed"
