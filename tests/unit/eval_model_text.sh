#!/usr/bin/env bash
# Eval renders what training rendered: the tokenizer and chat template come from the model being
# scored (launcher/data_setup.h choose_tokenizer / chat_template_for), also with --config naming
# another model.path. A Llama 3 model with its own tokenizer.json and a ChatML template trains 3
# steps with data.val_path; `ckpt consolidate` of the step-3 checkpoint carries the tokenizer files
# into the export; `eval --model EXPORT --data VAL` then equals training's step-3 val_loss and its
# target count, with and without a --config whose model.path holds another template (which
# gives other numbers). `train --fresh` keeps the old metrics.jsonl as metrics.jsonl.1 and starts a
# new one.
set -euo pipefail
BIN=${TESSERA_BIN:?}/tessera
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/../expect.bash"
EX="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/examples/chat"

$BIN init-model --preset tiny-llama3 --out "$T/m" --seed 5 --dtype fp32 > /dev/null
$BIN init-model --preset tiny-llama3 --out "$T/other" --seed 5 --dtype fp32 > /dev/null
# A byte-level BPE tokenizer.json (ids 0-255 the bytes in GPT-2's alphabet, a few merges) with
# ChatML's specials; m's template is ChatML, other's puts the roles in another form.
python3 - "$T" "$(dirname "${BASH_SOURCE[0]}")/../tokenizer" <<'PY'
import json, sys
t = sys.argv[1]
sys.path.insert(0, sys.argv[2])
import bytelevel  # tests/tokenizer/bytelevel.py
specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"]
tok = bytelevel.tokenizer([(" ", "t"), ("h", "e"), (" t", "he"), ("i", "s"), (" ", "=")], specials,
                          {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
                          ignore_merges=False)
chatml = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
plain = "{{ bos_token }}{% for m in messages %}{{ '[' + m['role'] + '] ' + m['content'] + eos_token }}{% endfor %}"
for d, template in (("m", chatml), ("other", plain)):
    json.dump(tok, open("%s/%s/tokenizer.json" % (t, d), "w"))
    json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|im_end|>", "chat_template": template},
              open("%s/%s/tokenizer_config.json" % (t, d), "w"))
json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|im_end|>"}, open(t + "/m/special_tokens_map.json", "w"))
json.dump({"model": {"path": t + "/other"}, "data": {"seq_len": 256}}, open(t + "/run.json", "w"))
PY

$BIN train --set model.path="$T/m" --set data.path="$EX/train.jsonl" --set data.val_path="$EX/val.jsonl" \
  --set data.seq_len=256 --set train.steps=3 --set eval.every=3 --set checkpoint.dir="$T/ck" --set checkpoint.every=3 \
  --set log.dir="$T/log" > "$T/train.log" 2>&1 || { cat "$T/train.log"; fail "train"; }
check "training renders m's own template" grep -q "^data: chat template: the model's own ($T/m/tokenizer_config.json)" "$T/train.log"
$BIN ckpt consolidate --checkpoint "$T/ck/step-3" --out "$T/export" --dtype fp32 > "$T/cons.log" || fail "consolidate"
check "consolidate names the tokenizer files it copied" \
  grep -q "^tokenizer files from $T/m: tokenizer.json, tokenizer_config.json, special_tokens_map.json" "$T/cons.log"
for f in tokenizer.json tokenizer_config.json special_tokens_map.json; do
  check "the export holds $f as it was" cmp -s "$T/m/$f" "$T/export/$f"
done

same() {  # LABEL EVAL_JSON
  python3 - "$2" "$T/log/metrics.jsonl" <<'PY' || fail "$1"
import json, sys
e = json.load(open(sys.argv[1]))
m = [json.loads(l) for l in open(sys.argv[2]) if '"val_loss"' in l][-1]
print("eval", e["mean_loss"], e["tokens"], "| train step", m["step"], "val_loss", m["val_loss"], m["val_tokens"])
assert m["step"] == 3, m["step"]
assert e["tokens"] == m["val_tokens"], (e["tokens"], m["val_tokens"])
assert abs(e["mean_loss"] - m["val_loss"]) <= 1e-5 * m["val_loss"], (e["mean_loss"], m["val_loss"])
PY
  ok "$1"
}
$BIN eval --model "$T/export" --data "$EX/val.jsonl" --set data.seq_len=256 > "$T/e.json" 2> "$T/e.err" || { cat "$T/e.err"; fail "eval"; }
check "eval renders the export's template" grep -q "the model's own ($T/export/tokenizer_config.json)" "$T/e.err"
same "eval of the export = training's val_loss at step 3 (same target count)" "$T/e.json"
$BIN eval --model "$T/export" --data "$EX/val.jsonl" --config "$T/run.json" > "$T/ec.json" 2> "$T/ec.err" || { cat "$T/ec.err"; fail "eval --config"; }
check "--config with another model.path: still --model's template" grep -q "the model's own ($T/export/tokenizer_config.json)" "$T/ec.err"
same "eval --config run.json (model.path another model) = training's val_loss" "$T/ec.json"
# The other template scores other tokens: the checks above tell the two apart.
$BIN eval --model "$T/other" --data "$EX/val.jsonl" --config "$T/run.json" > "$T/eo.json" 2> /dev/null
check "the other template gives another target count" python3 -c '
import json, sys; a, b = (json.load(open(f)) for f in sys.argv[1:]); sys.exit(a["tokens"] == b["tokens"])' "$T/e.json" "$T/eo.json"

# --fresh: a new metrics.jsonl; the old one kept as metrics.jsonl.1.
cp "$T/log/metrics.jsonl" "$T/old_metrics.jsonl"
$BIN train --fresh --set model.path="$T/m" --set data.path="$EX/val.jsonl" --set data.seq_len=256 --set train.steps=2 \
  --set checkpoint.dir="$T/ck" --set log.dir="$T/log" > "$T/fresh.log" 2>&1 || { cat "$T/fresh.log"; fail "train --fresh"; }
check "--fresh says where the old metrics went" grep -q "^--fresh: the previous run's $T/log/metrics.jsonl is kept as $T/log/metrics.jsonl.1" "$T/fresh.log"
check "metrics.jsonl.1 is the old run's file" cmp -s "$T/old_metrics.jsonl" "$T/log/metrics.jsonl.1"
check "metrics.jsonl holds only the new run's steps 1, 2" python3 -c '
import json, sys; s = [json.loads(l)["step"] for l in open(sys.argv[1])]; sys.exit(s != [1, 2])' "$T/log/metrics.jsonl"
echo "$pass passed, 0 failed"
