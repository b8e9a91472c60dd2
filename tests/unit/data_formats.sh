#!/usr/bin/env bash
# The data formats users bring (issue 35), on the real binary, one process, no MPI. `tessera tokenize`
# and `tessera train` print the format each data file was detected as and read it; what they cannot
# read is refused: exit 2, one error line naming the file, nothing written.
#   read:    a JSON array of chat records and a .jsonl.gz (made by gzip) give the token file of the
#            same records as JSONL, byte for byte; Alpaca and ShareGPT records give that of their
#            `messages` records; a directory of mixed files takes its data files and names the
#            skipped ones; a .txt and the quick start's extension-less licence texts are text;
#            `train` (2 steps of the tiny preset) on the mixed directory.
#   refused: a parquet-magic file, a zip (made by zip), a file with NUL bytes, a .json that does not
#            parse (line and column), a Hugging Face save_to_disk folder (.arrow, state.json), a
#            corrupt .gz; `train` on one of them writes no log or checkpoint directory.
set -uo pipefail
BIN=${TESSERA_BIN:?}/tessera
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/../expect.bash"  # ok, fail, check, expect_error
cd "$WORK"

tokenize() { "$BIN" tokenize --out "$1" --input "${@:2}" > out.txt 2> err.txt || fail "tokenize $*: $(cat err.txt)"; }
printed() { grep -qxF "$1" out.txt || fail "expected the line '$1' in: $(cat out.txt)"; ok "printed: $1"; }
same() { cmp -s "$1" "$2" || fail "$1 and $2 differ"; ok "$1 = $2 ($3)"; }

# Chat records as JSONL, the same as a pretty-printed JSON array, and gzip-compressed.
for i in $(seq 1 24); do
  echo "{\"messages\": [{\"role\": \"user\", \"content\": \"What is $i + $i?\"}, {\"role\": \"assistant\", \"content\": \"$((i + i))\"}]}"
done > lines.jsonl
{ echo "["; sed '$!s/$/,/; s/^/  /' lines.jsonl; echo "]"; } > array.json
gzip -k lines.jsonl
tokenize lines.bin lines.jsonl
printed "input lines.jsonl: 1 file (jsonl)"
tokenize array.bin array.json
printed "input array.json: 1 file (json)"
same array.bin lines.bin "a JSON array reads as its JSONL"
tokenize gz.bin lines.jsonl.gz
printed "input lines.jsonl.gz: 1 file (jsonl.gz)"
same gz.bin lines.bin "gzip reads as its JSONL"

# Alpaca and ShareGPT records render and mask as their `messages` records (docs/DATA.md mapping).
cat > alpaca.jsonl <<'EOF'
{"instruction": "Add the numbers.", "input": "2 and 3", "output": "5", "system": "Be brief."}
{"instruction": "Say hi.", "output": "hi"}
{"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}, {"from": "human", "value": "c"}, {"from": "gpt", "value": "d"}]}
{"conversations": [{"from": "human", "value": "a"}, {"from": "bot", "value": "b"}]}
EOF
cat > alpaca_messages.jsonl <<'EOF'
{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Add the numbers.\n\n2 and 3"}, {"role": "assistant", "content": "5"}]}
{"messages": [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "hi"}]}
{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]}
EOF
tokenize alpaca.bin alpaca.jsonl
check "a bad ShareGPT record is named" grep -q "alpaca.jsonl:4: dropped (ShareGPT turn 2: from 'bot' is not human/gpt/system" err.txt
tokenize alpaca_messages.bin alpaca_messages.jsonl
same alpaca.bin alpaca_messages.bin "Alpaca and ShareGPT read as their messages"

