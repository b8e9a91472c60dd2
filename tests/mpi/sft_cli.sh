#!/usr/bin/env bash
# Fine-tuning as users do it, end to end through the real CLI under real mpirun:
#  - loss masking: prompts random, completions one fixed string -> with train_on=completion the loss
#    goes to ~0, with train_on=all it cannot (the random prompt tokens stay unpredictable);
#    target_tokens in metrics.jsonl is the step's exact number of completion tokens;
#  - validation (data.val_path / data.val_fraction, eval.every, end of run), val_loss and perplexity
#    in metrics.jsonl and the progress line; checkpoint.keep_best keeps the best beside the last K;
#  - docs/DATA.md's chat example (examples/chat) trains with masking and validation and writes report.html;
#  - tokenizer safety: the model directory's tokenizer.model is used (also when only rank 0 sees it),
#    bytes only when asked or for a byte-vocabulary model, else exit 2 naming the vocab size and the fix;
#  - bad records are dropped with one line each naming file and line, the count printed; exit 2 when
#    nothing trainable remains; data.truncation; data.packing; data.chat_template.
set -euo pipefail
BIN=${TESSERA_BIN:?}/tessera
SRC=${TESSERA_SRC:?}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"
source "$(dirname "${BASH_SOURCE[0]}")/../expect.bash"  # ok, fail, check, expect_error
last() { python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).readlines()[-1])[sys.argv[2]])" "$1" "$2"; }

# ---- 1. loss masking -----------------------------------------------------------------------------
python3 - "$T/mask.jsonl" <<'PY'
import json, random, sys
rng = random.Random(5)
with open(sys.argv[1], "w") as f:
    for _ in range(400):
        prompt = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(24))
        f.write(json.dumps({"prompt": prompt, "completion": " The answer is always forty-two."}) + "\n")
PY
MASK=(--set data.path="$T/mask.jsonl" --set data.seq_len=128 --set train.steps=40 --set train.micro_batch=4
      --set train.lr=3e-3 --set train.min_lr=1e-3 --set train.warmup_steps=5 --set log.every=20)
"${MPIRUN[@]}" -np 2 $BIN train "${MASK[@]}" --set log.dir="$T/completion" > "$T/completion.log"
"${MPIRUN[@]}" -np 2 $BIN train "${MASK[@]}" --set data.train_on=all --set log.dir="$T/all" > "$T/all.log"
c=$(last "$T/completion/metrics.jsonl" loss); a=$(last "$T/all/metrics.jsonl" loss)
echo "final loss: train_on=completion $c, train_on=all $a"
check "masked loss goes to near zero ($c)" python3 -c "import sys; sys.exit(not float('$c') < 0.05)"
check "unmasked loss cannot ($a)" python3 -c "import sys; sys.exit(not float('$a') > 1.0)"
# Every row packs two examples (BOS + 24 + 32 + EOS = 58 tokens each); 8 rows per step; each
# example's targets are the 32 completion characters and EOS.
check "target_tokens = 8 rows x 2 examples x 33" python3 -c "
import json,sys
r=[json.loads(l) for l in open('$T/completion/metrics.jsonl')]
assert all(x['target_tokens']==528 for x in r), [x['target_tokens'] for x in r][:5]"
check "train_on=all counts every token after an example's first" python3 -c "
import json; r=json.loads(open('$T/all/metrics.jsonl').readline()); assert r['target_tokens']==8*2*57, r"

# ---- 2. validation and keep_best -----------------------------------------------------------------
# Train on completions of A, validate on completions of B: validation improves first, then worsens
# as the model commits to A, so the best checkpoint is not the last one.
python3 - "$T" <<'PY'
import json, sys
for name, c in (("a.jsonl", "A" * 20), ("b.jsonl", "B" * 20)):
    with open(sys.argv[1] + "/" + name, "w") as f:
        for i in range(64):
            f.write(json.dumps({"prompt": "item %d:" % i, "completion": c}) + "\n")
