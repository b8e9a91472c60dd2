#!/usr/bin/env bash
# Every configuration key does something: each key of the schema (`tessera config --reference`) is
# read by code outside the schema (launcher/config.h, config.cpp) through the field the schema binds
# it to. The schema's entries name the field: field(&C::schedule, &optim::LrSchedule::lr, "train.lr")
# binds train.lr to member lr of Config's part `schedule` (an optim::LrSchedule, owned by the
# optimizer). A read is `schedule.lr` (cfg.schedule.lr, s.cfg.schedule.lr), or `.lr` in a file of
# the owner that names its type (LrSchedule: schedule.cpp reads s.lr). String literals and //
# comments are blanked first: prose naming a key is not a read. An assignment is not a read. A key
# that is parsed, documented and then ignored -- what comm.timeout_s once was -- fails here.
set -euo pipefail
BIN=${TESSERA_BIN:?}/tessera SRC=${TESSERA_SRC:?}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
source "$SRC/tests/expect.bash"  # ok, check

"$BIN" config --reference | sed -n 's/^| `\([a-z_0-9]*\.[a-z_0-9]*\)`.*/\1/p' > "$T/keys"
check "the schema has keys ($(wc -l < "$T/keys"))" test "$(wc -l < "$T/keys")" -ge 30
# key section member type, from the schema's entries (one per key)
tr '\n' ' ' < "$SRC/launcher/config.cpp" |
  grep -oP '(field|choice)\(&C::\w+,\s*&[\w:]+::\w+,\s*"[\w.]+"' |
  sed -E 's/.*&C::(\w+),\s*&([A-Za-z_:]*::)?(\w+)::(\w+),\s*"([a-z_0-9.]+)"/\5 \1 \4 \3/' | sort > "$T/bindings"
check "every key has one binding in launcher/config.cpp" \
  test "$(cut -d' ' -f1 "$T/bindings" | sort -u)" = "$(sort "$T/keys")"

# The code that may read configuration: everything but the schema itself (and the tests), each
# file with its string literals and // comments blanked.
mkdir "$T/code"
find "$SRC/launcher" "$SRC/runtime" "$SRC/text" "$SRC/model" "$SRC/benchmarks" "$SRC/util" \( -name '*.h' -o -name '*.cpp' \) \
  ! -path "$SRC/launcher/config.cpp" ! -path "$SRC/launcher/config.h" | while read -r f; do
  sed -E 's/"([^"\\]|\\.)*"/""/g; s://.*$::' "$f" > "$T/code/$(echo "${f#"$SRC"/}" | tr / _)"
done

# Keys whose field no code under directory $1 reads, one per line.
unread() {
  while read -r key section member type; do
    grep -rqP "(?<![A-Za-z0-9_])$section\.$member\b(?!\s*=[^=])" "$1" && continue
    owners=$(grep -rlw "$type" "$1" || true)
    [ -n "$owners" ] && grep -qP "\.$member\b(?!\s*=[^=])" $owners && continue
    echo "$key"
  done < "$T/bindings"
}

# The check itself must catch a dead key: the same code without its one read of comm.timeout_s.
cp -r "$T/code" "$T/code_without"
sed -i 's/cfg\.comm\.timeout_s;/0.0;/' "$T"/code_without/*
check "the code reads comm.timeout_s once, as cfg.comm.timeout_s" test "$(cat "$T"/code/* | grep -c 'cfg\.comm\.timeout_s;')" = 1
check "a key nothing reads is found (comm.timeout_s with its read removed)" \
  test "$(unread "$T/code_without")" = comm.timeout_s

dead=$(unread "$T/code")
[ -z "$dead" ] || echo "configuration keys no code reads (apply them, or remove them from launcher/config.cpp): $dead"
check "every one of the $(wc -l < "$T/keys") keys is read by the code" test -z "$dead"
echo "$pass passed, 0 failed"
