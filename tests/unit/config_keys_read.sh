#!/usr/bin/env bash
# Every configuration key does something: each key of the schema (`tessera config --reference`) is
# read by code outside the schema (launcher/config.h, config.cpp) through its typed field
# (`cfg.section.key`, e.g. cfg.train.steps; config.h binds key "section.key" to field section.key),
# or through the section handed to its owner under the section's name (`data.split`, a DataConfig
# named data). String literals and // comments are blanked first: prose naming a key is not a read.
# An assignment to the field is not a read. A key that is parsed, documented and then ignored --
# what comm.timeout_s once was -- fails here.
set -euo pipefail
BIN=${TESSERA_BIN:?}/tessera SRC=${TESSERA_SRC:?}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
source "$SRC/tests/expect.bash"  # ok, check

"$BIN" config --reference | sed -n 's/^| `\([a-z_0-9]*\.[a-z_0-9]*\)`.*/\1/p' > "$T/keys"
check "the schema has keys ($(wc -l < "$T/keys"))" test "$(wc -l < "$T/keys")" -ge 30

# The code that may read configuration: everything but the schema itself (and the tests).
find "$SRC/launcher" "$SRC/runtime" "$SRC/model" "$SRC/benchmarks" "$SRC/util" \( -name '*.h' -o -name '*.cpp' \) \
  ! -path "$SRC/launcher/config.cpp" ! -path "$SRC/launcher/config.h" -print0 | sort -z | xargs -0 cat |
  sed -E 's/"([^"\\]|\\.)*"/""/g; s://.*$::' > "$T/code"

# Keys of $T/keys whose field no code in file $1 reads, one per line.
unread() {
  while read -r key; do
    # a field access (section.key, not part of a longer name), not followed by an assignment
    grep -qP "(?<![A-Za-z0-9_])${key//./\\.}\b(?!\s*=[^=])" "$1" || echo "$key"
  done < "$T/keys"
}

# The check itself must catch a dead key: the same code without its one read of comm.timeout_s.
sed 's/cfg\.comm\.timeout_s;/0.0;/' "$T/code" > "$T/code_without"
check "the code reads comm.timeout_s once, as cfg.comm.timeout_s" test "$(grep -c 'cfg\.comm\.timeout_s;' "$T/code")" = 1
check "a key nothing reads is found (comm.timeout_s with its read removed)" \
  test "$(unread "$T/code_without")" = comm.timeout_s

dead=$(unread "$T/code")
[ -z "$dead" ] || echo "configuration keys no code reads (apply them, or remove them from launcher/config.cpp): $dead"
check "every one of the $(wc -l < "$T/keys") keys is read by the code" test -z "$dead"
echo "$pass passed, 0 failed"
