#!/usr/bin/env bash
# lean_libtorch.sh LIBTORCH_CPU OUT_DIR: puts in OUT_DIR a copy of LIBTORCH_CPU (under its SONAME)
# without the DT_NEEDED entries it takes no symbol from, and nothing else changed; the build's
# binaries find it first (their RUNPATH, cmake/lean_libtorch.cmake). Where nothing is to be left out,
# the library has a RUNPATH/RPATH of its own (pip's: $ORIGIN would then point at OUT_DIR), or
# patchelf is missing, OUT_DIR holds no copy and the binaries load LIBTORCH_CPU itself.
#
# Why: Debian's libtorch_cpu.so.1.13 names 46 libraries, 24 of which (OpenCV, FFmpeg, LevelDB, LMDB,
# ZeroMQ, OpenCL, ...) define none of its undefined symbols; they pull in 246 libraries more (GDAL,
# Poppler, Xerces, ...), whose loading, relocation and static initialisers cost every process that
# loads LibTorch ~0.19 of its ~0.42 CPU-seconds of start-up (`tessera`: 50 libraries instead of 296).
#
# Kept: every entry that defines one of the library's undefined symbols (weak ones included, by name,
# any version), and every entry whose file this script cannot find or read. libtorch_cpu is linked
# with BIND_NOW, so a symbol a left-out library did provide would fail loudly when it loads, not later.
set -euo pipefail
lib=$1
out_dir=$2
mkdir -p "$out_dir"
real=$(readlink -f "$lib")
soname=$(objdump -p "$real" | awk '$1 == "SONAME" {print $2}')
[[ -n $soname ]] || { echo "lean_libtorch: $real has no SONAME" >&2; exit 1; }
copy=$out_dir/$soname

# The library's DT_NEEDED entries that define none of its undefined symbols.
unused_needed() {
  local und cache needed file defs used
  und=$(mktemp)
  cache=$(ldconfig -p)
  nm -D --undefined-only "$real" | awk '{print $NF}' | sed 's/@.*//' | sort -u >"$und"
  for needed in $(objdump -p "$real" | awk '$1 == "NEEDED" {print $2}'); do
    file=$(awk -v n="$needed" '$1 == n && !f {f = $NF} END {print f}' <<<"$cache")
    [[ -n $file && -r $file ]] || continue
    defs=$(nm -D --defined-only "$file" 2>/dev/null) || continue
    used=$(awk '{print $NF}' <<<"$defs" | sed 's/@.*//' | sort -u | comm -12 - "$und" | wc -l)
    ((used == 0)) && echo "$needed"
  done
  rm -f "$und"
}

rm -f "$copy"
if objdump -p "$real" | grep -qE '^ *(RUNPATH|RPATH) '; then
  echo "lean_libtorch: $real has a RUNPATH/RPATH of its own: loaded as it is"
  exit 0
fi
if ! command -v patchelf >/dev/null; then
  echo "lean_libtorch: patchelf not found (scripts/deps.sh installs it): $real loaded as it is" >&2
  exit 0
fi
mapfile -t unused < <(unused_needed)
if ((${#unused[@]} == 0)); then
  echo "lean_libtorch: every library $real names is used: loaded as it is"
  exit 0
fi
cp "$real" "$copy.tmp"
patchelf $(printf -- '--remove-needed %s ' "${unused[@]}") "$copy.tmp"
mv "$copy.tmp" "$copy"
echo "lean_libtorch: $copy: $real without ${#unused[@]} unused DT_NEEDED entries (${unused[*]})"
