#!/usr/bin/env bash
# Data directories with splits, named as Hugging Face datasets names them (runtime/data/splits.h):
# file names (train.jsonl + test.jsonl beside a README), folders (train/ + test/) and data/ shards
# (data/train-00000-of-00001.jsonl, validation, test). Training reads the train split only and
# validates on validation, else test, when data.val_path is unset, saying so in one line: the same
# data as the files given one by one (equal example and token counts, equal loss and val_loss).
# data.split trains on another split, data.val_split picks or turns off the validation split, and
# `eval --data DIR` scores the split training validates on (--split another). Bad input (a split
# that is not there, alone and under mpirun; a save_to_disk DatasetDict of Arrow files): one line,
# exit 2.
set -euo pipefail
BIN=${TESSERA_BIN:?}/tessera
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/../mpi/lib.bash"
source "$(dirname "${BASH_SOURCE[0]}")/../expect.bash"

python3 - "$T" <<'PY'
import json, os, sys
t = sys.argv[1]
def write(path, recs):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        for r in recs: f.write(json.dumps(r) + "\n")
train = [{"prompt": "Q: %d plus %d? A:" % (a, 2 * a), "completion": " %d" % (3 * a)} for a in range(300)]
test = [{"prompt": "Q: %d minus %d? A:" % (5 * a, a), "completion": " %d" % (4 * a)} for a in range(60)]
val = [{"prompt": "Q: %d times 2? A:" % a, "completion": " %d" % (2 * a)} for a in range(40)]
for name, recs in (("train", train), ("test", test), ("val", val)): write("%s/%s.jsonl" % (t, name), recs)
write(t + "/files/train.jsonl", train); write(t + "/files/test.jsonl", test)
open(t + "/files/README.md", "w").write("# the dataset card\n")
write(t + "/folders/train/data-00000.jsonl", train); write(t + "/folders/test/data-00000.jsonl", test)
for name, recs in (("train", train), ("validation", val), ("test", test)):
    write("%s/shards/data/%s-00000-of-00001.jsonl" % (t, name), recs)
write(t + "/plain/a.jsonl", train)
# What DatasetDict.save_to_disk writes: dataset_dict.json and a folder of Arrow files per split.
json.dump({"splits": ["train", "test"]}, open(t + "/saved_dataset_dict.json", "w"))
for s in ("train", "test"):
    os.makedirs("%s/saved/%s" % (t, s))
    open("%s/saved/%s/data-00000-of-00001.arrow" % (t, s), "wb").write(b"\xff\xff\xff\xff" + bytes(60))
    json.dump({"_data_files": [{"filename": "data-00000-of-00001.arrow"}], "_split": s}, open("%s/saved/%s/state.json" % (t, s), "w"))
    json.dump({}, open("%s/saved/%s/dataset_info.json" % (t, s), "w"))
os.rename(t + "/saved_dataset_dict.json", t + "/saved/dataset_dict.json")
PY

