#!/usr/bin/env bash
# Where the step's time goes, and whether the replica all-reduce overlaps backward (issue 22):
#  1. no_shard at 2 ranks and hybrid_shard at 2 x 2 (emulated nodes) with train.profile_steps [2, 3]:
#     every rank writes log.dir/trace-rank-<r>.json, a Chrome trace holding exactly steps 2 and 3,
#     a "compute" track with the parts (forward, backward, ...) and one track per communicator;
#     in every traced step at least one gradient all-reduce across replicas (world for no_shard,
#     inter for hybrid_shard) STARTS before autograd's backward of that step ends: the reduction
#     overlaps backward instead of waiting for all of it (drain_reductions);
#  2. metrics.jsonl: every record's "time" parts plus idle add up to step_s, overlap in [0, 1],
#     communication time > 0; the end-of-run summary line is printed; report.html draws the trace;
#  3. the kernel trace of the same steps (runtime/profile/kernel_trace.h): with a LibTorch that has
#     Kineto (its libtorch_cpu lacks the "without Kineto" message), every rank writes
#     log.dir/kernels-rank-<r>.json holding LibTorch operators (aten::mm / addmm / matmul) inside
#     the spans tessera/train step 2 and 3, tessera/forward, backward and optimizer; without Kineto
#     (Debian's 1.13) rank 0 says so in one warning, once, counting the operators and Tessera's spans
#     the profiler saw, and no kernels-rank-* file is written;
#  4. bad train.profile_steps: one line naming the key, exit 2 (under mpirun: the job's), nothing traced.
set -euo pipefail
BIN=${TESSERA_BIN:?}/tessera
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"
source "$(dirname "${BASH_SOURCE[0]}")/../expect.bash"  # ok, fail, check, expect_error
# small has 8 layers: enough units that hybrid_shard's in-flight bound retires reductions inside backward.
COMMON=(--set model.preset=small --set data.tokenizer=bytes --set data.seq_len=16 --set train.micro_batch=1
        --set train.steps=3 --set 'train.profile_steps=[2,3]')

