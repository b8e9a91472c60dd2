#!/usr/bin/env bash
# The build's lean libtorch_cpu (cmake/lean_libtorch.cmake, scripts/lean_libtorch.sh). glibc's
# loader, loading LibTorch's own file for `tessera --version` (LD_DEBUG=bindings, LD_BIND_NOW: every
# symbol of every library bound at the start, not only those the start calls), says which of
# libtorch_cpu's DT_NEEDED entries it binds none of its symbols to. Where there are some (Debian's
# LibTorch), build/lib holds a copy that
#   - differs from LibTorch's own file only inside its .dynamic section (byte comparison),
#   - exports the same symbols and names the same DT_NEEDED entries less some of those unbound ones;
#   - changes no binding of the libraries both starts load but a weak (vague-linkage) symbol whose
#     first copy sat in a library left out (it binds to another copy of the same code);
# and `tessera` and `tessera-faults` load it (their RUNPATH), with fewer libraries than LibTorch's
# own file brings. Where there are none, or the library has a RUNPATH of its own (pip's), no copy.
set -uo pipefail
SRC=${TESSERA_SRC:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
BIN=${TESSERA_BIN:?set TESSERA_BIN to the bin folder of the build}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
source "$SRC/tests/expect.bash"  # ok, fail, check

# libtorch_cpu as tessera would load it without the copy: the system's loader search.
orig=$(LD_LIBRARY_PATH=/nonexistent ldd "$BIN/tessera" | awk '$1 ~ /^libtorch_cpu\.so/ {print $1}')
[[ -n $orig ]] || fail "tessera does not link libtorch_cpu"
lean=$(cd "$BIN/../lib" && pwd)/$orig
sys=$(ldconfig -p | awk -v n="$orig" '$1 == n {print $NF}' | head -1)
[[ -n $sys ]] || fail "$orig is not in the loader's cache: cannot compare"
sys=$(readlink -f "$sys")
needed() { objdump -p "$1" | awk '$1 == "NEEDED" {print $2}' | sort; }
needed "$sys" >"$T/sys.needed"
# glibc's loader, loading LibTorch's own file: the libraries it binds libtorch_cpu's symbols to.
LD_LIBRARY_PATH=$(dirname "$sys") LD_BIND_NOW=1 LD_DEBUG=bindings LD_DEBUG_OUTPUT="$T/bind" "$BIN/tessera" --version >/dev/null ||
  fail "tessera --version with LibTorch's own file"
cat "$T"/bind.* | awk '$2 == "binding" && $4 ~ /libtorch_cpu\.so/ {n = split($7, p, "/"); print p[n]}' | sort -u >"$T/used"
check "the loader bound libtorch_cpu's symbols ($(wc -l <"$T/used") libraries)" test -s "$T/used"
comm -23 "$T/sys.needed" "$T/used" >"$T/unbound"
echo "libtorch_cpu's DT_NEEDED entries the loader binds nothing to: $(wc -l <"$T/unbound") of $(wc -l <"$T/sys.needed")"

if objdump -p "$sys" | grep -qE '^ *(RUNPATH|RPATH) '; then
  check "a LibTorch with a RUNPATH of its own is loaded as it is (no copy)" test ! -e "$lean"
  echo "$pass passed (no copy to check: $sys has a RUNPATH)"; exit 0
fi
if [[ ! -s $T/unbound ]]; then
  check "every entry is bound: no copy" test ! -e "$lean"
  echo "$pass passed (no copy to check)"; exit 0
fi
check "build/lib holds the lean copy of $sys" test -f "$lean"

# Only the .dynamic section differs.
read -r dyn_off dyn_size < <(readelf -S -W "$lean" | awk '$2 == ".dynamic" {print $5, $6}')
dyn_off=$((16#$dyn_off)); dyn_size=$((16#$dyn_size))
outside=$(cmp -l "$sys" "$lean" | awk -v a="$dyn_off" -v n="$dyn_size" '$1 - 1 < a || $1 - 1 >= a + n' | wc -l)
differing=$(cmp -l "$sys" "$lean" | wc -l)
[[ $(stat -c %s "$sys") == $(stat -c %s "$lean") && $outside == 0 && $differing -gt 0 ]] ||
  fail "the copy differs outside .dynamic ($outside of $differing bytes) or in size"
ok "the copy differs only inside .dynamic ($differing bytes)"
check "the same exported symbols" cmp -s <(nm -D --defined-only "$sys") <(nm -D --defined-only "$lean")

needed "$lean" >"$T/lean.needed"
comm -13 "$T/sys.needed" "$T/lean.needed" >"$T/added"
comm -23 "$T/sys.needed" "$T/lean.needed" >"$T/removed"
check "no entry added" test ! -s "$T/added"
check "entries left out ($(wc -l <"$T/removed") of $(wc -l <"$T/sys.needed"))" test -s "$T/removed"
bound_removed=$(comm -23 "$T/removed" "$T/unbound" | tr '\n' ' ')
check "only entries the loader binds nothing to${bound_removed:+; bound: $bound_removed}" test -z "$bound_removed"

# Every other binding the same: for each (library, symbol) both starts bind, the same library,
# except where the copy bound before sat in a library left out and the library bound now defines
# the symbol weak (a C++ template or inline function's copy: the same code; glibc's own account).
# bindings FILE...: LD_DEBUG output -> "referrer symbol targets path", a line per (referrer, symbol):
# the libraries it is bound to (a copy relocation binds twice: the executable's copy and the source),
# comma-separated and sorted, and the path of the last.
bindings() {
  awk '$2 == "binding" {n = split($4, a, "/"); m = split($7, b, "/"); s = $0
       sub(/.*symbol `/, "", s); sub(/'"'"'.*/, "", s); print a[n], s, b[m], $7}' "$@" | sort -u |
    awk '{k = $1 " " $2} k != prev {if (prev != "") print prev, ts, path; prev = k; ts = $3; path = $4; next}
         {ts = ts "," $3; path = $4} END {if (prev != "") print prev, ts, path}'
}
LD_BIND_NOW=1 LD_DEBUG=bindings LD_DEBUG_OUTPUT="$T/lean_bind" "$BIN/tessera" --version >/dev/null || fail "tessera --version (bindings)"
bindings "$T"/bind.* >"$T/sys.bindings"
bindings "$T"/lean_bind.* >"$T/lean.bindings"
awk 'NR == FNR {t[$1 " " $2] = $3; next} ($1 " " $2) in t && t[$1 " " $2] != $3 {print $1, $2, t[$1 " " $2], $3, $4}' \
  "$T/sys.bindings" "$T/lean.bindings" >"$T/rebound"
strong=""
while read -r ref sym was now path; do
  grep -qxF "$was" "$T/removed" && nm -D --defined-only "$path" | awk -v s="$sym" '$3 == s {print $2}' | grep -q '^[WV]$' ||
    strong+="$ref:$sym ($was -> $now) "
done <"$T/rebound"
sed 's/^/  moved: /' "$T/rebound"
check "of the $(wc -l <"$T/lean.bindings") (library, symbol) pairs bound, $(wc -l <"$T/rebound") moved, each a weak copy from a library left out${strong:+; not: $strong}" test -z "$strong"

# The binaries load the copy, with fewer libraries.
for b in tessera tessera-faults; do
  where=$(ldd "$BIN/$b" | awk -v n="$orig" '$1 == n {print $3}')
  check "$b loads $where" test "$where" = "$lean"
  n_lean=$(ldd "$BIN/$b" | wc -l)
  n_sys=$(LD_LIBRARY_PATH=$(dirname "$sys") ldd "$BIN/$b" | wc -l)
  check "$b: $n_lean libraries, against $n_sys with LibTorch's own file" test "$n_lean" -lt "$n_sys"
done
"$BIN/tessera" --version >"$T/version" || fail "tessera --version with the copy"
check "tessera runs with the copy: $(head -1 "$T/version")" grep -q LibTorch "$T/version"
echo "$pass passed"
