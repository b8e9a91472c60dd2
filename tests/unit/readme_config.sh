#!/usr/bin/env bash
# The README's configuration reference is exactly what the binary's schema prints.
set -euo pipefail
BIN=${TESSERA_BIN:?}/tessera
README=${TESSERA_SRC:?}/README.md
want=$("$BIN" config --reference)
got=$(sed -n '/<!-- config-reference:begin -->/,/<!-- config-reference:end -->/p' "$README" | sed '1d;$d')
if [ "$want" != "$got" ]; then
  echo "README configuration reference is stale; regenerate with: tessera config --reference"
  diff <(echo "$want") <(echo "$got") || true
  echo "0 passed, 1 failed"; exit 1
fi
# And every documented command exists.
for cmd in topo train eval init-model tokenize ckpt bench config diagnose; do
  "$BIN" "$cmd" --help >/dev/null || { echo "command $cmd has no --help"; echo "0 passed, 1 failed"; exit 1; }
done
echo "2 passed, 0 failed"
