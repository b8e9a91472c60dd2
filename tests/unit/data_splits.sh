#!/usr/bin/env bash
# Data directories with splits, named as Hugging Face datasets names them (runtime/data/splits.h):
# file names (train.jsonl + test.jsonl beside a README), folders (train/ + test/) and data/ shards
# (data/train-00000-of-00001.jsonl, validation, test).
# - `tokenize --input DIR` tokenizes the train split only (--split another), saying so: the token
#   file is byte-identical to that of the split's own file.
# - Training reads the train split only and validates on validation, else test, when data.val_path
#   is unset, saying so in one line: the same data as the files given one by one (equal example and
#   token counts, equal loss and val_loss). data.split trains on another split (never validating on
#   the split it trains on), data.val_split picks or turns off the validation split, and a
#   data.val_path that has splits gives its data.val_split.
# - `eval --data DIR` scores the split training validates on (--split another) and names it (JSON,
#   and a line on stderr).
# Bad input (a split that is not there, for train alone and under mpirun, tokenize and eval; a
# save_to_disk DatasetDict of Arrow files): one line, exit 2.
# Small data and one run per case (each train run checks one layout and one key): a few seconds.
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
train = [{"prompt": "Q: %d plus %d? A:" % (a, 2 * a), "completion": " %d" % (3 * a)} for a in range(24)]
test = [{"prompt": "Q: %d minus %d? A:" % (5 * a, a), "completion": " %d" % (4 * a)} for a in range(9)]
val = [{"prompt": "Q: %d times 2? A:" % a, "completion": " %d" % (2 * a)} for a in range(6)]
for name, recs in (("train", train), ("test", test), ("val", val)): write("%s/%s.jsonl" % (t, name), recs)
write(t + "/files/train.jsonl", train); write(t + "/files/test.jsonl", test)
open(t + "/files/README.md", "w").write("# the dataset card\n")
write(t + "/folders/train/data-00000.jsonl", train); write(t + "/folders/test/data-00000.jsonl", test)
for name, recs in (("train", train), ("validation", val), ("test", test)):
    write("%s/shards/data/%s-00000-of-00001.jsonl" % (t, name), recs)
write(t + "/plain/a.jsonl", train)
# What DatasetDict.save_to_disk writes: dataset_dict.json and a folder of Arrow files per split.
for s in ("train", "test"):
    os.makedirs("%s/saved/%s" % (t, s))
    open("%s/saved/%s/data-00000-of-00001.arrow" % (t, s), "wb").write(b"\xff\xff\xff\xff" + bytes(60))
    json.dump({"_data_files": [{"filename": "data-00000-of-00001.arrow"}], "_split": s}, open("%s/saved/%s/state.json" % (t, s), "w"))
    json.dump({}, open("%s/saved/%s/dataset_info.json" % (t, s), "w"))
json.dump({"splits": ["train", "test"]}, open(t + "/saved/dataset_dict.json", "w"))
PY

# tokenize: the train split by default, --split another; the same token file as the split's own file.
tok() {  # NAME tokenize-ARGS...
  local name=$1; shift
  $BIN tokenize --out "$T/$name.bin" "$@" > "$T/$name.tok" 2>&1 || { cat "$T/$name.tok"; fail "tokenize $name"; }
}
tok train_ref --input "$T/train.jsonl"
tok test_ref --input "$T/test.jsonl"
tok val_ref --input "$T/val.jsonl"
tok files --input "$T/files"
check "tokenize DIR: the train split" cmp -s "$T/files.bin" "$T/train_ref.bin"
check "tokenize says which split" grep -q "^input $T/files has splits train (1 file), test (1 file) (by file names): --split train$" "$T/files.tok"
tok folders_test --input "$T/folders" --split test
check "tokenize --split test of train/ + test/ folders" cmp -s "$T/folders_test.bin" "$T/test_ref.bin"
tok shards_val --input "$T/shards" --split validation
check "tokenize --split validation of data/ shards" cmp -s "$T/shards_val.bin" "$T/val_ref.bin"
tok plain --input "$T/plain"
check "tokenize of a directory without splits: all of it, no split line" \
  bash -c "cmp -s '$T/plain.bin' '$T/train_ref.bin' && ! grep -q 'has splits' '$T/plain.tok'"
# "D documents -> N tokens" of a reference token file, as training's "N tokens in D examples".
counts() { sed -n 's/^tokenized 1 file(s), \([0-9]*\) document(s) -> \([0-9]*\) tokens.*/\2 tokens in \1 examples/p' "$T/$1.tok"; }

