#!/usr/bin/env bash
# Resume under faults, end to end through `tessera train` under mpirun (tiny preset, constant LR,
# a token file as data; a few seconds per run):
#  1. a flipped byte in the newest checkpoint's rank file: checkpoint.resume=auto skips it in one line
#     naming the file and the tensor, resumes the one before, and ends byte-identical to an
#     uninterrupted run; the damaged checkpoint moves to retired/ (kept, still damaged);
#     the same for the final checkpoint (at train.steps), damaged after the run ended: it is
#     verified, skipped, and the last steps are trained again;
#  2. a newest manifest cut in half: skipped, naming the manifest; every checkpoint damaged: exit 2,
#     one line, nothing changed on disk;
#  3. checkpoint.dir on a small tmpfs filled during a save: exit 2, one line naming the path and the
#     bytes needed; the previous checkpoint stays complete and verifies (skipped if mounting fails);
#  4. the token file truncated under the running job: exit 2, one line per rank naming the file;
#  5. elastic resume 4 -> 2 ranks: train.grad_accum 1 -> 2 keeps the global batch; the loss stays
#     within 1e-4 (relative, each step) of the uninterrupted 4-rank run, and the final state equals
#     the same resharding done by hand (--set train.grad_accum=2) byte for byte;
#  6. refused in one line, exit 2: 3 ranks (no whole grad_accum keeps a global batch of 8 at
#     micro_batch 2), hybrid_shard on one node.
set -euo pipefail
BIN=${TESSERA_BIN:?}/tessera
T=$(mktemp -d); MNT=$T/small
cleanup() { umount -l "$MNT" 2>/dev/null || true; rm -rf "$T"; }
trap cleanup EXIT
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"
WORK=$T source "$(dirname "${BASH_SOURCE[0]}")/../expect.bash"
"$BIN" tokenize --input /usr/share/common-licenses --out "$T/train.bin" >/dev/null
COMMON=(--set model.preset=tiny --set data.seq_len=32 --set train.micro_batch=2 --set train.warmup_steps=1
        --set train.schedule=constant --set log.every=1000 --set data.path="$T/train.bin" --set checkpoint.keep=5
        --set checkpoint.every=2)
train() { local np=$1; shift; "${MPIRUN[@]}" -np "$np" "$BIN" train "${COMMON[@]}" "$@"; }
refused() { local want=$1 np=$2; shift 2; expect_error 2 "$want" "${MPIRUN[@]}" -np "$np" "$BIN" train "${COMMON[@]}" "$@"; }
flip() { python3 -c "import sys; f=open(sys.argv[1],'r+b'); f.seek(int(sys.argv[2])); b=f.read(1); f.seek(int(sys.argv[2])); f.write(bytes([b[0]^16]))" "$@"; }
same_state() {  # same_state A B: rank files byte-identical, same step, data order and optimizer state
  local f; for f in "$1"/*.bin; do cmp -s "$f" "$2/${f##*/}" || return 1; done
  [[ $(position "$1") == $(position "$2") ]]
}
# The data position is the step (the sampler is a pure function of it; its saved cursor, state.sampler.step,
# is the run's starting step, so it is left out) with the sampler's seed, order and global batch.
position() {
  python3 -c "import json,sys; s=json.load(open(sys.argv[1]+'/manifest.json'))['state']
print(s['step'], s['optimizer'], s.get('numerics'), {k: v for k, v in s['sampler'].items() if k not in ('step', 'epoch', 'step_in_epoch')})" "$1"
}

# ---- 1. flipped byte ---------------------------------------------------------------------------
train 2 --set train.steps=8 --set checkpoint.dir="$T/ref" >"$T/ref.log"
train 2 --set train.steps=4 --set checkpoint.dir="$T/ck" >/dev/null
flip "$T/ck/step-4/rank-00001.bin" 5000
cp "$T/ck/step-4/rank-00001.bin" "$T/damaged.bin"
train 2 --set train.steps=8 --set checkpoint.dir="$T/ck" >"$T/r1.log" 2>"$T/r1.err"
grep -q "^tessera: checkpoint $T/ck/step-4 is damaged and skipped: checksum mismatch in checkpoint file $T/ck/step-4/rank-00001.bin: .*; tensor [a-z_.0-9]* .*elements \[.*differ from what was saved); resuming from $T/ck/step-2 instead$" "$T/r1.err" ||
  fail "no skip line naming the file and the tensor: $(cat "$T/r1.err")"