PY
"${MPIRUN[@]}" -np 2 $BIN train --set data.path="$T/a.jsonl" --set data.val_path="$T/b.jsonl" --set data.seq_len=64 \
  --set train.steps=12 --set train.lr=1e-2 --set train.warmup_steps=1 --set eval.every=3 --set log.every=100 \
  --set checkpoint.dir="$T/ck" --set checkpoint.keep=1 --set checkpoint.keep_best=true > "$T/val.log"
check "val_loss, val_ppl at steps 3, 6, 9, 12 only" python3 -c "
import json, math
r=[json.loads(l) for l in open('$T/ck/metrics.jsonl')]
ev=[x['step'] for x in r if 'val_loss' in x]
assert ev==[3,6,9,12], ev
assert all(abs(x['val_ppl']-math.exp(x['val_loss']))<1e-6*x['val_ppl'] and x['val_tokens']==64*21 for x in r if 'val_loss' in x)"
check "progress line shows the validation loss" grep -qE "^step 3/12 \| loss [0-9.]+ \| val [0-9.]+ \(ppl [0-9.]+\)" "$T/val.log"
best=$(python3 -c "
import json; r=[json.loads(l) for l in open('$T/ck/metrics.jsonl') if 'val_loss' in l]
print(min(r, key=lambda x: x['val_loss'])['step'])")
echo "best validation step: $best; checkpoints: $(ls "$T/ck" | grep step- | tr '\n' ' ')"
check "the best checkpoint is not the last (the test's premise)" test "$best" -ne 12
check "keep_best keeps step-$best beside the last 1" test "$(ls -d "$T"/ck/step-* | xargs -n1 basename | sort | tr '\n' ' ')" = "step-12 step-$best "
check "its manifest names it the best" python3 -c "
import json; s=json.load(open('$T/ck/step-12/manifest.json'))['state']; assert s['best']['step']==$best, s['best']"
grep -q "best val_loss .* at step $best" "$T/val.log" && ok "done line names the best step"
# data.val_fraction holds out part of data.path; without eval.every validation runs at the end only.
"${MPIRUN[@]}" -np 2 $BIN train --set data.path="$SRC/examples/chat/train.jsonl" --set data.val_fraction=0.1 \
  --set data.seq_len=256 --set train.steps=4 --set log.dir="$T/frac" > "$T/frac.log"
check "val_fraction: validation at the end" python3 -c "
import json; r=[json.loads(l) for l in open('$T/frac/metrics.jsonl')]; assert [x['step'] for x in r if 'val_loss' in x]==[4]"
check "banner names the validation split" grep -q "validation .* examples" "$T/frac.log"

# ---- 3. docs/DATA.md's chat example -------------------------------------------------------------
$BIN init-model --preset tiny --seed 1 --out "$T/chatmodel" > /dev/null
"${MPIRUN[@]}" -np 2 $BIN train --config "$SRC/examples/chat/run.json" --set model.path="$T/chatmodel" \
  --set data.path="$SRC/examples/chat/train.jsonl" --set data.val_path="$SRC/examples/chat/val.jsonl" \
  --set log.dir="$T/chat" --set checkpoint.dir="$T/chat/checkpoints" --set train.steps=10 --set eval.every=5 > "$T/chat.log"
cat "$T/chat.log"
check "example: report written at the end of training" test -s "$T/chat/report.html"
check "example: run_info.json has config and topology" python3 -c "
import json; i=json.load(open('$T/chat/run_info.json')); assert i['topology']['world_size']==2 and i['config']['data']['chat_template']=='llama2'"
check "example: validation at 5 and 10" python3 -c "
import json; r=[json.loads(l) for l in open('$T/chat/metrics.jsonl')]; assert [x['step'] for x in r if 'val_loss' in x]==[5,10]"

# ---- 4. tokenizer safety -------------------------------------------------------------------------
expect_error 2 "model preset small (vocab_size 32000) is a preset without a tokenizer: set data.tokenizer" \
  $BIN train --set model.preset=small --set train.steps=1
python3 -c "
import json; c=json.load(open('$T/chatmodel/config.json')); c.update(vocab_size=512, bos_token_id=1, eos_token_id=2)
json.dump(c, open('$T/v512.json','w'))"
$BIN init-model --config "$T/v512.json" --out "$T/m512" > /dev/null
expect_error 2 "$T/m512 (vocab_size 512) has no tokenizer.model or tokenizer.json in its directory: set data.tokenizer" \
  "${MPIRUN[@]}" -np 2 $BIN train --set model.path="$T/m512" --set train.steps=1 --set data.path="$SRC/examples/chat/train.jsonl" --set data.seq_len=256
"${MPIRUN[@]}" -np 2 $BIN train --set model.path="$T/m512" --set train.steps=1 --set data.tokenizer=bytes \
  --set data.path="$SRC/examples/chat/train.jsonl" --set data.seq_len=256 > "$T/bytes.log"
check "data.tokenizer=bytes is honoured" grep -q "tokenizer byte" "$T/bytes.log"
cp "$SRC/tests/unit/fixtures/llama2-chat-test.model" "$T/m512/tokenizer.model"
"${MPIRUN[@]}" -np 2 $BIN train --set model.path="$T/m512" --set train.steps=2 --set data.path="$SRC/examples/chat/train.jsonl" --set data.seq_len=256 \
  --set log.dir="$T/sp" > "$T/sp.log"
check "the model directory's tokenizer.model is used" grep -q "tokenizer sentencepiece:$T/m512/tokenizer.model" "$T/sp.log"
# model.load=rank0 with the model (and its tokenizer.model) on rank 0's disk only: broadcast.
mkdir -p "$T/r0" "$T/r1" && cp -r "$T/m512" "$T/r0/m"
R0=(train --set model.path=m --set train.steps=2 --set data.path="$SRC/examples/chat/train.jsonl" --set data.seq_len=256 --set log.dir="$T/r0log")
# Each rank in its own folder: a shell per rank, not mpirun's MPMD "A : B" (Open MPI 5.0.7's launcher
# segfaults on any MPMD line: open-mpi/ompi#13303).
"${MPIRUN[@]}" -np 2 bash -c 'cd "$0/r$OMPI_COMM_WORLD_RANK" && exec "$@"' "$T" $BIN "${R0[@]}" > "$T/r0.log"
check "rank0 load: the tokenizer reaches the rank without the model" test "$(wc -l < "$T/r0log/metrics.jsonl")" -eq 2
check "same losses as when every rank reads it" test "$(last "$T/r0log/metrics.jsonl" loss)" = "$(last "$T/sp/metrics.jsonl" loss)"
# With a chat template beside the tokenizer on rank 0's disk only, rank 1 cannot render it: refused,
# not rendered with llama2 there (it was, before the choice carried the tokenizer_config.json).
echo '{"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"}' > "$T/r0/m/tokenizer_config.json"
expect_error 2 "rank 1: data.chat_template auto: m/tokenizer_config.json (beside the tokenizer) is not visible on this rank" \
  "${MPIRUN[@]}" -np 2 bash -c 'cd "$0/r$OMPI_COMM_WORLD_RANK" && exec "$@"' "$T" $BIN "${R0[@]}"
rm "$T/r0/m/tokenizer_config.json"
expect_error 2 "has a vocab of 420 tokens, more than the model's vocab_size 320" \
  $BIN train --set data.tokenizer="$SRC/tests/unit/fixtures/llama2-chat-test.model" --set train.steps=1
$BIN tokenize --input "$SRC/examples/chat/val.jsonl" --tokenizer "$SRC/tests/unit/fixtures/llama2-chat-test.model" --out "$T/sp420.bin" > /dev/null
expect_error 2 "token file $T/sp420.bin was written with a vocab of 420, but the tokenizer byte has a vocab of 258" \
  $BIN train --set data.path="$T/sp420.bin" --set train.steps=1

# ---- 5. bad records ------------------------------------------------------------------------------
python3 - "$T/bad.jsonl" <<'PY'
import json, sys
good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]}
lines = [json.dumps(good),
         '{"messages": [',                                                                   # 2 invalid JSON
         json.dumps({"messages": [{"role": "robot", "content": "x"}]}),                      # 3 unknown role
         json.dumps({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}),  # 4
         json.dumps({"messages": [{"role": "user", "content": "question only"}]}),           # 5 no targets
         json.dumps({"prompt": "p" * 300, "completion": "c"}),                              # 6 too long
         json.dumps(good)]
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
PY
$BIN train --set data.path="$T/bad.jsonl" --set data.seq_len=64 --set train.steps=1 --set train.micro_batch=1 > "$T/bad.out" 2> "$T/bad.err"
cat "$T/bad.err"
for want in ":2: dropped (invalid JSON" ":3: dropped (message 1 has unknown role \"robot\"" ":4: dropped (message 2 is \"user\"" \
            ":5: dropped (no target tokens" ":6: dropped (example of 303 tokens is longer than data.seq_len + 1 = 65"; do
  check "warning $want" grep -qF "tessera: warning: $T/bad.jsonl$want" "$T/bad.err"
