#!/usr/bin/env bash
# docs/GUIDE.md, run as written without SLURM (its `local` blocks: mpirun): every shell block of the
# guide in order, in one bash, from the repository root, on a small model (tests/guide.bash) with the
# guide's variables set small: examples/chat as data, 2 ranks, 20 steps of 256 tokens. The run is
# preempted with SIGUSR2 mid-way and resumed, exported to Hugging Face safetensors and loaded again.
# Fails on the first guide command that fails (naming its line in GUIDE.md), then checks the results.
# Then runs the README's Example block the same way.
set -euo pipefail
SRC=${TESSERA_SRC:?} BIN_DIR=${TESSERA_BIN:?}
export TESSERA_SRC=$SRC TESSERA_GUIDE_BIN=$BIN_DIR/tessera
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
source "$SRC/tests/mpi/lib.bash"   # mpirun as root, one torch thread per rank
source "$SRC/tests/expect.bash"    # ok, check
source "$SRC/tests/guide.bash"
# The guide's plain `mpirun -np N` on this host: oversubscribed, TCP on loopback (as lib.bash's MPIRUN).
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=127.0.0.1/8 \
       OMPI_MCA_oob_tcp_if_include=lo

guide_model "$T/model"
export MODEL=$T/model DATA=$SRC/examples/chat/train.jsonl VAL=$SRC/examples/chat/val.jsonl RUN=$T/run \
       NODES=1 GPUS_PER_NODE=2 SEQ_LEN=256 STEPS=20 EVERY=10 LR=3e-3 LAUNCH="mpirun -np 2" PYTHON=/usr/bin/python3
guide_run local > "$T/guide.log" 2>&1 || { tail -n 40 "$T/guide.log"; fail "the guide's commands (log above)"; }
ok "every block of docs/GUIDE.md ran (local)"

check "the Accelerate file became full_shard + bf16 + rank0 loading" \
  python3 -c "import json,sys; c=json.load(open(sys.argv[1]))
assert c['fsdp']['strategy']=='full_shard' and c['fsdp']['mixed_precision']=='bf16' and c['model']['load']=='rank0', c" "$RUN/run.json"
check "the run was preempted mid-way" grep -Eq "^preempted at step ([1-9]|1[0-9]): checkpoint" "$RUN/train.log"
check "and resumed from that checkpoint" grep -Eq "^resumed from $RUN/checkpoints/step-[0-9]+ at step" "$RUN/train2.log"
check "metrics hold every step once" test "$(python3 -c "import json,sys; print(sorted({json.loads(l)['step'] for l in open(sys.argv[1])}) == list(range(1, 21)))" "$RUN/metrics.jsonl")" = True
check "the export is a Hugging Face directory with the tokenizer" test -s "$RUN/hf/config.json" -a -s "$RUN/hf/model.safetensors" -a -s "$RUN/hf/tokenizer.model"
check "the fine-tuned model scores lower than the base model on the sample" \
  python3 -c "import json,sys; b,t=(json.load(open(f))['mean_loss'] for f in sys.argv[1:]); assert t < b - 0.5, (b, t)" "$RUN/base-eval.json" "$RUN/tuned-eval.json"
check "the PyTorch reader loaded every tensor" grep -q "^21 tensors, 494,208 parameters, 2 layers" "$T/guide.log"

# The README's Example block, as written, in a scratch copy of the repository root (build/ and
# examples/ linked) so that its runs/demo lands there.
mkdir -p "$T/readme" && ln -s "$SRC/build" "$T/readme/build" && ln -s "$SRC/examples" "$T/readme/examples"
sed -n '/^## Example/,/^## /p' "$SRC/README.md" | awk '/^```sh/ { f = 1; next } /^```/ { f = 0 } f' > "$T/readme/example.sh"
check "the README has an example of at least 5 lines" test "$(wc -l < "$T/readme/example.sh")" -ge 5
(cd "$T/readme" && bash -euo pipefail example.sh) > "$T/readme.log" 2>&1 || { tail -n 20 "$T/readme.log"; fail "the README's example"; }
check "the README's example trains and exports" test -s "$T/readme/runs/demo/hf/model.safetensors"
check "the README's example generates an answer from the sharded checkpoint" \
  grep -Eq "^tessera generate: runs/demo/ask.jsonl:1: [0-9]+ tokens \((eos|length)\)" "$T/readme.log"
check "the README's example samples the question after steps 15 and 30" python3 -c "
import json; r = [json.loads(l) for l in open('$T/readme/runs/demo/checkpoints/samples.jsonl')]
assert [x['step'] for x in r] == [15, 30], r"
echo "$pass passed, 0 failed"