# check_trace DIR RANKS GROUP: the traces of DIR and the overlap of GROUP's all-reduces with backward.
check_trace() {
  python3 - "$@" <<'PY'
import json, sys
d, ranks, group = sys.argv[1], int(sys.argv[2]), sys.argv[3]
for r in range(ranks):
    t = json.load(open(f"{d}/trace-rank-{r}.json"))
    ev = t["traceEvents"]
    tracks = {e["tid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert "compute" in tracks.values(), (r, tracks)
    assert any(v.startswith(f"comm {group} ") for v in tracks.values()), (r, group, tracks)
    assert {e["pid"] for e in ev} == {r}, r
    X = [e for e in ev if e["ph"] == "X"]
    steps = sorted(e["name"] for e in X if e.get("cat") == "step")
    assert steps == ["step 2", "step 3"], (r, steps)
    for name in ("forward", "backward", "optimizer", "reduce_wait"):
        assert any(e["name"] == name for e in X), (r, name)
    for st in (e for e in X if e.get("cat") == "step"):
        inside = lambda e: st["ts"] <= e["ts"] <= st["ts"] + st["dur"]
        compute = sorted((e for e in X if tracks[e["tid"]] == "compute" and e["name"] == "backward" and inside(e)),
                         key=lambda e: e["ts"])
        backward_end = compute[0]["ts"] + compute[0]["dur"]  # autograd's backward (the next one is the root's)
        grads = [e for e in X if tracks[e["tid"]].startswith(f"comm {group} ") and e["name"] == "all_reduce"
                 and e["args"]["bytes"] > 4096 and inside(e)]
        early = [e for e in grads if e["ts"] < backward_end]
        assert grads and early, (r, st["name"], len(grads), "gradient all-reduces, none started inside backward")
        print(f"rank {r} {st['name']}: {len(early)} of {len(grads)} {group} all-reduces started inside backward")
PY
}

# check_metrics FILE: "time" of every record adds up; overlap is a fraction; there was communication.
check_metrics() {
  python3 - "$1" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    t = json.loads(line)["time"]
    parts = sum(v for k, v in t.items() if k.endswith("_s") and k not in ("step_s", "comm_s", "exposed_comm_s"))
    assert abs(parts - t["step_s"]) < 1e-6 * max(1, t["step_s"]), t
    assert 0 <= t["overlap"] <= 1 and t["comm_s"] > 0, t
    assert abs(t["exposed_comm_s"] - t["gather_wait_s"] - t["reduce_wait_s"]) < 1e-9, t
PY
}

# check_kernels DIR RANKS: the kernel traces of a LibTorch with Kineto (3. above).
check_kernels() {
  python3 - "$@" <<'PY'
import json, sys
d, ranks = sys.argv[1], int(sys.argv[2])
for r in range(ranks):
    doc = json.load(open(f"{d}/kernels-rank-{r}.json"))
    ev = doc["traceEvents"] if isinstance(doc, dict) else doc
    names = {e.get("name") for e in ev}
    for want in ("tessera/train step 2", "tessera/train step 3", "tessera/forward", "tessera/backward", "tessera/optimizer"):
        assert want in names, (r, want)
    assert names & {"aten::mm", "aten::addmm", "aten::matmul"}, (r, sorted(n for n in names if str(n).startswith("aten::"))[:20])
PY
}

# ---- 1 + 2. no_shard at 2 ranks, hybrid_shard at 2 x 2 -----------------------------------------------
"${MPIRUN[@]}" -np 2 "$BIN" train "${COMMON[@]}" --set fsdp.strategy=no_shard --set log.dir="$T/no" >"$T/no.out" 2>&1 ||
  { cat "$T/no.out"; fail "no_shard run"; }
check "no_shard: traces of steps 2-3, gradient all-reduces start inside backward" check_trace "$T/no" 2 world
check "no_shard: metrics.jsonl time parts add up" check_metrics "$T/no/metrics.jsonl"
grep -q '^trace of steps 2-3: .*/trace-rank-\*.json' "$T/no.out" || { cat "$T/no.out"; fail "no trace line"; }
grep -q '^time per step (median of 2, .*): compute .* | reduce wait .* | comm .* overlapped$' "$T/no.out" ||
  { cat "$T/no.out"; fail "no end-of-run time summary"; }
ok "progress: the trace line and the end-of-run time summary"
TORCH_CPU=$(ldd "$BIN" | awk '$1 ~ /^libtorch_cpu/ {print $3}')
check "the binary's libtorch_cpu found ($TORCH_CPU)" test -f "$TORCH_CPU"
if grep -q "with Kineto support (USE_KINETO=1)" "$TORCH_CPU"; then  # built without Kineto
  check "no Kineto: one warning says so, with the operators and Tessera's spans it saw, naming the file not written" \
    test "$(grep -c "^tessera: warning: kernel trace: this LibTorch has no Kineto (built without USE_KINETO; .*), so it recorded [1-9][0-9]* operators and [1-9][0-9]* Tessera spans but cannot save them; $T/no/kernels-rank-0.json not written$" "$T/no.out")" = 1
  check "... and no kernel trace (nor its temporary) on any rank" test -z "$(ls "$T"/no/kernels-rank-* 2>/dev/null)"
else
  check "Kineto: every rank's kernels-rank-<r>.json holds operators inside Tessera's spans" check_kernels "$T/no" 2
  grep -q "^kernel trace of rank 0: $T/no/kernels-rank-0.json: " "$T/no.out" || { cat "$T/no.out"; fail "no kernel trace line"; }
fi
check "report.html draws rank 0's trace and the breakdown" grep -q "Trace of the profiled steps.*data-name=\"all_reduce\"" \
  <(tr -d '\n' < "$T/no/report.html")

"${MPIRUN[@]}" -np 4 "$BIN" train --ranks-per-node 2 "${COMMON[@]}" --set fsdp.strategy=hybrid_shard \
  --set log.dir="$T/hy" >"$T/hy.out" 2>&1 || { cat "$T/hy.out"; fail "hybrid_shard run"; }
check "hybrid_shard 2x2: traces of steps 2-3, inter-node all-reduces start inside backward" check_trace "$T/hy" 4 inter
check "hybrid_shard: metrics.jsonl time parts add up" check_metrics "$T/hy/metrics.jsonl"

# ---- 4. bad values ---------------------------------------------------------------------------------------
BASE=(--set model.preset=tiny --set data.seq_len=16 --set train.steps=3 --set log.dir="$T/bad")
expect_error 2 "train.profile_steps must be \[first, last\] with 1 <= first <= last <= train.steps (3), got \[3,2\]" \
  "${MPIRUN[@]}" -np 2 "$BIN" train "${BASE[@]}" --set 'train.profile_steps=[3,2]'
expect_error 2 "got \[1,4\]" "$BIN" train "${BASE[@]}" --set 'train.profile_steps=[1,4]'
expect_error 2 "got \[2\]" "$BIN" train "${BASE[@]}" --set 'train.profile_steps=[2]'
expect_error 2 "config key 'train.profile_steps' must be int list, got string \"2-3\"" \
  "$BIN" train "${BASE[@]}" --set 'train.profile_steps="2-3"'
expect_error 2 'train.profile_steps \[1,2\] needs log.dir (or checkpoint.dir)' \
  "$BIN" train --set model.preset=tiny --set train.steps=3 --set 'train.profile_steps=[1,2]'
check "no trace from refused runs" test -z "$(ls "$T"/bad/trace-* 2>/dev/null)"
echo "$pass passed, 0 failed"
