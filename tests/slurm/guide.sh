#!/usr/bin/env bash
# docs/GUIDE.md, run as written with SLURM (its `slurm` blocks): every shell block of the guide in
# order, from the repository root, against the local two-node cluster (slurm/local-cluster: 2 CPU
# nodes x 2 ranks): `make -f Makefile.slurm submit/status/logs/preempt`, the job checkpoints and
# requeues itself and its second run resumes; eval through srun --mpi=pmix; export and load.
# Small model and variables as in tests/mpi/guide.sh.
source "$(dirname "$0")/lib.bash"   # cluster up (down on exit), cd $WORK, fail, job_field
source "$SRC/tests/guide.bash"
export TESSERA_GUIDE_BIN=$TESSERA_BIN

guide_model "$WORK/model"
# CPU nodes: GPUS_PER_NODE=0 with TASKS_PER_NODE ranks (Makefile.slurm reads both from the environment).
export MODEL=$WORK/model DATA=$SRC/examples/chat/train.jsonl VAL=$SRC/examples/chat/val.jsonl RUN=$WORK/run \
       NODES=2 GPUS_PER_NODE=0 TASKS_PER_NODE=2 RANKS=4 SEQ_LEN=256 STEPS=20 EVERY=10 LR=3e-3 TIME=00:10:00 \
       LAUNCH="srun --nodes=2 --ntasks-per-node=2 --mpi=pmix" PYTHON=/usr/bin/python3 LOCAL=1
guide_run slurm > "$WORK/guide.log" 2>&1 || { tail -n 40 "$WORK/guide.log" >&2; tail -n 30 "$RUN"/slurm-logs/*.out >&2 || true; fail "the guide's commands (log above)"; }
echo "ok: every block of docs/GUIDE.md ran (slurm)"

log=$(ls "$RUN"/slurm-logs/tessera-train-*.out)
grep -q "4 ranks on 2 node(s), 2 per node" "$log" || fail "no 2 x 2 SLURM topology in $log"
grep -Eq "^preempted at step [0-9]+: checkpoint" "$log" || fail "the job was not preempted ($log)"
grep -q "run 2 on node" "$log" || fail "no second run of the job in $log"
grep -Eq "^resumed from $RUN/checkpoints/step-[0-9]+ at step" "$log" || fail "the second run did not resume ($log)"
echo "ok: submitted, preempted, requeued and resumed"
python3 -c "import json,sys; b,t=(json.load(open(f))['mean_loss'] for f in sys.argv[1:]); assert t < b - 0.5, (b, t)" \
  "$RUN/base-eval.json" "$RUN/tuned-eval.json" || fail "the fine-tuned model does not score lower than the base"
grep -q "^21 tensors, 494,208 parameters, 2 layers" "$WORK/guide.log" || fail "the PyTorch reader did not load the export"
echo "ok: exported, and the export scores lower than the base model"
