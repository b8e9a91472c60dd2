#!/usr/bin/env python3
"""Where a training step's device time goes, by kind of kernel, Tessera next to PyTorch eager.

  kernel_table.py --trace tessera=kernels-rank-0.json --trace eager=eager-trace.json [--json OUT] [--top 10]

Each --trace is NAME=PATH[:STEPS]: a Chrome trace written by LibTorch's Kineto profiler (Tessera's
train.profile_steps writes log.dir/kernels-rank-<r>.json; tests/gpu/bench_gpu.py eager --trace writes
PyTorch's torch.profiler export_chrome_trace) and the number of training steps it holds (default:
the distinct step annotations in it -- Tessera's "tessera/train step N", torch.profiler's
"ProfilerStep#N" -- else 1). Every device event (Kineto "cat" kernel, gpu_memcpy, gpu_memset; any
capitalisation) is put into the first category whose pattern matches its name, or failing that the
name of the LibTorch operator that launched it (the cpu_op with the same "External id", its own or its
runtime call's: the cuda_runtime event with the same "correlation"); after the first three, a kernel
launched (its runtime call, else its operator, on the host) inside Tessera's "tessera/optimizer" span
(runtime/profile/kernel_trace.h) is the optimizer's and one inside "tessera/head and loss" the
loss's, whatever its name:

  communication   nccl
  attention       flash, fmha, sdpa, attention, cudnn (SDPA's fused kernels: FlashAttention-2,
                  memory-efficient, cuDNN attention)
  gemm            gemm, cutlass, xmma, cublas, nvjet, gemv, splitKreduce (cuBLAS / CUTLASS GEMMs)
  optimizer       multi_tensor_apply, adam, lpnorm, foreach (fused and foreach AdamW, clip's norm);
                  launched by aten::_foreach_* / _fused_adam*; in the span tessera/optimizer
  loss            nll_loss, softmax, cross_entropy, logsumexp; launched by aten::nll_loss*,
                  aten::*log_softmax*, aten::cross_entropy*, aten::logsumexp; in tessera/head and loss
  copies          memcpy, memset, copy, cast, fill, cat (casts, copies, zeroing); launched by
                  aten::copy_, _to_copy, fill_, zero_, cat, clone
  glue            elementwise, reduce, norm, silu, rsqrt, pow, mean, embedding, index (the RMSNorm,
                  RoPE, SwiGLU, residual and embedding kernels LibTorch composes)
  other           the rest

and the table prints milliseconds of kernel time per step and the share of each side's total (kernel
time summed: kernels on concurrent streams count each). Then the SDPA backend each side ran (from
the attention kernels' names) and each side's longest kernels. Python 3 standard library only.
"""
import argparse
import json
import re
import sys

from json_file import read_json  # benchmarks/json_file.py, beside this script

CATEGORIES = ["gemm", "attention", "glue", "copies", "loss", "optimizer", "communication", "other"]
# (category, kernel-name pattern, launching-operator pattern), tried in order.
RULES = [
    ("communication", r"nccl", None),
    ("attention", r"flash|fmha|sdpa|attention|cudnn", r"attention|^aten::_flash|^aten::_efficient|^aten::_cudnn"),
    ("gemm", r"gemm|cutlass|xmma|cublas|nvjet|gemv|splitkreduce", r"^aten::(mm|bmm|addmm|matmul|linear|baddbmm)$"),
    ("optimizer", r"multi_tensor_apply|adam|lpnorm|foreach", r"^aten::_foreach_|^aten::_fused_adam"),
    ("loss", r"nll_loss|softmax|cross_entropy|logsumexp", r"nll_loss|log_softmax|cross_entropy|logsumexp"),
    ("copies", r"memcpy|memset|copy|cast|fill|catarray", r"^aten::(copy_|_to_copy|to|fill_|zero_|cat|clone|contiguous)$"),
    ("glue", r"elementwise|reduce|norm|silu|rsqrt|pow|mean|embedding|index", r"^aten::"),
]
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset")
# Tessera's spans (runtime/profile/kernel_trace.h) that decide a kernel's category after the first
# three rules, and the step annotations.
SPANS = {"tessera/optimizer": "optimizer", "tessera/head and loss": "loss"}
STEP_MARK = re.compile(r"^(ProfilerStep#|tessera/train step )\d+$")
# SDPA backends by their kernels' names, most specific first (cuDNN's names also say "flash").
BACKENDS = [
    ("cuDNN attention", r"cudnn|fort_native_sdpa"),
    ("FlashAttention-3", r"flash.*sm90|flashattnfwdsm90|flash::.*hopper"),
    ("FlashAttention-2", r"flash_fwd|flash_bwd|pytorch_flash"),
    ("memory-efficient attention", r"fmha_cutlass|efficient_attention|mem_eff"),
]


def load(spec):
    """NAME=PATH[:STEPS] -> (name, path, steps or None)."""
    if "=" not in spec:
        raise SystemExit("kernel_table: --trace %r: want NAME=PATH[:STEPS]" % spec)
    name, rest = spec.split("=", 1)
    m = re.match(r"^(.*):(\d+)$", rest)
    return (name, m.group(1), int(m.group(2))) if m else (name, rest, None)


def read_events(path):
    doc = read_json(path, SystemExit, "kernel_table: cannot read the trace ")
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise SystemExit("kernel_table: %s has no traceEvents list" % path)
    return [e for e in events if isinstance(e, dict)]


def external_id(e):
    args = (e or {}).get("args") or {}
    return args.get("External id", args.get("external id"))


def correlation(e):
    return ((e or {}).get("args") or {}).get("correlation")


