#!/usr/bin/env bash
# The main job: a real fine-tuning run on the embedded default. Builds Tessera, makes a `small`
# Llama with init-model, and fine-tunes it with FSDP (full_shard) on 2 local MPI ranks on the
# license texts every Debian system ships (/usr/share/common-licenses, as byte-level tokens: the model
# has no tokenizer.model), with a checkpoint at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
# The binary alone, with only the packages it needs: scripts/test.sh installs the test suite's
# tools and builds the tests.
DEPS=--main TARGETS=tessera bash scripts/build.sh
RUN=${RUN:-runs/quickstart}
BIN=build/bin/tessera
rm -rf "$RUN" && mkdir -p "$RUN"
$BIN init-model --preset small --seed 1 --out "$RUN/model"
cat > "$RUN/run.json" <<JSON
{
  "model": {"path": "$RUN/model"},
  "data": {"path": "/usr/share/common-licenses", "seq_len": 128, "tokenizer": "bytes"},
  "train": {"steps": ${STEPS:-200}, "micro_batch": 4, "grad_accum": 1, "lr": 1e-3, "min_lr": 1e-4, "warmup_steps": 20},
  "fsdp": {"strategy": "full_shard", "mixed_precision": "fp32"},
  "checkpoint": {"dir": "$RUN/checkpoints", "every": 100, "keep": 2},
  "log": {"dir": "$RUN", "every": 10}
}
JSON
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun -np 2 --mca odls_base_sigkill_timeout 60 --mca btl self,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo \
  $BIN train --config "$RUN/run.json"
echo "quickstart: model $RUN/model, config $RUN/run.json, metrics $RUN/metrics.jsonl, checkpoints $RUN/checkpoints"
