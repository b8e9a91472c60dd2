#!/usr/bin/env bash
# Every family of the model registry through the real CLI, on its tiny preset: init-model writes the
# family's config.json (tied Llama 3 and Qwen3: no lm_head.weight; Qwen2's q/k/v biases, Qwen3's q/k
# norms); eval prints the same losses alone and under
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

for preset in tiny-llama3 tiny-mistral tiny-qwen2 tiny-qwen3; do
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
elif preset == "tiny-mistral":
    assert c["model_type"] == "mistral" and c["architectures"] == ["MistralForCausalLM"], c
    assert c["sliding_window"] == 32 and c["num_key_value_heads"] == 1, c
elif preset == "tiny-qwen2":  # Qwen2Config has no attention_bias: q/k/v biases are always there
    assert c["model_type"] == "qwen2" and c["architectures"] == ["Qwen2ForCausalLM"], c
    assert "attention_bias" not in c and c["use_sliding_window"] is False and c["rope_theta"] == 1e6, c
else:
    assert c["model_type"] == "qwen3" and c["architectures"] == ["Qwen3ForCausalLM"], c
    assert c["head_dim"] == 48 and c["attention_bias"] is False and c["tie_word_embeddings"] is True, c
PY
  init_names=$(names "$M")
  case $preset in  # 9 tensors a layer, + 3 biases (qwen2) or 2 q/k norms (qwen3); embed, norm, lm_head unless tied
    tiny-llama3) want_names="20 without lm_head" ;;
    tiny-mistral) want_names="21 with lm_head" ;;
    tiny-qwen2) want_names="27 with lm_head" ;;
    tiny-qwen3) want_names="24 without lm_head" ;;
  esac
  have_names="$(echo "$init_names" | wc -w) $([[ $init_names == *lm_head.weight* ]] && echo with || echo without) lm_head"
  check "$preset: $want_names tensors" test "$have_names" = "$want_names"
  [[ $preset != tiny-qwen2 || $init_names == *layers.1.self_attn.v_proj.bias* ]] || fail "tiny-qwen2 has no v_proj.bias"
  [[ $preset != tiny-qwen3 || $init_names == *layers.1.self_attn.k_norm.weight* ]] || fail "tiny-qwen3 has no k_norm"

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
  if [[ $preset != tiny-qwen* ]]; then  # the preset path is the same for every family: two runs show it
    "${MPIRUN[@]}" -np 2 $BIN train --set model.preset=$preset --set data.seq_len=64 --set train.steps=2 \
      --set log.every=100 > "$T/train_preset.log" 2>&1 || { cat "$T/train_preset.log"; fail "train np 2 from preset $preset"; }
    grep -q "model preset $preset" "$T/train_preset.log" || fail "train from preset $preset: $(cat "$T/train_preset.log")"
    ok "$preset: train from the preset under mpirun -np 2"
  fi

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
expect_error 2 "$T/gemma/config.json: model_type \"gemma\" is not supported (supported: llama, mistral, qwen2, qwen3)" \
  $BIN eval --model "$T/gemma" --tokens "$T/tokens.txt"
expect_error 2 "$T/yarn/config.json: rope_scaling.rope_type \"yarn\" is not supported" \
  $BIN eval --model "$T/yarn" --tokens "$T/tokens.txt"
expect_error 2 "$T/yarn/config.json: rope_scaling.rope_type" $BIN init-model --config "$T/yarn/config.json" --out "$T/never"
[ ! -e "$T/never" ] || fail "a failed init-model wrote its output"
expect_error 2 "$T/gemma/config.json: model_type \"gemma\"" \
  "${MPIRUN[@]}" -np 2 $BIN train --set model.path="$T/gemma" --set checkpoint.dir="$T/ck-bad"
[ ! -e "$T/ck-bad" ] || fail "a failed train created its checkpoint dir"
mkdir "$T/qwen_window" && cp "$T/tiny-qwen2/model.safetensors" "$T/qwen_window/"
python3 -c "
import json, sys
c = json.load(open(sys.argv[1])); c['use_sliding_window'] = True
json.dump(c, open(sys.argv[2], 'w'))" "$T/tiny-qwen2/config.json" "$T/qwen_window/config.json"
expect_error 2 "$T/qwen_window/config.json: use_sliding_window true is not supported" \
  "${MPIRUN[@]}" -np 2 $BIN train --set model.path="$T/qwen_window" --set checkpoint.dir="$T/ck-bad"
echo "$pass passed, 0 failed"
