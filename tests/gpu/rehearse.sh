#!/usr/bin/env bash
# Rehearses tests/gpu/run.sh on this (GPU-less, Debian 12) machine as a machine WITHOUT Tessera's
# C++ dependencies, and without ssh or rsh, would see it: in a private mount namespace, the system's
# own Open MPI, Boost, yaml-cpp, nlohmann-json and GTest (headers, CMake packages, libraries, launchers) are
# hidden -- directories under empty tmpfs mounts, files under /dev/null -- so any silent fallback to
# /usr fails the build or the runs, and so are ssh and rsh, so an MPI start that needs them (Open
# MPI's default launcher, even for one rank) fails the MPI steps. Needs root (unshare -m) and the
# packed folder (bash tests/gpu/pack_deps.sh). At its end run.sh checks that the steps ran in the GPU
# order and prints the GPU-mode limits after the build for several budgets left, each checked to fit
# (the same plan as `bash tests/gpu/run.sh --plan`, which computes it in a second without running).
#
#   bash tests/gpu/rehearse.sh        # results in $OUT/gpu_results.txt, else ./gpu_results.txt
#   TESSERA_GPU_STEPS=conformance bash tests/gpu/rehearse.sh     # some steps only (see run.sh)
#   TESSERA_GPU_REHEARSAL_KEEP=1 ...  # keep the last rehearsal's build folder: an incremental build
set -euo pipefail
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
if [[ ${1:-} != --inside ]]; then
  [[ $(id -u) -eq 0 ]] || { echo "rehearse: needs root (mount namespace)" >&2; exit 2; }
  compgen -G "${TESSERA_GPU_DEBS:-$SRC/.gpu-deps}/*.deb" >/dev/null ||
    { echo "rehearse: no packed dependencies; run: bash tests/gpu/pack_deps.sh" >&2; exit 2; }
  exec unshare -m --propagation private bash "${BASH_SOURCE[0]}" --inside
fi
L=/usr/lib/x86_64-linux-gnu
for d in /usr/include/boost /usr/include/yaml-cpp /usr/include/nlohmann /usr/include/gtest /usr/include/gmock "$L/openmpi" \
  "$L/cmake/Boost-1.74.0" "$L/cmake/boost_headers-1.74.0" "$L/cmake/boost_program_options-1.74.0" "$L/cmake/GTest" "$L/cmake/yaml-cpp" \
  /usr/share/cmake/nlohmann_json /usr/share/openmpi /etc/openmpi; do
  if [[ -d $d ]]; then mount -t tmpfs none "$d"; fi
done
n=0
for f in "$L"/libmpi* "$L"/libopen-rte* "$L"/libopen-pal* "$L"/libboost_program_options* "$L"/libyaml-cpp* "$L"/libgtest* "$L"/libgmock* \
  "$L"/libpmix* "$L"/libhwloc* "$L"/libevent* "$L"/libfabric* "$L"/libucx* "$L"/libuc[pmst]* \
  /usr/bin/mpirun* /usr/bin/mpicc* /usr/bin/mpiexec* /usr/bin/orterun /usr/bin/orted /usr/bin/opal_wrapper; do
  if [[ -e $f && ! -L $f ]]; then mount --bind /dev/null "$f" && n=$((n + 1)); fi
done
source "$SRC/tests/gpu/deps.bash"
shells=$(hide_remote_shells) || { echo "rehearse: could not hide ssh/rsh" >&2; exit 1; }
echo "rehearse: system copies hidden ($n files, $(ls /usr/include/boost | wc -l) entries left in /usr/include/boost); $shells of ssh/rsh hidden, command -v ssh: $(p=$(command -v ssh); [[ -x $p ]] && echo "$p" || echo none)"
export TESSERA_GPU_REHEARSAL=1 TESSERA_GPU_WORK=${TESSERA_GPU_WORK:-/tmp/tessera-gpu-rehearsal}
if [[ ${TESSERA_GPU_REHEARSAL_KEEP:-0} == 1 ]]; then
  rm -rf "$TESSERA_GPU_WORK/logs" "$TESSERA_GPU_WORK/run"
else
  rm -rf "$TESSERA_GPU_WORK"
fi
exec bash "$SRC/tests/gpu/run.sh"
