#!/usr/bin/env bash
# End-to-end test of `tessera lora merge` (launcher/cmd_lora.cpp, model/peft_adapter.h): a tiny
# model made by `tessera init-model`, a random PEFT LoRA adapter written here by Python (torch 1.13;
# the safetensors bytes by hand: header JSON + raw data), the merge; then Python checks every
# adapted weight equals W + (lora_alpha / r) B A computed by torch, every other tensor is
# byte-identical to the base's, and config.json / the tokenizer files are the base's. A bf16 merge
# is the fp32 result rounded once. The refusals (exit 2, one line, nothing written): --out the base
# or inside it or a link to it, an existing non-empty --out, an adapter for another base, one
# whose shapes do not fit the base, one Tessera cannot honour (use_rslora). Then `tessera eval`
# reads the merged model.
set -u
BIN="${TESSERA_BIN:?TESSERA_BIN not set}/tessera"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/../expect.bash"  # ok, fail, check, expect_error

"$BIN" init-model --preset tiny --out "$WORK/base" --seed 7 >/dev/null || fail "init-model exited $?"
printf '{"model_max_length": 64}\n' >"$WORK/base/tokenizer_config.json"

# adapter.py DIR R ALPHA TARGETS BASE_NAME [SHAPE_R]: a random adapter for the base (A, B drawn so
# that B A is not small: PEFT initialises B to 0, a trained adapter has it non-zero).
cat >"$WORK/adapter.py" <<'PY'
import json, os, struct, sys
import torch
out, r, alpha, targets, base_name = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4].split(","), sys.argv[5]
shape_r = int(sys.argv[6]) if len(sys.argv) > 6 else r
cfg = json.load(open(os.path.join(os.path.dirname(out), "base", "config.json")))
h, inter = cfg["hidden_size"], cfg["intermediate_size"]
kv = cfg["num_key_value_heads"] * (h // cfg["num_attention_heads"])
dims = {"q_proj": ("self_attn", h, h), "k_proj": ("self_attn", kv, h), "v_proj": ("self_attn", kv, h),
        "o_proj": ("self_attn", h, h), "gate_proj": ("mlp", inter, h), "up_proj": ("mlp", inter, h),
        "down_proj": ("mlp", h, inter)}
g = torch.Generator().manual_seed(11)
tensors = {}
for i in range(cfg["num_hidden_layers"]):
    for t in targets:
        part, o, n = dims[t]
        m = f"base_model.model.model.layers.{i}.{part}.{t}"
        tensors[m + ".lora_A.weight"] = torch.randn(shape_r, n, generator=g) * 0.05
        tensors[m + ".lora_B.weight"] = torch.randn(o, shape_r, generator=g) * 0.05
header, blobs, at = {"__metadata__": {"format": "pt"}}, [], 0
for k, t in tensors.items():
    raw = t.contiguous().numpy().tobytes()
    header[k] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [at, at + len(raw)]}
    blobs.append(raw)
    at += len(raw)
hj = json.dumps(header).encode()
hj += b" " * (-len(hj) % 8)
os.makedirs(out)
open(os.path.join(out, "adapter_model.safetensors"), "wb").write(struct.pack("<Q", len(hj)) + hj + b"".join(blobs))
json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r, "lora_alpha": alpha, "lora_dropout": 0.05,
           "target_modules": targets, "bias": "none", "fan_in_fan_out": False, "inference_mode": True,
           "base_model_name_or_path": base_name, "use_rslora": False, "use_dora": False, "rank_pattern": {},
           "alpha_pattern": {}, "modules_to_save": None, "revision": None, "init_lora_weights": True},
          open(os.path.join(out, "adapter_config.json"), "w"))
PY
/usr/bin/python3 "$WORK/adapter.py" "$WORK/ad" 4 8 q_proj,v_proj,down_proj /models/hub/base || fail "adapter.py"

"$BIN" lora merge --model "$WORK/base" --adapter "$WORK/ad" --out "$WORK/merged" --dtype fp32 >"$WORK/merge.log" ||
  fail "merge exited $?: $(cat "$WORK/merge.log")"
grep -q "6 weights" "$WORK/merge.log" || fail "merge summary: $(cat "$WORK/merge.log")"
"$BIN" lora merge --model "$WORK/base" --adapter "$WORK/ad" --out "$WORK/merged16" --dtype bf16 --max-shard-size 300KB \
  >/dev/null || fail "bf16 merge exited $?"

# The independent check: safetensors parsed by hand, B A by torch.
/usr/bin/python3 - "$WORK" <<'PY' || fail "merged weights differ from W + (alpha / r) B A"
import json, os, struct, sys
import torch
w = sys.argv[1]
def tensors(d):
    files = [f for f in os.listdir(d) if f.endswith(".safetensors")]
    out = {}
    for f in files:
        data = open(os.path.join(d, f), "rb").read()
        (n,) = struct.unpack("<Q", data[:8])
        for k, v in json.loads(data[8:8 + n]).items():
            if k == "__metadata__": continue
            b, e = v["data_offsets"]
            raw = data[8 + n + b:8 + n + e]
            dt = {"F32": torch.float32, "BF16": torch.bfloat16}[v["dtype"]]
            out[k] = (raw, torch.frombuffer(bytearray(raw), dtype=dt).reshape(v["shape"]) if raw else torch.zeros(v["shape"]))
    return out
