#!/usr/bin/env bash
# The docs/MEMORY.md table "70B with LoRA and QLoRA": `tessera plan` for Llama 2 70B and Llama 3.1
# 70B (their config.json, written here), LoRA r 16 (alpha 32, the seven projections) on a bf16 base
# and QLoRA r 16 (lora.base_dtype nf4), full_shard, bf16 compute, seq 2048, micro-batch 1,
# activation checkpointing on, one node of 2 x 24, 2 x 48, 8 x 40 or 8 x 80 GiB GPUs (512 GiB of
# host RAM). Where a layout does not fit, the row below it adds fsdp.offload=params (fsdp_qlora's
# CPU offload). Prints a Markdown table; no MPI, no weights, a few seconds.
#
#   benchmarks/lora_70b_plans.sh [BIN=build/bin/tessera]
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-$SRC/build/bin/tessera}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
mkdir -p "$T/llama2" "$T/llama31"
cat > "$T/llama2/config.json" <<'J'
{"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 32000, "hidden_size": 8192,
 "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
 "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "torch_dtype": "bfloat16",
 "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": false}
J
cat > "$T/llama31/config.json" <<'J'
{"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 128256, "hidden_size": 8192,
 "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
 "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "torch_dtype": "bfloat16",
 "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192, "rope_type": "llama3"},
 "bos_token_id": 128000, "eos_token_id": 128001, "tie_word_embeddings": false}
J
echo "| model | method | GPUs | offload | GPU peak per rank (GiB) | fits | host per node (GiB) |"
echo "|---|---|---|---|---|---|---|"
for model in llama2 llama31; do
  name=$([ $model = llama2 ] && echo "Llama 2 70B" || echo "Llama 3.1 70B")
  for method in LoRA QLoRA; do
    base=$([ $method = QLoRA ] && echo ', "base_dtype": "nf4"' || true)
    cat > "$T/run.json" <<J
{"model": {"path": "$T/$model", "load": "rank0"}, "data": {"seq_len": 2048}, "train": {"micro_batch": 1},
 "fsdp": {"strategy": "full_shard", "mixed_precision": "bf16", "activation_checkpointing": "true"},
 "lora": {"rank": 16, "alpha": 32$base}}
J
    for gpus in "2 24" "2 48" "8 40" "8 80"; do
      set -- $gpus
      for offload in none params; do
        "$BIN" plan --config "$T/run.json" --nodes 1 --gpus-per-node "$1" --gpu-mem "$2GiB" --host-mem 512GiB \
          --set fsdp.offload=$offload --json > "$T/plan.json" || true
        fits=$(python3 - "$T/plan.json" "$name" "$method" "$1 x $2 GiB" "$offload" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
gpu, host = p["peak_gpu_bytes_per_rank"] / 2**30, p["host_bytes_per_node"] / 2**30
fits = "yes (%.0f%% headroom)" % (100 * (1 - p["peak_gpu_bytes_per_rank"] / float(sys.argv[4].split(" x ")[1].split()[0]) / 2**30)) if p["fits"] else "no"
print("| %s | %s r 16 | %s | %s | %.1f | %s | %.1f |" % (sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], gpu, fits, host), file=sys.stderr)
print("yes" if p["fits"] else "no")
PY
        )
        [ "$fits" = yes ] && break
      done
    done
  done
done 2>&1
