#!/usr/bin/env bash
# benchmarks/kernel_table.py (issue 56, step 0): the device kernel time of Tessera's and eager's
# Chrome traces, grouped into categories per step. Two synthetic traces with Kineto's structure
# (traceEvents; device events with cat "kernel" / "gpu_memcpy" / "gpu_memset", their launching
# cpu_op by "External id", user annotations, host events that must not count) and real kernel names
# of cuBLAS, CUTLASS, FlashAttention-2, cuDNN attention, NCCL and ATen (the rows:
# tests/unit/kernel_table_kernels.json); the expected milliseconds are summed by hand below, not by
# the script's rules:
#   tessera, per step (2 steps, "tessera/train step N"): gemm 1000 + 500, attention 400 (a flash
#     kernel whose name also says cutlass), communication 300, optimizer 200 + 50 (an add and a norm
#     launched inside the span tessera/optimizer; the add's kernel names its launch by "correlation"
#     alone), loss 120 (an exp inside tessera/head and loss),
#     copies 80 + 30 (a copy_ kernel, a device memcpy), glue 60 (silu), other 10 = 2750 us;
#   eager, per step (2 steps, "ProfilerStep#N"): gemm 1200, attention 300 (cuDNN), optimizer 100
#     (fused AdamW), loss 90 + 10 (log_softmax, nll_loss), glue 150 (a mul launched by aten::mul),
#     copies 50 + 5 (CatArrayBatchedCopy, a memset) = 1905 us.
# Then: an explicit step count overrides the annotations; unreadable input is one error, exit 1.
set -euo pipefail
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
source "$SRC/tests/expect.bash"
TABLE=(python3 "$SRC/benchmarks/kernel_table.py")

python3 - "$T" "$SRC/tests/unit/kernel_table_kernels.json" <<'PY'
import json, sys
out = sys.argv[1]
def trace(path, steps, step_name, kernels, spans):
    ev, ext, t0 = [], 100, 0.0
    for s in range(steps):
        base = t0 + s * 100000.0
        ev.append({"ph": "X", "cat": "user_annotation", "name": step_name % (s + 1), "pid": 7, "tid": 1, "ts": base, "dur": 90000.0})
        for span, (b, e) in spans.items():  # host spans (and their device twins, which must not count)
            ev.append({"ph": "X", "cat": "user_annotation", "name": span, "pid": 7, "tid": 1, "ts": base + b, "dur": e - b})
            ev.append({"ph": "X", "cat": "gpu_user_annotation", "name": span, "pid": 0, "tid": 7, "ts": base + b, "dur": 99999.0})
        for i, (cat, name, dur, op, at) in enumerate(kernels):
            ext += 1
            args = {"External id": ext, "correlation": ext + 5000}
            if op:  # the launching operator on the host (another thread: autograd's), and its runtime call
                ev.append({"ph": "X", "cat": "cpu_op", "name": op, "pid": 7, "tid": 2, "ts": base + at, "dur": 3.0,
                           "args": {"External id": ext}})
                ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 7, "tid": 2,
                           "ts": base + at + 1, "dur": 5.0, "args": dict(args)})
            if op == "aten::add_":  # a kernel linked to its launch by "correlation" alone
                del args["External id"]
            ev.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": base + 20000.0 + i * 3000,
                       "dur": float(dur), "args": args if op else {}})
    json.dump({"schemaVersion": 1, "traceEvents": ev, "deviceProperties": []}, open(path, "w"))

kernels = json.load(open(sys.argv[2]))  # rows: (cat, name, dur us, launching op, its host time within the step)
tessera, eager = kernels["tessera"], kernels["eager"]
trace(out + "/tessera.json", 2, "tessera/train step %d",  # steps 3 and 4 of a run: any numbers
      [k for k in tessera], {"tessera/optimizer": (59000, 65000), "tessera/head and loss": (29000, 31000)})
trace(out + "/eager.json", 2, "ProfilerStep#%d", eager, {})
PY

"${TABLE[@]}" --trace tessera="$T/tessera.json" --trace eager="$T/eager.json" --json "$T/table.json" --top 3 >"$T/out" ||
  { cat "$T/out"; fail "kernel_table.py failed"; }
