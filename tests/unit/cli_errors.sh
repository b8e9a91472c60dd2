#!/usr/bin/env bash
# Bad input gives ONE line naming the problem and exit code 2 -- on every rank, without a hang,
# with nothing written. Runs the real binary, alone and under mpirun.
set -uo pipefail
BIN=${TESSERA_BIN:?}/tessera
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/../mpi/lib.bash"
fail=0; pass=0
# expect_error NAME EXPECTED_SUBSTRING CMD...: exit 2, exactly one stderr line containing SUBSTRING
expect_error() {
  local name=$1 want=$2; shift 2
  timeout 120 "$@" >"$T/out" 2>"$T/err"; local rc=$?
  # mpirun adds its own banner about the non-zero exit; count Tessera's lines only.
  local lines; lines=$(grep -c '^tessera' "$T/err")
  if [ $rc -eq 2 ] && [ "$lines" -eq 1 ] && grep -qF -- "$want" "$T/err"; then
    pass=$((pass+1))
  else
    fail=$((fail+1)); echo "FAIL $name: rc=$rc lines=$lines want '$want'"; cat "$T/err"
  fi
}
echo '{"train": {"steps": 3,}}' > "$T/bad.json"
echo '{"train": {"stepz": 3}}' > "$T/typo.json"
echo '{"train": {"steps": "three"}}' > "$T/type.json"
echo '{"fsdp": {"strategy": "full_shad"}}' > "$T/choice.json"
: > "$T/empty.txt"
printf 'short text\n' > "$T/short.txt"
echo 'not a sentencepiece model' > "$T/tok.model"

expect_error unknown-command "did you mean 'train'" $BIN trian
expect_error unknown-option "did you mean '--config'" $BIN train --confg x.json
expect_error invalid-json "bad.json:1:" $BIN train --config "$T/bad.json"
expect_error unknown-key "did you mean 'train.steps'" $BIN train --config "$T/typo.json"
expect_error wrong-type "'train.steps' must be int" $BIN train --config "$T/type.json"
expect_error bad-choice "did you mean 'full_shard'" $BIN train --config "$T/choice.json"
expect_error bad-set "unknown config key 'train.lrr'" $BIN train --set train.lrr=1
expect_error missing-config "cannot open config file" $BIN train --config "$T/nope.json"
expect_error empty-data "empty.txt" $BIN train --set data.path="$T/empty.txt" --set checkpoint.dir="$T/ck1"
expect_error short-data "short.txt" $BIN train --set data.path="$T/short.txt" --set checkpoint.dir="$T/ck2"
# (scripts/sanitize.sh sets TESSERA_TEST_NO_SENTENCEPIECE: the sanitizer runtimes refuse the
# RTLD_DEEPBIND load of libsentencepiece, text/tokenizer.cpp.)
if [ -z "${TESSERA_TEST_NO_SENTENCEPIECE:-}" ]; then
  expect_error bad-tokenizer "tok.model" $BIN train --set data.tokenizer="$T/tok.model"
else
  echo "skipped bad-tokenizer: TESSERA_TEST_NO_SENTENCEPIECE (sanitizer build)"
fi
expect_error seq-too-long "max_position_embeddings" $BIN train --set data.seq_len=100000
expect_error bad-timeout "--set: config key 'comm.timeout_s' must be >= 0.001, got 0" $BIN train --set comm.timeout_s=0
expect_error emulate-zero-gbps "comm.emulate_gbps must be above 0" $BIN train --set comm.emulate_ranks=8 --set comm.emulate_gbps=0
expect_error emulate-negative-gbps "comm.emulate_gbps must be above 0" $BIN train --set comm.emulate_gbps=-48
expect_error emulate-one-rank "comm.emulate_ranks must be 0 (off) or the number of ranks to emulate (>= 2), got 1" $BIN train --set comm.emulate_ranks=1
expect_error emulate-staged "comm.device_backend=staged has none" $BIN train --set comm.emulate_ranks=8 --set comm.device_backend=staged
expect_error emulate-on-cpu "comm.emulate_ranks=8 delays the NCCL communicator's stream, but this run is on the CPU (train.device=cpu)" $BIN train --set comm.emulate_ranks=8 --set train.device=cpu
expect_error staged-on-cpu "comm.device_backend=staged stages the collectives of GPU tensors, but train.device=cpu runs on the CPU" $BIN train --set comm.device_backend=staged --set train.device=cpu
expect_error diagnose-nothing "no flight records" $BIN diagnose "$T/nothing-here"
expect_error batch-too-big "fewer than one global batch" $BIN train --set data.path="$T/short.txt" --set data.seq_len=2 --set train.micro_batch=100000
expect_error bad-ranks-per-node "must be a positive integer" $BIN topo --ranks-per-node zero
# Under mpirun: every rank fails the same way; mpirun exits 2; one line printed (by rank 0).
expect_error mpi-unknown-key "did you mean 'train.steps'" "${MPIRUN[@]}" -np 2 $BIN train --config "$T/typo.json"
expect_error mpi-hybrid-layout "does not divide the world size" "${MPIRUN[@]}" -np 4 $BIN train --ranks-per-node 3 --set fsdp.strategy=hybrid_shard
expect_error mpi-missing-model "nomodel: model directory does not exist" "${MPIRUN[@]}" -np 2 $BIN train --set model.path="$T/nomodel"
# train.device asks for a GPU this CPU-only build cannot use: rank, host and device named, exit 2 on
# every rank, nothing written (checkpoint and log dirs are created only after the device is agreed).
expect_error device-bad-spec "train.device 'gpu' is not one of auto, cpu, cuda, cuda:N" $BIN train --set train.device=gpu
expect_error device-cuda-cpu-build "tessera: error: rank 0: train.device=cuda on host $(hostname) (local rank 0, device cuda:0): this tessera was built without CUDA" \
  $BIN train --set train.device=cuda --set checkpoint.dir="$T/ck3" --set log.dir="$T/log3"
expect_error device-index "train.device=cuda:7 on host $(hostname) (local rank 0, device cuda:7)" \
  $BIN train --set train.device=cuda:7 --set checkpoint.dir="$T/ck4"
expect_error mpi-device-cuda "tessera: error: rank 0: train.device=cuda on host $(hostname) (local rank 0, device cuda:0)" \
  "${MPIRUN[@]}" -np 3 $BIN train --set train.device=cuda --set checkpoint.dir="$T/ck5" --set log.dir="$T/log5"
expect_error mpi-device-cuda-nodes "tessera: error: rank 0: train.device=cuda:1 on host $(hostname) (local rank 0, device cuda:1)" \
  "${MPIRUN[@]}" -np 2 $BIN train --ranks-per-node 1 --set train.device=cuda:1 --set checkpoint.dir="$T/ck6"
# SLURM says this task is rank 5 of 9 but MPI (a singleton) says rank 0 of 1.
expect_error slurm-mismatch "SLURM and MPI disagree" env SLURM_JOB_ID=77 SLURM_STEP_ID=0 SLURM_PROCID=5 SLURM_NTASKS=9 \
  SLURM_LOCALID=1 SLURM_NODEID=2 SLURM_NNODES=3 SLURM_JOB_NODELIST='n[1-3]' $BIN topo
# Nothing was written by any failed run.
[ ! -e "$T/ck1" ] && [ ! -e "$T/ck2" ] && [ ! -e "$T/ck3" ] && [ ! -e "$T/log3" ] && [ ! -e "$T/ck4" ] &&
  [ ! -e "$T/ck5" ] && [ ! -e "$T/log5" ] && [ ! -e "$T/ck6" ] && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL: a failed run created its checkpoint dir"; }
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
