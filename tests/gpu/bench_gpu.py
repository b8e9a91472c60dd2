#!/usr/bin/env python3
"""Throughput reference for tests/gpu/run.sh: the Llama 2 training step of Tessera written in plain
PyTorch eager, on one GPU, plus the report that puts Tessera's own figures next to it.

  bench_gpu.py eager  --config config.json --seq 2048 --batch 4 --warmup 3 --steps 10 --out eager.json \
                      [--trace eager-kernels.json --profile-steps 2] [--compile]
  bench_gpu.py report --config config.json --seq 2048 --batch 4 --eager eager.json [--compiled compile.json] \
                      [--tessera-metrics metrics.jsonl] [--skip-reason TEXT] \
                      [--kernel-table kernel_table.json] [--tessera-nccl "NCCL version ..."] [--record record.json]

With --compile the same step runs with the model under torch.compile (inductor, default mode): the
peer a torchtitan user would pick; its warm-up steps hold the compilation (compile_s in the result).
--record writes the run's record, one JSON object (benchmarks/results/gpu.jsonl takes it as a line):
date, device, torch, cudnn, nccl, model, seq, micro_batch, tessera_tokens_per_s, eager_tokens_per_s,
compile_tokens_per_s, the two ratios, mfu, peak_gpu_mem_gib, eager_peak_gpu_mem_gib and
compile_peak_gpu_mem_gib, forward_s, backward_s and optimizer_s (medians of Tessera's timed steps),
and kernel_ms_per_step (kernel_table.py's categories per side); what did not run is null.

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
    if args.compile:
        if not hasattr(torch, "compile"):
            print("eager: torch %s has no torch.compile" % torch.__version__, file=sys.stderr)
            return 3
        model = torch.compile(model)
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

    t_warm = time.perf_counter()
    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    warmup_s = time.perf_counter() - t_warm
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
        "mode": "compile" if args.compile else "eager",
        "warmup_s": warmup_s,  # with --compile: the compilation, mostly
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


def read_json(path):
    if not path or not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def median_of(values):
    values = [v for v in values if isinstance(v, (int, float))]
    return statistics.median(values) if values else None


def tessera_summary(path):
    """Tessera's timed steps (metrics.jsonl without its first two, warm-up steps): medians of
    tokens/s and the step's parts, and the peak GPU memory; None without steps."""
    if not path or not os.path.exists(path):
        return None
    with open(path) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    timed = recs[min(2, len(recs) - 1):] if recs else []
    if not timed:
        return {"steps": 0}
    mem = max((r.get("peak_gpu_mem_bytes", 0) for r in timed), default=0)
    part = lambda name: median_of((r.get("time") or {}).get(name) for r in timed)  # noqa: E731
    return {"steps": len(timed), "tokens_per_s": median_of(r.get("tokens_per_s") for r in timed),
            "peak_mem_gib": mem / 2**30 if mem else None,
            "forward_s": part("forward_s"), "backward_s": part("backward_s"), "optimizer_s": part("optimizer_s"),
            "gather_wait_s": part("gather_wait_s"), "reduce_wait_s": part("reduce_wait_s"),
            "comm_s": part("comm_s"), "exposed_comm_s": part("exposed_comm_s")}


def peer_line(what, r):
    return ("pytorch %s (%s, torch %s): %.0f tokens/s, MFU %.1f%% of %.0f TFLOP/s (%s), step %.3f s, "
            "peak GPU memory %.1f GiB allocated / %.1f reserved, loss %.3f -> %.3f"
            % (what, r["device"], r["torch"], r["tokens_per_s"], 100 * r["mfu"], r["peak_tflops"], r["peak_source"],
               r["step_s_median"], r["peak_mem_gib"], r["peak_reserved_gib"], r["loss_first_last"][0], r["loss_first_last"][1]))


