#!/usr/bin/env bash
# `tessera bench load` smoke test under mpirun -np 2 on a small bf16 checkpoint (16 layers of 3.2 M
# parameters): the JSON has every mode and rank with its figures, rank0/parallel meet the memory
# goals, only rank 0 reads in rank0 mode (straight from the memory map: no staging buffer; the
# receiver widens in place inside its shard: no buffer either), and
# naive grows by at least the model's fp32 size on every rank (the measurement sees a full model
# when one is materialised).
set -u
source "$(dirname "${BASH_SOURCE[0]}")/../expect.bash"  # fail
BIN="${TESSERA_BIN:?TESSERA_BIN not set}/tessera"
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"
MPIRUN+=(-np 2)
work_dir load-bench

cat >"$WORK/config.json" <<'EOF'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 1000, "hidden_size": 512,
 "intermediate_size": 1376, "num_hidden_layers": 16, "num_attention_heads": 8, "num_key_value_heads": 8,
 "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false,
 "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32"}
EOF
"$BIN" init-model --config "$WORK/config.json" --dtype bf16 --max-shard-size 40MB --out "$WORK/model" >/dev/null ||
  fail "init-model exited $?"
"${MPIRUN[@]}" "$BIN" bench load --model "$WORK/model" --repeat 2 --json >"$WORK/out.json" 2>"$WORK/err" ||
  fail "bench load exited $?: $(cat "$WORK/err")"
python3 - "$WORK/out.json" <<'PY' || fail "$(cat "$WORK/out.json")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["ranks"] == 2 and r["cat_seconds"] > 0 and r["checkpoint_bytes"] > 90e6, r
modes = {m["mode"]: m for m in r["modes"]}
assert set(modes) == {"rank0", "parallel", "naive"}, modes.keys()
full_fp32 = r["parameters"] * 4
for name, m in modes.items():
    assert len(m["ranks"]) == 2 and m["seconds"] > 0
    for k in m["ranks"]:
        for f in ("base_bytes", "peak_bytes", "growth_bytes", "shard_bytes", "largest_unit_bytes", "load_seconds",
                  "peak_vs_naive"):
            assert f in k, (name, f)
        assert k["shard_bytes"] * 2 >= full_fp32, k
    if name != "naive":
        assert m["memory_goal_met"], (name, m)
        assert "throughput_goal_met" in m
for k in modes["rank0"]["ranks"]:
    assert k["reader"] == (k["rank"] == 0), k
    # bf16 goes out from the reader's memory map (no staging) and is widened in place by the receiver
    assert k["staging_bytes"] == 0, k
for k in modes["naive"]["ranks"]:
    assert k["growth_bytes"] > 0.9 * full_fp32, ("naive must materialise the model", k)
for name in ("rank0", "parallel"):
    for k in modes[name]["ranks"]:
        assert k["growth_bytes"] < modes["naive"]["ranks"][k["rank"]]["growth_bytes"] / 2, (name, k)
print("bench load:", {n: [round(k["growth_bytes"] / 2**20, 1) for k in m["ranks"]] for n, m in modes.items()},
      "MiB growth per rank")
PY
echo PASS
