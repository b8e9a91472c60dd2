#!/usr/bin/env bash
# A Hugging Face tokenizer.json through the real CLI: `tessera tokenize` ids derived by hand for a
# small byte-level BPE (special tokens in the text, BOS/EOS from tokenizer_config.json), `train` on
# a Llama 3 model with it (also a model directory holding its tokenizer.json, found by an empty
# data.tokenizer and opened by every rank under mpirun), and bad input: a tokenizer whose
# vocabulary exceeds the model's, and tokenizer.json files of unsupported kinds (WordPiece, a
# Whitespace pre-tokenizer) -> one line naming the file and the field, exit 2, alone and under mpirun.
set -uo pipefail
BIN=${TESSERA_BIN:?}/tessera
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/../mpi/lib.bash"
source "$(dirname "${BASH_SOURCE[0]}")/../expect.bash"  # ok, fail, check, expect_error

# tokenizer.json: the 256 bytes (id = byte, GPT-2 alphabet), merges " t" -> 256, "h e" -> 257,
# " t he" -> 258, "i n" -> 259, " c" -> 260; specials 300-302; Llama 3's pre-tokenizer.
python3 - "$T" "$(dirname "${BASH_SOURCE[0]}")/../tokenizer" <<'PY'
import json, os, sys
t = sys.argv[1]
sys.path.insert(0, sys.argv[2])
import bytelevel  # tests/tokenizer/bytelevel.py
merges = [(" ", "t"), ("h", "e"), (" t", "he"), ("i", "n"), (" ", "c")]
pattern = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
tok = bytelevel.tokenizer(merges, specials, {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]})
for d in ("tok", "big", "wordpiece", "whitespace"): os.mkdir(os.path.join(t, d))
json.dump(tok, open(t + "/tok/tokenizer.json", "w"))
json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}, open(t + "/tok/tokenizer_config.json", "w"))
big = json.loads(json.dumps(tok)); big["added_tokens"].append(dict(big["added_tokens"][0], id=128255, content="<|last|>"))
json.dump(big, open(t + "/big/tokenizer.json", "w"))
wp = json.loads(json.dumps(tok)); wp["model"] = {"type": "WordPiece", "unk_token": "[UNK]", "vocab": {"[UNK]": 0}}
json.dump(wp, open(t + "/wordpiece/tokenizer.json", "w"))
ms = json.loads(json.dumps(tok)); ms["pre_tokenizer"] = {"type": "Whitespace"}
json.dump(ms, open(t + "/whitespace/tokenizer.json", "w"))
json.dump({"text": " the cat<|eot_id|>in"}, open(t + "/doc.jsonl", "w"))
PY

# 1. tokenize: BOS, " the" = 258, " c" "a" "t", <|eot_id|> = 302 (a special in the text), "in" = 259, EOS.
$BIN tokenize --input "$T/doc.jsonl" --tokenizer "$T/tok/tokenizer.json" --out "$T/doc.bin" > "$T/tok.log" || fail "tokenize"
grep -q "vocab 303" "$T/tok.log" || fail "vocab is not 303: $(cat "$T/tok.log")"
got=$(python3 -c "
import struct, sys; b = open(sys.argv[1], 'rb').read(); n = struct.unpack_from('<Q', b, 16)[0]  # token file v2
print(' '.join(str(w & 0x7fffffff) for w in struct.unpack_from('<%dI' % n, b, 32)))" "$T/doc.bin")
[ "$got" = "300 258 260 97 116 302 259 301" ] || fail "ids '$got'"
ok "tokenize with tokenizer.json: ids derived by hand"

# 2. train a Llama 3 model (vocab 320) on text tokenized by it.
$BIN train --set model.preset=tiny-llama3 --set data.tokenizer="$T/tok" --set data.seq_len=32 --set train.steps=2 \
  --set log.every=100 > "$T/train.log" 2>&1 || { cat "$T/train.log"; fail "train with tokenizer.json"; }
ok "train tiny-llama3 with tokenizer.json"

# 3. a model directory with its own tokenizer.json: an empty data.tokenizer finds it, and under
#    mpirun with model.load=rank0 (the default) every rank opens it (only a tokenizer.model is
#    broadcast from rank 0).
$BIN init-model --preset tiny-llama3 --out "$T/m3" > /dev/null || fail "init-model tiny-llama3"
cp "$T/tok/tokenizer.json" "$T/tok/tokenizer_config.json" "$T/m3/"
"${MPIRUN[@]}" -np 2 $BIN train --set model.path="$T/m3" --set data.seq_len=32 --set train.steps=2 --set log.every=100 \
  --set log.dir="$T/m3log" --set checkpoint.dir="$T/m3ck" > "$T/m3.log" 2>&1 || { cat "$T/m3.log"; fail "train a model directory holding tokenizer.json"; }
check "the model directory's tokenizer.json is used" grep -q "tokenizer bpe:$T/m3/tokenizer.json" "$T/m3.log"

# 4. bad input.
expect_error 2 "tokenizer bpe:$T/big/tokenizer.json has a vocab of 128256 tokens, more than the model's vocab_size 320 (preset tiny-llama3)" \
  $BIN train --set model.preset=tiny-llama3 --set data.tokenizer="$T/big" --set checkpoint.dir="$T/ck1"
expect_error 2 "more than the model's vocab_size 320" \
  "${MPIRUN[@]}" -np 2 $BIN train --set model.preset=tiny-llama3 --set data.tokenizer="$T/big/tokenizer.json" --set checkpoint.dir="$T/ck2"
expect_error 2 "tokenizer $T/wordpiece/tokenizer.json: model.type \"WordPiece\" is not supported" \
  $BIN tokenize --input "$T/doc.jsonl" --tokenizer "$T/wordpiece/tokenizer.json" --out "$T/bad.bin"
expect_error 2 "tokenizer $T/whitespace/tokenizer.json: pre_tokenizer.type \"Whitespace\" is not supported" \
  $BIN train --set data.tokenizer="$T/whitespace" --set checkpoint.dir="$T/ck3"
[ ! -e "$T/bad.bin" ] && [ ! -e "$T/ck1" ] && [ ! -e "$T/ck2" ] && [ ! -e "$T/ck3" ] || fail "a failed run wrote output"
ok "nothing written by the failed runs"
echo "$pass passed, 0 failed"
