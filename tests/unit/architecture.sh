#!/usr/bin/env bash
# docs/ARCHITECTURE.md names only things that exist: every backticked path is a file or folder of
# the tree, every backticked type is declared (class / struct / using / enum) in the sources, every
# backticked function or member (`f`, `T::f`, `f()`) appears in them, every configuration key
# (`section.key`) is in the schema. A rename or removal without the map following fails here. Every
# source that starts a thread or installs a signal handler is named in the map's Threads section.
set -euo pipefail
SRC=${TESSERA_SRC:?}
DOC=${ARCHITECTURE_DOC:-$SRC/docs/ARCHITECTURE.md}  # another file: to test this test
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
source "$SRC/tests/expect.bash"  # ok, check

# The sources the names must come from (not tests, not the docs themselves).
find "$SRC/launcher" "$SRC/runtime" "$SRC/model" "$SRC/benchmarks" "$SRC/util" \
  \( -name '*.h' -o -name '*.cpp' \) -print0 | xargs -0 cat > "$T/src"
grep -o '`[^`]*`' "$DOC" | tr -d '`' | sort -u > "$T/names"
check "the map names things ($(wc -l < "$T/names") distinct)" test "$(wc -l < "$T/names")" -ge 60

bad=0 paths=0 types=0 words=0 keys=0
while IFS= read -r name; do
  case "$name" in
    *' '*|*=*) continue ;;  # commands and settings (`tessera topo`, `model.load = rank0`)
    */*)
      paths=$((paths + 1))
      compgen -G "$SRC/${name%/}" > /dev/null || { echo "not in the tree: $name"; bad=1; } ;;  # globs too
    [a-z]*.[a-z]*)
      keys=$((keys + 1))
      grep -qF "\"$name\"," "$SRC/launcher/config.cpp" || { echo "not a configuration key: $name"; bad=1; } ;;
    *)
      id=${name%()}
      [[ $id =~ ^[A-Za-z_][A-Za-z0-9_]*(::[A-Za-z_][A-Za-z0-9_]*)*$ ]] || { echo "cannot check: $name"; bad=1; continue; }
      first=${id%%::*} last=${id##*::}
      if [[ $first =~ ^[A-Z][a-z] ]]; then  # a type (CamelCase): declared somewhere
        types=$((types + 1))
        grep -qE "(class|struct|using|enum class) $first\b" "$T/src" || { echo "type not declared: $first (from $name)"; bad=1; continue; }
      fi
      words=$((words + 1))
      grep -qw -- "$last" "$T/src" || { echo "not in the sources: $last (from $name)"; bad=1; }
      ;;
  esac
done < "$T/names"
check "every name exists ($paths paths, $types types, $words identifiers, $keys keys)" test $bad -eq 0

# The threads and signal handlers the map lists are the ones the code starts and installs: every
# source that starts a thread (std::thread(...)) or installs a handler (sa_handler / sa_sigaction)
# is named in its "## Threads" section.
sed -n '/^## Threads/,/^## /p' "$DOC" > "$T/threads"
unlisted=0 starters=0
while IFS= read -r f; do
  starters=$((starters + 1))
  grep -qF "\`${f#$SRC/}\`" "$T/threads" || { echo "starts a thread or installs a signal handler, not in ## Threads: ${f#$SRC/}"; unlisted=1; }
done < <(grep -lE 'std::thread\(|\.sa_(handler|sigaction) = ' -r "$SRC/launcher" "$SRC/runtime" "$SRC/model" "$SRC/benchmarks" "$SRC/util" \
           --include='*.cpp' --include='*.h' | sort)
check "every file that starts a thread or installs a handler is in ## Threads ($starters files)" test $unlisted -eq 0 -a $starters -ge 5
# The layers' order (## Layers): a folder includes only itself and the folders before it; the
# program's main() (launcher/main.cpp) is above them all (it adds benchmarks/' command to the table).
layers=(util model runtime launcher benchmarks) wrong=0
for ((i = 0; i < ${#layers[@]}; i++)); do
  later=$(IFS='|'; echo "${layers[*]:i+1}")
  [ -n "$later" ] || continue
  if grep -rnE "#include \"($later)/" "$SRC/${layers[i]}" --include='*.h' --include='*.cpp' | grep -v "^$SRC/launcher/main.cpp:" > "$T/up"; then
    echo "includes a later layer:"; sed "s|^$SRC/||" "$T/up"; wrong=1
  fi
done
check "no include points from a layer to a later one (${layers[*]})" test $wrong -eq 0
echo "$pass passed, 0 failed"
