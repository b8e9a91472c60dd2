#!/usr/bin/env bash
# End-to-end test of `tessera tokenize`: real files, the real binary, exit codes, the token file
# layout (runtime/data/token_file.h: magic, u32 vocab, u32 0, u64 tokens, u64 documents, u32 token
# words with the target bit, the document table), chat records, bad records, the progress bar, and
# bounded memory: peak RSS on a 320 MB input stays within 64 MiB of that on a 3 MB one.
set -u
BIN="${TESSERA_BIN:?TESSERA_BIN not set}/tessera"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/../expect.bash"  # fail

# u32/u64 little-endian field of a file at a byte offset.
field() { od -An -t "u$3" -j "$2" -N "$3" --endian=little "$1" | tr -d ' '; }

# 1. Byte tokenizer over a directory: two plain-text documents of 3 and 5 bytes -> 5 + 7 = 12 tokens.
mkdir -p "$WORK/corpus"
printf 'hello' > "$WORK/corpus/b.txt"
printf 'abc' > "$WORK/corpus/a.txt"
out=$("$BIN" tokenize --input "$WORK/corpus" --out "$WORK/bytes.bin" 2> "$WORK/progress.txt") || fail "tokenize exited $?"
echo "$out"
echo "$out" | grep -q "2 document(s) -> 12 tokens" || fail "expected 2 documents, 12 tokens in: $out"
grep -q "100% .* MB/s .* tokens/s" "$WORK/progress.txt" || fail "no progress line: $(cat "$WORK/progress.txt")"
[ "$(head -c 7 "$WORK/bytes.bin")" = "TSRTOK2" ] || fail "bad magic"
[ "$(field "$WORK/bytes.bin" 8 4)" = 258 ] || fail "vocab field is not 258"
[ "$(field "$WORK/bytes.bin" 16 8)" = 12 ] || fail "token count is not 12"
[ "$(field "$WORK/bytes.bin" 24 8)" = 2 ] || fail "document count is not 2"
[ "$(stat -c %s "$WORK/bytes.bin")" = $((32 + 4 * 12 + 8 * 3)) ] || fail "file size"
# Sorted order: a.txt first -> BOS(256) 'a'(97) ..., every token of plain text a target (bit 31).
[ "$(field "$WORK/bytes.bin" 32 4)" = $((256 + 2147483648)) ] || fail "first token is not BOS with the target bit"
[ "$(field "$WORK/bytes.bin" 36 4)" = $((97 + 2147483648)) ] || fail "second token is not 'a' (files not sorted?)"
table=$((32 + 4 * 12))
[ "$(field "$WORK/bytes.bin" $((table + 8)) 8)" = 9223372036854775813 ] || fail "document 2 does not start at 5 as text"

# 2. Existing output is not replaced without --force; the old file survives intact.
sum_before=$(md5sum < "$WORK/bytes.bin")
"$BIN" tokenize --input "$WORK/corpus/a.txt" --out "$WORK/bytes.bin" > "$WORK/err.txt" 2>&1
rc=$?
[ $rc -eq 2 ] || fail "overwrite without --force exited $rc, expected 2"
grep -q "already exists" "$WORK/err.txt" || fail "no 'already exists' message: $(cat "$WORK/err.txt")"
[ "$(md5sum < "$WORK/bytes.bin")" = "$sum_before" ] || fail "existing output changed"
"$BIN" tokenize --input "$WORK/corpus/a.txt" --out "$WORK/bytes.bin" --force > /dev/null 2>&1 || fail "--force failed"
[ "$(field "$WORK/bytes.bin" 16 8)" = 5 ] || fail "--force did not replace the file"

# 3. A SentencePiece model trained here: vocab 300 in the header, ids from the model.
# Not in a sanitizer build (scripts/sanitize.sh sets TESSERA_TEST_NO_SENTENCEPIECE): the sanitizer
# runtimes refuse the RTLD_DEEPBIND load of libsentencepiece (text/tokenizer.cpp).
if [ -z "${TESSERA_TEST_NO_SENTENCEPIECE:-}" ]; then
cat /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/Apache-2.0 > "$WORK/train.txt"
spm_train --input="$WORK/train.txt" --model_prefix="$WORK/sp" --vocab_size=300 --model_type=bpe --minloglevel=2 > /dev/null 2>&1 \
  || fail "spm_train failed"
printf '{"text": "free software"}\n{"text": "Apache License"}\n' > "$WORK/docs.jsonl"
"$BIN" tokenize --input "$WORK/docs.jsonl" --tokenizer "$WORK/sp.model" --out "$WORK/sp.bin" > /dev/null 2>&1 || fail "spm tokenize failed"
[ "$(field "$WORK/sp.bin" 8 4)" = 300 ] || fail "vocab field is not 300"
n1=$(echo "free software" | spm_encode --model="$WORK/sp.model" --output_format=id | wc -w)
n2=$(echo "Apache License" | spm_encode --model="$WORK/sp.model" --output_format=id | wc -w)
[ "$(field "$WORK/sp.bin" 16 8)" = $((n1 + n2 + 4)) ] || fail "count is not $((n1 + n2 + 4))"
bad_cases="notsp empty missing allbad template"
else
  echo "skipped the SentencePiece cases: TESSERA_TEST_NO_SENTENCEPIECE (sanitizer build)"
  bad_cases="empty missing allbad template"