grep -q "^resumed from $T/ck/step-2 at step 2$" "$T/r1.log" || fail "did not resume step-2: $(cat "$T/r1.log")"
ok "a flipped byte in step-4: skipped in one line (file and tensor), resumed from step-2"
check "final state byte-identical to the uninterrupted run" same_state "$T/ref/step-8" "$T/ck/step-8"
check "the damaged step-4 is kept in retired/, unchanged" cmp -s "$T/damaged.bin" "$T/ck/retired/step-4/rank-00001.bin"
# The final checkpoint damaged after the run: verified before the run is called finished, skipped,
# and the last steps trained again (--resume naming it: refused, exit 2, naming the file).
flip "$T/ck/step-8/rank-00000.bin" 7000
refused "checksum mismatch in checkpoint file $T/ck/step-8/rank-00000.bin" 2 --set train.steps=8 --resume "$T/ck/step-8"
train 2 --set train.steps=8 --set checkpoint.dir="$T/ck" >"$T/r8.log" 2>"$T/r8.err"
grep -q "^tessera: checkpoint $T/ck/step-8 is damaged and skipped: checksum mismatch in checkpoint file $T/ck/step-8/rank-00000.bin: .*; resuming from $T/ck/step-6 instead$" "$T/r8.err" ||
  fail "the damaged final checkpoint was not skipped: $(cat "$T/r8.err" "$T/r8.log")"
grep -q "^done: steps 6 -> 8" "$T/r8.log" || fail "steps 7-8 were not trained again: $(cat "$T/r8.log")"
ok "a flipped byte in the final step-8: skipped, steps 7-8 trained again"
check "final state byte-identical to the uninterrupted run again" same_state "$T/ref/step-8" "$T/ck/step-8"
check "the damaged step-8 is kept in retired/" test -f "$T/ck/retired/step-8/rank-00000.bin"

# ---- 2. truncated manifest; every checkpoint damaged ---------------------------------------------
m=$T/ck/step-8/manifest.json
truncate -s $(($(stat -c %s "$m") / 2)) "$m"
train 2 --set train.steps=10 --set checkpoint.dir="$T/ck" >"$T/r2.log" 2>"$T/r2.err"
grep -q "^tessera: checkpoint $T/ck/step-8 is damaged and skipped: malformed manifest $m: .*; resuming from $T/ck/step-6 instead$" "$T/r2.err" ||
  fail "no skip line naming the manifest: $(cat "$T/r2.err")"
ok "a manifest cut in half: skipped in one line naming it, resumed from step-6"
for d in "$T/ck"/step-*; do truncate -s 10 "$d/manifest.json"; done
before=$(cd "$T/ck" && find . -type f -exec md5sum {} + | sort)
refused "every checkpoint in checkpoint.dir $T/ck is damaged (said above); nothing was changed: to start over, pass --fresh" \
  2 --set train.steps=12 --set checkpoint.dir="$T/ck"
[[ $(cd "$T/ck" && find . -type f -exec md5sum {} + | sort) == "$before" ]] || fail "files changed after the refusal"
ok "nothing on disk changed"

# ---- 3. full disk during a save -------------------------------------------------------------------
mkdir -p "$MNT"
if mount -t tmpfs -o size=16m tmpfs "$MNT" 2>/dev/null; then
  train 2 --set train.steps=2 --set checkpoint.dir="$MNT/ck" >/dev/null  # 5.3 MB
  fallocate -l $(($(stat -f -c '%a*%S' "$MNT") - 400000)) "$MNT/filler"
  refused "checkpoint step-4 does not fit in checkpoint.dir $MNT/ck: cannot allocate [0-9]* bytes for $MNT/ck/step-4.tmp/rank-0000[01].bin: No space left on device ([0-9]* bytes free); the whole checkpoint needs [0-9]* bytes; the previous checkpoint $MNT/ck/step-2 is kept" \
    2 --set train.steps=6 --set checkpoint.dir="$MNT/ck"
  "$BIN" ckpt verify "$MNT/ck/step-2" >/dev/null || fail "step-2 does not verify after the full disk"
  [[ $(ls "$MNT/ck" | grep -c tmp) == 0 && $(cat "$MNT/ck/latest") == step-2 ]] || fail "left: $(ls "$MNT/ck"), latest $(cat "$MNT/ck/latest")"
  ok "the previous checkpoint verifies and is still the latest; no step-4.tmp left"
  umount -l "$MNT"
