#!/usr/bin/env bash
# `tessera bench step --peer` end to end (structure only, no timing assertions): run as one plain
# process, it launches Tessera under real mpirun (shared memory, and 2 emulated nodes over TCP for
# hybrid_shard) and the PyTorch DDP peer (benchmarks/torch_peer.py, gloo), and prints for every
# requested configuration the medians of both, the ratio and the issue's goals; --strategies and
# --dtypes narrow the set; bad input is one line and exit code 2, also under mpirun. And the in-process
# `bench step --modes` (issue 36: each memory mode's step time / the default's, same run; seconds).
set -u
BIN="${TESSERA_BIN:?TESSERA_BIN not set}/tessera"
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/../expect.bash"  # fail, expect_error
/usr/bin/python3 -c "import torch" 2>/dev/null || fail "/usr/bin/python3 has no torch (scripts/deps.sh installs python3-torch)"
FAST=(--preset tiny --seq-len 32 --global-batch 4 --rounds 1 --steps 2 --timeout 300)

# 1. Two strategies x two dtypes, JSON: full_shard at 2 ranks, hybrid_shard 2x2 over TCP and its
#    full_shard reference at 4 ranks; DDP at 2 and 4 ranks.
"$BIN" bench step --peer "${FAST[@]}" --strategies full_shard,hybrid_shard --dtypes fp32,bf16 --json \
  >"$WORK/a.json" 2>"$WORK/a.err" || fail "bench step --peer exited $?: $(tail -3 "$WORK/a.err")"
/usr/bin/python3 - "$WORK/a.json" <<'PY' || fail "JSON structure: $(cat "$WORK/a.json")"
import json, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 1, "want exactly one JSON line on stdout, got %d" % len(lines)
j = json.loads(lines[0])
assert j["bench"] == "step" and j["np"] == 2 and j["global_batch"] == 4 and j["seq_len"] == 32, j
assert j["parameters"] == 445056 and j["rounds"] == 1 and j["steps"] == 2, j
assert j["peer"]["torch"].startswith("1.") or j["peer"]["torch"][0].isdigit(), j["peer"]
got = {(c["strategy"], c["dtype"], c["ranks"], c["link"]) for c in j["configs"]}
want = {(s, d, n, l) for d in ("fp32", "bf16")
        for s, n, l in (("full_shard", 2, "shm"), ("hybrid_shard", 4, "tcp"), ("full_shard", 4, "shm"))}
assert got == want, (got, want)
for c in j["configs"]:
    assert c["tessera_tokens_per_s"] > 0 and c["peer_tokens_per_s"] > 0, c
    assert abs(c["ratio"] - c["tessera_tokens_per_s"] / c["peer_tokens_per_s"]) < 1e-9 * c["ratio"], c
    assert len(c["tessera_samples"]) == len(c["peer_samples"]) == 1, c
    assert c["reference"] == (c["strategy"] == "full_shard" and c["ranks"] == 4), c
    assert ("ratio_vs_peer_fp32" in c) == (c["dtype"] == "bf16"), c
    t = c["tessera_time"]  # the step-time breakdown of the Tessera run (rank 0's median step)
    parts = sum(v for k, v in t.items() if k.endswith("_s") and k not in ("step_s", "comm_s", "exposed_comm_s"))
    assert t["step_s"] > 0 and t["forward_s"] > 0 and t["backward_s"] > 0 and t["optimizer_s"] > 0, t
    assert abs(parts - t["step_s"]) < 1e-6 * t["step_s"] and 0 <= t["overlap"] <= 1, t
goals = {g["what"]: g for g in j["goals"]}
for what, goal in (("full_shard fp32 / DDP fp32", 1.25), ("full_shard bf16 / DDP fp32", 2.2),
                   ("hybrid_shard 2x2 tcp / full_shard 4 shm fp32", 0.9),
                   ("hybrid_shard 2x2 tcp / full_shard 4 shm bf16", 0.9)):
    g = goals.pop(what)
    assert g["goal"] == goal and g["met"] == (g["ratio"] >= goal) and g["ratio"] > 0, g
assert not goals, goals
PY
echo "ok: --json, 2 strategies x 2 dtypes, hybrid over TCP and its reference"

# 2. Narrowed to one configuration, text: one row, its DDP peer, no_shard's goal.
"$BIN" bench step --peer "${FAST[@]}" --np 1 --strategies no_shard --dtypes bf16 >"$WORK/b.txt" 2>"$WORK/b.err" ||
  fail "narrowed run exited $?: $(tail -3 "$WORK/b.err")"
grep -q "DistributedDataParallel over gloo" "$WORK/b.txt" || fail "no peer description: $(cat "$WORK/b.txt")"
grep -q "baseline users compare" "$WORK/b.txt" || fail "no note that DDP is the baseline: $(cat "$WORK/b.txt")"
rows=$(grep -cE '^(full_shard|shard_grad_op|no_shard|hybrid_shard) ' "$WORK/b.txt")
[ "$rows" = 1 ] || fail "want 1 row, got $rows: $(cat "$WORK/b.txt")"
grep -qE '^no_shard +1 +shm +bf16 +[0-9.]+ +[0-9.]+ +[0-9.]+x' "$WORK/b.txt" || fail "row: $(cat "$WORK/b.txt")"
grep -qE '^Tessera no_shard bf16 at 1 ranks +[0-9.]+ s: compute [0-9]+% .* optimizer [0-9]+% .* overlapped$' "$WORK/b.txt" ||
  fail "no step-time breakdown line: $(cat "$WORK/b.txt")"
echo "ok: --strategies / --dtypes narrow the set"