# A 1-step run with lr 0 (its loss and val_loss are those of the data it read): the data part of its
# first line ("N tokens in D examples -> ..., validation N tokens in D examples"), then the loss and
# val_loss of its metrics record.
train() {  # NAME --set ...
  local name=$1; shift
  $BIN train --set data.seq_len=32 --set train.micro_batch=1 --set train.steps=1 --set train.lr=0 --set train.min_lr=0 \
    --set train.warmup_steps=0 --set log.dir="$T/log-$name" "$@" > "$T/$name.log" 2>&1 || { cat "$T/$name.log"; fail "train $name"; }
  grep '^tessera train:' "$T/$name.log" | sed 's/.*, data [^ ]* (//' > "$T/$name.data"
  tail -n 1 "$T/log-$name/metrics.jsonl" | grep -o '"\(loss\|val_loss\)":[^,}]*' >> "$T/$name.data"
  grep -q '^[0-9]* tokens in' "$T/$name.data" && grep -q '^"loss":' "$T/$name.data" || fail "train $name: $(cat "$T/$name.data")"
}
same() {  # LABEL NAME REFERENCE
  if cmp -s "$T/$2.data" "$T/$3.data"; then ok "$1"; else fail "$1: $(cat "$T/$2.data") vs $(cat "$T/$3.data")"; fi
}
trained() { sed -n '1s/^\([0-9]* tokens in [0-9]* examples\).*/\1/p' "$T/$1.data"; }  # what NAME trained on
validated() { sed -n '1s/.*, validation \([0-9]* tokens in [0-9]* examples\).*/\1/p' "$T/$1.data"; }
train ref --set data.path="$T/train.jsonl" --set data.val_path="$T/test.jsonl"
check "the reference trains on train.jsonl" [ "$(trained ref)" = "$(counts train_ref)" ]
check "and validates on test.jsonl" [ "$(validated ref)" = "$(counts test_ref)" ]
train files --set data.path="$T/files"
same "train.jsonl + test.jsonl: trains on train, validates on test" files ref
check "one line says so" grep -q "^data: data.path $T/files has splits train (1 file), test (1 file) (by file names): data.split train; validation: split test (data.val_path is unset" "$T/files.log"
check "the train split's listing names the files read" grep -q "^data.path $T/files split train: 1 file (jsonl); skipped: README.md" "$T/files.log"
# train/ + test/ folders as data.path, data/ shards as data.val_path with data.val_split test: the same.
train val_dir --set data.path="$T/folders" --set data.val_path="$T/shards" --set data.val_split=test
same "train/ + test/ folders, and data.val_path a directory with splits: data.val_split of it" val_dir ref
check "by folder names, and the validation split named" \
  grep -q "has splits train (1 file), test (1 file) (by folder names): data.split train; validation: split test of data.val_path $T/shards" "$T/val_dir.log"
train shards --set data.path="$T/shards"
check "data/{train,validation,test}-00000-of-00001.jsonl: trains on train" [ "$(trained shards)" = "$(counts train_ref)" ]
check "and validation is preferred to test" [ "$(validated shards)" = "$(counts val_ref)" ]
train on_test --set data.path="$T/files" --set data.split=test
check "data.split=test trains on test" [ "$(trained on_test)" = "$(counts test_ref)" ]
check "and no split is left to validate on (never the split trained on)" bash -c "! grep -q validation '$T/on_test.data'"
train no_val --set data.path="$T/shards" --set data.val_split=none
check "data.val_split=none: train alone" [ "$(trained no_val)" = "$(counts train_ref)" ]
check "no validation beside it" bash -c "! grep -q validation '$T/no_val.data'"

# eval --data DIR scores the split training validates on; --split another; its JSON names the split.
$BIN init-model --preset tiny --out "$T/m" --seed 3 --dtype fp32 > /dev/null
ev() {  # NAME eval-ARGS...: the mean_loss, split and tokens of the eval's JSON line
  local name=$1; shift
  $BIN eval --model "$T/m" --set data.seq_len=32 "$@" > "$T/$name.json" 2> "$T/$name.err" || { cat "$T/$name.err"; fail "eval $name"; }
  grep -o '"\(mean_loss\|split\|tokens\)":[^,}]*' "$T/$name.json" | tr '\n' ' ' > "$T/$name.ev"
}
ev test_ref --data "$T/test.jsonl"
ev val_ref --data "$T/val.jsonl"
check "eval of data without splits: split null" grep -q '"split":null' "$T/test_ref.ev"
ev files --data "$T/files"
check "eval --data DIR scores its test split, and says so" [ "$(cat "$T/files.ev")" = "$(sed 's/"split":null/"split":"test"/' "$T/test_ref.ev")" ]
check "also in one line on stderr" grep -q "^eval: split test of $T/files (the split training validates on; --split another)$" "$T/files.err"
ev shards --data "$T/shards"
check "eval of a directory of shards scores validation" [ "$(cat "$T/shards.ev")" = "$(sed 's/"split":null/"split":"validation"/' "$T/val_ref.ev")" ]
ev shards_test --data "$T/shards" --split test
check "eval --split test" [ "$(cat "$T/shards_test.ev")" = "$(sed 's/"split":null/"split":"test"/' "$T/test_ref.ev")" ]

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
expect_error 2 "--split dev: data directory $T/files has no split dev (splits found: train (1 file), test (1 file))" \
  $BIN tokenize --input "$T/files" --split dev --out "$T/never.bin"
[ ! -e "$T/never.bin" ] || fail "a refused tokenize wrote its output"
expect_error 2 "data directory $T/saved is a Hugging Face save_to_disk DatasetDict (dataset_dict.json: splits train, test) stored as Arrow" \
  $BIN train --set data.path="$T/saved"
echo "$pass passed, 0 failed"
