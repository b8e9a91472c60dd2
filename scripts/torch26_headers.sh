#!/usr/bin/env bash
# Fetches Debian 13's LibTorch 2.6 headers (trixie's libtorch-dev .deb; its headers need no other
# package) for the LibTorch 2.6 syntax check (tests/unit/torch26_syntax.sh), WITHOUT installing
# anything: a private apt list (the system's own apt sources and state are not touched), `apt-get
# download`, `dpkg-deb -x` into DIR/root. Works on a fresh Debian 12 (apt, dpkg and
# debian-archive-keyring, which holds trixie's keys, are always there).
#
#   bash scripts/torch26_headers.sh [DIR]     # default build/torch26 (git-ignored)
#
# Idempotent: when DIR/stamp names an unpacked version, nothing is fetched. The headers end up in
# DIR/root/usr/include (plus .../torch/csrc/api/include); DIR/gen holds the one generated header a CPU
# package lacks (c10/cuda/impl/cuda_cmake_macros.h). Exits non-zero, saying why, when anything fails.
# Environment: TORCH26_MIRROR (default: the Debian URI of this system's apt sources), TORCH26_SUITE
# (default trixie).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-build/torch26}
SUITE=${TORCH26_SUITE:-trixie}
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
die() { printf 'torch26_headers: ERROR: %s\n' "$*" >&2; exit 1; }

if [ -f "$DIR/stamp" ] && [ -f "$DIR/root/usr/include/torch/csrc/api/include/torch/torch.h" ]; then
  echo "torch26_headers: $(cat "$DIR/stamp") already in $DIR"
  exit 0
fi

source "$(dirname "${BASH_SOURCE[0]}")/debian_mirror.bash"  # mirror
MIRROR=${TORCH26_MIRROR:-$(mirror)}
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
[ -r "$KEYRING" ] || die "$KEYRING is missing (package debian-archive-keyring)"

A=$DIR/apt
rm -rf "$A" "$DIR/root" "$DIR/gen" "$DIR/stamp"
mkdir -p "$A/lists/partial" "$A/cache/archives/partial" "$A/debs"
echo "deb [signed-by=$KEYRING] $MIRROR $SUITE main" > "$A/sources.list"
: > "$A/status"
# Everything apt reads or writes is under $A; the host's sources, preferences and dpkg state are ignored.
APT=(-o Dir::Etc::SourceList="$A/sources.list" -o Dir::Etc::SourceParts=/dev/null
     -o Dir::Etc::Preferences=/dev/null -o Dir::Etc::PreferencesParts=/dev/null
     -o Dir::State::Lists="$A/lists" -o Dir::Cache="$A/cache" -o Dir::State::status="$A/status"
     -o APT::Architecture=amd64 -o APT::Architectures::=amd64 -o Acquire::Languages=none
     -o APT::Sandbox::User=root -o Debug::NoLocking=1 -o Acquire::Retries=3)
echo "torch26_headers: apt-get update ($MIRROR $SUITE main, private list in $A)"
apt-get "${APT[@]}" -qq update > "$A/update.log" 2>&1 || { cat "$A/update.log" >&2; die "apt-get update of $SUITE failed"; }
# apt-get update exits 0 when a mirror cannot be reached (it only warns): no index is the failure.
ls "$A"/lists/*_Packages* > /dev/null 2>&1 || { cat "$A/update.log" >&2; die "no package index of $SUITE from $MIRROR"; }
ver=$(apt-cache "${APT[@]}" show libtorch-dev 2>/dev/null | sed -n 's/^Version: //p' | head -1 || true)
[ -n "$ver" ] || die "no libtorch-dev in $SUITE ($MIRROR)"
echo "torch26_headers: apt-get download libtorch-dev=$ver"
(cd "$A/debs" && apt-get "${APT[@]}" -qq download "libtorch-dev=$ver") > "$A/download.log" 2>&1 ||
  { cat "$A/download.log" >&2; die "apt-get download libtorch-dev=$ver failed"; }
deb=$(ls "$A"/debs/libtorch-dev_*.deb)
dpkg-deb -x "$deb" "$DIR/root" || die "dpkg-deb -x $deb failed"
rm -rf "$A/lists" "$A/cache"  # ~30 MB of indexes nothing needs any more; the .deb stays (2.4 MB)

inc=$DIR/root/usr/include
V=$inc/torch/csrc/api/include/torch/version.h
[ -f "$V" ] || die "$deb has no torch/version.h"
major=$(sed -n 's/^#define TORCH_VERSION_MAJOR //p' "$V")
minor=$(sed -n 's/^#define TORCH_VERSION_MINOR //p' "$V")
[ "$major.$minor" = "2.6" ] || [ -n "${TORCH26_ANY_VERSION:-}" ] ||
  die "$SUITE's libtorch-dev $ver is LibTorch $major.$minor, not 2.6 (TORCH26_ANY_VERSION=1 accepts it)"
# Export macros CMake generates when it builds c10_cuda; a CPU package has none (as in
# cmake/cuda_nccl.cmake's type check).
if [ ! -f "$inc/c10/cuda/impl/cuda_cmake_macros.h" ]; then
  mkdir -p "$DIR/gen/c10/cuda/impl"
  printf '#pragma once\n// Written by scripts/torch26_headers.sh (CPU LibTorch package).\n#define C10_CUDA_BUILD_SHARED_LIBS\n' \
    > "$DIR/gen/c10/cuda/impl/cuda_cmake_macros.h"
fi
echo "libtorch-dev $ver (LibTorch $major.$minor, $SUITE)" > "$DIR/stamp"
echo "torch26_headers: $(cat "$DIR/stamp") unpacked in $DIR/root"
