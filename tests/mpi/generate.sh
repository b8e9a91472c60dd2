#!/usr/bin/env bash
# `tessera generate` sharded, and samples during training (train.sample_every: written to
# samples.jsonl, equal to generate's from the same checkpoint, shown by `tessera report`, leaving the
# training bytes alone): a checkpoint trained under mpirun -np 2 is read directly (no
# consolidation) and gives the same tokens, greedy and seeded sampling, at 1, 2 and 4 ranks, with
# the layers re-gathered per token (full_shard) or kept gathered (shard_grad_op), and the same as its
# consolidated Hugging Face export. Bad input stops every rank with one line, exit 2: sampling
# values out of range, a prompt too long for the model's positions, ids outside the vocabulary, an
# empty prompt file, a messages prompt without a chat template, a checkpoint whose manifest or data
# does not verify.
set -uo pipefail
BIN=${TESSERA_BIN:?}/tessera
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"
source "$(dirname "${BASH_SOURCE[0]}")/../expect.bash"  # ok, fail, check, expect_error

# The checkpoint the tests read is trained with samples after every step (train.sample_every); a run
# without them must give the same checkpoint bytes and losses (sampling leaves training alone).
printf '{"prompt": "Hello"}\n{"messages": [{"role": "user", "content": "hi"}]}\n' > "$T/samples.jsonl"
TRAIN=("${MPIRUN[@]}" -np 2 $BIN train --set train.steps=2 --set data.seq_len=64 --set train.micro_batch=1
       --set train.lr=1e-2 --set checkpoint.every=2)
SAMPLES=(--set train.sample_every=1 --set train.sample_prompts="$T/samples.jsonl" --set train.sample_max_new_tokens=6)
"${TRAIN[@]}" --set checkpoint.dir="$T/ck" "${SAMPLES[@]}" > "$T/train.log" 2>&1 || { cat "$T/train.log"; fail "train"; }
"${TRAIN[@]}" --set checkpoint.dir="$T/ck0" > "$T/train0.log" 2>&1 || { cat "$T/train0.log"; fail "train without samples"; }
CK=$T/ck/step-2
for f in "$T"/ck0/step-2/rank-*.bin; do
  check "samples leave training alone: $(basename "$f") is the same bytes" cmp -s "$f" "$CK/$(basename "$f")"
done
losses() { python3 -c "import json,sys; print([json.loads(l)['loss'] for l in open(sys.argv[1])])" "$1"; }
check "samples leave training alone: the same losses" test "$(losses "$T/ck/metrics.jsonl")" = "$(losses "$T/ck0/metrics.jsonl")"
check "samples.jsonl: both prompts after steps 1 and 2, with the prompt's text" python3 -c "
import json; r = [json.loads(l) for l in open('$T/ck/samples.jsonl')]
assert [(x['step'], x['prompt']) for x in r] == [(1, 0), (1, 1), (2, 0), (2, 1)], r
assert all(1 <= len(x['generated_ids']) <= 6 and x['finish_reason'] in ('eos', 'length') for x in r), r
assert r[0]['prompt_text'].endswith('Hello') and r[1]['where'].endswith('samples.jsonl:2'), r[:2]"
check "the pause is counted per step (sample_s) and in the summary" python3 -c "
import json; r = [json.loads(l) for l in open('$T/ck/metrics.jsonl')]
assert all(x['sample_s'] > 0 for x in r) and all('sample_s' not in x['time'] for x in r), r"
check "the pause is printed" grep -q "samples after step 2: 2 answer(s), .* greedy, in $T/ck/samples.jsonl (a pause of" "$T/train.log"
check "the summary counts the pauses" grep -q "samples (train.sample_every): 2 pause(s)" "$T/train.log"
$BIN generate --checkpoint "$CK" --prompts "$T/samples.jsonl" --set data.chat_template=llama2 --max-new-tokens 6 \
  --json > "$T/after2.json" 2> "$T/err" || { cat "$T/err"; fail "generate the samples' prompts"; }
