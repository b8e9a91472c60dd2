#!/usr/bin/env bash
# `tessera eval --data`: on chat and prompt/completion data the loss is over the target tokens
# (assistant turns, completions) by default and equals training's validation loss on the same data
# and weights (a 1-step `tessera train` with lr 0 of the same model, the data as data.val_path);
# with --all-tokens it equals the validation loss of a run with data.train_on=all. The JSON says
# which was scored; --tokens files are scored on every token; bad combinations exit 2, one line.
set -euo pipefail
BIN=${TESSERA_BIN:?}/tessera
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/../expect.bash"
EX="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/examples/chat"

$BIN init-model --preset tiny --out "$T/m" --seed 3 --dtype fp32 > /dev/null
python3 - "$T/pc.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for a in range(12):
        f.write(json.dumps({"prompt": "Q: what is %d plus %d? A:" % (a, 2 * a), "completion": " %d" % (3 * a)}) + "\n")
PY
# Training's validation loss after one step with lr 0 (the weights stay those of $T/m).
val_loss() {  # DATA LOGDIR [--set ...]
  local data=$1 dir=$2; shift 2
  $BIN train --set model.path="$T/m" --set data.path="$data" --set data.val_path="$data" \
    --set data.seq_len=256 --set train.steps=1 --set train.lr=0 --set train.min_lr=0 --set train.warmup_steps=0 \
    --set log.dir="$dir" "$@" > /dev/null
}
same() {  # LABEL EVAL_JSON METRICS_JSONL SCORED
  python3 - "$2" "$3" "$4" <<'PY' || fail "$1"
import json, sys
e = json.load(open(sys.argv[1]))
m = [json.loads(l) for l in open(sys.argv[2])][-1]
print("eval", e["mean_loss"], e["tokens"], e["scored"], "| train validation", m["val_loss"], m["val_tokens"])
assert e["scored"] == sys.argv[3], e["scored"]
assert e["tokens"] == m["val_tokens"], (e["tokens"], m["val_tokens"])
assert abs(e["mean_loss"] - m["val_loss"]) <= 1e-6 * m["val_loss"], (e["mean_loss"], m["val_loss"])
PY
  ok "$1"
}
echo '{"data": {"seq_len": 256}}' > "$T/run.json"
# One file of both kinds: the chat examples and the prompt/completion records.
cat "$EX/val.jsonl" "$T/pc.jsonl" > "$T/mixed.jsonl"
val_loss "$T/mixed.jsonl" "$T/t"
val_loss "$T/mixed.jsonl" "$T/a" --set data.train_on=all
# The data keys by the run configuration (--config) for targets, by --set for all tokens.
$BIN eval --model "$T/m" --data "$T/mixed.jsonl" --config "$T/run.json" > "$T/e.json"
$BIN eval --model "$T/m" --data "$T/mixed.jsonl" --set data.seq_len=256 --all-tokens > "$T/ea.json"
same "chat + prompt/completion: targets = training's validation loss" "$T/e.json" "$T/t/metrics.jsonl" "target tokens"
same "--all-tokens = validation loss with data.train_on=all" "$T/ea.json" "$T/a/metrics.jsonl" "all tokens"
check "fewer targets than tokens, another loss" python3 -c '
import json, sys; t, a = (json.load(open(f)) for f in sys.argv[1:])
sys.exit(not (0 < t["tokens"] < a["tokens"] and t["mean_loss"] != a["mean_loss"]))' "$T/e.json" "$T/ea.json"
$BIN eval --model "$T/m" --data "$T/pc.jsonl" --set data.seq_len=256 > "$T/e_pc.json"
# Counted by hand: the tiny model's byte tokenizer makes each completion's bytes and its EOS the targets.
check "pc: targets are the completions' bytes + EOS" python3 -c '
import json, sys; e = json.load(open(sys.argv[1]))
sys.exit(e["tokens"] != sum(len(" %d" % (3 * a)) + 1 for a in range(12)))' "$T/e_pc.json"
printf '1 2 3 4\n5 6 7\n' > "$T/tok.txt"
check "--tokens: every token" grep -q '"scored":"all tokens"' <($BIN eval --model "$T/m" --tokens "$T/tok.txt")
expect_error 2 "one of --tokens FILE or --data PATH" $BIN eval --model "$T/m" --tokens "$T/tok.txt" --data "$T/pc.jsonl"
expect_error 2 "one of --tokens FILE or --data PATH" $BIN eval --model "$T/m"
expect_error 2 "apply to --data" $BIN eval --model "$T/m" --tokens "$T/tok.txt" --all-tokens
echo "$pass passed, 0 failed"
