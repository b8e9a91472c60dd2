#!/usr/bin/env bash
# The memory model against measurement: `tessera bench memory --quick` trains 8 configurations
# (small preset and a 58M model; 1, 2 and 4 ranks; full_shard, shard_grad_op, no_shard,
# hybrid_shard 2x2; fp32 and bf16; sharded and unsharded accumulation; activation checkpointing;
# bf16 optimizer state; long sequences; LoRA on a frozen bf16 base; QLoRA on an NF4 base) and evaluates one, each under real mpirun, and reads each
# rank 0's measured breakdown at the step's peak. For every configuration tessera plan's prediction
# must be within 10% of the measured peak resident set, and the shard state (master, gradient shard,
# optimizer) measured by the allocation tracker must equal the formula's to the byte.
set -uo pipefail
BIN=${TESSERA_BIN:?}/tessera
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"
timeout 900 "$BIN" bench memory --quick --json --dir "$T" > "$T/out.json" 2> "$T/err"; rc=$?
if [ $rc -ne 0 ]; then echo "bench memory failed (rc=$rc)"; cat "$T/err"; tail -c 2000 "$T/out.json"; echo "0 passed, 1 failed"; exit 1; fi
python3 - "$T/out.json" <<'P'
import json, sys
rows = json.load(open(sys.argv[1]))["configurations"]
passed = failed = 0
assert len(rows) >= 7, len(rows)
for r in rows:
    m, p = r["measured"], r["predicted"]
    problems = []
    if abs(r["prediction_error"]) > 0.10:
        problems.append("plan %.0f MiB vs measured %.0f MiB (%+.1f%%)" % (r["predicted_bytes"] / 2**20, r["measured_peak_bytes"] / 2**20, 100 * r["prediction_error"]))
    for k in ("master", "grad_shard", "optimizer"):
        if m.get(k, 0) != p.get(k, 0):
            problems.append("%s measured %d != formula %d" % (k, m.get(k, 0), p.get(k, 0)))
    if r["phase"] == "eval" and (m.get("grad_shard", 0) or m.get("optimizer", 0)):
        problems.append("evaluation holds training state")
    print("%-46s measured %6.0f MiB  plan %6.0f MiB (%+5.1f%%)  floor ratio %.3f  %s" % (
        r["name"], r["measured_peak_bytes"] / 2**20, r["predicted_bytes"] / 2**20, 100 * r["prediction_error"],
        r["measured_over_floor"], "; ".join(problems) or "ok"))
    if problems: failed += 1
    else: passed += 1
print("%d passed, %d failed" % (passed, failed))
sys.exit(1 if failed else 0)
P
