#!/usr/bin/env bash
# A CLI that never ignores what it was given (issue 35), on the real binary, one process, no MPI:
#  - `tessera --version` says what was built, and exits with its output flushed but no static destructors;
#  - `tessera train run.json` (no --config) trains THAT configuration; a stray argument is refused;
#  - a size without a unit is refused, not read as bytes;
#  - Hugging Face / Accelerate / torchtune key names get Tessera's key;
#  - re-running a finished run with a changed configuration is refused (exit 2) saying what it found
#    and what to do, with nothing on disk changed; --fresh starts over and keeps the old checkpoints;
#    the SLURM job that saved it, requeued after its last save, exits 0 saying it is complete;
#  - the final line names the checkpoint; `ckpt verify` takes a checkpoint.dir;
#  - Ctrl-C (SIGINT) on a single process stops after the step with a checkpoint, and resumes;
#  - `diagnose` tells an interruption and a resumed history from a failure;
#  - a quantized checkpoint is named as such.
set -uo pipefail
BIN=${TESSERA_BIN:?}/tessera
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/../expect.bash"  # ok, fail, check, expect_error

"$BIN" --version > "$T/version" || fail "tessera --version exited $?"
check "--version names the version, commit and LibTorch" grep -qE '^tessera [0-9]+\.[0-9]+\.[0-9]+ \(.+\), LibTorch [0-9]+\.[0-9]+' "$T/version"
# A finished command ends without static destructors (app/main.cpp, exit_now: LibTorch's would cost
# ~10% of a short command's CPU), its output flushed: through a pipe the line is whole, and the
# loader ran every library's initialiser but no finaliser.
LD_DEBUG=files "$BIN" --version 2> "$T/ld_debug" | cat > "$T/version_pipe"
check "--version through a pipe prints the same line" cmp -s "$T/version" "$T/version_pipe"
check "the loader ran the libraries' initialisers" grep -q "calling init: .*libtorch_cpu" "$T/ld_debug"
check "and no finaliser (no static destructors at exit)" test "$(grep -c 'calling fini' "$T/ld_debug")" = 0

# A small text corpus and a configuration given WITHOUT --config.
for i in $(seq 1 60); do echo "line $i: the quick brown fox jumps over the lazy dog, again and again."; done > "$T/corpus.txt"
cat > "$T/run.json" <<JSON
{"data": {"path": "$T/corpus.txt", "tokenizer": "bytes", "seq_len": 32},
 "train": {"steps": 3, "micro_batch": 2, "lr": 1e-3, "warmup_steps": 1},
 "checkpoint": {"dir": "$T/ck", "every": 0}, "log": {"dir": "$T/log"}}
JSON
# (as SLURM job 4242: the checkpoint records the job that saved it). One process, no launcher: an
# MPI singleton, which starts no orted (launcher/bootstrap.cpp: Open MPI 4 would fork one).
SLURM_JOB_ID=4242 "$BIN" train "$T/run.json" > "$T/out1" 2> "$T/err1" &
pid=$! orted=0
while kill -0 "$pid" 2>/dev/null; do
  pgrep -P "$pid" -x orted >/dev/null && orted=1
  sleep 0.05
done
wait "$pid" || fail "tessera train run.json exited $?: $(cat "$T/err1")"
check "one process (an MPI singleton) starts no orted" test "$orted" = 0
check "the positional configuration is used (its data path in the first line)" grep -q "data $T/corpus.txt" "$T/out1"
check "its checkpoint.dir got step-3" test -f "$T/ck/step-3/manifest.json"
check "the final line names the checkpoint" grep -q "done: steps 0 -> 3.*checkpoint $T/ck/step-3" "$T/out1"
expect_error 2 "the configuration is given twice (--config $T/run.json and extra.json)" "$BIN" train --config "$T/run.json" extra.json
expect_error 2 "unexpected argument 'stray'" "$BIN" plan --config "$T/run.json" --ranks 8 stray

expect_error 2 "'80' has no unit.*80GiB" "$BIN" plan --config "$T/run.json" --ranks 8 --gpu-mem 80
expect_error 2 "unknown config key 'train.learning_rate' (Tessera's key for it: train.lr)" \
  "$BIN" train --config "$T/run.json" --set train.learning_rate=1e-4
