#!/usr/bin/env bash
# `tessera generate` against an independent reference decoding: the published Llama equations
# (RMSNorm, rotate-half RoPE with Llama 3's frequency scaling, grouped-query attention, SwiGLU, tied
# or untied head) written here with Debian's python3-torch in fp64, no cache: the whole sequence is
# recomputed for every new token, and the argmax taken. For tiny random Llama 2 and Llama 3 models
# (weights large enough that the logits are far from ties), greedy generation with the KV cache gives
# the reference's tokens, token for token, stopping at the model's end-of-sequence id when the
# reference does. Also: --prompt TEXT is BOS + its bytes; seeded sampling is reproducible and
# depends on the seed; --stop cuts the text; the plain output prints the text.
set -uo pipefail
BIN="${TESSERA_BIN:?TESSERA_BIN not set}/tessera"
PY=/usr/bin/python3
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/../expect.bash"  # ok, fail, check, expect_error
export TESSERA_SUPPORT_PY="$(cd "$(dirname "${BASH_SOURCE[0]}")/../support" && pwd)" PYTHONDONTWRITEBYTECODE=1
"$PY" -c "import torch" 2>/dev/null || fail "$PY has no torch (scripts/deps.sh installs python3-torch)"

cat > "$T/ref.py" <<'PY'
import json, math, os, struct, sys
import torch
sys.path.insert(0, os.environ["TESSERA_SUPPORT_PY"])
from safetensors_f32 import read_safetensors, write_safetensors  # tests/support


def randomize(path, seed):
    g = torch.Generator().manual_seed(seed)
    w = read_safetensors(path)
    write_safetensors(path, {k: (0.5 + torch.rand(t.shape, generator=g)) if k.endswith("norm.weight")
                             else 0.1 * torch.randn(t.shape, generator=g) for k, t in w.items()})

def inv_freq(c, D):
    f = 1.0 / (c["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    s = c.get("rope_scaling")
    if not s:
        return f
    # Meta's apply_scaling (Llama 3.1): keep high frequencies, divide low ones, blend between.
    C, factor, lo, hi = s["original_max_position_embeddings"], s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    out = []
    for x in f.tolist():
        w = 2 * math.pi / x
        if w < C / hi:
            out.append(x)
        elif w > C / lo:
            out.append(x / factor)
        else:
            m = (C / w - lo) / (hi - lo)
            out.append((1 - m) * x / factor + m * x)
    return torch.tensor(out, dtype=torch.float64)

def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

def rotate_half(x):
    return torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1)

def logits(c, W, ids):
    """LlamaForCausalLM on one sequence, fp64, every position recomputed."""
    H, nh, nkv, eps = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["rms_norm_eps"]
    D, T = H // nh, len(ids)
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq(c, D))
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    mask = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
    x = W["model.embed_tokens.weight"][torch.tensor(ids)]
    for l in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % l
        h = rms_norm(x, W[p + "input_layernorm.weight"], eps)
        q = (h @ W[p + "self_attn.q_proj.weight"].T).view(T, nh, D).transpose(0, 1)
        k = (h @ W[p + "self_attn.k_proj.weight"].T).view(T, nkv, D).transpose(0, 1)
        v = (h @ W[p + "self_attn.v_proj.weight"].T).view(T, nkv, D).transpose(0, 1)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(nh // nkv, dim=0), v.repeat_interleave(nh // nkv, dim=0)
        a = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(D) + mask, dim=-1) @ v
        x = x + a.transpose(0, 1).reshape(T, H) @ W[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, W[p + "post_attention_layernorm.weight"], eps)
        x = x + (torch.nn.functional.silu(h @ W[p + "mlp.gate_proj.weight"].T) * (h @ W[p + "mlp.up_proj.weight"].T)) \
            @ W[p + "mlp.down_proj.weight"].T
    head = W["model.embed_tokens.weight"] if c.get("tie_word_embeddings") else W["lm_head.weight"]
    return rms_norm(x, W["model.norm.weight"], eps) @ head.T