def classify(name, op, span):
    """The category of kernel `name`, launched by operator `op` (or None) inside Tessera's span
    category `span` (or None)."""
    low = name.lower()
    for i, (cat, pattern, op_pattern) in enumerate(RULES):
        if i == 3 and span:
            return span
        if re.search(pattern, low) or (op and op_pattern and re.search(op_pattern, op)):
            return cat
    return span or "other"


def span_of(host_event, spans):
    """The category of the Tessera span (SPANS) around a kernel's launch on the host, or None."""
    if host_event is None:
        return None
    t, pid = float(host_event.get("ts", 0)), host_event.get("pid")
    for cat, begin, end, span_pid in spans:
        if begin <= t <= end and span_pid == pid:
            return cat
    return None


def summarize(name, path, steps):
    events = read_events(path)
    ops = {external_id(e): e for e in events
           if str(e.get("cat", "")).lower() == "cpu_op" and external_id(e) is not None}
    # The runtime call that launched each kernel (cudaLaunchKernel, ...), by correlation id: its host
    # time is inside the spans even where a kernel's own "External id" is missing.
    launches = {correlation(e): e for e in events
                if str(e.get("cat", "")).lower() in ("cuda_runtime", "cuda_driver") and correlation(e) is not None}
    spans = [(SPANS[e["name"]], float(e.get("ts", 0)), float(e.get("ts", 0)) + float(e.get("dur", 0)), e.get("pid"))
             for e in events if e.get("name") in SPANS and str(e.get("cat", "")).lower() == "user_annotation"]
    if steps is None:
        steps = max(1, len({e.get("name") for e in events if STEP_MARK.match(str(e.get("name", "")))}))
    by_cat = {c: 0.0 for c in CATEGORIES}
    by_kernel = {}
    n = 0
    for e in events:
        if str(e.get("cat", "")).lower() not in DEVICE_CATS or e.get("ph", "X") != "X":
            continue
        kname, dur = e.get("name", ""), float(e.get("dur", 0))
        launch = launches.get(correlation(e))
        op = ops.get(external_id(e) if external_id(e) is not None else external_id(launch))
        cat = classify(kname, op and op.get("name", ""), span_of(launch or op, spans))
        by_cat[cat] += dur
        k = by_kernel.setdefault(kname, [0.0, 0, cat])
        k[0] += dur
        k[1] += 1
        n += 1
    return {"name": name, "path": path, "steps": steps, "kernels": n,
            "ms_per_step": {c: by_cat[c] / 1e3 / steps for c in CATEGORIES},
            "total_ms_per_step": sum(by_cat.values()) / 1e3 / steps,
            "sdpa_backend": backend(by_kernel),
            "top": sorted(([k, v[0] / 1e3 / steps, v[1] / steps, v[2]]
                           for k, v in by_kernel.items()), key=lambda r: -r[1])}


def backend(by_kernel):
    """The SDPA backend(s) whose kernels ran, by kernel names; 'none' without attention kernels."""
    names = [k.lower() for k, v in by_kernel.items() if v[2] == "attention"]
    found = {next((b for b, pattern in BACKENDS if re.search(pattern, k)), None) for k in names} - {None}
    if found:
        return " + ".join(b for b, _ in BACKENDS if b in found)
    return "unrecognised attention kernels" if names else "none (no fused attention kernel: math SDPA or own attention)"


def table(sides):
    width = 18
    out = ["device kernel time per training step, by category (ms per step, % of the side's total):",
           "%-15s" % "category" + "".join("%*s" % (width, "%s (%d step%s)" % (s["name"], s["steps"], "s" * (s["steps"] != 1)))
                                          for s in sides)]
    for c in CATEGORIES + ["total"]:
        cells = []
        for s in sides:
            ms = s["total_ms_per_step"] if c == "total" else s["ms_per_step"][c]
            share = 100 * ms / s["total_ms_per_step"] if s["total_ms_per_step"] else 0
            cells.append("%*s" % (width, "%.2f %5.1f%%" % (ms, share)))
        out.append("%-15s" % c + "".join(cells))
    out.append("%-15s" % "kernels/step" + "".join("%*d" % (width, s["kernels"] // max(1, s["steps"])) for s in sides))
    if len(sides) == 2 and sides[1]["total_ms_per_step"]:
        a, b = sides
        out.append("%s / %s kernel time: %.2fx" % (a["name"], b["name"], a["total_ms_per_step"] / b["total_ms_per_step"]))
    for s in sides:
        out.append("SDPA backend that ran (%s): %s" % (s["name"], s["sdpa_backend"]))
        if not s["kernels"]:
            out.append("NOTE: %s has no device kernels (%s): a CPU-only trace, or a profiler that did not record "
                       "the device" % (s["name"], s["path"]))
    return out


def top_lines(s, n):
    out = ["longest kernels of %s (ms per step, launches per step, category):" % s["name"]]
    for k, ms, count, cat in s["top"][:n]:
        out.append("  %8.3f %7.1f  %-13s %s" % (ms, count, cat, k if len(k) <= 110 else k[:107] + "..."))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", action="append", required=True, help="NAME=PATH[:STEPS] (repeat: one column each)")
    ap.add_argument("--json", help="also write the table as JSON here")
    ap.add_argument("--top", type=int, default=10, help="longest kernels listed per side (0: none)")
    args = ap.parse_args()
    sides = [summarize(*load(t)) for t in args.trace]
    lines = table(sides)
    for s in sides:
        if args.top > 0:
            lines += top_lines(s, args.top)
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([dict(s, top=s["top"][:args.top]) for s in sides], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