base, ad, merged, m16 = tensors(w + "/base"), tensors(w + "/ad"), tensors(w + "/merged"), tensors(w + "/merged16")
cfg = json.load(open(w + "/ad/adapter_config.json"))
scale = cfg["lora_alpha"] / cfg["r"]
assert set(merged) == set(base) == set(m16), (set(merged) ^ set(base))
adapted = 0
for k, (raw, t) in base.items():
    mod = "base_model.model." + k[:-len(".weight")]
    if mod + ".lora_A.weight" in ad:
        A, B = ad[mod + ".lora_A.weight"][1], ad[mod + ".lora_B.weight"][1]
        want = t + scale * (B @ A)
        got = merged[k][1]
        assert torch.allclose(got, want, rtol=1e-6, atol=1e-7), (k, (got - want).abs().max())
        assert (got - t).abs().max() > 1e-3, k  # the adapter did change it
        assert torch.allclose(m16[k][1].float(), want.to(torch.bfloat16).float(), rtol=8e-3, atol=1e-6), k
        adapted += 1
    else:
        assert merged[k][0] == raw, k + " changed"
        assert torch.equal(m16[k][1], t.to(torch.bfloat16)), k
assert adapted == 6, adapted
bc, mc = json.load(open(w + "/base/config.json")), json.load(open(w + "/merged/config.json"))
assert bc == mc, (bc, mc)
assert json.load(open(w + "/merged16/config.json"))["torch_dtype"] == "bfloat16"
assert open(w + "/merged/tokenizer_config.json").read() == open(w + "/base/tokenizer_config.json").read()
print("merged tensors checked:", len(base), "adapted:", adapted)
PY
ok "merged = W + (alpha/r) B A; others byte-identical; bf16 rounded once; config and tokenizer files"

# Refusals: exit 2, one error line, nothing written.
expect_error 2 "is the base model directory" "$BIN" lora merge --model "$WORK/base" --adapter "$WORK/ad" --out "$WORK/base"
expect_error 2 "is inside the base model directory" "$BIN" lora merge --model "$WORK/base" --adapter "$WORK/ad" --out "$WORK/base/sub"
[ ! -e "$WORK/base/sub" ] || fail "--out inside the base was created"
ln -s "$WORK/base" "$WORK/link"
expect_error 2 "is a symbolic link" "$BIN" lora merge --model "$WORK/base" --adapter "$WORK/ad" --out "$WORK/link"
mkdir -p "$WORK/full" && echo x >"$WORK/full/keep"
expect_error 2 "exists and is not empty" "$BIN" lora merge --model "$WORK/base" --adapter "$WORK/ad" --out "$WORK/full"
[ "$(cat "$WORK/full/keep")" = x ] || fail "an existing --out was touched"
/usr/bin/python3 "$WORK/adapter.py" "$WORK/ad-other" 4 8 q_proj other-model || fail "adapter.py"
expect_error 2 'base_model_name_or_path "other-model" does not name the base model' \
  "$BIN" lora merge --model "$WORK/base" --adapter "$WORK/ad-other" --out "$WORK/o1"
/usr/bin/python3 "$WORK/adapter.py" "$WORK/ad-shape" 8 8 q_proj base 4 || fail "adapter.py"
expect_error 2 "adapter_model.safetensors: tensor base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight has shape \[4,128\], the base model needs \[8,128\]" \
  "$BIN" lora merge --model "$WORK/base" --adapter "$WORK/ad-shape" --out "$WORK/o2"
/usr/bin/python3 "$WORK/adapter.py" "$WORK/ad-rs" 4 8 q_proj base || fail "adapter.py"
/usr/bin/python3 -c "import json,sys; p=sys.argv[1]; c=json.load(open(p)); c['use_rslora']=True; json.dump(c,open(p,'w'))" "$WORK/ad-rs/adapter_config.json"
expect_error 2 "adapter_config.json: use_rslora true is not supported" \
  "$BIN" lora merge --model "$WORK/base" --adapter "$WORK/ad-rs" --out "$WORK/o3"
for o in o1 o2 o3; do [ ! -e "$WORK/$o" ] || fail "$o written after a refusal"; done
ls -a "$WORK" | grep -q '\.tmp-' && fail "a temporary directory was left: $(ls -a "$WORK")"
ok "nothing written by the refused merges"

# The merged model is a model `tessera eval` reads; the adapter changes its loss.
printf '1 2 3 4 5 6 7 8 9 10\n256 72 101 108 108 111 257\n' >"$WORK/tokens.txt"
"$BIN" eval --model "$WORK/merged" --tokens "$WORK/tokens.txt" >"$WORK/eval_m.json" || fail "eval of the merged model exited $?"
"$BIN" eval --model "$WORK/base" --tokens "$WORK/tokens.txt" >"$WORK/eval_b.json" || fail "eval of the base exited $?"
/usr/bin/python3 - "$WORK/eval_m.json" "$WORK/eval_b.json" <<'PY' || fail "eval of the merged model"
import json, math, sys
m, b = json.load(open(sys.argv[1]))["mean_loss"], json.load(open(sys.argv[2]))["mean_loss"]
assert math.isfinite(m) and abs(m - b) > 1e-6, (m, b)
print("mean loss base", b, "merged", m)
PY
ok "tessera eval reads the merged model"
echo "$pass passed"