# 3. Bad input: one line, exit code 2 (on every rank under mpirun, one line from rank 0).
expect_error 2 "unknown strategy 'ful_shard' in --strategies (did you mean 'full_shard'?)" \
  "$BIN" bench step --peer "${FAST[@]}" --strategies ful_shard
expect_error 2 "unknown dtype 'fp16' in --dtypes" "$BIN" bench step --peer "${FAST[@]}" --dtypes fp16
expect_error 2 "bench step: --strategy does not apply with --peer (use --strategies)" \
  "$BIN" bench step --peer "${FAST[@]}" --strategy no_shard
expect_error 2 "must be a multiple of 4" "$BIN" bench step --peer --preset tiny --global-batch 6
printf '#!/bin/sh\nexec /usr/bin/python3 -S "$@"\n' >"$WORK/python-without-torch"  # -S: no dist-packages
chmod +x "$WORK/python-without-torch"
expect_error 2 "peer DDP fp32 at 2 ranks failed (exit code 2): torch_peer: error: PyTorch is not installed" \
  "$BIN" bench step --peer "${FAST[@]}" --strategies full_shard --dtypes fp32 --python "$WORK/python-without-torch"
# Under mpirun: exit code 2 and one error line (from rank 0; mpirun adds its own notice).
"${MPIRUN[@]}" -np 2 "$BIN" bench step --peer "${FAST[@]}" >"$WORK/out" 2>"$WORK/err"
rc=$?
[ "$rc" = 2 ] || fail "under mpirun: exit $rc (want 2): $(cat "$WORK/err")"
[ "$(grep -c '^tessera: error' "$WORK/err")" = 1 ] || fail "under mpirun: want one error line: $(cat "$WORK/err")"
grep -q "run it as one plain process, not under mpirun" "$WORK/err" || fail "under mpirun: $(cat "$WORK/err")"
echo "ok: bad input"

# 4. In process, --modes (issue 36): every memory mode's step time against the default in the same
#    run, under mpirun; the default is measured even when not listed, and comes first.
"${MPIRUN[@]}" -np 2 "$BIN" bench step --baseline none --preset tiny --seq-len 32 --micro-batch 2 --steps 1 \
  --rounds 2 --modes in_backward+offload_params,int8 --json >"$WORK/m.json" 2>"$WORK/m.err" ||
  fail "bench step --modes exited $?: $(tail -3 "$WORK/m.err")"
/usr/bin/python3 - "$WORK/m.json" <<'PY' || fail "--modes JSON: $(cat "$WORK/m.json")"
import json, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 1, "want one JSON line (rank 0), got %d" % len(lines)
j = json.loads(lines[0])
assert j["what"] == "modes" and j["world_size"] == 2 and j["rounds"] == 2 and j["steps"] == 1, j
m = j["modes"]
assert [r["mode"] for r in m] == ["default", "in_backward+offload_params", "int8"], m
assert m[1]["keys"] == "optim.in_backward=true train.clip=0 fsdp.offload=params" and m[0]["keys"] == "", m
for r in m:
    assert len(r["samples"]) == 2 and r["tokens_per_s"] > 0 and r["time"]["step_s"] > 0, r
    # the ratio: the median (the upper one of 2) over rounds of the default's tokens/s / the mode's in that round
    want = [d / x for d, x in zip(m[0]["samples"], r["samples"])]
    assert all(abs(a - b) < 1e-12 * b for a, b in zip(r["round_ratios"], want)), r
    assert r["step_time_ratio"] == sorted(r["round_ratios"])[1], r
assert m[0]["step_time_ratio"] == 1.0 and m[0]["round_ratios"] == [1.0, 1.0], m[0]
PY
"${MPIRUN[@]}" -np 2 "$BIN" bench step --baseline none --op-counts false --preset tiny --seq-len 32 --steps 1 \
  --rounds 1 --modes default,bf16 >"$WORK/m.txt" 2>"$WORK/m.err" || fail "bench step --modes (text) exited $?: $(tail -3 "$WORK/m.err")"
grep -qE '^default +[0-9.]+ +[0-9.]+ +1\.000  \(none\)$' "$WORK/m.txt" || fail "--modes: no default row: $(cat "$WORK/m.txt")"
grep -qE '^bf16 +[0-9.]+ +[0-9.]+ +[0-9]+\.[0-9]{3}  optim\.state_dtype=bf16$' "$WORK/m.txt" ||
  fail "--modes: no bf16 row: $(cat "$WORK/m.txt")"
grep -q "in_backward runs with train.clip = 0" "$WORK/m.txt" || fail "--modes: no note on clipping: $(cat "$WORK/m.txt")"
echo "ok: --modes"
expect_error 2 "unknown mode 'int9' (did you mean 'int8'?)" "$BIN" bench step --baseline none --modes default,int9
expect_error 2 "mode 'int8+bf16' sets optim.state_dtype twice" "$BIN" bench step --baseline none --modes int8+bf16
expect_error 2 "bench step: --modes does not apply with --peer" "$BIN" bench step --peer "${FAST[@]}" --modes int8
expect_error 2 "bench step: --rounds applies only with --peer or --modes" "$BIN" bench step --rounds 2
"${MPIRUN[@]}" -np 2 "$BIN" bench step --baseline none --modes offload_gpu >"$WORK/out" 2>"$WORK/err"
rc=$?
[ "$rc" = 2 ] || fail "--modes under mpirun: exit $rc (want 2): $(cat "$WORK/err")"
[ "$(grep -c '^tessera: error' "$WORK/err")" = 1 ] || fail "--modes under mpirun: want one error line: $(cat "$WORK/err")"
echo "ok: --modes bad input"