cat "$T/out"
check_json() {  # the numbers, from the JSON the script wrote
  python3 - "$T/table.json" <<'PY'
import json, sys
want = {"tessera": {"gemm": 1.5, "attention": 0.4, "communication": 0.3, "optimizer": 0.25, "loss": 0.12, "copies": 0.11,
                    "glue": 0.06, "other": 0.01},
        "eager": {"gemm": 1.2, "attention": 0.3, "communication": 0.0, "optimizer": 0.1, "loss": 0.1, "copies": 0.055,
                  "glue": 0.15, "other": 0.0}}
sides = {s["name"]: s for s in json.load(open(sys.argv[1]))}
for name, cats in want.items():
    s = sides[name]
    assert s["steps"] == 2, (name, s["steps"])
    for c, ms in cats.items():
        assert abs(s["ms_per_step"][c] - ms) < 1e-9, (name, c, s["ms_per_step"][c], ms)
    assert abs(s["total_ms_per_step"] - sum(cats.values())) < 1e-9, (name, s["total_ms_per_step"])
assert sides["tessera"]["kernels"] == 22 and sides["eager"]["kernels"] == 16, (sides["tessera"]["kernels"], sides["eager"]["kernels"])
assert sides["tessera"]["sdpa_backend"] == "FlashAttention-2", sides["tessera"]["sdpa_backend"]
assert sides["eager"]["sdpa_backend"] == "cuDNN attention", sides["eager"]["sdpa_backend"]
PY
}
check "per-step ms of each category, 2 steps from the annotations, kernels counted, both SDPA backends" check_json
has() { grep -qF -- "$1" "$T/out"; }
check "the table: gemm 1.50 ms = 54.5% of tessera's 2.75, 1.20 ms = 63.0% of eager's 1.905" \
  has "gemm                  1.50  54.5%       1.20  63.0%"
check "... optimizer 0.25 (9.1%) against 0.10 (5.2%)" has "optimizer             0.25   9.1%       0.10   5.2%"
check "... the totals and their ratio (2.75 / 1.905 = 1.44x)" has "tessera / eager kernel time: 1.44x"
check "... the SDPA backends" has "SDPA backend that ran (eager): cuDNN attention"
check "... tessera's longest kernel first (cuBLAS's sm90 GEMM, 1 launch per step)" \
  grep -q "^   *1\.000 *1\.0  gemm *sm90_xmma_gemm" "$T/out"

# An explicit step count replaces the annotations: 1 step holds twice the time.
"${TABLE[@]}" --trace tessera="$T/tessera.json:1" --top 0 >"$T/one"
check "tessera=PATH:1: 3.00 ms of gemm per step, no top list" grep -q "^gemm  *3\.00  54\.5%$" "$T/one"
check "... and nothing else after the backend line" test "$(tail -n 1 "$T/one")" = "SDPA backend that ran (tessera): FlashAttention-2"

# A trace without attention kernels: the backend says so.
python3 -c 'import json,sys; json.dump({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_nn", "ts": 0, "dur": 7}]}, open(sys.argv[1], "w"))' "$T/plain.json"
"${TABLE[@]}" --trace cpu="$T/plain.json" >"$T/plain"
check "no attention kernel: 'none (no fused attention kernel ...)'" grep -q "^SDPA backend that ran (cpu): none (no fused attention kernel" "$T/plain"
# A trace without device events (a CPU run; PyTorch 1.13's legacy export, a bare list): said so.
echo '[{"name": "aten::mm", "ph": "X", "ts": 1, "dur": 5, "tid": 1, "pid": "CPU functions", "args": {}}]' >"$T/cpu.json"
"${TABLE[@]}" --trace cpu="$T/cpu.json" >"$T/cpu"
check "no device kernels: a NOTE naming the trace" grep -q "^NOTE: cpu has no device kernels ($T/cpu.json)" "$T/cpu"

# Bad input: one line naming the file, non-zero exit.
echo '{"traceEvents": 3}' >"$T/bad.json"
rc=0; "${TABLE[@]}" --trace x="$T/bad.json" >"$T/o" 2>"$T/e" || rc=$?
check "a trace without a traceEvents list: exit 1, one line naming it" \
  test "$rc" = 1 -a "$(cat "$T/e")" = "kernel_table: $T/bad.json has no traceEvents list"
rc=0; "${TABLE[@]}" --trace x="$T/missing.json" >"$T/o" 2>"$T/e" || rc=$?
check "a missing trace: exit 1, one line naming it" grep -q "^kernel_table: cannot read the trace $T/missing.json: " "$T/e"
echo "$pass passed, 0 failed"