def greedy(c, W, prompt, n):
    eos = c["eos_token_id"] if isinstance(c["eos_token_id"], list) else [c["eos_token_id"]]
    ids, out, margin = list(prompt), [], float("inf")
    for _ in range(n):
        last = logits(c, W, ids)[-1]
        top = torch.topk(last, 2).values
        margin = min(margin, (top[0] - top[1]).item())
        t = int(last.argmax())
        out.append(t)
        if t in eos:
            break
        ids.append(t)
    return out, margin

if __name__ == "__main__":
    if sys.argv[1] == "randomize":
        randomize(sys.argv[2] + "/model.safetensors", int(sys.argv[3]))
        sys.exit(0)
    model, prompts, got, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    c = json.load(open(model + "/config.json"))
    W = {k: v.to(torch.float64) for k, v in read_safetensors(model + "/model.safetensors").items()}
    results = [json.loads(l) for l in open(got)]
    seqs = [list(map(int, l.split())) for l in open(prompts) if l.strip()]
    assert len(results) == len(seqs), (len(results), len(seqs))
    for seq, r in zip(seqs, results):
        want, margin = greedy(c, W, seq, n)
        print("prompt", seq, "reference", want, "tessera", r["generated_ids"], r["finish_reason"], "margin %.3g" % margin)
        assert r["prompt_ids"] == seq
        assert r["generated_ids"] == want, (r["generated_ids"], want)
        assert margin > 1e-4, "the reference's top two logits are too close for the comparison to mean anything"
        eos = c["eos_token_id"] if isinstance(c["eos_token_id"], list) else [c["eos_token_id"]]
        assert r["finish_reason"] == ("eos" if want[-1] in eos else "length"), r["finish_reason"]
PY

printf '256 72 101 108 108 111\n256 7 300 2 19 44 250 3\n\n256\n' > "$T/prompts.txt"
for preset in tiny tiny-llama3; do
  M=$T/$preset
  $BIN init-model --preset $preset --out "$M" --dtype fp32 > /dev/null || fail "init-model $preset"
  "$PY" "$T/ref.py" randomize "$M" 7 || fail "randomize $preset"
  $BIN generate --model "$M" --prompt-ids "$T/prompts.txt" --max-new-tokens 12 --json > "$T/$preset.jsonl" 2> "$T/err" ||
    { cat "$T/err"; fail "generate $preset"; }
  "$PY" "$T/ref.py" "$M" "$T/prompts.txt" "$T/$preset.jsonl" 12 > "$T/cmp" 2>&1 ||
    { cat "$T/cmp"; fail "$preset: greedy tokens differ from the reference decoding"; }
  cat "$T/cmp"
  ok "$preset: greedy generation equals the reference decoding (fp64, recomputed each step), token for token"
done
M=$T/tiny

# --prompt TEXT: BOS + the text's bytes (the byte tokenizer of the tiny model) = the first prompt above.
$BIN generate --model "$M" --prompt Hello --max-new-tokens 12 --json > "$T/text.jsonl" 2> /dev/null || fail "--prompt"
check "--prompt Hello generates what ids 256 72 101 108 108 111 generate" \
  "$PY" -c "import json,sys; a=json.loads(open('$T/text.jsonl').readline()); b=json.loads(open('$T/tiny.jsonl').readline());
assert a['prompt_ids']==b['prompt_ids'] and a['generated_ids']==b['generated_ids'], (a, b)"
$BIN generate --model "$M" --prompt Hello --max-new-tokens 12 > "$T/plain.txt" 2> "$T/plain.err" || fail "plain output"
check "the plain output is the generated text (the bytes of the generated ids)" "$PY" -c "
import json; r=json.loads(open('$T/text.jsonl').readline())
assert open('$T/plain.txt','rb').read() == bytes(i for i in r['generated_ids'] if i < 256) + b'\\n'"
check "stderr says how many tokens and why it stopped" grep -Eq "^tessera generate: --prompt: [0-9]+ tokens \((length|eos)\)" "$T/plain.err"

