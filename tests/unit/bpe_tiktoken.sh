#!/usr/bin/env bash
# Tessera's tokenizer.json reader against an independent implementation: npm's js-tiktoken with
# its cl100k_base ranks (the base of Llama 3's vocabulary). tests/tokenizer/make_fixture.js builds a
# Hugging Face tokenizer.json from those ranks (Llama 3's pre-tokenizer regex, merges derived from
# the ranks, Llama 3.1's special tokens), ~4 MB of varied text (sources, license texts, generated
# Unicode: CJK, emoji, scripts, combining marks, whitespace runs, digits, contractions, special
# tokens in the text) and js-tiktoken's ids; `tessera tokenize` must produce the identical ids.
# node and js-tiktoken come from scripts/deps.sh (a missing one is a failure, not a skip).
set -u
BIN=${TESSERA_BIN:?}/tessera
SRC=${TESSERA_SRC:?}
FIX=$SRC/tests/tokenizer/make_fixture.js
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/../expect.bash"  # fail
command -v node >/dev/null || fail "node is not installed (scripts/deps.sh installs nodejs)"
[ -f "$SRC/tests/tokenizer/node_modules/js-tiktoken/package.json" ] ||
  fail "js-tiktoken is not installed in tests/tokenizer/node_modules (run scripts/deps.sh)"
node "$FIX" make "$T/fx" "$SRC" || fail "make_fixture.js make"
start=$(date +%s%N)
"$BIN" tokenize --input "$T/fx/corpus.jsonl" --tokenizer "$T/fx/tokenizer.json" --out "$T/got.bin" ||
  fail "tessera tokenize exited $?"
echo "tessera tokenize: $(( ($(date +%s%N) - start) / 1000000 )) ms"
node "$FIX" compare "$T/fx" "$T/got.bin" || fail "ids differ from js-tiktoken's"
pass=$((pass+1))
# The directory holding tokenizer.json names the same tokenizer.
"$BIN" tokenize --input "$T/fx/corpus.jsonl" --tokenizer "$T/fx" --out "$T/dir.bin" >/dev/null || fail "--tokenizer DIR"
cmp -s "$T/got.bin" "$T/dir.bin" || fail "--tokenizer DIR gives other ids than --tokenizer DIR/tokenizer.json"
pass=$((pass+1))
echo "$pass passed, 0 failed"
