#!/usr/bin/env bash
# Every family of the model registry through the real CLI, on its tiny preset: init-model writes the
# family's config.json (tied Llama 3: no lm_head.weight); eval prints the same losses alone and under
# mpirun -np 2; train runs under mpirun -np 2 (from the model directory and from the preset);
# ckpt consolidate writes a Hugging Face directory with every tensor once that eval reads; and
# unsupported model_type / rope_scaling values stop with one line naming the file and key, exit 2.
set -uo pipefail
BIN=${TESSERA_BIN:?}/tessera
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"
source "$(dirname "${BASH_SOURCE[0]}")/../expect.bash"  # ok, fail, check, expect_error

python3 -c "
import random; random.seed(5)
for n in (17, 60, 9, 90): print(' '.join(str(random.randrange(320)) for _ in range(n)))" > "$T/tokens.txt"
# safetensors tensor names of a directory (single file or index).
names() { python3 - "$1" <<'PY'
import json, os, struct, sys
d = sys.argv[1]
idx = os.path.join(d, "model.safetensors.index.json")
files = sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx) else ["model.safetensors"]
out = []
for f in files:
    data = open(os.path.join(d, f), "rb").read(8)
    (n,) = struct.unpack("<Q", data)
    header = json.loads(open(os.path.join(d, f), "rb").read(8 + n)[8:])
    out += [k for k in header if k != "__metadata__"]
print(" ".join(sorted(out)))
PY
}

for preset in tiny-llama3 tiny-mistral; do
  M=$T/$preset
  $BIN init-model --preset $preset --seed 3 --out "$M" > "$T/init.json" || fail "init-model $preset"
  python3 - "$M/config.json" "$preset" <<'PY' || fail "$preset config.json"
import json, sys
c, preset = json.load(open(sys.argv[1])), sys.argv[2]
if preset == "tiny-llama3":
    assert c["model_type"] == "llama" and c["architectures"] == ["LlamaForCausalLM"], c
    assert c["tie_word_embeddings"] is True and c["rope_theta"] == 500000.0, c
    assert c["rope_scaling"] == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 64}, c
else:
    assert c["model_type"] == "mistral" and c["architectures"] == ["MistralForCausalLM"], c
    assert c["sliding_window"] == 32 and c["num_key_value_heads"] == 1, c
PY
  init_names=$(names "$M")
  if [ $preset = tiny-llama3 ]; then
    check "$preset: tied embedding stored once, no lm_head.weight" \
      bash -c "[[ '$init_names' != *lm_head* && \$(echo '$init_names' | wc -w) == 20 ]]"
  else
    check "$preset: 21 tensors with lm_head.weight" bash -c "[[ '$init_names' == *lm_head.weight* && \$(echo '$init_names' | wc -w) == 21 ]]"
  fi

  $BIN eval --model "$M" --tokens "$T/tokens.txt" > "$T/eval1.json" || fail "eval $preset"
  "${MPIRUN[@]}" -np 2 $BIN eval --model "$M" --tokens "$T/tokens.txt" > "$T/eval2.json" || fail "eval np 2 $preset"
  python3 - "$T/eval1.json" "$T/eval2.json" <<'PY' || fail "$preset: eval np 2 differs"
import json, math, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a["tokens"] == b["tokens"] == 172, (a, b)
assert abs(a["mean_loss"] - math.log(320)) < 0.3, a
for x, y in zip(a["per_sequence_loss"], b["per_sequence_loss"]):
    assert abs(x - y) <= 1e-6 * abs(x), (x, y)
PY
  ok "$preset: eval np 2 equals one process"

  # seq_len 64 > Mistral's window 32. Losses must fall.
  "${MPIRUN[@]}" -np 2 $BIN train --set model.path="$M" --set data.seq_len=64 --set train.steps=6 \
    --set train.lr=3e-3 --set train.warmup_steps=1 --set log.every=100 --set checkpoint.dir="$T/ck-$preset" \
    > "$T/train.log" 2>&1 || { cat "$T/train.log"; fail "train np 2 $preset"; }
  python3 - "$T/ck-$preset/metrics.jsonl" <<'PY' || fail "$preset: training did not lower the loss"
import json, sys
losses = [json.loads(l)["loss"] for l in open(sys.argv[1])]
assert len(losses) == 6 and losses[-1] < losses[0] - 0.3, losses
PY
  ok "$preset: train under mpirun -np 2 lowers the loss"
  "${MPIRUN[@]}" -np 2 $BIN train --set model.preset=$preset --set data.seq_len=64 --set train.steps=2 \
    --set log.every=100 > "$T/train_preset.log" 2>&1 || { cat "$T/train_preset.log"; fail "train np 2 from preset $preset"; }
  grep -q "model preset $preset" "$T/train_preset.log" || fail "train from preset $preset: $(cat "$T/train_preset.log")"
  ok "$preset: train from the preset under mpirun -np 2"

  $BIN ckpt consolidate --checkpoint "$T/ck-$preset/step-6" --out "$T/hf-$preset" --dtype fp32 > /dev/null ||
    fail "consolidate $preset"
  check "$preset: consolidate writes the same tensors once" test "$(names "$T/hf-$preset")" = "$init_names"
  python3 - "$M/config.json" "$T/hf-$preset/config.json" <<'PY' || fail "$preset: consolidated config.json differs"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a == b, (a, b)
PY
  $BIN eval --model "$T/hf-$preset" --tokens "$T/tokens.txt" > "$T/eval_trained.json" || fail "eval consolidated $preset"
  python3 - "$T/eval1.json" "$T/eval_trained.json" <<'PY' || fail "$preset: trained model evaluates like the initial one"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a["per_sequence_loss"] != b["per_sequence_loss"], (a, b)
PY
  ok "$preset: eval reads the consolidated model"
done

# Bad config.json values: one line naming the file and the key, exit 2, alone and under mpirun.
mkdir "$T/gemma" "$T/yarn"
cp "$T/tiny-llama3/model.safetensors" "$T/gemma/" && cp "$T/tiny-llama3/model.safetensors" "$T/yarn/"
python3 - "$T" <<'PY'
import json, sys
t = sys.argv[1]
c = json.load(open(t + "/tiny-llama3/config.json"))
json.dump(dict(c, model_type="gemma"), open(t + "/gemma/config.json", "w"))
json.dump(dict(c, rope_scaling=dict(c["rope_scaling"], rope_type="yarn")), open(t + "/yarn/config.json", "w"))
PY
expect_error 2 "$T/gemma/config.json: model_type \"gemma\" is not supported (supported: llama, mistral)" \
  $BIN eval --model "$T/gemma" --tokens "$T/tokens.txt"
expect_error 2 "$T/yarn/config.json: rope_scaling.rope_type \"yarn\" is not supported" \
  $BIN eval --model "$T/yarn" --tokens "$T/tokens.txt"
expect_error 2 "$T/yarn/config.json: rope_scaling.rope_type" $BIN init-model --config "$T/yarn/config.json" --out "$T/never"
[ ! -e "$T/never" ] || fail "a failed init-model wrote its output"
expect_error 2 "$T/gemma/config.json: model_type \"gemma\"" \
  "${MPIRUN[@]}" -np 2 $BIN train --set model.path="$T/gemma" --set checkpoint.dir="$T/ck-bad"
[ ! -e "$T/ck-bad" ] || fail "a failed train created its checkpoint dir"
echo "$pass passed, 0 failed"
