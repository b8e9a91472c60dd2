#!/usr/bin/env bash
# The GPU script's carried dependencies (tests/gpu/pack_deps.sh + tests/gpu/deps.bash) work from a
# private root: the packages download, unpack outside /, an MPI program built with the carried
# wrapper runs under the carried mpirun on 2 ranks with the carried libmpi, also on a machine
# without ssh (mpi_local_env), the glibc check refuses C libraries older than the packages' (and
# run.sh then uses the machine's own packages), and Tessera's CMake configure takes Open MPI, Boost,
# nlohmann-json and GTest from that root, not /usr. Also tests/gpu/run.sh's plan (`run.sh --plan`,
# nothing runs): the GPU step order, every limit after the build within the budget left, and the
# --gtest_filter names it runs naming tests that exist.
set -uo pipefail
SRC=${TESSERA_SRC:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
source "$SRC/tests/expect.bash"  # ok, fail
# passed NAME STATUS [DETAIL]: ok NAME when STATUS (the $? of what was just run) is 0, else fail NAME DETAIL.
passed() { if [ "$2" -eq 0 ]; then ok "$1"; else fail "$1 ${3:-}"; fi; }

bash "$SRC/tests/gpu/pack_deps.sh" "$T/debs" >"$T/pack.log" 2>&1
passed "pack_deps downloads every package" $? "$(tail -3 "$T/pack.log")"
source "$SRC/tests/gpu/deps.bash"
deps_unpack "$T/debs" "$T/root"
passed "unpack into a private root" $?
CMAKE_DEPS=()
deps_use "$T/root"
passed "deps_use" $?
[[ $OPAL_PREFIX == "$T/root/usr" && $(command -v mpirun) == "$T/root/bin/mpirun" ]]
passed "environment points at the root" $? "OPAL_PREFIX=$OPAL_PREFIX mpirun=$(command -v mpirun)"

cat >"$T/hello.c" <<'C'
#include <mpi.h>
#include <stdio.h>
#include <string.h>
int main(int argc, char** argv) {
  int level, rank, size, one = 1, sum = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &level);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  char line[1024], lib[1024] = "";
  FILE* maps = fopen("/proc/self/maps", "r");
  while (maps && fgets(line, sizeof line, maps))
    if (strstr(line, "libmpi.so")) { sscanf(strchr(line, '/'), "%1023s", lib); break; }
  printf("rank %d of %d sum %d multiple %d lib %s\n", rank, size, sum, level == MPI_THREAD_MULTIPLE, lib);
  MPI_Finalize();
  return 0;
}
C
mpicc "$T/hello.c" -o "$T/hello" 2>"$T/cc.log"
passed "carried mpicc compiles" $? "$(head -3 "$T/cc.log")"
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 60 \
  mpirun --oversubscribe -np 2 --mca btl self,tcp --mca btl_tcp_if_include lo "$T/hello" >"$T/run.log" 2>&1
passed "carried mpirun runs 2 ranks" $? "$(tail -3 "$T/run.log")"
n=$(grep -c "of 2 sum 2 multiple 1 lib $T/root/usr/lib/" "$T/run.log")
[ "$n" -eq 2 ]
passed "both ranks use the carried libmpi with MPI_THREAD_MULTIPLE" $? "$(cat "$T/run.log")"

deps_glibc_ok 2.35 2>/dev/null
[ $? -ne 0 ]
passed "glibc 2.35 refused for the carried packages" $?
deps_glibc_ok 2.36 && deps_glibc_ok 2.39 && deps_glibc_ok
passed "glibc 2.36, 2.39 and this machine's own accepted" $?
# What tests/gpu/run.sh decides from that (deps_choice): an older glibc means the machine's own packages.
why=$(TESSERA_GPU_GLIBC=2.31 deps_choice "$T/debs")
rc=$?
[[ $rc -ne 0 && $why == "glibc 2.31 is older than 2.36, which the carried Debian 12 packages need: using this machine's own C++ dependencies instead" ]]
passed "run.sh with glibc 2.31: says so and uses the machine's own packages" $? "(rc $rc: $why)"
why=$(deps_choice "$T/debs") && [[ $why == "the carried C++ dependencies, "*" packages from $T/debs" ]]
passed "run.sh with this machine's glibc: the carried packages" $? "($why)"
why=$(deps_choice "$T/none")
[[ $? -ne 0 && $why == *"no carried C++ dependencies"*"using this machine's own" ]]
passed "run.sh without carried packages: the machine's own" $? "($why)"

