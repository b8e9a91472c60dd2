# What the quality benchmarks share (int8_quality.sh, lora_quality.sh): sourced after they set
# their own defaults. Sets SRC, BIN, NP and WORK (a fresh folder, removed on exit), writes the 58M
# Llama's initialisation to $WORK/init, and defines train().
#   QUALITY_NAME   names the work folder (/tmp/tessera-<name>-quality-XXXXXX)
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${BIN:-$SRC/build/bin/tessera}
NP=${NP:-2}
WORK=$(mktemp -d "/tmp/tessera-${QUALITY_NAME:?}-quality-XXXXXX")
trap 'rm -rf "$WORK"' EXIT
"$BIN" init-model --config "$SRC/benchmarks/mid_llama.json" --out "$WORK/init" --seed 1 > /dev/null
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# train NAME MODEL DATA STEPS LR MIXED_PRECISION EXTRA_JSON: one `tessera train` of NP ranks under
# mpirun (seq 128 x micro-batch 4 per rank, cosine from LR to LR/10 after 20 warm-up steps), its
# checkpoint (the last step's) and log in $WORK/NAME; EXTRA_JSON (", \"key\": {...}") adds sections.
train() {
  local name=$1 model=$2 data=$3 steps=$4 lr=$5 mp=$6 extra=$7 start
  cat > "$WORK/$name.json" <<JSON
{
  "model": {"path": "$model"},
  "data": {"path": "$data", "seq_len": 128, "tokenizer": "bytes"},
  "train": {"steps": $steps, "micro_batch": 4, "grad_accum": 1, "lr": $lr, "min_lr": $(python3 -c "print($lr / 10)"),
            "warmup_steps": 20, "seed": 7},
  "fsdp": {"strategy": "full_shard", "mixed_precision": "$mp"},
  "checkpoint": {"dir": "$WORK/$name", "every": $steps, "keep": 1},
  "log": {"dir": "$WORK/$name", "every": 50}$extra
}
JSON
  start=$(date +%s)
  mpirun -np "$NP" --mca btl self,tcp --mca btl_tcp_if_include 127.0.0.1/8 -x OMP_NUM_THREADS=1 \
    "$BIN" train --config "$WORK/$name.json" > "$WORK/$name.log" 2>&1 || { tail -20 "$WORK/$name.log"; exit 1; }
  echo "$name: $steps steps in $(( $(date +%s) - start )) s"
}