echo '{"per_device_train_batch_size": 4}' > "$T/hf.json"
expect_error 2 "Tessera's key for it: train.micro_batch" "$BIN" config --check "$T/hf.json"
echo '{"train": {"warmup_ratio": 0.1}}' > "$T/hf2.json"
expect_error 2 "warmup_ratio.*train.warmup_steps" "$BIN" config --check "$T/hf2.json"
# A Hugging Face TrainingArguments YAML: every unknown key in one line, each with Tessera's key.
cat > "$T/training_args.yaml" <<'YAML'
output_dir: out
learning_rate: 2.0e-5
num_train_epochs: 3
per_device_train_batch_size: 4
gradient_accumulation_steps: 8
max_steps: 100
warmup_steps: 10
weight_decay: 0.01
lr_scheduler_type: cosine
logging_steps: 10
save_steps: 50
seed: 42
gradient_checkpointing: true
bf16: true
YAML
expect_error 2 "training_args.yaml: 14 unknown config keys: " "$BIN" config --check "$T/training_args.yaml"
for k in output_dir:checkpoint.dir learning_rate:train.lr num_train_epochs:train.steps per_device_train_batch_size:train.micro_batch \
    gradient_accumulation_steps:train.grad_accum max_steps:train.steps warmup_steps:train.warmup_steps \
    weight_decay:train.weight_decay lr_scheduler_type:train.schedule logging_steps:log.every save_steps:checkpoint.every \
    seed:train.seed gradient_checkpointing:fsdp.activation_checkpointing bf16:fsdp.mixed_precision=bf16; do
  grep -q "'${k%%:*}' (Tessera's key for it: ${k#*:}" "$T/err" || fail "no Tessera key ${k#*:} for ${k%%:*} in: $(cat "$T/err")"
done
ok "each TrainingArguments key names Tessera's"

# The finished run again, with another learning rate: refused, nothing on disk changed.
snapshot() { find "$T/ck" -type f -exec md5sum {} + | sort; }
snapshot > "$T/before"
expect_error 2 "checkpoint $T/ck/step-3 is at step 3, the end of this run (train.steps 3).*train.lr 0.001 -> 0.0005.*raise train.steps.*--fresh" \
  "$BIN" train "$T/run.json" --set train.lr=5e-4
# The same job requeued after its last save (a rank killed after it): complete, exit 0, so that
# TESSERA_REQUEUE_ON_FAILURE does not requeue it again; another job over the same directory: refused.
SLURM_JOB_ID=4242 SLURM_RESTART_COUNT=1 "$BIN" train "$T/run.json" > "$T/out5" 2>&1 ||
  fail "the requeued job that had finished exited $?: $(cat "$T/out5")"
check "the requeued job says its training is complete" grep -q "^tessera train: checkpoint $T/ck/step-3 is at the end of this run (train.steps 3); SLURM job 4242 saved it before this restart (SLURM_RESTART_COUNT 1): training is complete, nothing left to do$" "$T/out5"
expect_error 2 "checkpoint $T/ck/step-3 is at step 3, the end of this run (train.steps 3): nothing to train" \
  env SLURM_JOB_ID=4243 SLURM_RESTART_COUNT=1 "$BIN" train "$T/run.json"
snapshot > "$T/after"
check "the refused re-runs and the requeue changed nothing in checkpoint.dir" cmp -s "$T/before" "$T/after"
"$BIN" train "$T/run.json" --set train.steps=5 > "$T/out2" 2>&1 || fail "raising train.steps exited $?: $(cat "$T/out2")"
check "raising train.steps continues from step 3" grep -q "done: steps 3 -> 5" "$T/out2"
"$BIN" train "$T/run.json" --fresh > "$T/out3" 2>&1 || fail "--fresh exited $?: $(cat "$T/out3")"
check "--fresh starts at step 0" grep -q "done: steps 0 -> 3" "$T/out3"
check "--fresh kept the old checkpoints (retired)" test -f "$T/ck/retired/step-5/manifest.json"
expect_error 2 "--fresh and --resume contradict" "$BIN" train "$T/run.json" --fresh --resume