def run_report(args):
    c = load_config(args.config)
    fpt = flops_per_token(c, args.seq)
    model = ("%.2fB Llama (hidden %d, %d layers, %d heads, %d kv heads, intermediate %d, vocab %d)"
             % (num_parameters(c) / 1e9, c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"],
                c["num_key_value_heads"], c["intermediate_size"], c["vocab_size"]))
    lines = ["model: %s, seq %d, micro-batch %d, %.2f GFLOP/token" % (model, args.seq, args.batch, fpt / 1e9)]
    eager, compiled = read_json(args.eager), read_json(args.compiled)
    lines.append(peer_line("eager", eager) if eager else "pytorch eager: no result (see the eager step's log)")
    if args.compiled:
        lines.append(peer_line("torch.compile", compiled) + ", warm-up with compilation %.0f s" % compiled["warmup_s"]
                     if compiled else "pytorch torch.compile: no result (see the compile step's log)")
    t = tessera_summary(args.tessera_metrics if not args.skip_reason else None)
    peak = eager["peak_tflops"] if eager else peak_tflops("")[0]
    mfu = t["tokens_per_s"] * fpt / (peak * 1e12) if t and t["steps"] else None
    if t is None:
        lines.append("tessera: SKIPPED - %s" % (args.skip_reason or "no metrics"))
    elif not t["steps"]:
        lines.append("tessera: metrics file has no steps")
    else:
        lines.append("tessera: %.0f tokens/s, MFU %.1f%% (same FLOP count and peak), peak GPU memory %s, %d timed steps"
                     % (t["tokens_per_s"], 100 * mfu, "%.1f GiB" % t["peak_mem_gib"] if t["peak_mem_gib"] else "not reported",
                        t["steps"]))
        if eager and eager.get("measured_matmul_tflops"):
            m = eager["measured_matmul_tflops"]
            lines.append("against the %.0f TFLOP/s a bf16 8192^3 matmul reached in this run: MFU tessera %.1f%%, "
                         "pytorch eager %.1f%%" % (m, 100 * t["tokens_per_s"] * fpt / (m * 1e12),
                                                   100 * eager["tokens_per_s"] * fpt / (m * 1e12)))
        if args.tessera_settings:
            lines.append("tessera settings: %s; per step: gather wait %s, reduce wait %s, communication %s (%s not overlapped)"
                         % (args.tessera_settings, *("%.1f ms" % (1e3 * t[k]) if t.get(k) is not None else "-"
                                                     for k in ("gather_wait_s", "reduce_wait_s", "comm_s", "exposed_comm_s"))))
        for what, r in (("pytorch eager", eager), ("torch.compile", compiled)):
            if r:
                lines.append("tessera / %s: %.2fx tokens/s" % (what, t["tokens_per_s"] / r["tokens_per_s"]))
    lines += version_lines(eager, args.tessera_nccl, args.kernel_table)
    print("\n".join(lines))
    if args.record:
        rec = record(model, args, eager, compiled, t, mfu, read_json(args.kernel_table))
        with open(args.record, "w") as f:
            json.dump(rec, f)
            f.write("\n")
        print("record: %s (one line for benchmarks/results/gpu.jsonl)" % args.record)
    return 0


def record(model, args, eager, compiled, t, mfu, table):
    """The run's line of benchmarks/results/gpu.jsonl (issue 56, item 7); null where a side did not run."""
    ok = t is not None and t.get("steps", 0) > 0
    tok = t["tokens_per_s"] if ok else None
    side = lambda r, key: r.get(key) if r else None  # noqa: E731
    ratio = lambda r: tok / r["tokens_per_s"] if tok and r else None  # noqa: E731
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": side(eager, "device") or side(compiled, "device"),
        "torch": side(eager, "torch"), "cuda": side(eager, "cuda"), "cudnn": side(eager, "cudnn"),
        "nccl": side(eager, "nccl"), "tessera_nccl": args.tessera_nccl or None,
        "model": model, "seq": args.seq, "micro_batch": args.batch,
        "tessera_settings": args.tessera_settings.split(),  # [] : the defaults (model.fused_kernels on, ...)
        "tessera_tokens_per_s": tok, "eager_tokens_per_s": side(eager, "tokens_per_s"),
        "compile_tokens_per_s": side(compiled, "tokens_per_s"),
        "tessera_over_eager": ratio(eager), "tessera_over_compile": ratio(compiled),
        "mfu": mfu, "eager_mfu": side(eager, "mfu"), "compile_mfu": side(compiled, "mfu"),
        "peak_gpu_mem_gib": t["peak_mem_gib"] if ok else None, "eager_peak_gpu_mem_gib": side(eager, "peak_mem_gib"),
        "compile_peak_gpu_mem_gib": side(compiled, "peak_mem_gib"),
        "forward_s": t["forward_s"] if ok else None, "backward_s": t["backward_s"] if ok else None,
        "optimizer_s": t["optimizer_s"] if ok else None,
        # communication (comm.emulate_ranks: the emulated ranks' time): compute's waits for the
        # all-gathers and the reductions, the collectives' time, and the part of it not overlapped
        "gather_wait_s": t.get("gather_wait_s") if ok else None, "reduce_wait_s": t.get("reduce_wait_s") if ok else None,
        "comm_s": t.get("comm_s") if ok else None, "exposed_comm_s": t.get("exposed_comm_s") if ok else None,
        "kernel_ms_per_step": {s["name"]: s["ms_per_step"] for s in table} if table else None,
    }


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
            p.add_argument("--compile", action="store_true", help="the model under torch.compile (inductor)")
        else:
            p.add_argument("--eager")
            p.add_argument("--compiled", help="the eager step's result with --compile")
            p.add_argument("--record", help="write the run's record (one JSON object) here")
            p.add_argument("--tessera-metrics")
            p.add_argument("--skip-reason", default="")
            p.add_argument("--kernel-table", help="benchmarks/kernel_table.py --json output")
            p.add_argument("--tessera-nccl", default="", help="the 'NCCL version' line of Tessera's run")
            p.add_argument("--tessera-settings", default="",
                           help="the config keys the 1.1B run was given beyond its defaults (run.sh TESSERA_GPU_TRAIN_SET)")
    args = ap.parse_args()
    return run_eager(args) if args.cmd == "eager" else run_report(args)


if __name__ == "__main__":
    sys.exit(main())