# --prompts: a "messages" record through data.chat_template (llama2 here: the tiny model's byte
# tokenizer has no template of its own) with the generation prompt, and a "prompt" record.
printf '%s\n' '{"messages": [{"role": "user", "content": "Hi"}]}' '{"prompt": "Hi"}' > "$T/chat.jsonl"
$BIN generate --model "$M" --prompts "$T/chat.jsonl" --set data.chat_template=llama2 --max-new-tokens 2 --json \
  > "$T/chat.out" 2> "$T/err" || { cat "$T/err"; fail "--prompts"; }
check "messages render as training renders them, up to the answer; a prompt record is BOS + its text" "$PY" -c "
import json; a, b = [json.loads(l)['prompt_ids'] for l in open('$T/chat.out')]
assert a == [256] + list(b'[INST] Hi [/INST]') and b == [256] + list(b'Hi'), (a, b)"

# Seeded sampling: the same seed, the same tokens; another seed, others.
sample() { $BIN generate --model "$M" --prompt-ids "$T/prompts.txt" --max-new-tokens 16 --temperature 1.5 --top-k 50 \
             --top-p 0.95 --seed "$1" --json 2> /dev/null | "$PY" -c "import json,sys; print([json.loads(l)['generated_ids'] for l in sys.stdin])"; }
a=$(sample 11) b=$(sample 11) c=$(sample 12)
check "sampling with --seed 11 twice gives the same tokens" test -n "$a" -a "$a" = "$b"
check "--seed 12 gives other tokens" test "$a" != "$c"

# --stop: a printable character the greedy text holds (after its first token) ends the generation
# there, and the text ends before it.
at=$("$PY" -c "
import json; ids=json.loads(open('$T/text.jsonl').readline())['generated_ids']
print(next(i for i in range(1, len(ids)) if 33 <= ids[i] < 127 and ids[i] not in ids[:i] and chr(ids[i]).isalnum()))") ||
  fail "the greedy text holds no printable character to stop at"
stop=$("$PY" -c "import json; print(chr(json.loads(open('$T/text.jsonl').readline())['generated_ids'][$at]))")
$BIN generate --model "$M" --prompt Hello --max-new-tokens 12 --stop "$stop" --json > "$T/stop.jsonl" 2> /dev/null || fail "--stop"
$BIN generate --model "$M" --prompt Hello --max-new-tokens "$at" --json > "$T/before.jsonl" 2> /dev/null || fail "before"
check "--stop '$stop' stops at that token and cuts the text before it" "$PY" -c "
import json; r=json.loads(open('$T/stop.jsonl').readline()); full=json.loads(open('$T/text.jsonl').readline())['generated_ids']
before=json.loads(open('$T/before.jsonl').readline())
assert r['finish_reason']=='stop' and r['generated_ids']==full[:$at + 1] and r['text']==before['text'], (r, full, before)"
# generation_config.json's eos_token_id list (as Llama 3 Instruct's) ends the generation too: with a
# token the greedy text holds among them, it stops there ("eos"), that id kept last.
eos_at=$("$PY" -c "
import json; ids=json.loads(open('$T/text.jsonl').readline())['generated_ids']
i=next(i for i in range(1, len(ids)) if ids[i] not in ids[:i]); print(i)
json.dump({'eos_token_id': [257, ids[i]]}, open('$M/generation_config.json', 'w'))") || fail "generation_config.json"
$BIN generate --model "$M" --prompt Hello --max-new-tokens 12 --json > "$T/eos.jsonl" 2> /dev/null || fail "eos"
check "an eos_token_id of generation_config.json ends the generation" "$PY" -c "
import json; r=json.loads(open('$T/eos.jsonl').readline()); full=json.loads(open('$T/text.jsonl').readline())['generated_ids']
assert r['finish_reason']=='eos' and r['generated_ids']==full[:$eos_at + 1], (r, full)"
echo "$pass passed, 0 failed"
