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
find "$SRC/app" "$SRC/launcher" "$SRC/runtime" "$SRC/text" "$SRC/tools" "$SRC/model" "$SRC/benchmarks" "$SRC/util" \
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
done < <(grep -lE 'std::thread\(|\.sa_(handler|sigaction) = ' -r "$SRC/launcher" "$SRC/runtime" "$SRC/text" "$SRC/tools" "$SRC/model" "$SRC/benchmarks" "$SRC/util" \
           --include='*.cpp' --include='*.h' | sort)
check "every file that starts a thread or installs a handler is in ## Threads ($starters files)" test $unlisted -eq 0 -a $starters -ge 5
# The layers' order (## Layers): a folder includes only itself and the folders before it; the
# program's main() (app/main.cpp) is above them all (it adds benchmarks/' command to the table).
# The compiler holds this (below: each layer's library compiles against its own include root); the
# greps here say it of every file without a build, tests and harnesses aside.
# upward WHAT PREFIX FOLDER...: prints the includes from each folder ($SRC/PREFIX<folder>) of one
# listed after it (#include "PREFIX<later>/"); fails if there are any.
upward() {
  local what=$1 prefix=$2 i later bad=0
  shift 2
  local folders=("$@")
  for ((i = 0; i < ${#folders[@]}; i++)); do
    later=$(IFS='|'; echo "${folders[*]:i+1}")
    [ -n "$later" ] || continue
    if grep -rnE "#include \"$prefix($later)/" "$SRC/$prefix${folders[i]}" --include='*.h' --include='*.cpp' > "$T/up"; then
      echo "includes a later $what:"; sed "s|^$SRC/||" "$T/up"; bad=1
    fi
  done
  return $bad
}
layers=(util text model runtime tools launcher benchmarks app) wrong=0
upward layer "" "${layers[@]}" || wrong=1
check "no include points from a layer to a later one (${layers[*]})" test $wrong -eq 0
# runtime/'s folders in their order (cmake/layers.cmake, TESSERA_RUNTIME_FOLDERS): each includes only
# itself, the ones before it and runtime/'s own headers.
read -r -a rfolders <<< "$(sed -nE 's/^set\(TESSERA_RUNTIME_FOLDERS (.*)\)$/\1/p' "$SRC/cmake/layers.cmake")"
wrong=0
upward "runtime folder" runtime/ "${rfolders[@]}" || wrong=1
check "no include points from a runtime folder to a later one (${rfolders[*]})" test $wrong -eq 0 -a ${#rfolders[@]} -ge 10
# What no library boundary holds: the Jinja interpreter (text/jinja/) stands alone in text/, which
# only text/chat_template_jinja.cpp uses; the BPE tokenizer (text/bpe/) knows no chat template.
inside=$(grep -rnE '#include "text/' "$SRC/text/jinja" --include='*.h' --include='*.cpp' | grep -v '"text/jinja/' || true)
inside+=$(grep -rnE '#include "text/(chat_template|records|names)' "$SRC/text/bpe" || true)
[ -z "$inside" ] || echo "text/'s parts lean on each other: $inside"
check "text/jinja/ includes nothing else of text/, text/bpe/ no chat template" test -z "$inside"
# No function over 100 lines in runtime/, text/, launcher/, model/, benchmarks/ or tools/: every function
# defined at column 0 (a signature ending in ')' and '{', or a ')' line followed by '{' or an
# initialiser list) is measured up to its closing '}' at column 0.
find "$SRC/runtime" "$SRC/text" "$SRC/launcher" "$SRC/model" "$SRC/benchmarks" "$SRC/tools" -name '*.cpp' -print0 |
  xargs -0 awk '
    FNR == 1 { start = 0; pend = 0 }
    start == 0 && /^[A-Za-z_].*[)]( const)?( noexcept)?( override)? *[{] *$/ && !/^(namespace|struct|class|enum|union|extern)/ { start = FNR; name = $0; next }
    start == 0 && /^[A-Za-z_].*[)]( const)?( noexcept)?( override)? *$/ && !/;/ { pend = FNR; pname = $0; next }
    start == 0 && pend == FNR - 1 && /^[{]|^ *:/ { start = pend; name = pname; next }
    start > 0 && /^[}]/ { n = FNR - start + 1; if (n > 100) printf "%d lines: %s:%d %s\n", n, FILENAME, start, substr(name, 1, 80); start = 0 }
  ' > "$T/long"
measured=$(find "$SRC/runtime" "$SRC/text" "$SRC/launcher" "$SRC/model" "$SRC/benchmarks" "$SRC/tools" -name '*.cpp' | wc -l)
[ -s "$T/long" ] && { echo "functions over 100 lines:"; sed "s|$SRC/||" "$T/long"; }
check "no function over 100 lines ($measured files)" test ! -s "$T/long"
# One observation scope: the memory label and the flight recorder's activity are set only by
# profile::Phase (runtime/profile/phase.cpp), and no code outside runtime/profile/ opens a bare
# profile::Scope.
others=$(grep -rnE 'memory::set_phase\(|flight::set_activity\(|profile::Scope [a-z_]+\(' "$SRC/launcher" "$SRC/runtime" "$SRC/text" \
           "$SRC/tools" "$SRC/model" "$SRC/benchmarks" --include='*.cpp' --include='*.h' | grep -v "^$SRC/runtime/profile/" || true)
[ -z "$others" ] || echo "sets a phase outside profile::Phase: $others"
check "the step's phases go through profile::Phase alone" test -z "$others"
# One home for GPU code (runtime/gpu/gpu.h): only runtime/gpu/ tests the build switch; the other
# folders ask gpu::built() at run time, and CUDA's headers are included there alone.
cuda=$(grep -rnE '^#if(def|ndef)? .*TESSERA_WITH_CUDA|#include <(cuda|nccl|c10/cuda/)' "$SRC/app" "$SRC/launcher" "$SRC/runtime" "$SRC/text" \
         "$SRC/tools" "$SRC/model" "$SRC/benchmarks" "$SRC/util" --include='*.cpp' --include='*.h' --include='*.cu' | grep -v "^$SRC/runtime/gpu/" || true)
[ -z "$cuda" ] || echo "GPU code outside runtime/gpu/: $cuda"
check "the GPU switch and CUDA's headers appear in runtime/gpu/ alone" test -z "$cuda" -a -n "$(ls "$SRC"/runtime/gpu/*_cuda.cpp)"
# Both builds define the whole seam: every function gpu.h and nccl.h declare is defined in
# absent.cpp (the GPU path off) and in one of the *_cuda.cpp files (on; compiled with
# TESSERA_WITH_CUDA=1 by the type check here).
seam=$(sed -nE 's/^[A-Za-z][^(]*[ :]([a-z_0-9]+)\(.*/\1/p' "$SRC/runtime/gpu/gpu.h" "$SRC/runtime/gpu/nccl.h" | sort -u)
undefined=""
for f in $seam; do
  grep -E "^[A-Za-z].*\b$f\(" "$SRC/runtime/gpu/absent.cpp" | grep -v ';$' > /dev/null || undefined+=" $f (absent.cpp)"
  cat "$SRC"/runtime/gpu/*_cuda.cpp | grep -E "^[A-Za-z].*\b$f\(" | grep -v ';$' > /dev/null || undefined+=" $f (*_cuda.cpp)"
done
[ -z "$undefined" ] || echo "the GPU seam lacks a definition:$undefined"
check "both builds define the GPU seam ($(echo $seam | wc -w) functions)" test -z "$undefined" -a "$(echo $seam | wc -w)" -ge 8
# The failure tests' faults are decorators of the seams (tests/support/fault_env.cpp), in the test
# binary alone: its parser, which names TESSERA_TEST_FAULT, is linked into tessera-faults and never
# into tessera; the runtime has no fault point of its own.
hooks=$(grep -rn "test_fault\|TESSERA_TEST_FAULT" "$SRC/runtime" "$SRC/text" "$SRC/launcher" "$SRC/model" --include='*.cpp' --include='*.h' || true)
[ -z "$hooks" ] || echo "fault points in the product's sources: $hooks"
check "no fault point in the product's sources (faults decorate the seams)" test -z "$hooks"
if [ -n "${TESSERA_BIN:-}" ] && [ -x "$TESSERA_BIN/tessera" ] && [ -x "$TESSERA_BIN/tessera-faults" ]; then
  check "tessera has no test fault hook" bash -c "! grep -q TESSERA_TEST_FAULT '$TESSERA_BIN/tessera'"
  check "tessera-faults has it" grep -q TESSERA_TEST_FAULT "$TESSERA_BIN/tessera-faults"
else
  echo "FAIL: TESSERA_BIN must hold tessera and tessera-faults"; exit 1
fi
# The compiler holds the layers (cmake/layers.cmake): the build writes, per layer (each runtime/
# folder one), an include root of links to that layer and the ones below it, and compiles the
# layer's library against it alone. For every pair of layers, a source compiled against the lower
# one's root that includes a header of the upper one fails "No such file or directory"; against a
# layer's own root, a header of it and of each layer below resolves there. And every object of the
# layers' libraries was compiled with its own layer's root, never the source tree
# (compile_commands.json).
BUILD=$(cd "$TESSERA_BIN/.." && pwd) LAYERS=$(cd "$TESSERA_BIN/.." && pwd)/layers
CXX=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$BUILD/CMakeCache.txt")
names=() folders=()
while read -r name folder; do names+=("$name"); folders+=("$folder"); done < "$LAYERS/order.txt"
check "the build wrote the layers' order (${#names[@]} layers: ${names[*]})" test ${#names[@]} -eq $((${#layers[@]} - 1 + ${#rfolders[@]}))
probe() { (cd "$SRC" && ls "$1"/*.h 2>/dev/null || ls "$1"/*.cpp) | head -n 1; }  # a file to include, of folder $1
bad=0 refused=0 resolved=0
for ((i = 0; i < ${#names[@]}; i++)); do
  root=$LAYERS/${names[i]} own=()
  for ((j = 0; j <= i; j++)); do own+=("$(probe "${folders[j]}")"); done
  printf '#include "%s"\n' "${own[@]}" > "$T/own.cpp"
  LC_ALL=C "$CXX" -MM -MG -I "$root" "$T/own.cpp" > "$T/deps" 2>&1 || true
  for h in "${own[@]}"; do
    if grep -qF "$root/$h" "$T/deps"; then resolved=$((resolved + 1)); else echo "${names[i]}: $h not found under $root"; bad=1; fi
  done
  for ((j = i + 1; j < ${#names[@]}; j++)); do
    h=$(probe "${folders[j]}")
    printf '#include "%s"\n' "$h" > "$T/up.cpp"
    if ! LC_ALL=C "$CXX" -fsyntax-only -I "$root" "$T/up.cpp" > "$T/err" 2>&1 && grep -qF "$h: No such file or directory" "$T/err"; then
      refused=$((refused + 1))
    else
      echo "${names[i]} compiles an include of ${folders[j]} ($h):"; head -n 3 "$T/err"; bad=1
    fi
  done
done
check "each layer's root: its own and the lower layers' headers found ($resolved), every upper one's refused by the compiler ($refused)" \
  test $bad -eq 0 -a $refused -eq $((${#names[@]} * (${#names[@]} - 1) / 2))
python3 - "$BUILD" "$SRC" "${names[@]}" > "$T/roots" <<'PY' || true
import json, re, sys
build, src, names = sys.argv[1], sys.argv[2].rstrip("/"), sys.argv[3:]
seen = set()
for e in json.load(open(build + "/compile_commands.json")):
    out = e.get("output") or re.search(r" -o (\S+)", e["command"]).group(1)
    m = re.match(r"CMakeFiles/tessera_([a-z_]+?)(_torch|_aten|_plain)?\.dir/", out)
    if not m:
        continue
    layer = {"main": "app"}.get(m.group(1), m.group(1))
    if layer not in names:
        continue
    seen.add(layer)
    dirs = re.findall(r"(?:-I|-isystem )\s*(\S+)", e["command"])
    own = build + "/layers/" + layer
    if own not in dirs:
        print(f"BAD {layer}: {e['file']} compiles without {own}")
    for d in dirs:
        if d == src or (d.startswith(src + "/") and not d.startswith(build + "/layers/")):
            print(f"BAD {layer}: {e['file']} compiles with -I{d}")
print(f"LAYERS {len(seen)}")
PY
grep '^BAD' "$T/roots" || true
check "every layer's library compiles against its own root, not the source tree ($(sed -n 's/^LAYERS //p' "$T/roots") libraries)" \
  test -z "$(grep '^BAD' "$T/roots")" -a "$(sed -n 's/^LAYERS //p' "$T/roots")" = ${#names[@]}
# No include cycle between folders (runtime's sub-folders each count as one; app/, main(), is
# above all): every edge "A includes B" goes into tsort, which reports a loop when the folders cannot be ordered.
folder_of() { case "$1" in runtime/*/*) echo "${1%/*}" ;; *) echo "${1%%/*}" ;; esac; }
: > "$T/edges"
while IFS=: read -r file inc; do
  from=$(folder_of "${file#$SRC/}") to=$(folder_of "$inc")
  [ "$from" = "$to" ] || echo "$from $to" >> "$T/edges"
