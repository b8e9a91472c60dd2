# Sourced by tests/gpu/run.sh and tests/unit/gpu_deps.sh: use the Debian packages that
# tests/gpu/pack_deps.sh carried, from a private root (never /).
#
#   deps_unpack DEBS_DIR ROOT   extracts every DEBS_DIR/*.deb into ROOT (dpkg-deb, or ar + tar where
#                               the machine has no dpkg); non-zero on any failure
#   deps_use ROOT               exports OPAL_PREFIX, PATH (mpirun, mpicc) and LD_LIBRARY_PATH for ROOT
#                               and sets the array CMAKE_DEPS to the CMake arguments that find
#                               Open MPI, Boost, yaml-cpp, nlohmann-json, GTest and PCRE2 there
#   deps_glibc_ok [VERSION]     true when glibc (this machine's, or VERSION) is new enough for the
#                               carried Debian 12 packages (>= 2.36); else says so on stderr
#   deps_choice DEBS_DIR        which C++ dependencies a GPU run uses, one line: the carried packages
#                               of DEBS_DIR (true) where they can load here, else why not and that the
#                               machine's own are used (false); TESSERA_GPU_GLIBC=X.Y pretends a glibc
#   mpi_local_env               exports what every MPI start on one machine without ssh needs
#   hide_remote_shells          (root, inside a private mount namespace) hides every ssh and rsh on
#                               PATH under /dev/null, as on a machine that has neither
deps_unpack() {
  local debs=$1 root=$2 f d
  compgen -G "$debs/*.deb" >/dev/null || { echo "deps_unpack: no .deb in $debs" >&2; return 1; }
  rm -rf "$root" && mkdir -p "$root" || return 1
  for f in "$debs"/*.deb; do
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$f" "$root" || return 1
    else
      d=$(ar t "$f" | grep '^data\.tar') || return 1
      ar p "$f" "$d" | tar -xa -f - -C "$root" 2>/dev/null || ar p "$f" "$d" | tar -x --zstd -f - -C "$root" || return 1
    fi
  done
}

deps_use() {
  local root=$1
  local usr=$root/usr lib=$root/usr/lib/x86_64-linux-gnu
  [[ -x $usr/bin/mpirun.openmpi && -d $lib/cmake/Boost-1.74.0 ]] || { echo "deps_use: $root holds no unpacked dependencies" >&2; return 1; }
  mkdir -p "$root/bin"
  ln -sf "$usr/bin/mpirun.openmpi" "$root/bin/mpirun"
  ln -sf "$usr/bin/mpicc.openmpi" "$root/bin/mpicc"
  # Open MPI finds its components, help files and wrapper data under OPAL_PREFIX.
  export OPAL_PREFIX=$usr PATH=$root/bin:$PATH LD_LIBRARY_PATH=$lib:${LD_LIBRARY_PATH:-}
  CMAKE_DEPS=(-DMPI_C_COMPILER="$usr/bin/mpicc.openmpi" -DBoost_DIR="$lib/cmake/Boost-1.74.0"
    -Dnlohmann_json_DIR="$usr/share/cmake/nlohmann_json" -DGTest_DIR="$lib/cmake/GTest" -Dyaml-cpp_DIR="$lib/cmake/yaml-cpp"
    -DPCRE2_INCLUDE_DIR="$usr/include" -DPCRE2_LIBRARY="$lib/libpcre2-8.so"
    -DUTF8PROC_INCLUDE_DIR="$usr/include" -DUTF8PROC_LIBRARY="$lib/libutf8proc.so")
}

# The carried packages are Debian 12's, built against glibc 2.36: older C libraries fail at load
# time with "version `GLIBC_2.3x' not found", long after the unpack.
deps_glibc_ok() {
  local v=${1:-$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')}
  [[ -z $v ]] && v=$(ldd --version 2>/dev/null | awk 'NR==1 {print $NF}')
  local major=${v%%.*} minor=${v#*.}
  minor=${minor%%[!0-9]*}
  if [[ ! $major =~ ^[0-9]+$ || ! $minor =~ ^[0-9]+$ ]]; then
    echo "deps_glibc_ok: cannot tell this machine's glibc version ('$v')" >&2
    return 1
  fi
  if ((major < 2 || (major == 2 && minor < 36))); then
    echo "deps_glibc_ok: glibc $v is older than 2.36, which the carried Debian 12 packages need" >&2
    return 1
  fi
}

deps_choice() {
  local debs=$1 why
  if ! compgen -G "$debs/*.deb" >/dev/null; then
    echo "no carried C++ dependencies ($debs/*.deb): using this machine's own"
    return 1
  fi
  if ! why=$(deps_glibc_ok ${TESSERA_GPU_GLIBC:-} 2>&1); then
    echo "${why#deps_glibc_ok: }: using this machine's own C++ dependencies instead"
    return 1
  fi
  echo "the carried C++ dependencies, $(ls "$debs"/*.deb | wc -l) packages from $debs"
}

# Open MPI 4.1 starts even `mpirun -np 1`, and a singleton MPI_Init (a daemon is forked), through
# its rsh launcher, which aborts when neither ssh nor rsh exists ("plm_rsh_agent: ssh : rsh ... could
# not be found"), as on a bare GPU machine. The isolated launcher starts local processes only.
# Running as root needs the two ALLOW variables.
mpi_local_env() {
  export OMPI_MCA_plm=isolated OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
}

hide_remote_shells() {
  local p n=0
  for p in $(type -aP ssh rsh 2>/dev/null | xargs -r realpath | sort -u); do
    mount --bind /dev/null "$p" || return 1
    n=$((n + 1))
  done
  echo "$n"
}