else
  echo "SKIP: full disk (cannot mount a tmpfs here: needs root)"
fi

# ---- 4. data truncated under the run ------------------------------------------------------------
cp "$T/train.bin" "$T/data.bin"
rc=0
{ train 2 --set train.steps=100000 --set data.path="$T/data.bin" >"$T/d.log" 2>"$T/d.err" || rc=$?; } &
pid=$!
for _ in $(seq 300); do [[ -s $T/d.log ]] && grep -q "^MFU" "$T/d.log" && break; sleep 0.1; done
sleep 1
truncate -s 100000 "$T/data.bin"
wait $pid || rc=$?
rc=$(grep -c "^tessera: rank [01] ([^)]*): file $T/data.bin can no longer be read at byte [0-9]* (SIGBUS: it was truncated, replaced in place or its storage failed while this rank had it mapped); restore it and resume$" "$T/d.err" || true)
[[ $rc -ge 1 ]] || fail "no line naming the truncated data file: $(cat "$T/d.err")"
grep -q "Exit code: *2" "$T/d.err" || fail "the run did not exit with 2: $(tail -5 "$T/d.err")"
ok "data truncated under the run: exit 2, $rc rank(s) named the file"

# ---- 5. elastic resume 4 -> 2 ranks -------------------------------------------------------------
train 4 --set train.steps=12 --set log.dir="$T/e4log" --set checkpoint.dir="$T/e4" >/dev/null
train 4 --set train.steps=6 --set checkpoint.dir="$T/el" >/dev/null
cp -r "$T/el" "$T/hand"
train 2 --set train.steps=12 --set checkpoint.dir="$T/el" >"$T/el.log"
grep -q "^tessera: resuming $T/el/step-6 (saved by 4 ranks) on 2 ranks: train.grad_accum 1 -> 2 keeps the global batch of 8 sequences (micro_batch 2 x grad_accum 2 x 2 ranks)$" "$T/el.log" ||
  fail "no grad_accum line: $(cat "$T/el.log")"
train 2 --set train.steps=12 --set checkpoint.dir="$T/hand" --set train.grad_accum=2 >"$T/hand.log"
grep -q "grad_accum 1 -> 2" "$T/hand.log" && fail "by hand, grad_accum was changed again"
check "elastic 4 -> 2 equals the resharding by hand byte for byte" same_state "$T/hand/step-12" "$T/el/step-12"
gap=$(python3 -c "
import json, sys
load = lambda p: {r['step']: r['loss'] for r in map(json.loads, open(p))}
a, b = load(sys.argv[1]), load(sys.argv[2])
print(max(abs(b[s] - a[s]) / abs(a[s]) for s in b if s > 6))" "$T/e4log/metrics.jsonl" "$T/el/metrics.jsonl")
python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) <= 1e-4 else 1)" "$gap" || fail "loss after 4 -> 2 differs by $gap (relative) from the 4-rank run"
ok "loss after 4 -> 2 within 1e-4 of the uninterrupted 4-rank run (largest relative gap $gap)"

# ---- 6. refusals ---------------------------------------------------------------------------------
refused "cannot resume $T/el/step-12 on 3 ranks: it was trained by 2 ranks with a global batch of 8 sequences, which is not a multiple of 3 ranks x train.micro_batch 2" \
  3 --set train.steps=14 --set checkpoint.dir="$T/el"
refused "fsdp.strategy hybrid_shard on 1 node (2 ranks) replicates nothing" \
  2 --set train.steps=14 --set checkpoint.dir="$T/el" --set fsdp.strategy=hybrid_shard
echo "$pass passed, 0 failed"