done
check "the count of dropped examples is printed" grep -qF "4 of 7 examples dropped (1 invalid JSON, 1 no target tokens, 1 roles do not alternate, 1 unknown role)" "$T/bad.out"
check "and the over-long one" grep -qF "1 of 3 examples dropped (1 too long)" "$T/bad.out"
$BIN train --set data.path="$T/bad.jsonl" --set data.seq_len=64 --set data.truncation=left --set train.steps=1 --set train.micro_batch=1 > "$T/left.out"
check "truncation=left keeps the over-long example" grep -q "3 examples" "$T/left.out"
expect_error 2 "$T/bad.jsonl:6: example of 303 tokens is longer than data.seq_len + 1 = 65 (data.truncation = error" \
  "${MPIRUN[@]}" -np 2 $BIN train --set data.path="$T/bad.jsonl" --set data.seq_len=64 --set data.truncation=error --set checkpoint.dir="$T/nock"
check "nothing written on error" test ! -e "$T/nock"
sed -n '2,5p' "$T/bad.jsonl" > "$T/allbad.jsonl"
expect_error 2 "data.path $T/allbad.jsonl holds no trainable example (4 of 4 examples dropped" \
  "${MPIRUN[@]}" -np 2 $BIN train --set data.path="$T/allbad.jsonl"