# ckpt verify on the checkpoint.dir verifies each checkpoint; inspect names them.
"$BIN" ckpt verify "$T/ck" > "$T/verify" 2>&1 || fail "ckpt verify CHECKPOINT_DIR exited $?: $(cat "$T/verify")"
check "ckpt verify on a checkpoint.dir verifies its checkpoints" grep -q "^OK: all 1 checkpoints of $T/ck verified" "$T/verify"
expect_error 2 "is a checkpoint.dir holding 1 checkpoint(s), not one checkpoint: name one, e.g. $T/ck/step-3" "$BIN" ckpt inspect "$T/ck"

# Ctrl-C on one process: stops after the step with a checkpoint; diagnose calls it an interruption
# (no records) or history once resumed.
"$BIN" train "$T/run.json" --fresh --set train.steps=400 --set checkpoint.dir="$T/ck2" --set log.dir="$T/log2" \
  > "$T/out4" 2> "$T/err4" &
pid=$!
for _ in $(seq 1 600); do grep -q '^step' "$T/out4" 2>/dev/null && break; sleep 0.1; done
kill -INT $pid
wait $pid; rc=$?
check "SIGINT on a single process exits 0 after a checkpoint (rc $rc)" test "$rc" = 0
check "it says it stops with a checkpoint" grep -q "interrupt: stopping at the next micro-batch boundary with a checkpoint" "$T/err4"
step=$(sed -n 's/^preempted at step \([0-9]*\): checkpoint .*/\1/p' "$T/out4")
check "the checkpoint of the interrupted step exists (step $step)" test -n "$step" -a -f "$T/ck2/step-$step/manifest.json"
"$BIN" train "$T/run.json" --set train.steps=$((step + 2)) --set checkpoint.dir="$T/ck2" --set log.dir="$T/log2" \
  > "$T/out5" 2>&1 || fail "resume after SIGINT exited $?: $(cat "$T/out5")"
check "the interrupted run resumes where it stopped" grep -q "resumed from $T/ck2/step-$step at step $step" "$T/out5"

# diagnose: a flight record of a SIGTERM'd step-1 run (the run run_info.json names), then a run that
# logged later steps: history (the --fresh run above started a new metrics.jsonl, up to step 3).
run_id=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["run_id"])' "$T/log/run_info.json")
check "run_info.json names the run's id ($run_id)" test -n "$run_id"
mkdir -p "$T/log/flight"
cat > "$T/log/flight/rank-0.json" <<JSON
{"format": "tessera-flight", "version": 1, "rank": 0, "world_size": 1, "host": "h", "pid": 1, "run_id": "$run_id",
 "reason": "signal SIGTERM", "message": "terminated", "context": {"step": 1, "phase": "forward"}, "timeout_ms": 1000,
 "stops": 0, "groups": []}
JSON
"$BIN" diagnose "$T/log" > "$T/dx1" 2>&1 || fail "diagnose exited $?: $(cat "$T/dx1")"
check "diagnose: a run resumed past the records is history, not a failure" \
  grep -q "^summary: these records are of a run that stopped at step 1; the run was resumed and has since logged up to step 3" "$T/dx1"
rm "$T/log/metrics.jsonl"
"$BIN" diagnose "$T/log" > "$T/dx2" 2>&1 || fail "diagnose exited $?: $(cat "$T/dx2")"
check "diagnose: SIGTERM on every rank with nothing pending is an interruption" \
  grep -q "^summary: every rank got SIGTERM at step 1 (Ctrl-C under mpirun, preemption or scancel), not a hang; no collective was left pending" "$T/dx2"

# Records of a run older than the one run_info.json names are stale (a later run started since).
sed -i "s/\"run_id\": \"$run_id\"/\"run_id\": \"1000-1\"/" "$T/log/flight/rank-0.json"
"$BIN" diagnose "$T/log" > "$T/dx3" 2>&1 || fail "diagnose exited $?: $(cat "$T/dx3")"
check "diagnose: records older than run_info.json's run are history, not a failure" \
  grep -q "^summary: these records are of an earlier run (run 1000-1); a later run (run $run_id, run_info.json) started" "$T/dx3"
