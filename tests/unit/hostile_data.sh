#!/usr/bin/env bash
# Hostile data through the real CLI (issue 58; tests/hostile.bash): each probe ends in one line and
# exit 2, or succeeds, without a hang, a signal, peak memory over its bound, or a change in $OUTSIDE.
#  - compression bombs: a 1 MB .jsonl.gz (and a .json.gz array) holding one 1 GiB record is refused
#    at the record budget (util::budget::kRecordBytes) naming file and line; many ordinary lines in
#    a big .gz stream through `tokenize` in flat memory; `train` (2 ranks) refuses to hold more
#    than util::budget::kInMemoryDataBytes of tokens in memory and points to `tokenize`;
#  - a data directory's links that leave it are refused naming link and target (links inside, and
#    a loop, are fine);
#  - FIFOs, pipes (<(...)), devices as --input, inside a data directory, as a token file: refused by
#    name at start, never opened (a FIFO would block);
#  - a killed `tokenize` leaves its temporary; the next run removes it and says so.
set -uo pipefail
BIN=${TESSERA_BIN:?}/tessera
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/../mpi/lib.bash"  # MPIRUN
source "$(dirname "${BASH_SOURCE[0]}")/../expect.bash"
source "$(dirname "${BASH_SOURCE[0]}")/../hostile.bash"
hostile_setup

# gz FILE HEAD MIB BODY TAIL: a gzip file of HEAD, then MIB MiB of BODY repeated, then TAIL, made of
# gzip members (one compressed MiB written MIB times: zlib reads them as one stream), small on disk.
gz() {
  python3 - "$@" <<'PY'
import gzip, sys
path, head, mib, body, tail = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
chunk = (body * (2**20 // len(body) + 1))[: 2**20 - 2**20 % len(body)]
member = gzip.compress(chunk.encode(), 9)
with open(path, "wb") as f:
    f.write(gzip.compress(head.encode(), 9))
    for _ in range(mib):
        f.write(member)
    f.write(gzip.compress(tail.encode(), 9))
PY
}
TOK=("$BIN" tokenize --force --out "$T/out.bin" --input)
TRAIN=("$BIN" train --set log.dir="$T/run" --set checkpoint.dir="$T/ck" --set data.path)

# ---- compression bombs ---------------------------------------------------------------------------
gz "$T/line.jsonl.gz" '{"text": "' 1024 a $'"}\n'
check "the 1 GiB line is 1 MB on disk" test "$(stat -c %s "$T/line.jsonl.gz")" -lt 2000000
probe 2 "line.jsonl.gz line 1: a record longer than 16 MiB" 1024 "${TOK[@]}" "$T/line.jsonl.gz"
gz "$T/array.json.gz" '[{"text": "x"},
 {"text": "' 1024 a '"}]'
probe 2 "array.json.gz line 2: a record longer than 16 MiB" 1024 "${TOK[@]}" "$T/array.json.gz"
# 128 MiB of 16 KB lines (long lines: a quick test): past train's 256 MiB of tokens in memory (4
# bytes a token), and streamed by tokenize.
line='{"text": "'$(printf 'word %.0s' $(seq 3200))'"}'
gz "$T/lines.jsonl.gz" '' 128 "$line
" ''
probe 0 "" 1024 "${TOK[@]}" "$T/lines.jsonl.gz"
lines=$((128 * (2**20 / 16013)))  # whole lines of 16013 bytes in each MiB
grep -q " $lines document(s)" "$T/out" && ok "128 MiB of lines: every line tokenised" || fail "$(cat "$T/out")"
rm -f "$T/out.bin"
probe 2 "train reads into memory (256 MiB on every rank): tokenize it once" 1024 \
  "${MPIRUN[@]}" -np 2 "${TRAIN[@]}"="$T/lines.jsonl.gz"

# ---- links that leave the data directory ---------------------------------------------------------
mkdir -p "$T/data/sub"
echo '{"text": "inside"}' >"$T/data/sub/a.jsonl"
ln -s sub/a.jsonl "$T/data/b.jsonl"
ln -s .. "$T/data/sub/loop"
probe 0 "" 1024 "${TOK[@]}" "$T/data"
grep -q "2 files (jsonl)" "$T/out" && ok "links inside are read, the loop once" || fail "$(cat "$T/out")"
O=$(realpath "$OUTSIDE")
ln -s "$OUTSIDE/link" "$T/data/sub/z.jsonl"
probe 2 "data directory $T/data holds a link $T/data/sub/z.jsonl to $O/precious.txt, outside it" 1024 "${TOK[@]}" "$T/data"
rm "$T/data/sub/z.jsonl"
ln -s "$OUTSIDE/sub" "$T/data/out"
probe 2 "holds a link $T/data/out to $O/sub, outside it: .* copy the file in" 1024 "${TOK[@]}" "$T/data"
rm "$T/data/out"
ln -s ../.. "$T/data/sub/up"
probe 2 "holds a link $T/data/sub/up to $(realpath "$T")" 1024 "${TOK[@]}" "$T/data"
rm "$T/data/sub/up"

# ---- FIFOs, pipes, devices -----------------------------------------------------------------------
mkfifo "$T/fifo.jsonl" "$T/fifo.bin"
probe 2 "data file $T/fifo.jsonl is a FIFO, not a regular file" 1024 "${TOK[@]}" "$T/fifo.jsonl"
probe 2 "data file /dev/fd/[0-9]* is a FIFO, not a regular file: .*write it to a file first" 1024 \
  bash -c '"$@" <(echo "{\"text\": \"x\"}")' - "${TOK[@]}"
probe 2 "data file /dev/zero is a character device, not a regular file" 1024 "${TOK[@]}" /dev/zero
mv "$T/fifo.bin" "$T/data/t.bin"
probe 2 "data file $T/data/t.bin is a FIFO" 1024 "${TOK[@]}" "$T/data"
probe 2 "data file $T/data/t.bin is a FIFO" 1024 "${TRAIN[@]}"="$T/data/t.bin"
rm "$T/data/t.bin"

# ---- a killed tokenize ---------------------------------------------------------------------------
"$BIN" tokenize --input "$T/lines.jsonl.gz" --out "$T/k.bin" >/dev/null 2>&1 &
pid=$!
for _ in $(seq 100); do [ -e "$T/k.bin.tmp.$pid" ] && break; sleep 0.1; done
sleep 0.5; kill -9 $pid; wait $pid 2>/dev/null
check "the killed run left its temporary" test -e "$T/k.bin.tmp.$pid"
"$BIN" tokenize --input "$T/data" --out "$T/k.bin" >"$T/out" 2>&1 || fail "rerun: $(cat "$T/out")"
grep -qx "removed $T/k.bin.tmp.$pid, left by an interrupted tokenize" "$T/out" && ok "the rerun removes it, saying so" ||
  fail "$(cat "$T/out")"
check "and nothing else of the killed run is left" test -z "$(ls "$T" | grep 'k.bin.*tmp')"
echo "$pass passed, 0 failed"
