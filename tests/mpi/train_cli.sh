#!/usr/bin/env bash
# End to end through the real CLI under real mpirun:
#  - eval under mpirun -np 2 / -np 4 (sharded) prints the same losses as one process;
#  - a checkpoint written at W=4 resumes at W=2 and W=1 (and W=1 -> 4), and the next steps' losses
#    equal those of the run that never stopped (fp32 reduction-order tolerance);
#  - ckpt verify passes; ckpt consolidate writes a Hugging Face dir that eval and train read.
set -euo pipefail
BIN=${TESSERA_BIN:?}/tessera
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"
source "$(dirname "${BASH_SOURCE[0]}")/../expect.bash"  # ok, check

$BIN init-model --preset tiny --seed 7 --out "$T/model" >/dev/null
python3 -c "
import random; random.seed(3)
for n in (17, 40, 9, 64): print(' '.join(str(random.randrange(320)) for _ in range(n)))" > "$T/tokens.txt"
$BIN eval --model "$T/model" --tokens "$T/tokens.txt" > "$T/eval1.json"
for np in 2 4; do
  "${MPIRUN[@]}" -np $np $BIN eval --model "$T/model" --tokens "$T/tokens.txt" > "$T/eval$np.json"
  python3 - "$T/eval1.json" "$T/eval$np.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a["tokens"] == b["tokens"] == 126, (a, b)
for x, y in zip(a["per_sequence_loss"], b["per_sequence_loss"]):
    assert abs(x - y) <= 1e-6 * abs(x), (x, y)
PY
  ok "eval np=$np equals single process"
done

# The global batch is 8 sequences at every world size: micro_batch 1 x grad_accum 8/W.
COMMON=(--set model.path="$T/model" --set data.seq_len=32 --set train.steps=6 --set train.micro_batch=1
        --set train.warmup_steps=1 --set log.every=100)
accum() { echo "--set train.grad_accum=$((8 / $1))"; }
# The run that never stops, at W=4, saving step-3 on the way.
"${MPIRUN[@]}" -np 4 $BIN train "${COMMON[@]}" $(accum 4) --set checkpoint.dir="$T/ck4" --set checkpoint.every=3 --set checkpoint.keep=5 > "$T/train4.log"
check "verify step-3" $BIN ckpt verify "$T/ck4/step-3"
# The run's first line says what it trains: ranks, strategy, precision, device, model and data.
first=$(grep -m1 '^tessera train:' "$T/train4.log")
check "first line: $first" grep -qE "^tessera train: 4 rank\(s\) on 1 node\(s\), full_shard, fp32 on cpu, model $T/model \([0-9]+ parameters\), data [^ ]+ \(" <<<"$first"
losses() { python3 -c "import json,sys; print(' '.join(repr(json.loads(l)['loss']) for l in open(sys.argv[1])))" "$1"; }
for np in 2 1; do
  "${MPIRUN[@]}" -np $np $BIN train "${COMMON[@]}" $(accum $np) --set checkpoint.dir="$T/r$np" --set log.dir="$T/r$np" --resume "$T/ck4/step-3" > "$T/r$np.log"
  grep -q "resumed from $T/ck4/step-3 at step 3" "$T/r$np.log"
  check "W=4 -> W=$np resume matches the uninterrupted run" resumed_close 1e-4 "$T/ck4/metrics.jsonl" "$T/r$np/metrics.jsonl"
done
# 1 -> 4: reshard a single-process checkpoint to four ranks.
$BIN train "${COMMON[@]}" $(accum 1) --set checkpoint.dir="$T/ck1" --set checkpoint.every=3 --set checkpoint.keep=5 > /dev/null
"${MPIRUN[@]}" -np 4 $BIN train "${COMMON[@]}" $(accum 4) --set checkpoint.dir="$T/r14" --resume "$T/ck1/step-3" > /dev/null
check "W=1 -> W=4 resume matches" resumed_close 1e-4 "$T/ck1/metrics.jsonl" "$T/r14/metrics.jsonl"

