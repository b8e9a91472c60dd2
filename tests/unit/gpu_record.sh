#!/usr/bin/env bash
# tests/gpu/bench_gpu.py report (issue 56, items 6 and 7): from an eager and a torch.compile result,
# Tessera's metrics.jsonl and a kernel table, the report's lines (Tessera against both peers) and the
# run's record for benchmarks/results/gpu.jsonl: every field the issue names, the values computed
# here by hand (medians of the timed steps, the two warm-up steps left out; the ratios); a side
# that did not run is null, not absent.
set -euo pipefail
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
source "$SRC/tests/expect.bash"
BENCH=(python3 "$SRC/tests/gpu/bench_gpu.py")

cat > "$T/config.json" <<'JSON'
{"vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
 "num_attention_heads": 32, "num_key_value_heads": 4, "rms_norm_eps": 1e-5}
JSON
python3 - "$T" <<'PY'
import json, sys
t = sys.argv[1]
def peer(mode, tok, mem):
    return {"mode": mode, "warmup_s": 61.0 if mode == "compile" else 4.0, "device": "NVIDIA H100 80GB HBM3",
            "torch": "2.11.0+cu130", "parameters": 1100048384, "batch": 4, "seq": 2048, "step_s_median": 8192 / tok,
            "tokens_per_s": tok, "mfu": tok * 1e-5, "peak_tflops": 989.0, "peak_source": "H100 datasheet, dense bf16",
            "measured_matmul_tflops": 760.0, "peak_mem_gib": mem, "peak_reserved_gib": mem + 2, "loss_first_last": [10.6, 10.2],
            "finite": True, "cuda": "13.0", "cudnn": "9.10.2", "nccl": "2.28.9", "sdp_enabled": {"flash": True}}
json.dump(peer("eager", 40000.0, 50.0), open(t + "/eager.json", "w"))
json.dump(peer("compile", 50000.0, 40.0), open(t + "/compile.json", "w"))
with open(t + "/metrics.jsonl", "w") as f:  # two warm-up steps (left out), then three timed ones
    for s, (tok, fw, bw, opt, mem) in enumerate([(1, 9, 9, 9, 99 << 30), (2, 9, 9, 9, 99 << 30), (44000, 0.07, 0.10, 0.012, 45 << 30),
                                                 (46000, 0.05, 0.12, 0.010, 46 << 30), (45000, 0.06, 0.11, 0.011, 44 << 30)]):
        f.write(json.dumps({"step": s + 1, "tokens_per_s": tok, "peak_gpu_mem_bytes": mem,
                            "time": {"forward_s": fw, "backward_s": bw, "optimizer_s": opt}}) + "\n")
json.dump([{"name": n, "steps": 2, "kernels": 10, "sdpa_backend": b, "ms_per_step": {"gemm": g, "attention": 1.0},
            "total_ms_per_step": g + 1} for n, b, g in (("tessera", "FlashAttention-2", 100.0), ("eager", "cuDNN attention", 120.0))],
          open(t + "/kernel_table.json", "w"))
PY

common=(--config "$T/config.json" --seq 2048 --batch 4 --eager "$T/eager.json" --kernel-table "$T/kernel_table.json")
"${BENCH[@]}" report "${common[@]}" --compiled "$T/compile.json" --tessera-metrics "$T/metrics.jsonl" \
  --tessera-nccl "NCCL version 2.28.9+cuda13.0" --record "$T/record.json" > "$T/report.txt"
check "the report puts Tessera next to eager" grep -q "^tessera / pytorch eager: 1.12x tokens/s" "$T/report.txt"
check "and next to torch.compile, with its compile time" \
  bash -c "grep -q '^tessera / torch.compile: 0.90x tokens/s' '$T/report.txt' && grep -q '^pytorch torch.compile (.*warm-up with compilation 61 s' '$T/report.txt'"
python3 - "$T/record.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
need = ["date", "device", "torch", "cudnn", "nccl", "model", "seq", "micro_batch", "tessera_tokens_per_s",
        "eager_tokens_per_s", "compile_tokens_per_s", "mfu", "peak_gpu_mem_gib", "eager_peak_gpu_mem_gib",
        "forward_s", "backward_s", "optimizer_s", "kernel_ms_per_step"]
missing = [k for k in need if r.get(k) is None]
assert not missing, missing
expect = {"tessera_tokens_per_s": 45000, "eager_tokens_per_s": 40000, "compile_tokens_per_s": 50000,
          "tessera_over_eager": 1.125, "tessera_over_compile": 0.9, "peak_gpu_mem_gib": 46, "eager_peak_gpu_mem_gib": 50,
          "compile_peak_gpu_mem_gib": 40, "forward_s": 0.06, "backward_s": 0.11, "optimizer_s": 0.011, "seq": 2048, "micro_batch": 4}
for k, v in expect.items():
    assert abs(r[k] - v) < 1e-9, (k, r[k], v)
# MFU: 6 x (22 x (2 x 2048^2 + 2 x 2048 x 256 + 3 x 2048 x 5632) + 2048 x 32000) + 12 x 22 x 2048 x 2048 FLOP per token.
fpt = 6 * (22 * (2 * 2048**2 + 2 * 2048 * 256 + 3 * 2048 * 5632) + 2048 * 32000) + 12 * 22 * 2048 * 2048
assert abs(r["mfu"] - 45000 * fpt / 989e12) < 1e-12, r["mfu"]
assert r["kernel_ms_per_step"] == {"tessera": {"gemm": 100.0, "attention": 1.0}, "eager": {"gemm": 120.0, "attention": 1.0}}
assert r["device"] == "NVIDIA H100 80GB HBM3" and r["cudnn"] == "9.10.2" and r["nccl"] == "2.28.9", r
assert r["model"].startswith("1.10B Llama (hidden 2048, 22 layers"), r["model"]
assert r["tessera_settings"] == [], r["tessera_settings"]  # the defaults
assert "gather_wait_s" in r and "exposed_comm_s" in r, r  # null: the metrics above have no such parts
PY
ok "the record has every field, and the values computed by hand"

"${BENCH[@]}" report "${common[@]}" --compiled "$T/none.json" --skip-reason "tessera train did not pass" \
  --tessera-settings "model.fused_kernels=false train.lr=1e-4" --record "$T/partial.json" > "$T/partial.txt"
check "a peer that did not run is said in the report" grep -q "^pytorch torch.compile: no result" "$T/partial.txt"
python3 - "$T/partial.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for k in ("tessera_tokens_per_s", "compile_tokens_per_s", "mfu", "forward_s", "tessera_over_eager", "tessera_over_compile"):
    assert k in r and r[k] is None, (k, r.get(k))
assert r["eager_tokens_per_s"] == 40000, r
assert r["tessera_settings"] == ["model.fused_kernels=false", "train.lr=1e-4"], r["tessera_settings"]  # an A/B run says so
PY
ok "and is null in the record, the rest kept"
echo "$pass passed, 0 failed"
