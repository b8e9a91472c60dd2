#!/usr/bin/env bash
# Qwen2 / Qwen2.5 and Qwen3 against an independent reference: the equations of transformers'
# Qwen2ForCausalLM and Qwen3ForCausalLM written here with Debian's python3-torch (fp64), reading the
# weights by their Hugging Face names from the safetensors file (parsed by hand) and the sizes from
# config.json. For a tiny random model of each family (every tensor random, so biases and q/k norm
# weights are far from 0 and 1; Qwen3 with head_dim 48 apart from hidden / heads = 32 and a tied
# head; Qwen2 untied), `tessera eval`'s per-sequence losses equal the reference's, and the reference
# without the q/k/v biases (Qwen2) or without the q/k norms (Qwen3) is far from both, so the test
# would catch a missing piece. Then unsupported Qwen options stop with one line naming config.json
# and the key, exit 2; a config.json as transformers >= 5 writes it (rope_parameters, dtype) gives
# the same losses.
set -uo pipefail
BIN="${TESSERA_BIN:?TESSERA_BIN not set}/tessera"
PY=/usr/bin/python3
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/../expect.bash"  # ok, fail, expect_error
export TESSERA_SUPPORT_PY="$(cd "$(dirname "${BASH_SOURCE[0]}")/../support" && pwd)" PYTHONDONTWRITEBYTECODE=1
"$PY" -c "import torch" 2>/dev/null || fail "$PY has no torch (scripts/deps.sh installs python3-torch)"

# safetensors read/write by hand, the random weights, and the reference forward (fp64).
cat > "$T/qwen_ref.py" <<'PY'
import json, math, os, struct, sys
import torch
sys.path.insert(0, os.environ["TESSERA_SUPPORT_PY"])
from safetensors_f32 import read_safetensors, write_safetensors  # tests/support


def randomize(src, dst, seed):
    """Every tensor of src's file random: norm weights around 1, biases and weights around 0."""
    g = torch.Generator().manual_seed(seed)
    w = read_safetensors(src)
    out = {}
    for name, t in w.items():
        if name.endswith("norm.weight"):
            out[name] = 0.5 + torch.rand(t.shape, generator=g)
        elif name.endswith(".bias"):
            out[name] = 0.5 * torch.randn(t.shape, generator=g)
        else:
            out[name] = 0.08 * torch.randn(t.shape, generator=g)
    write_safetensors(dst, out)

def rms_norm(x, w, eps):  # Qwen2RMSNorm / Qwen3RMSNorm
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)