# Export to Hugging Face and read it back.
$BIN ckpt consolidate --checkpoint "$T/ck4/step-6" --out "$T/hf" > /dev/null
$BIN eval --model "$T/hf" --tokens "$T/tokens.txt" > "$T/eval_hf.json"
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert d['tokens']==126 and d['mean_loss'] < 10" "$T/eval_hf.json"
check "consolidated model loads into eval and train" $BIN train --set model.path="$T/hf" --set data.seq_len=32 --set train.steps=1
# model.load=rank0 needs the checkpoint on rank 0's disk only: rank 1 runs in a directory where the
# relative model path does not exist. (parallel mode, which reads on every rank, must refuse that.)
mkdir -p "$T/a" "$T/b" && cp -r "$T/model" "$T/a/m"
R0=(train --set model.path=m --set data.seq_len=32 --set train.steps=2)
# Rank 0 in a, rank 1 in b: a shell per rank, not mpirun's MPMD "A : B" (Open MPI 5.0.7's launcher
# segfaults on any MPMD line: open-mpi/ompi#13303).
in_ab() { "${MPIRUN[@]}" -np 2 bash -c 'cd "$0/$([ "$OMPI_COMM_WORLD_RANK" = 0 ] && echo a || echo b)" && exec "$@"' "$T" "$@"; }
in_ab $BIN "${R0[@]}" --set model.load=rank0 --set log.dir="$T/r0only" > /dev/null
check "rank0 load with the model on rank 0's disk only" test "$(wc -l < "$T/r0only/metrics.jsonl")" -eq 2
set +e
in_ab $BIN "${R0[@]}" --set model.load=parallel > /dev/null 2> "$T/par.err"
rc=$?
set -e
check "parallel load exits 2" test $rc -eq 2
check "parallel load names the rank that cannot see the model" grep -q "rank 1: m: model directory does not exist" "$T/par.err"

# Mixed precision: bf16 compute and reduction with fp32 master shards trains (loss falls) under hybrid 2x2.
"${MPIRUN[@]}" -np 4 $BIN train --ranks-per-node 2 --set fsdp.strategy=hybrid_shard --set fsdp.mixed_precision=bf16 \
  --set fsdp.reduce_dtype=bf16 --set data.seq_len=64 --set train.steps=12 --set train.lr=3e-3 --set log.dir="$T/bf16" > "$T/bf16.log"
python3 -c "
import json,sys; l=[json.loads(x)['loss'] for x in open(sys.argv[1])]
assert len(l)==12 and l[-1] < l[0] - 0.1, l" "$T/bf16/metrics.jsonl"
ok "bf16 hybrid_shard loss falls"
# Every metrics record says where it ran (tests/gpu/run.sh reads these): here the CPU, no GPU memory.
python3 -c "
import json,sys; r=[json.loads(x) for x in open(sys.argv[1])]
assert all(x['device']=='cpu' and x['peak_gpu_mem_bytes']==0 for x in r), r[0]" "$T/bf16/metrics.jsonl"
ok "metrics records carry device cpu and peak_gpu_mem_bytes 0"
# train.device=cpu is the same run as auto on this CPU-only build, bit for bit.
"${MPIRUN[@]}" -np 2 $BIN train --set data.seq_len=32 --set train.steps=3 --set log.dir="$T/auto" > /dev/null
"${MPIRUN[@]}" -np 2 $BIN train --set data.seq_len=32 --set train.steps=3 --set train.device=cpu --set log.dir="$T/cpu" > /dev/null
check "train.device=cpu equals auto on a CPU-only build" test "$(losses "$T/auto/metrics.jsonl")" = "$(losses "$T/cpu/metrics.jsonl")"

# comm.timeout_s is honoured: with rank 1 stopped (SIGSTOP) after the first step, rank 0 stops with the
# Timeout line naming the collective within the 3 s asked for, not the 600 s default.
timeout 60 "${MPIRUN[@]}" -np 2 $BIN train --set data.seq_len=32 --set train.steps=100000 --set comm.timeout_s=3 \
  --set log.dir="$T/hang" > /dev/null 2> "$T/hang.err" & hang=$!
for ((i = 0; i < 600; i++)); do [[ -s $T/hang/metrics.jsonl ]] && break; sleep 0.1; done
stopped=$(rank_pids $hang | sed -n 2p)
[[ -n $stopped ]] && kill -STOP "$stopped"
start=$SECONDS rc=0
wait $hang || rc=$?
kill -CONT "$stopped" 2>/dev/null || true
check "a stalled rank ends the run (exit $rc) within comm.timeout_s + 15 s" test $rc -ne 0 -a $((SECONDS - start)) -le 18
check "the timeout names the collective and the 3 s" grep -q "on comm 'world' (rank 0 of 2, host [^)]*), collective #[0-9]* (.*), did not complete within 3s" "$T/hang.err"
expect_error 2 "--set: config key 'comm.timeout_s' must be >= 0.001, got 0" $BIN train --set comm.timeout_s=0
echo "$pass passed, 0 failed"