# A 1-step run with lr 0 (its loss and val_loss are those of the data it read); the data part of
# its first line, the last metrics record.
train() {  # NAME --set ...
  local name=$1; shift
  $BIN train --set data.seq_len=64 --set train.steps=1 --set train.lr=0 --set train.min_lr=0 --set train.warmup_steps=0 \
    --set log.dir="$T/log-$name" "$@" > "$T/$name.log" 2>&1 || { cat "$T/$name.log"; fail "train $name"; }
  grep '^tessera train:' "$T/$name.log" | sed 's/.*, data [^ ]* (//' > "$T/$name.data"
  python3 -c 'import json, sys; m = [json.loads(l) for l in open(sys.argv[1])][-1]; print(m["loss"], m.get("val_loss"))' \
    "$T/log-$name/metrics.jsonl" >> "$T/$name.data"
}
same() {  # LABEL NAME REFERENCE
  if cmp -s "$T/$2.data" "$T/$3.data"; then ok "$1"; else fail "$1: $(cat "$T/$2.data") vs $(cat "$T/$3.data")"; fi
}
train ref --set data.path="$T/train.jsonl" --set data.val_path="$T/test.jsonl"
train files --set data.path="$T/files"
same "train.jsonl + test.jsonl: trains on train, validates on test" files ref
check "one line says so" grep -q "^data: data.path $T/files has splits train (1 file), test (1 file) (by file names): data.split train; validation: split test (data.val_path is unset" "$T/files.log"
check "the train split's listing names the files read" grep -q "^data.path $T/files split train: 1 file (jsonl); skipped: README.md" "$T/files.log"
train folders --set data.path="$T/folders"
same "train/ + test/ folders: the same" folders ref
check "by folder names" grep -q "has splits train (1 file), test (1 file) (by folder names)" "$T/folders.log"
train ref_val --set data.path="$T/train.jsonl" --set data.val_path="$T/val.jsonl"
train shards --set data.path="$T/shards"
same "data/{train,validation,test}-00000-of-00001.jsonl: validation is preferred to test" shards ref_val
# Example and token counts (the first line's): ref's validation data is test.jsonl, its training data train.jsonl.
counts() { sed -n "$2"'{s/^\([0-9]* tokens in [0-9]* examples\).*, validation \([0-9]* tokens in [0-9]* examples\).*/\'"$3"'/p;q}' "$T/$1.data"; }
train on_test --set data.path="$T/files" --set data.split=test
check "data.split=test trains on test (and no split is left to validate on)" \
  [ "$(sed -n '1s/\([0-9]* tokens in [0-9]* examples\).*/\1/p' "$T/on_test.data")" = "$(counts ref 1 2)" ]
check "no validation beside it" bash -c "! grep -q validation '$T/on_test.data'"
train no_val --set data.path="$T/files" --set data.val_split=none
check "data.val_split=none: train alone, no validation" \
  [ "$(sed -n '1s/\([0-9]* tokens in [0-9]* examples\).*/\1/p' "$T/no_val.data")" = "$(counts ref 1 1)" ]
check "no validation beside it" bash -c "! grep -q validation '$T/no_val.data'"
train val_dir --set data.path="$T/train.jsonl" --set data.val_path="$T/shards" --set data.val_split=test
same "data.val_path a directory with splits: data.val_split of it" val_dir ref

# eval --data DIR scores the split training validates on; --split another.
$BIN init-model --preset tiny --out "$T/m" --seed 3 --dtype fp32 > /dev/null
ev() { $BIN eval --model "$T/m" --set data.seq_len=64 "$@" 2> "$T/eval.err" | python3 -c 'import json, sys; e = json.load(sys.stdin); print(e["mean_loss"], e["tokens"])'; }
check "eval --data DIR scores its test split" [ "$(ev --data "$T/files")" = "$(ev --data "$T/test.jsonl")" ]
check "eval --split train" [ "$(ev --data "$T/files" --split train)" = "$(ev --data "$T/train.jsonl")" ]
check "eval of a directory of shards scores validation" [ "$(ev --data "$T/shards")" = "$(ev --data "$T/val.jsonl")" ]

# Bad input.
expect_error 2 "data.split nope: data directory $T/files has no split nope (splits found: train (1 file), test (1 file))" \
  $BIN train --set data.path="$T/files" --set data.split=nope
expect_error 2 "data.split test: data path $T/plain has no split test (splits found: train (1 file); no file or folder is named after a split" \
  $BIN train --set data.path="$T/plain" --set data.split=test
expect_error 2 "data.val_split validation: data directory $T/files has no split validation" \
  $BIN train --set data.path="$T/files" --set data.val_split=validation
expect_error 2 "data.split dev: data directory $T/files has no split dev" \
  "${MPIRUN[@]}" -np 2 $BIN train --set data.path="$T/files" --set data.split=dev
expect_error 2 "--split validation: data directory $T/files has no split validation" \
  $BIN eval --model "$T/m" --data "$T/files" --split validation
expect_error 2 "data directory $T/saved is a Hugging Face save_to_disk DatasetDict (dataset_dict.json: splits train, test) stored as Arrow" \
  $BIN train --set data.path="$T/saved"
echo "$pass passed, 0 failed"