# tests/gpu/run.sh's plan (--plan: nothing runs): the GPU order, and for any time left after the
# build every step's limit fits what is left (the sum of the limits after the build <= left - the
# report's reserve), for one GPU and for two.
plan_out=$(bash "$SRC/tests/gpu/run.sh" --plan 2>&1)
passed "run.sh --plan" $? "$(tail -3 <<<"$plan_out")"
[[ $(head -1 <<<"$plan_out") == "order: env deps configure build eager probe init_model tessera_train kernel_profile fsdp_train optim_bench shared_gpu compile fp16_bf16 conformance nccl_timeout nccl_stall hf_parity report" ]]
passed "the GPU order: build (eager beside it), probe + tessera_train, kernel_profile, fsdp_train, optim_bench, shared_gpu, compile (torch.compile), fp16_bf16, conformance, nccl_timeout, nccl_stall, hf_parity" $? "$(head -1 <<<"$plan_out")"
plan_ok=0
for gpus in 1 2; do
  for left in 600 490 400 300 200 120 75 40 10; do
    out=$(bash "$SRC/tests/gpu/run.sh" --plan "$left" "$gpus" 2>&1) || { plan_ok=1; echo "  --plan $left $gpus: $(tail -1 <<<"$out")"; }
    names=$(sed -n 's/^  \([a-z0-9_]\+\) \+\(limit \|skipped:\).*/\1/p' <<<"$out" | tr '\n' ' ')
    [[ $names == "probe init_model tessera_train kernel_profile fsdp_train optim_bench shared_gpu compile fp16_bf16 conformance nccl_timeout nccl_stall hf_parity " ]] ||
      { plan_ok=1; echo "  --plan $left $gpus: steps $names"; }
    sum=$(sed -n 's/^  [a-z0-9_]* *limit *\([0-9]*\)s$/\1/p' <<<"$out" | awk '{s += $1} END {print s + 0}')
    ((${sum:-0} <= left - 10)) || { plan_ok=1; echo "  --plan $left $gpus: limits sum to $sum"; }
    if ((left >= 300)); then
      grep -q '^  tessera_train  limit  120s$' <<<"$out" || { plan_ok=1; echo "  --plan $left $gpus: tessera_train without its full limit"; }
      grep -q '^  kernel_profile limit   75s$' <<<"$out" || { plan_ok=1; echo "  --plan $left $gpus: kernel_profile without its full limit"; }
    fi
  done
done
[[ $plan_ok -eq 0 ]]
passed "the limits after the build fit the budget left (9 budgets left x 1 and 2 GPUs), tessera_train and kernel_profile get their full limits from 300 s left" $?
# The device test cases run.sh filters on exist (a renamed test would leave a filter matching nothing).
filters_ok=0
for var in CONFORMANCE_TESTS FSDP_TESTS NCCL_TIMEOUT_TESTS; do
  list=$(sed -n "s/^$var=//p" "$SRC/tests/gpu/run.sh")
  [[ -n $list ]] || { filters_ok=1; echo "  no $var in run.sh"; }
  for t in ${list//:/ }; do
    grep -qE "^TEST(_F)?\(${t%%.*}, ${t#*.}\)" "$SRC"/tests/mpi/test_*.cpp || { filters_ok=1; echo "  $t: no such test in tests/mpi"; }
  done
done
[[ $filters_ok -eq 0 ]]
passed "every test case run.sh's --gtest_filter names exists in tests/mpi" $?

# A machine without ssh or rsh (as a bare GPU machine): the carried mpirun, even with one rank, and
# a singleton start abort unless mpi_local_env is in force; with it both work (tests/gpu/run.sh uses
# it for every MPI step). Hidden in a private mount namespace, which needs root.
if [[ $(id -u) -eq 0 ]] && command -v unshare >/dev/null; then
  cat >"$T/nossh.sh" <<'SH'
source "$1/tests/gpu/deps.bash"
deps_use "$2/root" || exit 1
echo "hidden: $(hide_remote_shells)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "== plain np1"; timeout 60 mpirun -np 1 "$2/hello" 2>&1; echo "rc=$?"
echo "== plain singleton"; timeout 60 "$2/hello" 2>&1; echo "rc=$?"
mpi_local_env
echo "== local np2"; timeout 60 mpirun --oversubscribe --bind-to none -np 2 --mca btl self,tcp --mca btl_tcp_if_include lo "$2/hello" 2>&1; echo "rc=$?"
echo "== local singleton"; timeout 60 "$2/hello" 2>&1; echo "rc=$?"
SH
  unshare -m --propagation private bash "$T/nossh.sh" "$SRC" "$T" >"$T/nossh.log" 2>&1
  section() { awk -v s="== $1" '$0 == s {on = 1; next} /^== / {on = 0} on' "$T/nossh.log"; }
  grep -q '^hidden: [1-9]' "$T/nossh.log" && ! section "plain np1" | grep -q '^rc=0$' &&
    section "plain np1" | grep -q 'plm_rsh_agent'
  passed "without ssh: plain mpirun -np 1 aborts (plm_rsh_agent)" $? "$(head -3 "$T/nossh.log")"
  ! section "plain singleton" | grep -q '^rc=0$'
  passed "without ssh: plain singleton MPI_Init fails" $?
  [[ $(section "local np2" | grep -c "of 2 sum 2") -eq 2 ]] && section "local np2" | grep -q '^rc=0$'
  passed "without ssh: mpirun -np 2 runs under mpi_local_env" $? "$(section "local np2" | tail -5)"
  section "local singleton" | grep -q "rank 0 of 1 sum 1" && section "local singleton" | grep -q '^rc=0$'
  passed "without ssh: singleton runs under mpi_local_env" $? "$(section "local singleton" | tail -5)"
else
  echo "skip without-ssh checks (need root and unshare for a private mount namespace)"
fi

GEN=(); command -v ninja >/dev/null && GEN=(-G Ninja)
cmake -S "$SRC" -B "$T/build" "${GEN[@]}" "${CMAKE_DEPS[@]}" >"$T/cmake.log" 2>&1
passed "Tessera configures against the root" $? "$(grep -A3 'CMake Error' "$T/cmake.log" | head -8)"
for var in MPI_C_HEADER_DIR MPI_mpi_LIBRARY Boost_DIR boost_program_options_DIR yaml-cpp_DIR nlohmann_json_DIR GTest_DIR PCRE2_INCLUDE_DIR PCRE2_LIBRARY; do
  val=$(grep -E "^$var:" "$T/build/CMakeCache.txt" | cut -d= -f2-)
  [[ $val == "$T/root/"* ]]
  passed "$var from the root" $? "($val)"
done
echo "$pass passed, 0 failed"