def logits(c, w, ids, drop=None):
    """Qwen2ForCausalLM / Qwen3ForCausalLM, one sequence, fp64. drop: "biases" or "qk_norm"."""
    qwen3 = c["model_type"] == "qwen3"
    H, nh, nkv, eps = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["rms_norm_eps"]
    D = c.get("head_dim") or H // nh
    W = {k: v.to(torch.float64) for k, v in w.items()}
    T = len(ids)
    inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    mask = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
    biased = not qwen3 or c.get("attention_bias", False)
    def proj(p, name, x, bias):
        y = x @ W[p + name + ".weight"].T
        return y + W[p + name + ".bias"] if bias and drop != "biases" else y
    x = W["model.embed_tokens.weight"][torch.tensor(ids)]
    for l in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % l
        h = rms_norm(x, W[p + "input_layernorm.weight"], eps)
        q = proj(p, "self_attn.q_proj", h, biased).view(T, nh, D)
        k = proj(p, "self_attn.k_proj", h, biased).view(T, nkv, D)
        v = proj(p, "self_attn.v_proj", h, biased).view(T, nkv, D).transpose(0, 1)
        if qwen3 and drop != "qk_norm":  # per head, over head_dim, before RoPE
            q = rms_norm(q, W[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, W[p + "self_attn.k_norm.weight"], eps)
        q, k = q.transpose(0, 1), k.transpose(0, 1)  # [heads, T, D]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(nh // nkv, dim=0)  # repeat_kv: query head i reads KV head i // n_rep
        v = v.repeat_interleave(nh // nkv, dim=0)
        a = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(D) + mask, dim=-1) @ v
        x = x + proj(p, "self_attn.o_proj", a.transpose(0, 1).reshape(T, nh * D), qwen3 and biased)
        h = rms_norm(x, W[p + "post_attention_layernorm.weight"], eps)
        g, u = h @ W[p + "mlp.gate_proj.weight"].T, h @ W[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(g) * u) @ W[p + "mlp.down_proj.weight"].T
    head = W["model.embed_tokens.weight"] if c.get("tie_word_embeddings") else W["lm_head.weight"]
    return rms_norm(x, W["model.norm.weight"], eps) @ head.T

def loss(c, w, ids, drop=None):
    return torch.nn.functional.cross_entropy(logits(c, w, ids, drop)[:-1], torch.tensor(ids[1:])).item()

if __name__ == "__main__":
    cmd, model = sys.argv[1], sys.argv[2]
    if cmd == "randomize":
        randomize(model + "/model.safetensors", model + "/random.safetensors", int(sys.argv[3]))
        sys.exit(0)
    c = json.load(open(model + "/config.json"))
    w = read_safetensors(model + "/model.safetensors")
    seqs = [list(map(int, l.split())) for l in open(sys.argv[3])]
    got = json.load(open(sys.argv[4]))["per_sequence_loss"]
    want = [loss(c, w, s) for s in seqs]
    dropped = [loss(c, w, s, "qk_norm" if c["model_type"] == "qwen3" else "biases") for s in seqs]
    print("%s: tessera %s" % (c["model_type"], " ".join("%.7f" % x for x in got)))
    print("%s: ref     %s" % (c["model_type"], " ".join("%.7f" % x for x in want)))
    print("%s: dropped %s" % (c["model_type"], " ".join("%.7f" % x for x in dropped)))
    assert len(got) == len(want), (got, want)
    for x, y in zip(got, want):
        assert abs(x - y) <= 2e-6 * abs(y), "tessera %.8f vs reference %.8f" % (x, y)
    moved = max(abs(z - y) for z, y in zip(dropped, want))  # vs tessera's agreement of ~1e-6
    assert moved > 0.05, "dropping the %s moves the losses by %.6f only" % (
        "q/k norms" if c["model_type"] == "qwen3" else "biases", moved)
PY

"$PY" -c "
import random; random.seed(7)
for n in (13, 40, 64, 29): print(' '.join(str(random.randrange(320)) for _ in range(n)))" > "$T/tokens.txt"

for family in qwen2 qwen3; do
  M=$T/$family
  "$BIN" init-model --preset tiny-$family --seed 3 --out "$M" > /dev/null || fail "init-model tiny-$family"
  "$PY" "$T/qwen_ref.py" randomize "$M" 11 || fail "randomizing $family's weights"
  mv "$M/random.safetensors" "$M/model.safetensors"
  "$BIN" eval --model "$M" --tokens "$T/tokens.txt" > "$T/eval_$family.json" || fail "tessera eval $family"
  "$PY" "$T/qwen_ref.py" check "$M" "$T/tokens.txt" "$T/eval_$family.json" || fail "$family differs from the reference"
  ok "$family: tessera eval equals the transformers equations (and dropping a piece moves the loss)"
done

# Unsupported Qwen options: one line naming config.json and the key, exit 2 (and nothing written).
edit() {  # edit DIR PYTHON-EXPRESSION-ON-c: a copy of qwen3's directory with config.json changed
  mkdir -p "$T/$1" && cp "$T/qwen3/model.safetensors" "$T/$1/"
  "$PY" -c "import json; c = json.load(open('$T/qwen3/config.json')); $2; json.dump(c, open('$T/$1/config.json', 'w'))"
}
edit sliding "c['use_sliding_window'] = True; c['sliding_window'] = 16"
expect_error 2 "$T/sliding/config.json: use_sliding_window true is not supported" \
  "$BIN" eval --model "$T/sliding" --tokens "$T/tokens.txt"
edit layer_types "c['layer_types'] = ['full_attention', 'sliding_attention']"
expect_error 2 "$T/layer_types/config.json: layer_types entry \"sliding_attention\" is not supported" \
  "$BIN" eval --model "$T/layer_types" --tokens "$T/tokens.txt"
edit yarn "c['rope_scaling'] = {'rope_type': 'yarn', 'factor': 4.0, 'original_max_position_embeddings': 32768}"
expect_error 2 "$T/yarn/config.json: rope_scaling.rope_type \"yarn\" is not supported for model_type \"qwen3\"" \
  "$BIN" init-model --config "$T/yarn/config.json" --out "$T/never"
[ ! -e "$T/never" ] || fail "a failed init-model wrote its output"
# transformers >= 5 writes rope_parameters instead of rope_theta / rope_scaling, and dtype for torch_dtype:
# the same model, the same losses; an unknown rope_type there is refused by its key.
edit v5 "c['rope_parameters'] = {'rope_theta': c.pop('rope_theta'), 'rope_type': 'default'}; c.pop('rope_scaling'); c['dtype'] = c.pop('torch_dtype')"
"$BIN" eval --model "$T/v5" --tokens "$T/tokens.txt" > "$T/eval_v5.json" || fail "eval of a transformers 5 config.json"
cmp -s <("$PY" -c "import json, sys; print(json.load(open(sys.argv[1]))['per_sequence_loss'])" "$T/eval_qwen3.json") \
  <("$PY" -c "import json, sys; print(json.load(open(sys.argv[1]))['per_sequence_loss'])" "$T/eval_v5.json") ||
  fail "rope_parameters changed the losses"
ok "config.json with rope_parameters (transformers >= 5): the same losses"
edit v5_yarn "c['rope_parameters'] = {'rope_theta': c.pop('rope_theta'), 'rope_type': 'yarn', 'factor': 4.0}; c.pop('rope_scaling')"
expect_error 2 "$T/v5_yarn/config.json: rope_parameters.rope_type \"yarn\" is not supported for model_type \"qwen3\" (supported: default)" \
  "$BIN" eval --model "$T/v5_yarn" --tokens "$T/tokens.txt"
edit mistral "c['model_type'] = 'mistral'"  # Mistral has no q/k norms nor a head_dim of its own
expect_error 2 "$T/mistral/config.json: head_dim 48 is not supported for model_type \"mistral\"" \
  "$BIN" eval --model "$T/mistral" --tokens "$T/tokens.txt"
# Sliding window off: its size is ignored, as transformers does (Qwen2.5's released configs).
edit window_off "c['use_sliding_window'] = False; c['sliding_window'] = 4; c['max_window_layers'] = 1"
"$BIN" eval --model "$T/window_off" --tokens "$T/tokens.txt" > "$T/eval_off.json" || fail "eval with use_sliding_window false"
"$PY" -c "
import json, sys
a, b = (json.load(open(p))['per_sequence_loss'] for p in sys.argv[1:3])
assert a == b, (a, b)" "$T/eval_qwen3.json" "$T/eval_off.json" || fail "use_sliding_window false changed the losses"
ok "use_sliding_window false: the window size is ignored"
echo "$pass passed, 0 failed"
