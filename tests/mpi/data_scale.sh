#!/usr/bin/env bash
# Data at scale: training memory-maps token files and each rank touches only its own rows. A
# 2.4 GB token file (written sparsely: header and document table only, the token region a hole of
# zeros) trains a few steps under mpirun -np 2 with every rank's peak RSS at most 64 MiB above the
# same run on a 4 MB file. (Reading the file into memory, as earlier versions did, adds 2.4 GB.)
set -euo pipefail
BIN=${TESSERA_BIN:?}/tessera
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"

# A token file of N byte-tokenizer tokens (vocab 258): one plain-text document (format:
# runtime/data/token_file.h). The tokens are zero words: id 0, target bit clear (hence train_on=all).
make_tokens() {
  python3 - "$1" "$2" <<'PY'
import struct, sys
path, n = sys.argv[1], int(sys.argv[2])
table_at = 32 + 4 * n + (4 if n % 2 else 0)
with open(path, "wb") as f:
    f.write(b"TSRTOK2\0" + struct.pack("<IIQQ", 258, 0, n, 1))
    f.seek(table_at)
    f.write(struct.pack("<QQ", 1 << 63, n))
PY
}
make_tokens "$T/big.bin" 600000000
make_tokens "$T/small.bin" 1000000
echo "big: $(du -h --apparent-size "$T/big.bin" | cut -f1) apparent, $(du -h "$T/big.bin" | cut -f1) on disk"

# Each rank's peak RSS (kB) through /usr/bin/time, one file per rank.
run() {
  "${MPIRUN[@]}" -np 2 bash -c 'exec /usr/bin/time -f %M -o "$0.rss.$OMPI_COMM_WORLD_RANK" "$@"' "$T/$1" \
    $BIN train --set data.path="$T/$1.bin" --set data.seq_len=512 --set train.steps=3 --set train.micro_batch=2 \
    --set train.warmup_steps=1 --set data.train_on=all --set log.dir="$T/log_$1" > "$T/$1.log"
}
run small
run big
cat "$T/big.log"
# Pieces of 513 tokens overlapping by one: ceil((600000000 - 1) / 512) = 1171875 rows.
grep -q "in 1171875 examples -> 1171875 sequences of 512" "$T/big.log" || { echo "FAIL: unexpected data summary"; exit 1; }
for r in 0 1; do
  s=$(tail -1 "$T/small.rss.$r"); b=$(tail -1 "$T/big.rss.$r")
  echo "rank $r: peak RSS small $((s / 1024)) MiB, big $((b / 1024)) MiB, growth $(((b - s) / 1024)) MiB"
  [ $((b - s)) -le $((64 * 1024)) ] || { echo "FAIL: rank $r grew more than 64 MiB"; exit 1; }
done
python3 -c "
import json; r=[json.loads(l) for l in open('$T/log_big/metrics.jsonl')]
assert len(r)==3 and all(x['target_tokens']==2*2*512 for x in r), r"
echo "PASS"