# A start refused on one rank (its input error before any step; the other rank ended by SIGTERM):
# records newer than run_info.json's run, at step -1. Refused, not a hang or a failed collective.
later=$(( ${run_id%%-*} + 1000 ))-2
for r in 0 1; do
  reason=$([ $r = 1 ] && echo error || echo "signal SIGTERM")
  cat > "$T/log/flight/rank-$r.json" <<JSON
{"format": "tessera-flight", "version": 1, "rank": $r, "world_size": 2, "host": "h", "pid": $((r + 1)), "run_id": "$later",
 "reason": "$reason", "message": "shard rank-1.bin: crc mismatch", "context": {"step": -1, "phase": "resume"},
 "timeout_ms": 1000, "stops": 0, "groups": [{"backend": "mpi", "name": "world", "instance": 0, "ranks": [0, 1],
 "entries": [{"seq": 3, "op": "all_reduce", "reduce": "max", "dtype": "int64", "count": 1, "state": "started"}]}]}
JSON
done
"$BIN" diagnose "$T/log" > "$T/dx4" 2>&1 || fail "diagnose exited $?: $(cat "$T/dx4")"
check "diagnose: a start refused by one rank's input error is named refused, not a failure" \
  grep -q "^summary: the run was refused at start by an input error on rank 1 (shard rank-1.bin: crc mismatch); no step ran and nothing hung" "$T/dx4"
# SIGTERM on both ranks while rank 1 was in a reduce-scatter rank 0 had not issued yet: 40 ms
# after rank 1 issued it, ranks at two points of one step (an interruption); 7 s after, rank 0 had
# stalled before the signal (a failure, the collective named).
for wait_ms in 40 7000; do
  for r in 0 1; do
    entries='{"seq": 3, "op": "reduce_scatter", "reduce": "sum", "dtype": "float32", "count": 4, "state": "completed", "enqueue_ns": 900}'
    [ $r = 1 ] && entries+=', {"seq": 4, "op": "reduce_scatter", "reduce": "sum", "dtype": "float32", "count": 4, "state": "started", "enqueue_ns": 1000}'
    cat > "$T/log/flight/rank-$r.json" <<JSON
{"format": "tessera-flight", "version": 1, "rank": $r, "world_size": 2, "host": "h", "pid": $((r + 1)), "run_id": "$later",
 "reason": "signal SIGTERM", "message": "terminated", "context": {"step": 5, "phase": "train step"},
 "timeout_ms": 60000, "stops": 0, "clock": {"monotonic_ns": $((1000 + wait_ms * 1000000)), "realtime_ns": 1000000000000},
 "groups": [{"backend": "mpi", "name": "world", "instance": 0, "ranks": [0, 1], "last_enqueued": $((3 + r)),
 "last_started": $((3 + r)), "last_completed": 3, "entries": [$entries]}]}
JSON
  done
  "$BIN" diagnose "$T/log" > "$T/dx5" 2>&1 || fail "diagnose exited $?: $(cat "$T/dx5")"
  if [ $wait_ms = 40 ]; then
    check "diagnose: a rank one collective behind, 40 ms after the other issued it, is an interruption" \
      grep -q "^summary: every rank got SIGTERM at step 5 (Ctrl-C under mpirun, preemption or scancel), not a hang" "$T/dx5"
  else
    check "diagnose: a rank behind a collective pending for 7 s before the SIGTERMs stalled: the collective is named" \
      grep -q "^summary: collective #4 reduce_scatter(sum) .* did not complete: rank 0 last issued #3" "$T/dx5"
  fi
done
rm -r "$T/log/flight"

# A quantized checkpoint is named as such.
"$BIN" init-model --preset tiny --out "$T/q" > /dev/null || fail "init-model"
python3 - "$T/q/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
json.dump(c, open(sys.argv[1], "w"))
PY
expect_error 2 "a quantized checkpoint (quantization_config: quant_method bitsandbytes)" \
  "$BIN" train --config "$T/run.json" --set model.path="$T/q" --set checkpoint.dir="$T/ck3"
check "nothing written for the refused quantized model" test ! -e "$T/ck3/step-3"
echo "$pass passed, 0 failed"