fi

# 4. Chat records keep their targets; bad records are dropped with file:line and counted.
cat > "$WORK/chat.jsonl" <<'EOF'
{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
{"messages": [{"role": "wizard", "content": "x"}]}
not json
EOF
out=$("$BIN" tokenize --input "$WORK/chat.jsonl" --out "$WORK/chat.bin" 2> "$WORK/chat.err") || fail "chat tokenize: $(cat "$WORK/chat.err")"
grep -q "tessera: warning: $WORK/chat.jsonl:2: dropped (message 1 has unknown role \"wizard\"" "$WORK/chat.err" || fail "no warning for line 2"
grep -q "tessera: warning: $WORK/chat.jsonl:3: dropped (invalid JSON" "$WORK/chat.err" || fail "no warning for line 3"
echo "$out" | grep -q "2 of 3 examples dropped" || fail "no drop count: $out"
# <s>[INST] hi [/INST] yo </s>: 1 + 17 + 4 + 1 = 23 tokens; targets " yo " and EOS (5).
[ "$(field "$WORK/chat.bin" 16 8)" = 23 ] || fail "chat token count"
targets=$(od -An -t u4 -j 32 -N $((4 * 23)) --endian=little -v "$WORK/chat.bin" | tr -s ' ' '\n' | awk '$1 >= 2147483648' | wc -l)
[ "$targets" = 5 ] || fail "chat targets: $targets, expected 5"
"$BIN" tokenize --input "$WORK/chat.jsonl" --out "$WORK/none.bin" --chat-template none > /dev/null 2>&1 || fail "--chat-template none"
[ "$(field "$WORK/none.bin" 16 8)" = 6 ] || fail "--chat-template none: <s>hiyo</s> is 6 tokens"

# 5. Bad input: exit 2, one error line naming the file, nothing written.
head -c 0 /dev/null > "$WORK/empty.txt"
printf 'not json\n' > "$WORK/allbad.jsonl"
for case in $bad_cases; do
  rm -f "$WORK/bad.bin"
  case $case in
    notsp) echo "not a model" > "$WORK/tokenizer.model"
           args=(--input "$WORK/corpus" --tokenizer "$WORK/tokenizer.model"); name="$WORK/tokenizer.model" ;;
    empty) args=(--input "$WORK/empty.txt"); name="$WORK/empty.txt" ;;
    missing) args=(--input "$WORK/nope.txt"); name="$WORK/nope.txt" ;;
    allbad) args=(--input "$WORK/allbad.jsonl"); name="$WORK/allbad.jsonl holds no trainable example" ;;
    template) args=(--input "$WORK/corpus" --chat-template llama3); name="needs the special token <|begin_of_text|>" ;;
  esac
  "$BIN" tokenize "${args[@]}" --out "$WORK/bad.bin" > "$WORK/out.txt" 2> "$WORK/err.txt"
  rc=$?
  [ $rc -eq 2 ] || fail "$case: exit $rc, expected 2: $(cat "$WORK/err.txt")"
  grep -qF "$name" "$WORK/err.txt" || fail "$case: message does not name $name: $(cat "$WORK/err.txt")"
  [ "$(grep -c '^tessera: error' "$WORK/err.txt")" -eq 1 ] || fail "$case: not one error line: $(cat "$WORK/err.txt")"
  [ ! -e "$WORK/bad.bin" ] || fail "$case: output written despite the error"
  ls "$WORK" | grep -q '\.tmp\.' && fail "$case: temporary file left behind"
done

# 6. Streaming: peak RSS does not grow with the input (320 MB of text vs 3 MB; the 1.3 GB output
#    and the input would not fit a 64 MiB margin if held in memory).
python3 - "$WORK" <<'PY'
import sys
line = ("the quick brown fox jumps over the lazy dog " * 3 + "\n").encode()
with open(sys.argv[1] + "/small.txt", "wb") as f: f.write(line * ((3 << 20) // len(line)))
with open(sys.argv[1] + "/large.txt", "wb") as f:
    block = line * ((8 << 20) // len(line))
    for _ in range(40): f.write(block)
PY
/usr/bin/time -f %M -o "$WORK/small.rss" "$BIN" tokenize --input "$WORK/small.txt" --out "$WORK/small.bin" > /dev/null 2>&1 || fail "small"
/usr/bin/time -f %M -o "$WORK/large.rss" "$BIN" tokenize --input "$WORK/large.txt" --out "$WORK/large.bin" > "$WORK/large.out" 2> "$WORK/large.err" || fail "large"
cat "$WORK/large.out"
grep -c "%" "$WORK/large.err" | grep -q "^1[01]$" || fail "expected a progress line every 10% (not a terminal): $(cat "$WORK/large.err")"
in_bytes=$(stat -c %s "$WORK/large.txt")
[ "$(field "$WORK/large.bin" 16 8)" = $((in_bytes + 2)) ] || fail "large: token count"
s=$(tail -1 "$WORK/small.rss"); l=$(tail -1 "$WORK/large.rss")
echo "tokenize peak RSS: 3 MB input $((s / 1024)) MiB, $((in_bytes >> 20)) MiB input $((l / 1024)) MiB"
[ $((l - s)) -le $((64 * 1024)) ] || fail "peak RSS grew by $(((l - s) / 1024)) MiB"
echo "PASS"