check "the samples after step 2 = tessera generate from the step-2 checkpoint (the same template)" python3 -c "
import json; s = [json.loads(l) for l in open('$T/ck/samples.jsonl')][2:]
g = [json.loads(l) for l in open('$T/after2.json')]
assert [x['generated_ids'] for x in s] == [x['generated_ids'] for x in g], (s, g)"
"${TRAIN[@]}" --set checkpoint.dir="$T/ck2" "${SAMPLES[@]}" --set train.sample_every=2 --set train.sample_temperature=1.5 \
  > "$T/train2.log" 2>&1 || { cat "$T/train2.log"; fail "train with sampled samples"; }
$BIN generate --checkpoint "$T/ck2/step-2" --prompts "$T/samples.jsonl" --set data.chat_template=llama2 --max-new-tokens 6 \
  --temperature 1.5 --seed 44 --json > "$T/sampled2.json" 2> "$T/err" || { cat "$T/err"; fail "generate sampled"; }
check "train.sample_temperature 1.5: the samples after step 2 = generate --temperature 1.5 --seed (train.seed 42 + 2)" python3 -c "
import json; s = [json.loads(l) for l in open('$T/ck2/samples.jsonl')]
g = [json.loads(l) for l in open('$T/sampled2.json')]
assert [x['step'] for x in s] == [2, 2] and [x['generated_ids'] for x in s] == [x['generated_ids'] for x in g], (s, g)"
check "the samples say they were sampled" grep -q "samples after step 2: 2 answer(s), .* sampled, in" "$T/train2.log"
$BIN report "$T/ck" > /dev/null 2> "$T/err" || { cat "$T/err"; fail "report"; }
check "the report shows the samples per prompt and step" python3 -c "
import html, json; page = open('$T/ck/report.html').read(); s = [json.loads(l) for l in open('$T/ck/samples.jsonl')]
assert 'Samples after steps' in page and 'Prompt 1 (' in page, 'no samples section'
assert all(html.escape(x['text'], quote=False) in page for x in s if x['text']), 'an answer is missing'"
WORK=$T
expect_error 2 "train.sample_every 1 needs train.sample_prompts" "${TRAIN[@]}" --set train.sample_every=1
expect_error 2 "train.sample_prompts $T/samples.jsonl needs train.sample_every" $BIN train --set train.steps=2 \
  --set train.sample_prompts="$T/samples.jsonl"
expect_error 2 "samples.jsonl:1: the prompt's 6 tokens + train.sample_max_new_tokens 510 = 516 exceed the model's max_position_embeddings 512" \
  "${TRAIN[@]}" --set checkpoint.dir="$T/ck1" "${SAMPLES[@]}" --set train.sample_max_new_tokens=510
printf '256 72 101 108 108 111\n256 7 300 2\n' > "$T/prompts.txt"
ids() { python3 -c "import json,sys; print([json.loads(l)['generated_ids'] for l in open(sys.argv[1])])" "$1"; }

run() {  # NP OUT ARGS...: generate at NP ranks (1: no mpirun) into OUT
  local np=$1 out=$2; shift 2
  local cmd=($BIN generate --prompt-ids "$T/prompts.txt" --max-new-tokens 10 --json "$@")
  if [ "$np" = 1 ]; then "${cmd[@]}" > "$out" 2> "$T/err"; else "${MPIRUN[@]}" -np "$np" "${cmd[@]}" > "$out" 2> "$T/err"; fi ||
    { cat "$T/err"; fail "generate at $np rank(s): $*"; }
}
SAMPLE=(--temperature 1.2 --top-k 40 --top-p 0.9 --seed 5)
for np in 1 2 4; do
  run $np "$T/greedy.$np" --checkpoint "$CK"
  run $np "$T/sample.$np" --checkpoint "$CK" "${SAMPLE[@]}"
done
check "rank 0 alone prints: one JSON line per prompt" test "$(wc -l < "$T/greedy.2")" = 2
for np in 2 4; do
  check "greedy tokens from the checkpoint at $np ranks = at 1 rank" test "$(ids "$T/greedy.$np")" = "$(ids "$T/greedy.1")"
  check "seeded sampling at $np ranks = at 1 rank" test "$(ids "$T/sample.$np")" = "$(ids "$T/sample.1")"