done < <(grep -rhoE --with-filename '#include "(util|text|model|runtime|tools|launcher|benchmarks)/[^"]+"' \
           "$SRC/util" "$SRC/model" "$SRC/runtime" "$SRC/text" "$SRC/tools" "$SRC/launcher" "$SRC/benchmarks" "$SRC/app" \
           --include='*.h' --include='*.cpp' | sed -E 's/#include "([^"]+)"/\1/')
sort -u "$T/edges" -o "$T/edges"
if ! tsort "$T/edges" > /dev/null 2> "$T/loop"; then echo "folders include each other:"; cat "$T/loop"; fi
check "no include cycle between folders ($(wc -l < "$T/edges") folder edges)" test ! -s "$T/loop" -a "$(wc -l < "$T/edges")" -ge 20
# Every folder of C++ code, tests included, for the checks below.
code_dirs=("$SRC/app" "$SRC/launcher" "$SRC/runtime" "$SRC/text" "$SRC/tools" "$SRC/model" "$SRC/benchmarks" "$SRC/util" "$SRC/tests")
# Directory trees are removed and walked through util/file_tree.h alone: std::filesystem::remove_all
# and recursive_directory_iterator bind to the copies a LibTorch wheel >= 2.5 exports
# (pytorch/pytorch#133437) and crash there.
users=$(grep -rnE 'remove_all[(]|recursive_directory_iterator' "${code_dirs[@]}" --include='*.cpp' --include='*.h' --include='*.cc' |
        grep -v "^$SRC/util/file_tree\.h:" || true)
