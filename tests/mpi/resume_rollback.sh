#!/usr/bin/env bash
# Resume picks the latest checkpoint of THIS run after a rollback (runtime/checkpoint/checkpoint.h,
# begin_lineage), end to end through `tessera train` under mpirun -np 2 (tiny preset):
#  1. a run saves step-2, step-4, step-6;
#  2. `--resume ck/step-2` ends before it saves anything (its step 3 stops the run: an injected inf
#     gradient with train.max_skipped_steps 1, exit 2): `auto` now resumes from step-2, not from the
#     stale step-6;
#  3. `--resume ck/step-2` to step 4 with another learning rate: its step-4 replaces the stale run's
#     step-4 and step-6, which move to ck/retired/ intact (they still verify, nothing deleted);
#  4. `auto` to step 6 resumes from the new step-4, not from the retired step-6.
set -euo pipefail
BIN=${TESSERA_BIN:?}/tessera-faults  # tessera with the test fault hook (runtime/train/test_fault.h)
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"
CK=$T/ck
COMMON=(--set model.preset=tiny --set data.seq_len=32 --set train.micro_batch=1 --set train.warmup_steps=1
        --set log.every=100 --set checkpoint.dir="$CK" --set checkpoint.keep=5)
source "$(dirname "${BASH_SOURCE[0]}")/../expect.bash"  # ok, fail
on_fail() { ls -R "$CK"; }
train() { "${MPIRUN[@]}" -np 2 "$BIN" train "${COMMON[@]}" "$@"; }
# A run that resumes and stops at step 3 before saving anything (exit 2).
stopped_at_3() {
  local rc=0
  "${MPIRUN[@]}" -np 2 -x TESSERA_TEST_FAULT=inf-grad@0:3 "$BIN" train "${COMMON[@]}" --set train.steps=4 \
    --set train.max_skipped_steps=1 "$@" || rc=$?
  [[ $rc == 2 ]] || fail "the run stopped at step 3 exited $rc, not 2"
}

train --set train.steps=6 --set checkpoint.every=2 >"$T/run1.log"
for s in 2 4 6; do [[ -f $CK/step-$s/manifest.json ]] || fail "run 1 wrote no step-$s"; done
cp "$CK/step-6/rank-00000.bin" "$T/old-step-6.bin"
ok "run 1 saved step-2, step-4, step-6"

stopped_at_3 --resume "$CK/step-2" >"$T/run2.log" 2>&1
grep -q "resumed from $CK/step-2 at step 2" "$T/run2.log" || fail "run 2 did not resume from step-2"
[[ -d $CK/step-6 ]] || fail "run 2 moved step-6 although it saved nothing"
stopped_at_3 >"$T/run2b.log" 2>&1  # auto
grep -q "resumed from $CK/step-2 at step 2" "$T/run2b.log" || { cat "$T/run2b.log"; fail "auto after a rollback chose $(grep -o 'resumed from [^ ]*' "$T/run2b.log")"; }
ok "after a rollback that saved nothing, auto resumes step-2 (not step-6)"

train --set train.steps=4 --set checkpoint.every=2 --set train.lr=1e-3 --resume "$CK/step-2" >"$T/run3.log" 2>"$T/run3.err"
grep -q "checkpoints of the run it replaces moved to $CK/retired: step-4, step-6" "$T/run3.err" ||
  { cat "$T/run3.err"; fail "run 3 did not say what it retired"; }
[[ ! -e $CK/step-6 && -f $CK/step-4/manifest.json ]] || fail "run 3 left step-6 in place or wrote no step-4"
for s in 4 6; do "$BIN" ckpt verify "$CK/retired/step-$s" >/dev/null || fail "retired step-$s does not verify"; done
cmp -s "$T/old-step-6.bin" "$CK/retired/step-6/rank-00000.bin" || fail "retired step-6 is not the old one"
cmp -s "$CK/step-4/rank-00000.bin" "$CK/retired/step-4/rank-00000.bin" && fail "the new step-4 equals the old one"
ok "run 3 (another lr) saved its own step-4; the old step-4 and step-6 are in retired/ and verify"

train --set train.steps=6 --set checkpoint.every=2 >"$T/run4.log"
grep -q "resumed from $CK/step-4 at step 4" "$T/run4.log" || { cat "$T/run4.log"; fail "auto did not resume the new step-4"; }
[[ $(cat "$CK/latest") == step-6 ]] || fail "latest does not name the new step-6"
cmp -s "$T/old-step-6.bin" "$CK/step-6/rank-00000.bin" && fail "the new step-6 equals the retired one"
ok "auto resumes this run's step-4 and continues its lineage"
echo "$pass passed, 0 failed"
