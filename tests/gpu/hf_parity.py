#!/usr/bin/env python3
"""Tessera's forward against Hugging Face transformers' own, for tests/gpu/run.sh (step hf_parity).

  hf_parity.py --tessera BUILD/bin/tessera --work DIR [--tol 1e-4]

On the device image (a CUDA PyTorch 2.x with transformers), for a tiny random model of each family:
  llama  LlamaForCausalLM, untied, GQA, rope_scaling of type llama3 with an original context of 64
         (sequences of 100 tokens reach every regime of the scaling), rope_theta 500000;
  qwen2  Qwen2ForCausalLM, untied, q/k/v biases, rope_theta 1e6;
  qwen3  Qwen3ForCausalLM, tied, q/k norms, head_dim 48 apart from hidden / heads = 32.
Each is built by transformers (AutoModelForCausalLM.from_config, eager attention, fp32), every
parameter made random (norm weights 0.5..1.5, biases and weights around 0: so that the biases and
norms matter), written with save_pretrained (safetensors; config.json as this transformers writes
it: rope_parameters and "dtype" from 5.x on, which Tessera must read), and scored on the same token
ids by transformers' forward (labels = ids: the mean next-token cross entropy per sequence, fp32 on
the CPU, no TF32) and by `tessera eval --model DIR --tokens FILE` (fp32; eval runs on the CPU too:
the step is on the GPU machine for its image's transformers, which this project's CPU machine lacks).

Tolerance, stated up front: every sequence's loss within 1e-4 nats of transformers' (both fp32;
summation order differs, nothing else). And the check can fail: transformers' loss without the
family's piece (Qwen2's biases zeroed, Qwen3's q/k norm weights set to 1, Llama's rope_scaling
removed) is more than 10 x the tolerance away from Tessera's on some sequence.
Prints one line per family starting "hf_parity:"; exits 1 on a mismatch.
"""
import argparse
import json
import os
import subprocess
import sys

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

SIZES = dict(vocab_size=320, hidden_size=128, intermediate_size=344, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6, bos_token_id=256,
             eos_token_id=257, hidden_act="silu")
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 64}
FAMILIES = {  # model_type -> (extra config keys, rope_theta, rope scaling or None)
    "llama": (dict(tie_word_embeddings=False), 500000.0, LLAMA3_SCALING),
    "qwen2": (dict(tie_word_embeddings=False, use_sliding_window=False), 1e6, None),
    "qwen3": (dict(tie_word_embeddings=True, head_dim=48, use_sliding_window=False), 1e6, None),
}


def make_config(model_type):
    extra, theta, scaling = FAMILIES[model_type]
    cls = type(AutoConfig.for_model(model_type))
    kw = dict(SIZES, **extra)
    if hasattr(cls(), "rope_parameters"):  # transformers >= 5
        kw["rope_parameters"] = dict(scaling or {"rope_type": "default"}, rope_theta=theta)
    else:
        kw["rope_theta"] = theta
        kw["rope_scaling"] = scaling
    return cls(**kw)


def randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.08 * torch.randn(p.shape, generator=g))


def hf_losses(model, seqs):
    with torch.no_grad():
        return [model(input_ids=torch.tensor([s]), labels=torch.tensor([s])).loss.item() for s in seqs]


def without_piece(model_type, model):
    """The model without what its family adds (in place): the check that the tolerance can fail."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if model_type == "qwen2" and name.endswith(".bias"):
                p.zero_()
            if model_type == "qwen3" and (name.endswith("q_norm.weight") or name.endswith("k_norm.weight")):
                p.fill_(1.0)
    if model_type == "llama":  # the same weights without the llama3 scaling
        cfg = make_config("llama")
        if isinstance(getattr(cfg, "rope_parameters", None), dict):
            cfg.rope_parameters = {"rope_type": "default", "rope_theta": FAMILIES["llama"][1]}
        else:
            cfg.rope_scaling = None
        plain = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float()
        plain.load_state_dict(model.state_dict())
        return plain
    return model


def check(model_type, args, seqs):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(make_config(model_type), attn_implementation="eager").float().eval()
    randomize(model, seed=11 + list(FAMILIES).index(model_type))
    out = os.path.join(args.work, model_type)
    model.save_pretrained(out)  # safetensors (the default since 4.35, the only format in 5)
    cfg = json.load(open(os.path.join(out, "config.json")))
    shape = "rope_parameters" if "rope_parameters" in cfg else "rope_theta/rope_scaling"
    ref = hf_losses(model, seqs)
    tokens = os.path.join(args.work, "tokens.txt")
    r = subprocess.run([args.tessera, "eval", "--model", out, "--tokens", tokens], capture_output=True, text=True)
    if r.returncode != 0:
        print("hf_parity: %s: tessera eval exited %d: %s" % (model_type, r.returncode, r.stderr.strip()[-500:]))
        return False
    got = json.loads(r.stdout.strip().splitlines()[-1])["per_sequence_loss"]
    diff = max(abs(a - b) for a, b in zip(got, ref))
    moved = max(abs(a - b) for a, b in zip(got, hf_losses(without_piece(model_type, model), seqs)))
    good = len(got) == len(ref) and diff <= args.tol and moved > 10 * args.tol
    print("hf_parity: %s %s (config.json %s): max |tessera - transformers| per-sequence loss %.2e over %d sequences "
          "(tolerance %g), losses %s; without the family's piece transformers moves by >= %.3f" %
          ("PASS" if good else "FAIL", model_type, shape, diff, len(got), args.tol,
           " ".join("%.5f" % x for x in ref), moved))
    return good


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tessera", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    os.makedirs(args.work, exist_ok=True)
    print("hf_parity: torch %s, transformers %s" % (torch.__version__, transformers.__version__))
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, SIZES["vocab_size"], (n,), generator=g).tolist() for n in (100, 37, 5)]
    with open(os.path.join(args.work, "tokens.txt"), "w") as f:
        f.writelines(" ".join(map(str, s)) + "\n" for s in seqs)
    results = [check(t, args, seqs) for t in FAMILIES]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
