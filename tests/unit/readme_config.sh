#!/usr/bin/env bash
# The configuration reference (docs/CONFIGURATION.md) is exactly what the binary's schema prints.
set -euo pipefail
BIN=${TESSERA_BIN:?}/tessera
DOC=${TESSERA_SRC:?}/docs/CONFIGURATION.md
# It moved out of the README (now a front page); a block there again (a merge, an old habit) is stale.
if grep -q '<!-- config-reference:begin -->' "$TESSERA_SRC/README.md"; then
  echo "README.md has a configuration reference block: the reference lives in docs/CONFIGURATION.md;"
  echo "regenerate it there with: tessera config --reference, and remove the README's copy"
  echo "0 passed, 1 failed"; exit 1
fi
want=$("$BIN" config --reference)
got=$(sed -n '/<!-- config-reference:begin -->/,/<!-- config-reference:end -->/p' "$DOC" | sed '1d;$d')
if [ "$want" != "$got" ]; then
  echo "docs/CONFIGURATION.md's configuration reference is stale; regenerate with: tessera config --reference"
  diff <(echo "$want") <(echo "$got") || true
  echo "0 passed, 1 failed"; exit 1
fi
# And every documented command exists.
for cmd in topo train eval init-model tokenize ckpt bench config diagnose; do
  "$BIN" "$cmd" --help >/dev/null || { echo "command $cmd has no --help"; echo "0 passed, 1 failed"; exit 1; }
done
echo "3 passed, 0 failed"
