#!/usr/bin/env bash
# The build's lean libtorch_cpu (cmake/lean_libtorch.cmake, scripts/lean_libtorch.sh): on a LibTorch
# that names libraries it never uses (Debian's), build/lib holds a copy that
#   - differs from LibTorch's own file only inside its .dynamic section (byte comparison),
#   - names the same DT_NEEDED entries less some, and exports the same symbols;
#   - leaves out only libraries the dynamic loader binds none of libtorch_cpu's symbols to (glibc's
#     own account, LD_DEBUG=bindings, of `tessera --version` loading LibTorch's own file);
# and `tessera` and `tessera-faults` load it (their RUNPATH), with fewer libraries than LibTorch's
# own file brings.
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
if objdump -p "$sys" | grep -qE '^ *(RUNPATH|RPATH) '; then
  check "a LibTorch with a RUNPATH of its own is loaded as it is (no copy)" test ! -e "$lean"
  echo "$pass passed (no copy to check: $sys has a RUNPATH)"; exit 0
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

needed() { objdump -p "$1" | awk '$1 == "NEEDED" {print $2}' | sort; }
needed "$sys" >"$T/sys.needed"
needed "$lean" >"$T/lean.needed"
comm -13 "$T/sys.needed" "$T/lean.needed" >"$T/added"
comm -23 "$T/sys.needed" "$T/lean.needed" >"$T/removed"
check "no entry added" test ! -s "$T/added"
check "entries left out ($(wc -l <"$T/removed") of $(wc -l <"$T/sys.needed"))" test -s "$T/removed"

# glibc's loader, loading LibTorch's own file: the libraries it binds libtorch_cpu's symbols to.
LD_LIBRARY_PATH=$(dirname "$sys") LD_DEBUG=bindings LD_DEBUG_OUTPUT="$T/bind" "$BIN/tessera" --version >/dev/null ||
  fail "tessera --version with LibTorch's own file"
cat "$T"/bind.* | awk '$2 == "binding" && $4 ~ /libtorch_cpu\.so/ {n = split($7, p, "/"); print p[n]}' | sort -u >"$T/used"
check "the loader bound libtorch_cpu's symbols ($(wc -l <"$T/used") libraries)" test -s "$T/used"
bound_removed=$(comm -12 "$T/used" "$T/removed" | tr '\n' ' ')
check "none of them left out${bound_removed:+: $bound_removed}" test -z "$bound_removed"

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
