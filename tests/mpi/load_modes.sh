#!/usr/bin/env bash
# `model.load` end to end under mpirun -np 2 with the real binary: `tessera train` on a sharded bf16
# checkpoint gives the same first losses with rank0, parallel and naive loading; and a bad
# checkpoint (shapes that disagree with config.json, a missing shard file, a truncated file, a
# tensor the index lists but its file lacks) stops every rank with exit 2 and one line naming the
# file (and the tensor) in every mode, before the engine exists (no "loading"/"step" output).
set -u
BIN="${TESSERA_BIN:?TESSERA_BIN not set}/tessera"
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"
MPIRUN+=(-np 2)
work_dir load-modes
source "$(dirname "${BASH_SOURCE[0]}")/../expect.bash"  # fail

"$BIN" init-model --preset tiny --dtype bf16 --seed 3 --max-shard-size 300KB --out "$WORK/good" >/dev/null ||
  fail "init-model exited $?"
[ -f "$WORK/good/model.safetensors.index.json" ] || fail "expected a sharded checkpoint"
printf 'the quick brown fox jumps over the lazy dog %d\n' $(seq 200) >"$WORK/data.txt"
train() {  # train DIR MODE [more --set]...
  local dir=$1 mode=$2; shift 2
  "${MPIRUN[@]}" "$BIN" train --set model.path="$dir" --set model.load="$mode" --set data.path="$WORK/data.txt" \
    --set data.seq_len=32 --set train.steps=2 --set train.micro_batch=1 --set log.every=1 "$@" </dev/null
}

# 1. The three modes load the same shards: identical losses.
for mode in rank0 parallel naive; do
  train "$WORK/good" $mode >"$WORK/$mode.out" 2>"$WORK/$mode.err" || fail "train with model.load=$mode: $(cat "$WORK/$mode.err")"
  grep -o 'loss [0-9.]* -> [0-9.]*' "$WORK/$mode.out" >"$WORK/$mode.loss" || fail "no loss line: $(cat "$WORK/$mode.out")"
done
cmp -s "$WORK/rank0.loss" "$WORK/parallel.loss" || fail "rank0 vs parallel: $(cat "$WORK/rank0.loss") / $(cat "$WORK/parallel.loss")"
cmp -s "$WORK/rank0.loss" "$WORK/naive.loss" || fail "rank0 vs naive: $(cat "$WORK/rank0.loss") / $(cat "$WORK/naive.loss")"

# 2. Bad checkpoints, each a broken copy of the good one.
first=$(ls "$WORK/good" | grep -m1 'model-00001-of')
second=$(ls "$WORK/good" | grep -m1 'model-00002-of')
broken() { rm -rf "$WORK/$1"; cp -r "$WORK/good" "$WORK/$1"; }
broken shape
python3 - "$WORK/shape/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["intermediate_size"] += 8; json.dump(c, open(sys.argv[1], "w"))
PY
broken missing_file; rm "$WORK/missing_file/$second"
broken truncated; truncate -s -1000 "$WORK/truncated/$second"
broken index_lies
python3 - "$WORK/index_lies/model.safetensors.index.json" "$first" <<'PY'
import json, sys
i = json.load(open(sys.argv[1])); i["weight_map"]["model.norm.weight"] = sys.argv[2]; json.dump(i, open(sys.argv[1], "w"))
PY
# case: directory, pattern naming the file, pattern naming the tensor ("" when the file itself is gone)
while read -r case file_pat tensor_pat; do
  for mode in rank0 parallel naive; do
    train "$WORK/$case" $mode >"$WORK/out" 2>"$WORK/err"
    rc=$?
    [ "$rc" = 2 ] || fail "$case/$mode: exit $rc (want 2): $(cat "$WORK/err")"
    grep -v '^\s*$' "$WORK/err" | grep -q . || fail "$case/$mode: no message"
    [ "$(grep -c 'tessera: error' "$WORK/err")" = 1 ] || fail "$case/$mode: not one error line: $(cat "$WORK/err")"
    grep 'tessera: error' "$WORK/err" | grep -q -- "$file_pat" || fail "$case/$mode: file not named: $(cat "$WORK/err")"
    [ "$tensor_pat" = "-" ] || grep 'tessera: error' "$WORK/err" | grep -q -- "$tensor_pat" ||
      fail "$case/$mode: tensor not named: $(cat "$WORK/err")"
    grep -q 'step' "$WORK/out" && fail "$case/$mode: training started: $(cat "$WORK/out")"
  done
  echo "ok: $case"
done <<EOF
shape .safetensors mlp
missing_file $second -
truncated $second model.
index_lies $first model.norm.weight
EOF
echo "PASS"