done
check "sampling differs from greedy" test "$(ids "$T/sample.1")" != "$(ids "$T/greedy.1")"
run 2 "$T/kept" --checkpoint "$CK" --set fsdp.strategy=shard_grad_op
check "layers kept gathered (shard_grad_op) give the same tokens" test "$(ids "$T/kept")" = "$(ids "$T/greedy.1")"
check "the strategy is printed" grep -q "shard_grad_op (decoder layers stay gathered between tokens)" "$T/err"
$BIN ckpt consolidate --checkpoint "$CK" --out "$T/export" --dtype fp32 > /dev/null || fail "consolidate"
run 1 "$T/export.1" --model "$T/export"
check "the consolidated export generates the checkpoint's tokens" test "$(ids "$T/export.1")" = "$(ids "$T/greedy.1")"

# bench generate at 2 ranks: every rate measured, the same tokens re-gathered and kept (it checks).
"${MPIRUN[@]}" -np 2 $BIN bench generate --preset tiny --prompt-len 8 --new-tokens 4 --recompute-tokens 2 --rounds 1 \
  --json > "$T/bench.json" 2> "$T/err" || { cat "$T/err"; fail "bench generate"; }
check "bench generate reports prefill, decode and recompute rates and their ratios" python3 -c "
import json; b = json.load(open('$T/bench.json'))
assert b['world_size'] == 2 and all(b[k] > 0 for k in ('prefill_tokens_per_s', 'decode_tokens_per_s',
  'decode_kept_gathered_tokens_per_s', 'recompute_tokens_per_s', 'kv_over_recompute', 'kept_over_regathered')), b"

# ---- bad input: one line, exit 2, every rank ------------------------------------------------------
WORK=$T
G=("${MPIRUN[@]}" -np 2 $BIN generate --checkpoint "$CK")
expect_error 2 "--top-p 0 must be in (0, 1\]" "${G[@]}" --prompt-ids "$T/prompts.txt" --top-p 0
G1=($BIN generate --checkpoint "$CK")  # the same checks alone (quicker)
expect_error 2 "--top-p 1.5 must be in (0, 1\]" "${G1[@]}" --prompt-ids "$T/prompts.txt" --top-p 1.5
expect_error 2 "--top-k -1 must be >= 0" "${G1[@]}" --prompt-ids "$T/prompts.txt" --top-k=-1
expect_error 2 "--temperature -0.5 must be >= 0" "${G1[@]}" --prompt-ids "$T/prompts.txt" --temperature=-0.5
expect_error 2 "--max-new-tokens 0 must be >= 1" "${G1[@]}" --prompt-ids "$T/prompts.txt" --max-new-tokens 0
expect_error 2 "prompts.txt sequence 1: the prompt's 6 tokens + --max-new-tokens 507 = 513 exceed the model's max_position_embeddings 512" \
  "${G[@]}" --prompt-ids "$T/prompts.txt" --max-new-tokens 507
printf '256 1 2\n256 320\n' > "$T/outside.txt"
expect_error 2 "outside.txt:2: token id 320 is outside the vocabulary \[0, 320)" "${G[@]}" --prompt-ids "$T/outside.txt"
: > "$T/empty.jsonl"
expect_error 2 "--prompts $T/empty.jsonl holds no prompt" "${G[@]}" --prompts "$T/empty.jsonl"
echo '{"messages": [{"role": "user", "content": "hi"}]}' > "$T/chat.jsonl"
expect_error 2 "chat.jsonl:1: a \"messages\" prompt, and the model's tokenizer has no chat template" \
  "${G[@]}" --prompts "$T/chat.jsonl"
cp -r "$CK" "$T/bad"
python3 - "$T/bad" <<'PY'
import glob, sys
f = sorted(glob.glob(sys.argv[1] + "/rank-*.bin"))[0]
data = bytearray(open(f, "rb").read())
data[len(data) // 2] ^= 0xFF
open(f, "wb").write(bytes(data))
PY
expect_error 2 "checksum mismatch in checkpoint file $T/bad/rank-" "${MPIRUN[@]}" -np 2 $BIN generate --checkpoint "$T/bad" \
  --prompt-ids "$T/prompts.txt"
head -c 100 "$CK/manifest.json" > "$T/bad/manifest.json"
expect_error 2 "$T/bad/manifest.json" "${MPIRUN[@]}" -np 2 $BIN generate --checkpoint "$T/bad" --prompt-ids "$T/prompts.txt"
echo "$pass passed, 0 failed"