expect_error 2 "data.val_path and data.val_fraction are both set" \
  $BIN train --set data.val_path="$T/bad.jsonl" --set data.val_fraction=0.1
expect_error 2 "eval.every is 5 but there is no validation data" $BIN train --set eval.every=5
expect_error 2 "checkpoint.keep_best needs validation data" $BIN train --set checkpoint.keep_best=true

# ---- 6. packing and chat template choices show in the data summary --------------------------------
summary() { $BIN train --set data.path="$SRC/examples/chat/train.jsonl" --set data.seq_len=256 --set train.steps=1 "$@" > "$T/summary"; grep -m1 '^tessera train:' "$T/summary"; }
packed=$(summary); padded=$(summary --set data.packing=false); none=$(summary --set data.chat_template=none)
echo "$packed"; echo "$padded"; echo "$none"
rows=$(sed -E 's/.*in 600 examples -> ([0-9]+) sequences of 256, packed.*/\1/' <<< "$packed")
check "packing: about two examples per sequence ($rows)" test "$rows" -lt 400
check "packing=false: one padded sequence per example" grep -qF "in 600 examples -> 600 sequences of 256, padded" <<< "$padded"
tok() { sed -E 's/.*\(([0-9]+) tokens in.*/\1/' <<< "$1"; }
check "chat_template=none renders fewer tokens than llama2" test "$(tok "$none")" -lt "$(tok "$packed")"
echo "$pass passed, 0 failed"
