# Sourced by tests/gpu/run.sh and tests/unit/gpu_deps.sh: use the Debian packages that
# tests/gpu/pack_deps.sh carried, from a private root (never /).
#
#   deps_unpack DEBS_DIR ROOT   extracts every DEBS_DIR/*.deb into ROOT (dpkg-deb, or ar + tar where
#                               the machine has no dpkg); non-zero on any failure
#   deps_use ROOT               exports OPAL_PREFIX, PATH (mpirun, mpicc) and LD_LIBRARY_PATH for ROOT
#                               and sets the array CMAKE_DEPS to the CMake arguments that find
#                               Open MPI, Boost, yaml-cpp, nlohmann-json and GTest there
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
    -DPCRE2_INCLUDE_DIR="$usr/include" -DPCRE2_LIBRARY="$lib/libpcre2-8.so")
}