[ -z "$users" ] || echo "uses std::filesystem's tree functions: $users"
check "trees are removed and walked by util/file_tree.h alone" test -z "$users"
# LibTorch 2.11's ATen/ATen.h no longer brings at::NoGradGuard (found on an H200 with pip torch
# 2.11; 2.6's headers, which torch26_syntax compiles against, still do): a file that names ATen's
# grad-mode guards includes their header itself (or torch/torch.h, which does).
missing=$(grep -rlE 'at::(NoGradGuard|AutoGradMode|GradMode)\b' "${code_dirs[@]}" --include='*.cpp' --include='*.h' |
          xargs -r grep -LE '#include <(ATen/core/grad_mode\.h|torch/torch\.h)>' || true)
[ -z "$missing" ] || echo "names at::NoGradGuard/AutoGradMode/GradMode without ATen/core/grad_mode.h: $missing"
check "ATen's grad-mode guards come with their header" test -z "$missing"
# Every JSON document is parsed through util/json.h, whose parse_json refuses nesting past
# budget::kJsonDepth (a 100k-deep value crashes the code that copies, compares or dumps it): no other
# source calls nlohmann's parser, neither json::parse / ordered_json::parse / sax_parse nor `in >> j`
# into a variable it declares as a json.
src_dirs=("$SRC/app" "$SRC/launcher" "$SRC/runtime" "$SRC/text" "$SRC/tools" "$SRC/model" "$SRC/benchmarks" "$SRC/util")
direct=$(grep -rnE '(json|basic_json<[^>]*>)::(sax_)?parse *[(]' "${src_dirs[@]}" --include='*.cpp' --include='*.h' |
         grep -v "^$SRC/util/json\.h:" || true)
while IFS= read -r f; do
  names=$(grep -oE '\b(ordered_)?json &?[a-z_][a-z0-9_]*' "$f" | sed -E 's/.* &?//' | sort -u | paste -sd'|' || true)
  hits=$([ -z "$names" ] || grep -nE ">> *($names)\b" "$f" | sed "s|^|$f:|" || true)
  [ -z "$hits" ] || direct+=$'\n'$hits
done < <(grep -rlE '\bjson\b' "${src_dirs[@]}" --include='*.cpp' --include='*.h' | grep -v "^$SRC/util/json\.h$")
[ -z "$direct" ] || echo "calls nlohmann's parser outside util/json.h: $direct"
check "JSON is parsed by util/json.h alone (depth-limited)" test -z "$direct"
echo "$pass passed, 0 failed"
