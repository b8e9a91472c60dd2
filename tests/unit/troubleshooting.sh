#!/usr/bin/env bash
# docs/TROUBLESHOOTING.md quotes Tessera's messages as users see them: this reproduces each quoted
# situation (a corrupted, truncated, incomplete checkpoint, a missing safetensors shard, bad keys and
# values, a token file from another tokenizer, Makefile.slurm's preflight) with the page's relative
# paths and checks that every message printed is on the page, numbers aside (digits and CRCs differ
# with the model), so the page cannot drift from the code.
set -euo pipefail
BIN=${TESSERA_BIN:?}/tessera SRC=${TESSERA_SRC:?}
export TESSERA_SRC=$SRC
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
source "$SRC/tests/expect.bash"  # ok, fail, check
source "$SRC/tests/guide.bash"   # guide_model
PAGE=$SRC/docs/TROUBLESHOOTING.md
norm() { sed -E 's/\b[0-9a-f]{8}\b/H/g; s/[0-9]+(\.[0-9]+)?/0/g'; }
norm < "$PAGE" > "$T/page"
# quoted LABEL CMD...: CMD fails, and its last stderr line is on the page.
quoted() {
  local label=$1 line; shift
  if "$@" > "$T/out" 2> "$T/err"; then fail "$label: expected a failure from: $*"; fi
  line=$(grep -v '^\s*$' "$T/err" | tail -n 1)
  check "$label: '$line' is quoted" grep -qxF -- "$(norm <<< "$line")" <(sed -E 's/^\s+//; s/^`|`$//g' "$T/page")
}
cd "$T"
guide_model m3 && rm m3/model-00002-of-00003.safetensors
quoted "a missing safetensors shard" "$BIN" eval --model m3 --tokens /dev/null
"$BIN" train --set checkpoint.dir=run/checkpoints --set train.steps=2 --set data.seq_len=32 > /dev/null
step=run/checkpoints/step-2
"$BIN" ckpt verify "$step" > ok.txt
check "ckpt verify's OK line is quoted" grep -qxF -- "$(norm < ok.txt)" "$T/page"
for i in 1 2 3 4; do cp -r "$step" "$T/c$i"; done
restore() { rm -rf "$step" && cp -r "$T/c$1" "$step"; }
printf X | dd of="$step/rank-00000.bin" bs=1 seek=1000 conv=notrunc 2>/dev/null
quoted "a corrupted checkpoint file" "$BIN" ckpt verify "$step"
restore 1 && truncate -s -100 "$step/rank-00000.bin"
quoted "a truncated checkpoint file" "$BIN" ckpt verify "$step"
restore 2 && rm "$step/rank-00000.bin"
quoted "a missing checkpoint file" "$BIN" ckpt verify "$step"
restore 3 && rm "$step/manifest.json"
quoted "a checkpoint without manifest" "$BIN" ckpt verify "$step"
quoted "comm.timeout_s 0" "$BIN" train --set comm.timeout_s=0
quoted "a preset without tokenizer" "$BIN" train --set model.preset=small --set train.steps=1
guide_model m
quoted "seq_len over the model's positions" "$BIN" train --set model.path=m --set data.seq_len=1024
quoted "a misspelt key" "$BIN" train --set fsdp.stratgy=x
"$BIN" tokenize --input "$SRC/examples/chat/val.jsonl" --tokenizer m/tokenizer.model --out run/train.bin > /dev/null 2>&1
quoted "a token file of another tokenizer" "$BIN" train --set data.path=run/train.bin --set train.steps=1
if command -v sbatch > /dev/null; then
  # Makefile.slurm's preflight (it stops before sbatch is called).
  quoted "preflight: no config" make -s -C "$SRC" -f Makefile.slurm submit CONFIG=/shared/runs/x/run.json NODES=2 GPUS_PER_NODE=8 TESSERA_BIN="$BIN"
  echo '{}' > run.json
  quoted "preflight: tasks vs GPUs" make -s -C "$SRC" -f Makefile.slurm submit CONFIG="$T/run.json" NODES=2 GPUS_PER_NODE=8 TASKS_PER_NODE=4 TESSERA_BIN="$BIN"
fi
echo "$pass passed, 0 failed"