# A directory of mixed files: its data files are read, the rest named.
mkdir -p mixed/sub
cp lines.jsonl mixed/a.jsonl; cp array.json mixed/sub/c.json; cp lines.jsonl.gz mixed/b.jsonl.gz
echo "# My data set" > mixed/README.md
printf '{\n  "description": "",\n  "features": {}\n}\n' > mixed/dataset_info.json
tokenize mixed.bin mixed
printed "input mixed: 3 files (1 jsonl, 1 jsonl.gz, 1 json); skipped: README.md, dataset_info.json"
[ "$(od -An -t u8 -j 24 -N 8 --endian=little mixed.bin | tr -d ' ')" = 72 ] || fail "mixed: not 3 x 24 documents"
# Text by extension, and the quick start's licence texts, whose names have none (or a version: GPL-2).
printf 'plain words\n' > notes.txt
tokenize notes.bin notes.txt --input /usr/share/common-licenses
printed "input notes.txt: 1 file (text)"
n=$(find -L /usr/share/common-licenses -type f | wc -l)
printed "input /usr/share/common-licenses: $n files (text)"

# Refused: exit 2, one error line naming the file, no output and no temporary file.
printf 'PAR1\x15\x04\x15\x10binary columnsPAR1' > data.parquet
python3 -c "import zipfile; zipfile.ZipFile('archive.zip', 'w').write('lines.jsonl')"  # a real zip, no zip(1) needed
printf '{"text": "a"}\n\0\0\0\0' > nul.jsonl
printf '[\n  {"messages": [{"role": "user" "content": "x"}]}\n]\n' > bad.json
mkdir -p hf/train
printf '\xff\xff\xff\xff\x78\0\0\0' > hf/train/data-00000-of-00001.arrow
echo '{"features": {}}' > hf/train/dataset_info.json; echo '{"_split": "train"}' > hf/train/state.json
echo '{"splits": ["train"]}' > hf/dataset_dict.json
head -c 20 lines.jsonl.gz > cut.jsonl.gz
refused() {
  local input=$1 want=$2
  expect_error 2 "$want" "$BIN" tokenize --input "$input" --out refused.bin
  [ ! -e refused.bin ] && ! ls | grep -q '\.tmp\.' || fail "$input: output written despite the refusal"
}
refused data.parquet "data file data.parquet is a Parquet file.*read_parquet"
refused archive.zip "data file archive.zip is a zip archive: unzip it"
refused nul.jsonl "data file nul.jsonl holds binary content (a NUL byte at offset 14)"
refused bad.json "data file bad.json does not parse as JSON (at line 2, column [0-9]*, in record 1: syntax error"
# The DatasetDict as a whole (its splits, as train and tokenize see them), and one split's folder.
refused hf "data directory hf is a Hugging Face save_to_disk DatasetDict (dataset_dict.json: splits train) stored as Arrow.*load_from_disk('hf')"
refused hf/train "data file hf/train/data-00000-of-00001.arrow is an Arrow file of a Hugging Face datasets save_to_disk folder.*load_from_disk('hf/train')"
refused cut.jsonl.gz "data file cut.jsonl.gz is corrupt gzip"
expect_error 2 "--format 'xml' is not one of auto, jsonl, json, text" \
  "$BIN" tokenize --input notes.txt --out refused.bin --format xml

# train: the detected formats in its output, and a refusal that writes nothing.
train=(--set model.preset=tiny --set data.tokenizer=bytes --set data.seq_len=64 --set train.steps=2
       --set train.warmup_steps=1 --set log.every=1)
"$BIN" train "${train[@]}" --set data.path=mixed > out.txt 2> err.txt || fail "train on mixed: $(cat err.txt)"
printed "data.path mixed: 3 files (1 jsonl, 1 jsonl.gz, 1 json); skipped: README.md, dataset_info.json"
check "train on mixed ran its 2 steps" grep -q "done: steps 0 -> 2" out.txt
expect_error 2 "data file data.parquet is a Parquet file" \
  "$BIN" train "${train[@]}" --set data.path=data.parquet --set log.dir=run/log --set checkpoint.dir=run/ck
check "a refused train wrote nothing" test ! -e run

echo "$pass passed, 0 failed"
