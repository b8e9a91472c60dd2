#!/usr/bin/env bash
# Packs Tessera's C++ build dependencies (Open MPI, Boost.Program_options, yaml-cpp, nlohmann-json, GTest, PCRE2, utf8proc) as
# Debian 12 packages into one folder, for a GPU machine that has CUDA, PyTorch and a compiler but
# not these, and cannot download anything. Run it HERE (Debian 12, apt reaches the mirror):
#
#   bash tests/gpu/pack_deps.sh            # -> .gpu-deps/ in the repository root (git-ignored)
#
# then carry that folder to the GPU machine (device tool: carry [".gpu-deps"]) and run
# `bash tests/gpu/run.sh` there: run.sh unpacks every .deb of it into a private root under its work
# folder (tests/gpu/deps.bash; never into /) and builds against that root. About 18 MB.
#
# The list is the run-time closure of libmpi, mpirun/orted and their components (found with ldd on
# this machine), less what every glibc-based Linux has (libc6, libstdc++6, libgcc-s1, zlib1g,
# libudev1, libuuid1, libatomic1). Headers-only -dev dependencies of libopenmpi-dev (hwloc, pmix,
# libevent, verbs) are left out: Tessera includes only mpi.h.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DEST=${1:-$ROOT/.gpu-deps}
PKGS=(
  # Open MPI 4.1.4: library, launcher (mpirun, orted), wrappers, headers, and what they load
  libopenmpi3 openmpi-bin openmpi-common libopenmpi-dev libpmix2 libevent-core-2.1-7
  libevent-pthreads-2.1-7 libhwloc15 libfabric1 libibverbs1 librdmacm1 libpsm-infinipath1 libpsm2-2
  libucx0 libmunge2 libnl-3-200 libnl-route-3-200 libnuma1 libltdl7
  # Boost.Program_options 1.74 (library, headers, CMake config)
  libboost-program-options1.74.0 libboost-program-options1.74-dev libboost-program-options-dev libboost1.74-dev
  # yaml-cpp 0.7 (library, headers, CMake config): YAML run configs, `tessera config --from-accelerate`
  libyaml-cpp0.7 libyaml-cpp-dev
  # header-only / static test dependencies
  nlohmann-json3-dev libgtest-dev
  # PCRE2 10.42 (tokenizer.json pre-tokenizer regexes): library and headers
  libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
  # utf8proc 2.8 (tokenizer.json's NFC / NFD / NFKC / NFKD normalizers): library and header
  libutf8proc-dev libutf8proc2
)
command -v apt-get >/dev/null || { echo "pack_deps: needs apt-get (run it on the Debian 12 development machine)" >&2; exit 2; }
mkdir -p "$DEST"
rm -f "$DEST"/*.deb
# apt's sandbox user cannot write into root-owned folders; download in a world-writable one.
TMP=$(mktemp -d)
chmod 777 "$TMP"
(cd "$TMP" && apt-get download "${PKGS[@]}" >/dev/null)
mv "$TMP"/*.deb "$DEST"/
rmdir "$TMP"
n=$(ls "$DEST"/*.deb | wc -l)
echo "pack_deps: $n packages, $(du -sh "$DEST" | cut -f1) in $DEST"
if ((n != ${#PKGS[@]})); then
  echo "pack_deps: expected ${#PKGS[@]} packages" >&2
  exit 1
fi
