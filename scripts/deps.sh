#!/usr/bin/env bash
# Installs every Debian package Tessera needs. Idempotent: does nothing when all are present.
set -euo pipefail
PKGS=(build-essential cmake libtorch-dev libopenmpi-dev openmpi-bin nlohmann-json3-dev
      libboost-program-options-dev libsentencepiece-dev sentencepiece libgtest-dev
      libopenblas0-openmp libgloo-dev slurm-wlm munge base-files
      clang libclang-rt-14-dev)  # clang + libFuzzer/ASan runtime: ctest sanitize.fuzz_replay (tests/fuzz)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "deps: all ${#PKGS[@]} packages present"; exit 0
fi
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
echo "deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
echo "deps: done"
