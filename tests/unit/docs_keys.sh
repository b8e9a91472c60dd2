#!/usr/bin/env bash
# Every configuration key the documentation names (README.md, docs/*.md: the guide, troubleshooting,
# the Accelerate -> Tessera table) exists in the binary's schema (`tessera config --reference`).
# A key renamed or removed in launcher/config.cpp without the docs following fails here.
set -euo pipefail
BIN=${TESSERA_BIN:?}/tessera SRC=${TESSERA_SRC:?}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
source "$SRC/tests/expect.bash"  # ok, check

"$BIN" config --reference | sed -n 's/^| `\([a-z_]*\.[a-z_]*\)`.*/\1/p' > "$T/keys"
check "the reference lists keys" test "$(wc -l < "$T/keys")" -ge 30
# Words that look like section.key but are not keys: file names, and a misspelling quoted from an error.
not_keys='^(train\.py|train\.jsonl|train\.sbatch|model\.safetensors|fsdp\.stratgy)$'
bad=0 n=0
for f in "$SRC/README.md" "$SRC"/docs/*.md; do
  while read -r key; do
    n=$((n + 1))
    grep -qxF "$key" "$T/keys" || { echo "${f#$SRC/}: '$key' is not a configuration key"; bad=1; }
  done < <(grep -oP '(?<![\w/.$-])(model|data|train|fsdp|checkpoint|eval|log|comm)\.[a-z_]+(?![\w.-])' "$f" |
           sort -u | grep -Ev "$not_keys" || true)
done
check "every key named in the docs exists ($n distinct per file, checked)" test $bad -eq 0
echo "$pass passed, 0 failed"
