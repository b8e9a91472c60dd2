#!/usr/bin/env bash
# The numerics guard and fp16 handling through `tessera train` under mpirun -np 2 (tiny preset):
#  1. an inf injected into rank 1's gradient at step 3 (test-only hook TESSERA_TEST_FAULT,
#     tests/support/fault_env.cpp): metrics.jsonl marks exactly step 3 skipped and counts it in every
#     later record, the progress line of step 3 says so, rank 0 warns once; the checkpoint of step 3
#     holds the same rank files' bytes of masters as step 2's (both ranks' shards);
#  2. train.max_skipped_steps 2 with infs at steps 4 and 5: every rank exits 2 with one line naming the
#     key; step-4 (saved after the first skip) is the last checkpoint, and it verifies; no step-5;
#  3. fsdp.mixed_precision fp16 on CPU: refused before anything runs, exit 2 on every rank, one line
#     naming the key and bf16; train.max_skipped_steps -1 is refused;
#  4. fsdp.reduce_dtype fp16 (a real fp16 gradient path on CPU): loss scale 65536 in every record,
#     halved after an injected inf.
set -euo pipefail
BIN=${TESSERA_BIN:?}/tessera-faults  # tessera with the test fault hook (tests/support/fault_env.cpp)
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"
source "$(dirname "${BASH_SOURCE[0]}")/../expect.bash"  # ok, fail, check, expect_error
COMMON=(--set model.preset=tiny --set data.seq_len=32 --set train.micro_batch=1 --set train.warmup_steps=1)
MPI2=("${MPIRUN[@]}" -np 2)
train() { local fault=$1; shift; "${MPI2[@]}" -x TESSERA_TEST_FAULT="$fault" "$BIN" train "${COMMON[@]}" "$@"; }  # train FAULT ARGS...
field() {  # field FILE KEY: KEY of every record, space-separated
  python3 -c "import json,sys; print(' '.join(json.dumps(json.loads(l).get(sys.argv[2])) for l in open(sys.argv[1])))" "$1" "$2"
}

# ---- 1. one injected inf: exactly that step skipped -------------------------------------------------
train inf-grad@1:3 --set train.steps=5 --set log.dir="$T/one" --set checkpoint.dir="$T/one/ck" \
  --set checkpoint.every=1 --set checkpoint.keep=10 >"$T/one.out" 2>"$T/one.err"
[[ $(field "$T/one/metrics.jsonl" skipped) == "false false true false false" ]] ||
  fail "skipped per step: $(field "$T/one/metrics.jsonl" skipped)"
[[ $(field "$T/one/metrics.jsonl" skipped_steps) == "0 0 1 1 1" ]] || fail "skipped_steps: $(field "$T/one/metrics.jsonl" skipped_steps)"
[[ $(field "$T/one/metrics.jsonl" grad_norm | cut -d' ' -f3) == null ]] || fail "step 3's grad_norm is not null (inf)"
ok "metrics.jsonl: step 3 skipped, counted in steps 3-5"
grep -q '^step 3/5 | .* | step skipped (1 in total)' "$T/one.out" || { cat "$T/one.out"; fail "progress line of step 3"; }
grep -q '^step 4/5 | .* | skipped 1 |' "$T/one.out" || { cat "$T/one.out"; fail "progress line of step 4"; }
[[ $(grep -c 'warning: step 3: non-finite gradient norm (inf); optimizer step skipped on every rank' "$T/one.err") == 1 ]] ||
  { cat "$T/one.err"; fail "no single warning for step 3"; }
ok "progress lines and one warning name the skipped step"
for r in 0 1; do
  f=rank-0000$r.bin
  cmp -s "$T/one/ck/step-2/$f" "$T/one/ck/step-3/$f" || fail "$f: step-3's shards differ from step-2's"
  cmp -s "$T/one/ck/step-3/$f" "$T/one/ck/step-4/$f" && fail "$f: step 4 did not update"
done
python3 - "$T/one/ck" <<'PY' || fail "checkpoint state after the skip"
import json, sys
st = [json.load(open(f"{sys.argv[1]}/step-{s}/manifest.json"))["state"] for s in (2, 3, 4)]
assert [s["optimizer"]["step_count"] for s in st] == [2, 2, 3], st
assert [s["numerics"]["skipped_steps"] for s in st] == [0, 1, 1], st
PY
ok "both ranks' checkpoint files of step 3 equal step 2's byte for byte; AdamW step count 2, 2, 3"

# ---- 2. train.max_skipped_steps ----------------------------------------------------------------------
WORK=$T
expect_error 2 "train.max_skipped_steps 2 reached: 2 optimizer steps in a row skipped (steps 4-5; last: non-finite gradient norm (inf)).*last checkpoint $T/lim/step-4" \
  "${MPI2[@]}" -x TESSERA_TEST_FAULT=inf-grad@1:4,inf-grad@1:5 "$BIN" train "${COMMON[@]}" --set train.steps=8 --set train.max_skipped_steps=2 \
  --set checkpoint.dir="$T/lim" --set checkpoint.every=1 --set checkpoint.keep=10
[[ -d $T/lim/step-4 && ! -e $T/lim/step-5 && ! -e $T/lim/step-5.tmp ]] || fail "checkpoints after the stop: $(ls "$T/lim")"
check "step-4 verifies" "$BIN" ckpt verify "$T/lim/step-4"
cmp -s "$T/lim/step-3/rank-00001.bin" "$T/lim/step-4/rank-00001.bin" || fail "step-4 is not step-3's state"

# ---- 3. fp16 compute on CPU, bad key values ----------------------------------------------------------
# LibTorch 2.x has an fp16 matmul on the CPU (1.13 has none): there the same run trains instead.
FP16=("${MPI2[@]}" "$BIN" train "${COMMON[@]}" --set train.steps=2 --set fsdp.mixed_precision=fp16 --set checkpoint.dir="$T/fp16")
if "${FP16[@]}" > "$T/fp16.out" 2>&1; then
  [[ -e $T/fp16/step-2 ]] || fail "fp16 on CPU exited 0 without its checkpoint: $(cat "$T/fp16.out")"
  ok "fsdp.mixed_precision fp16 trains on CPU with this LibTorch (it has an fp16 CPU matmul)"
else
  expect_error 2 "fsdp.mixed_precision fp16: .*Half.*; use fsdp.mixed_precision bf16" "${FP16[@]}"
  [[ ! -e $T/fp16/step-2 ]] || fail "the refused fp16 run saved a checkpoint"
fi
expect_error 2 "config key 'train.max_skipped_steps' must be >= 0, got -1" "${MPI2[@]}" "$BIN" train "${COMMON[@]}" --set train.max_skipped_steps=-1

# ---- 4. fp16 gradient reduction: the loss scale ------------------------------------------------------
train inf-grad@0:2 --set train.steps=4 --set fsdp.reduce_dtype=fp16 --set log.dir="$T/rd" >"$T/rd.out"
[[ $(field "$T/rd/metrics.jsonl" loss_scale) == "65536.0 65536.0 32768.0 32768.0" ]] ||
  fail "loss_scale per step: $(field "$T/rd/metrics.jsonl" loss_scale)"
[[ $(field "$T/rd/metrics.jsonl" skipped) == "false true false false" ]] || fail "fp16 skips: $(field "$T/rd/metrics.jsonl" skipped)"
grep -q '^step 2/4 | .* | scale 65536 | step skipped' "$T/rd.out" || { cat "$T/rd.out"; fail "fp16 progress line"; }
ok "fsdp.reduce_dtype fp16: loss scale 65536, halved by the skipped step 2"
echo "$pass passed, 0 failed"
