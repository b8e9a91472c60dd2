#!/usr/bin/env bash
# A downloaded model directory whose tokenizer_config.json holds a hostile chat template (a
# recursive macro: a stack overflow on every rank before the budgets of util/budgets.h), trained
# on chat data under 2 real mpirun ranks: exit 2 within 60 s, one error line naming the file and
# what was exceeded, nothing written. The other hostile templates: tests/unit/hostile_jinja.sh.
set -u
BIN=${TESSERA_BIN:?}/tessera
SRC=${TESSERA_SRC:?}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
WORK=$T
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"
source "$(dirname "${BASH_SOURCE[0]}")/../expect.bash"
source "$(dirname "${BASH_SOURCE[0]}")/../hostile.bash"
hostile_setup

# The tiny model with 512 tokens and the test SentencePiece tokenizer (as tests/mpi/sft_cli.sh).
$BIN init-model --preset tiny --seed 1 --out "$T/tiny" >/dev/null
python3 -c "
import json; c=json.load(open('$T/tiny/config.json')); c.update(vocab_size=512, bos_token_id=1, eos_token_id=2)
json.dump(c, open('$T/v512.json','w'))"
$BIN init-model --config "$T/v512.json" --out "$T/m" >/dev/null
cp "$SRC/tests/unit/fixtures/llama2-chat-test.model" "$T/m/tokenizer.model"
python3 -c 'import json, sys; json.dump({"bos_token": "<s>", "eos_token": "</s>",
  "chat_template": "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}"}, open(sys.argv[1], "w"))' "$T/m/tokenizer_config.json"

probe 2 "chat template $T/m/tokenizer_config.json line 1: nests deeper than 256 levels" 1024 \
  "${MPIRUN[@]}" -np 2 "$BIN" train --set model.path="$T/m" --set data.path="$SRC/examples/chat/train.jsonl" \
  --set data.seq_len=256 --set train.steps=2 --set log.dir="$T/log" --set checkpoint.dir="$T/ck"
n=$(grep -c "tessera: error: .*nests deeper than 256 levels" "$T/err")
[ "$n" -ge 1 ] && ok "the error line ($n on stderr under mpirun, one per rank at most)" || fail "no error line: $(cat "$T/err")"
[ ! -e "$T/ck" ] && ok "no checkpoint written" || fail "a refused run created $T/ck"
echo "$pass passed, 0 failed"
