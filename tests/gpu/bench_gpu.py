#!/usr/bin/env python3
"""Throughput reference for tests/gpu/run.sh: the Llama 2 training step of Tessera written in plain
PyTorch eager, on one GPU, plus the report that puts Tessera's own figures next to it.

  bench_gpu.py eager  --config config.json --seq 2048 --batch 4 --warmup 3 --steps 10 --out eager.json \
                      [--trace eager-kernels.json --profile-steps 2]
  bench_gpu.py report --config config.json --seq 2048 --batch 4 --eager eager.json \
                      [--tessera-metrics metrics.jsonl] [--skip-reason TEXT] \
                      [--kernel-table kernel_table.json] [--tessera-nccl "NCCL version ..."]

With --trace, after the timed steps (and after eager.json is written), --profile-steps more steps
run under torch.profiler (CPU operators and CUDA kernels), each inside a "ProfilerStep#N" annotation,
and the Chrome trace is written there: benchmarks/kernel_table.py puts it next to Tessera's
(train.profile_steps: log.dir/kernels-rank-<r>.json). The report prints the cuDNN and NCCL versions
and, from kernel_table.py's JSON, the SDPA backend each side ran.

The eager step matches Tessera's `fsdp.mixed_precision=bf16`: fp32 master weights and AdamW state,
bf16 compute (autocast), SDPA attention (flash on Hopper), untied lm_head, next-token cross entropy,
global-norm clipping at 1.0. MFU uses the PaLM / nanoGPT count: 6 x (parameters without the
embedding table) + 12 x layers x hidden x seq FLOP per token, against the GPU's dense bf16 peak.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

# Dense bf16 tensor-core peaks (vendor datasheets, without sparsity), TFLOP/s.
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0}


def load_config(path):
    with open(path) as f:
        c = json.load(f)
    c.setdefault("num_key_value_heads", c["num_attention_heads"])
    c.setdefault("rope_theta", 10000.0)
    return c


def flops_per_token(c, seq):
    h, L, i, v = c["hidden_size"], c["num_hidden_layers"], c["intermediate_size"], c["vocab_size"]
    kv = h // c["num_attention_heads"] * c["num_key_value_heads"]
    per_layer = h * h * 2 + h * kv * 2 + 3 * h * i  # q, o, k, v, gate/up/down (norm weights negligible)
    n = L * per_layer + h * v  # + lm_head; the embedding lookup is not a matmul
    return 6 * n + 12 * L * h * seq


def num_parameters(c):
    h, L, i, v = c["hidden_size"], c["num_hidden_layers"], c["intermediate_size"], c["vocab_size"]
    kv = h // c["num_attention_heads"] * c["num_key_value_heads"]
    return L * (h * h * 2 + h * kv * 2 + 3 * h * i + 2 * h) + h + 2 * h * v


def peak_tflops(device_name):
    override = os.environ.get("TESSERA_PEAK_TFLOPS")
    if override:
        return float(override), "TESSERA_PEAK_TFLOPS"
    for key, value in PEAK_BF16_TFLOPS.items():
        if key in device_name:
            return value, key + " datasheet, dense bf16"
    return 989.0, "unknown GPU '%s', assumed H100/H200 dense bf16" % device_name


def measured_matmul_tflops(torch, n=8192, iters=20):
    """The bf16 matmul rate this GPU reaches right now (n x n x n, median of iters): the practical
    peak MFU is also quoted against (an H200 reached about 790 of its 989 datasheet TFLOP/s)."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * n**3 / statistics.median(times) / 1e12


def build_model(c):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    H, nh, nkv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    hd = H // nh
    eps = c.get("rms_norm_eps", 1e-5)

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(H))

        def forward(self, x):
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * self.weight.to(x.dtype)

    def rotate_half(x):  # Hugging Face layout: first half / second half of each head
        a, b = x.chunk(2, dim=-1)
        return torch.cat((-b, a), dim=-1)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm, self.post_attention_layernorm = RMSNorm(), RMSNorm()
            self.q_proj = nn.Linear(H, nh * hd, bias=False)
            self.k_proj = nn.Linear(H, nkv * hd, bias=False)
            self.v_proj = nn.Linear(H, nkv * hd, bias=False)
            self.o_proj = nn.Linear(nh * hd, H, bias=False)
            self.gate_proj = nn.Linear(H, c["intermediate_size"], bias=False)
            self.up_proj = nn.Linear(H, c["intermediate_size"], bias=False)
            self.down_proj = nn.Linear(c["intermediate_size"], H, bias=False)

        def forward(self, x, cos, sin):
            B, S, _ = x.shape
            h = self.input_layernorm(x)
            q = self.q_proj(h).view(B, S, nh, hd).transpose(1, 2)
            k = self.k_proj(h).view(B, S, nkv, hd).transpose(1, 2)
            v = self.v_proj(h).view(B, S, nkv, hd).transpose(1, 2)
            cos, sin = cos.to(q.dtype), sin.to(q.dtype)  # keep q, k in the compute dtype (bf16)
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
            if nkv != nh:
                k = k.repeat_interleave(nh // nkv, dim=1)
                v = v.repeat_interleave(nh // nkv, dim=1)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.o_proj(a.transpose(1, 2).reshape(B, S, nh * hd))
            h = self.post_attention_layernorm(x)
            return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(c["vocab_size"], H)
            self.layers = nn.ModuleList(Layer() for _ in range(c["num_hidden_layers"]))
            self.norm = RMSNorm()
            self.lm_head = nn.Linear(H, c["vocab_size"], bias=False)
            inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2).float() / hd))
            self.register_buffer("inv_freq", inv, persistent=False)

        def forward(self, ids):
            S = ids.shape[1]
            f = torch.outer(torch.arange(S, device=ids.device).float(), self.inv_freq)
            emb = torch.cat((f, f), dim=-1)
            cos, sin = emb.cos()[None, None], emb.sin()[None, None]
            x = self.embed_tokens(ids)
            for layer in self.layers:
                x = layer(x, cos, sin)
            return self.lm_head(self.norm(x))

    model = Llama()
    for name, p in model.named_parameters():
        if p.dim() == 2:
            nn.init.normal_(p, std=0.02)
    return model


def profile_eager(torch, step, path, steps):
    """`steps` more eager steps under torch.profiler, written as a Chrome trace at `path`; one line
    says what was written (or why not: the throughput result is already saved)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    t0 = time.perf_counter()
    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for i in range(steps):
                with record_function("ProfilerStep#%d" % (i + 1)):
                    step()
            torch.cuda.synchronize()
        prof.export_chrome_trace(path)
    except Exception as e:  # noqa: BLE001 -- any profiler failure: said, and the result stays
        print("eager: kernel trace NOT written (%s: %s)" % (type(e).__name__, e), file=sys.stderr)
        return
    print("eager: kernel trace of %d steps: %s (%.1f MB, %.1f s with the export)"
          % (steps, path, os.path.getsize(path) / 1e6, time.perf_counter() - t0))


def versions(torch):
    """cuDNN, NCCL and the SDPA backends PyTorch may pick (which one ran: the kernel trace)."""
    nccl = torch.cuda.nccl.version() if hasattr(torch.cuda, "nccl") else None
    sdp = {name: getattr(torch.backends.cuda, name + "_sdp_enabled")()
           for name in ("cudnn", "flash", "mem_efficient", "math") if hasattr(torch.backends.cuda, name + "_sdp_enabled")}
    v = torch.backends.cudnn.version()  # cuDNN 9: major * 10000 + minor * 100 + patch; 8: major * 1000 + ...
    cudnn = None if v is None else "%d.%d.%d" % ((v // 10000, v // 100 % 100, v % 100) if v >= 10000 else
                                                 (v // 1000, v // 100 % 10, v % 100))
    return {"cuda": torch.version.cuda, "cudnn": cudnn,
            "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl, "sdp_enabled": sdp}


def run_eager(args):
    import torch
    import torch.nn.functional as F

    if not torch.cuda.is_available():
        print("eager: no CUDA device visible to PyTorch", file=sys.stderr)
        return 3
    c = load_config(args.config)
    dev = torch.device("cuda")
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    with dev:  # build and initialise directly on the GPU (seconds instead of a 4 GB CPU init + copy)
        model = build_model(c)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    ids = torch.randint(0, c["vocab_size"], (args.batch, args.seq + 1), device=dev)
    inputs, targets = ids[:, :-1], ids[:, 1:]

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(inputs)
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()  # per-step timing, as Tessera's step_time_s
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    name = torch.cuda.get_device_name()
    peak, peak_src = peak_tflops(name)
    matmul = measured_matmul_tflops(torch)
    step_s = statistics.median(times)
    tok_s = args.batch * args.seq / step_s
    res = {
        "device": name,
        "torch": torch.__version__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "batch": args.batch,
        "seq": args.seq,
        "step_s_median": step_s,
        "tokens_per_s": tok_s,
        "mfu": tok_s * flops_per_token(c, args.seq) / (peak * 1e12),
        "peak_tflops": peak,
        "peak_source": peak_src,
        "measured_matmul_tflops": matmul,
        "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30,
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
        "loss_first_last": [losses[0], losses[-1]],
        "finite": all(math.isfinite(x) for x in losses),
    }
    res.update(versions(torch))
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res))
    if args.trace:
        profile_eager(torch, step, args.trace, args.profile_steps)
    return 0 if res["finite"] else 4


def run_report(args):
    c = load_config(args.config)
    fpt = flops_per_token(c, args.seq)
    lines = ["model: %.2fB parameters (hidden %d, %d layers, %d heads, %d kv heads, intermediate %d, vocab %d), seq %d, "
             "micro-batch %d, %.2f GFLOP/token" % (num_parameters(c) / 1e9, c["hidden_size"], c["num_hidden_layers"],
                                                   c["num_attention_heads"], c["num_key_value_heads"],
                                                   c["intermediate_size"], c["vocab_size"], args.seq, args.batch, fpt / 1e9)]
    eager = None
    if args.eager and os.path.exists(args.eager):
        with open(args.eager) as f:
            eager = json.load(f)
        lines.append("pytorch eager (%s, torch %s): %.0f tokens/s, MFU %.1f%% of %.0f TFLOP/s (%s), step %.3f s, "
                     "peak GPU memory %.1f GiB allocated / %.1f reserved, loss %.3f -> %.3f"
                     % (eager["device"], eager["torch"], eager["tokens_per_s"], 100 * eager["mfu"], eager["peak_tflops"],
                        eager["peak_source"], eager["step_s_median"], eager["peak_mem_gib"], eager["peak_reserved_gib"],
                        eager["loss_first_last"][0], eager["loss_first_last"][1]))
    else:
        lines.append("pytorch eager: no result (see the eager step's log)")

    if args.tessera_metrics and os.path.exists(args.tessera_metrics):
        with open(args.tessera_metrics) as f:
            recs = [json.loads(line) for line in f if line.strip()]
        timed = recs[min(2, len(recs) - 1):] if recs else []  # drop warm-up steps
        if timed:
            tok_s = statistics.median(r["tokens_per_s"] for r in timed)
            peak = eager["peak_tflops"] if eager else peak_tflops("")[0]
            mem = max((r.get("peak_gpu_mem_bytes", 0) for r in timed), default=0)
            lines.append("tessera: %.0f tokens/s, MFU %.1f%% (same FLOP count and peak), peak GPU memory %s, %d timed steps"
                         % (tok_s, 100 * tok_s * fpt / (peak * 1e12),
                            "%.1f GiB" % (mem / 2**30) if mem else "not reported", len(timed)))
            if eager and eager.get("measured_matmul_tflops"):
                m = eager["measured_matmul_tflops"]
                lines.append("against the %.0f TFLOP/s a bf16 8192^3 matmul reached in this run: MFU tessera %.1f%%, "
                             "pytorch eager %.1f%%" % (m, 100 * tok_s * fpt / (m * 1e12),
                                                       100 * eager["tokens_per_s"] * fpt / (m * 1e12)))
            if eager:
                lines.append("tessera / pytorch eager: %.2fx tokens/s" % (tok_s / eager["tokens_per_s"]))
        else:
            lines.append("tessera: metrics file has no steps")
    else:
        lines.append("tessera: SKIPPED - %s" % (args.skip_reason or "no metrics"))
    lines += version_lines(eager, args.tessera_nccl, args.kernel_table)
    print("\n".join(lines))
    return 0


def version_lines(eager, tessera_nccl, kernel_table):
    """cuDNN and NCCL versions, and the SDPA backend each side ran (from its kernels' names)."""
    out = []
    if eager and "cudnn" in eager:
        out.append("libraries: CUDA %s, cuDNN %s, NCCL %s (torch's); tessera's NCCL: %s"
                   % (eager["cuda"], eager["cudnn"], eager["nccl"], tessera_nccl or "no 'NCCL version' line in its log"))
    table = None
    if kernel_table and os.path.exists(kernel_table):
        with open(kernel_table) as f:
            table = json.load(f)
    if table:
        out.append("SDPA backend that ran (kernel names): " + ", ".join("%s %s" % (s["name"], s["sdpa_backend"]) for s in table)
                   + ("; enabled in eager: " + ", ".join(k for k, v in eager.get("sdp_enabled", {}).items() if v)
                      if eager and eager.get("sdp_enabled") else ""))
    else:
        out.append("SDPA backend that ran: unknown (no kernel table: see the kernel_profile step)")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("eager", "report"):
        p = sub.add_parser(name)
        p.add_argument("--config", required=True, help="Hugging Face config.json of the model")
        p.add_argument("--seq", type=int, default=2048)
        p.add_argument("--batch", type=int, default=4)
        if name == "eager":
            p.add_argument("--warmup", type=int, default=3)
            p.add_argument("--steps", type=int, default=10)
            p.add_argument("--out", required=True)
            p.add_argument("--trace", help="Chrome trace of --profile-steps more steps (torch.profiler)")
            p.add_argument("--profile-steps", type=int, default=2)
        else:
            p.add_argument("--eager")
            p.add_argument("--tessera-metrics")
            p.add_argument("--skip-reason", default="")
            p.add_argument("--kernel-table", help="benchmarks/kernel_table.py --json output")
            p.add_argument("--tessera-nccl", default="", help="the 'NCCL version' line of Tessera's run")
    args = ap.parse_args()
    return run_eager(args) if args.cmd == "eager" else run_report(args)


if __name__ == "__main__":
    sys.exit(main())
