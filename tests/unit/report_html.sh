#!/usr/bin/env bash
# `tessera report RUN_DIR`: one self-contained HTML file. Structure (parsed as XML): a chart per
# metric with one polyline per series, the right number of points, all inside the viewBox; fields
# unknown to the report (a nested object, a new top-level number) get charts of their own; a step
# logged twice shows its last record; no script, no external reference. Rendering: headless
# Chromium's screenshot is not blank and shows the loss line's colour, and in Chromium's layout no
# chart title or legend text reaches past its chart's edge. The MFU chart names its peak (metrics'
# mfu_peak). A directory without metrics: exit 2, one error line, nothing on stdout.
set -euo pipefail
BIN=${TESSERA_BIN:?}/tessera
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/../expect.bash"  # fail
CHROMIUM=$(command -v chromium || command -v chromium-browser || true)
[ -n "$CHROMIUM" ] || fail "chromium is not installed (scripts/deps.sh installs it)"

mkdir -p "$T/run"
python3 - "$T/run" <<'PY'
import json, math, sys
d = sys.argv[1]
with open(d + "/metrics.jsonl", "w") as f:
    for s in range(1, 31):
        r = {"step": s, "loss": 5.0 * math.exp(-s / 10) + 0.5, "target_tokens": 500 + s, "grad_norm": 1.0 / s,
             "lr": 1e-3 * min(1, s / 5), "step_time_s": 0.1, "tokens_per_s": 1000 + 10 * s, "mfu": 0.2,
             "mfu_peak": {"flops": 989e12, "source": "vendor datasheet: NVIDIA H100 SXM dense bf16 989 TFLOP/s"},
             "mfu_of_measured_gemm": 0.5,
             "peak_rss_bytes": (300 + s) << 20, "device": "cpu", "peak_gpu_mem_bytes": 0,
             # fields the report does not know: a nested breakdown and a new number
             "memory": {"params_bytes": 10 << 20, "grads_bytes": (5 + s) << 20}, "comm_wait_s": 0.01 * s,
             # the step-time breakdown (runtime/profile/step_profile.h); recompute is zero throughout
             "time": {"step_s": 0.1, "forward_s": 0.03, "backward_s": 0.05, "recompute_s": 0.0, "gather_wait_s": 0.004,
                      "optimizer_s": 0.01, "idle_s": 0.006, "comm_s": 0.02, "exposed_comm_s": 0.004, "overlap": 0.8}}
        if s % 10 == 0:
            r.update(val_loss=r["loss"] + 0.2, val_ppl=math.exp(r["loss"] + 0.2), val_tokens=900)
        f.write(json.dumps(r) + "\n")
    # Step 30 again (a resumed run): the last record wins.
    r["loss"] = 0.25
    f.write(json.dumps(r) + "\n")
    f.write('{"step": 31, "loss": 0.2, "grad')  # a line cut short by a crash is skipped
json.dump({"started": "2026-12-01 10:00:00 UTC", "config": {"data": {"path": "x.jsonl", "chat_template": "llama2"}},
           "topology": {"world_size": 2, "nodes": 1, "strategy": "full_shard", "device": "cpu"},
           "model": {"source": "preset tiny", "parameters": 445056}}, open(d + "/run_info.json", "w"))
# A trace of train.profile_steps (runtime/profile/step_profile.h's format), drawn as a timeline.
M = lambda tid, name: {"ph": "M", "name": "thread_name", "pid": 0, "tid": tid, "args": {"name": name}}
X = lambda tid, name, ts, dur, cat="compute": {"ph": "X", "name": name, "cat": cat, "pid": 0, "tid": tid, "ts": ts, "dur": dur}
json.dump({"traceEvents": [M(1, "compute"), M(100, "comm world (mpi)"), X(1, "step 2", 1000, 900, "step"),
                           X(1, "forward", 1000, 300), X(1, "backward", 1300, 500), X(1, "optimizer", 1800, 100),
                           X(100, "all_gather", 1010, 50, "comm"), X(100, "all_reduce", 1500, 200, "comm")]},
          open(d + "/trace-rank-0.json", "w"))
PY
out=$("$BIN" report "$T/run") || fail "report exited $?"
[ "$out" = "wrote $T/run/report.html" ] || fail "unexpected output: $out"
"$BIN" report "$T/run" --out "$T/other.html" > /dev/null
cmp -s "$T/run/report.html" "$T/other.html" || fail "--out wrote something else"

python3 - "$T/run/report.html" <<'PY'
import re, sys
import xml.etree.ElementTree as ET
html = open(sys.argv[1]).read()
root = ET.fromstring(html.split("\n", 1)[1])  # after <!DOCTYPE html>
ns = {"h": "http://www.w3.org/1999/xhtml", "s": "http://www.w3.org/2000/svg"}
charts = root.findall(".//s:svg", ns)
titles = [c.get("data-title") for c in charts]
print("charts:", titles)
for want in ["Loss", "Learning rate", "Gradient norm", "Throughput", "MFU", "Memory", "Step time",
             "Target tokens per step", "memory", "comm_wait_s", "Where the step's time goes",
             "Communication per step", "Communication overlapped with compute"]:
    assert want in titles, (want, titles)
def series(title):
    c = charts[titles.index(title)]
    w, h = (float(x) for x in c.get("viewBox").split()[2:])
    out = {}
    for p in c.findall("s:polyline", ns):
        pts = [tuple(map(float, xy.split(","))) for xy in p.get("points").split()]
        assert all(0 <= x <= w and 0 <= y <= h for x, y in pts), (title, pts)
        out[p.get("data-name")] = pts
    return out
loss = series("Loss")
assert len(loss["train loss"]) == 30 and len(loss["validation loss"]) == 3, {k: len(v) for k, v in loss.items()}
ys = [y for _, y in loss["train loss"]]
assert ys[-1] > ys[0], "the loss falls, so its line goes down the chart (SVG y grows downwards)"
assert ys[-1] > ys[-2], "step 30's last record (0.25, below step 29) is the one shown"
assert set(series("memory")) == {"memory.params_bytes", "memory.grads_bytes"}, series("memory").keys()
assert set(series("Memory")) == {"peak_rss_bytes"}, "all-zero peak_gpu_mem_bytes is left out"
assert set(series("Where the step's time goes")) == {"forward", "backward", "gather_wait", "optimizer", "idle"}, \
    series("Where the step's time goes").keys()
assert set(series("Communication per step")) == {"busy (any communicator)", "exposed (compute waited)"}
assert "time" not in titles, "the breakdown is not charted a second time as a generic group"
trace = charts[titles.index("Trace")]
events = {r.get("data-name"): r for r in trace.findall("s:rect", ns) if r.get("class") == "event"}
assert set(events) == {"step 2", "forward", "backward", "optimizer", "all_gather", "all_reduce"}, events.keys()
lanes = [t.text for t in trace.findall("s:text", ns) if t.get("class") == "tick"]
assert lanes[:3] == ["steps", "compute", "comm world (mpi)"], lanes
# The all-reduce (1500..1700 us) lies inside backward (1300..1800 us) on the time axis.
x = lambda r: (float(r.get("x")), float(r.get("x")) + float(r.get("width")))
assert x(events["backward"])[0] < x(events["all_reduce"])[0] < x(events["all_reduce"])[1] < x(events["backward"])[1]
assert float(events["all_reduce"].get("y")) > float(events["backward"].get("y")), "its own lane, below compute"
assert "peak_gpu_mem_bytes" in html and "Zero throughout" in html
assert "MiB" in html
mfu = charts[titles.index("MFU")]
mfu_title = " ".join(t.text for t in mfu.findall("s:text", ns) if t.get("class") == "title")
assert mfu_title == "MFU (% of peak 989 TFLOP/s per rank, vendor datasheet)", mfu_title
assert "mfu_peak.flops" not in titles and "mfu_of_measured_gemm" not in titles
assert "MFU peak (per rank)" in html and "NVIDIA H100 SXM dense bf16" in html
assert set(series("Model FLOP/s over a square matmul timed at the start (not MFU)")) == {"of measured GEMM"}
for t in ("Summary", "Topology", "Model", "Configuration"):
    assert "<h2>%s</h2>" % t in html, t
assert "full_shard" in html and "chat_template" in html and "unreadable metrics lines" in html
assert re.search(r"best validation loss.*at step 30", html), "summary names the best validation step"
# Self-contained: no script, stylesheet link, image or external URL (only the XML namespaces).
assert "<script" not in html and "<link" not in html and "<img" not in html and "src=" not in html
urls = set(re.findall(r"https?://[^\"' )]+", html))
assert urls <= {"http://www.w3.org/1999/xhtml", "http://www.w3.org/2000/svg"}, urls
print("structure ok")
PY
ok "structure"

# Render it. Chromium as root needs --no-sandbox; nothing may be fetched from the network.
timeout 120 "$CHROMIUM" --headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run \
  --user-data-dir="$T/profile" --window-size=1280,1600 --screenshot="$T/shot.png" "file://$T/run/report.html" \
  > "$T/chromium.log" 2>&1 || { cat "$T/chromium.log"; fail "chromium failed"; }
[ -s "$T/shot.png" ] || fail "no screenshot"
python3 - "$T/shot.png" <<'PY'
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n"
pos, idat, w = 8, b"", 0
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b"IHDR":
        w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
        assert depth == 8 and ctype in (2, 6), (depth, ctype)
        bpp = 3 if ctype == 2 else 4
    elif kind == b"IDAT":
        idat += body
    pos += 12 + n
raw, stride = zlib.decompress(idat), w * bpp
prev, rows, i = bytearray(stride), [], 0
for _ in range(h):  # undo the PNG filters
    f, line = raw[i], bytearray(raw[i + 1:i + 1 + stride])
    i += 1 + stride
    for x in range(stride):
        a = line[x - bpp] if x >= bpp else 0
        b, c = prev[x], prev[x - bpp] if x >= bpp else 0
        if f == 1: line[x] = (line[x] + a) & 255
        elif f == 2: line[x] = (line[x] + b) & 255
        elif f == 3: line[x] = (line[x] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    rows.append(line)
    prev = line
total = w * h
non_white = blue = 0
for line in rows:
    for x in range(0, stride, bpp):
        r, g, b = line[x], line[x + 1], line[x + 2]
        if r < 240 or g < 240 or b < 240: non_white += 1
        if abs(r - 0x1f) < 12 and abs(g - 0x77) < 12 and abs(b - 0xb4) < 12: blue += 1
print("screenshot %dx%d: %.1f%% not white, %d pixels of the loss colour" % (w, h, 100.0 * non_white / total, blue))
assert non_white > total * 0.02, "the screenshot is (nearly) blank"
assert blue > 300, "the loss line is not drawn"
PY

ok "screenshot"

# Clipping, measured by Chromium's layout: a copy of the report with a script that compares every
# chart's title and legend text box (getBBox) with its SVG's width, its result dumped with the DOM.
sed 's|</body>|<script>var bad = []; document.querySelectorAll("svg.chart text.title, svg.chart text.legend").forEach(function (t) { var b = t.getBBox(), w = t.ownerSVGElement.viewBox.baseVal.width; if (b.x < 0 \|\| b.x + b.width > w) bad.push(t.ownerSVGElement.dataset.title + ": " + t.textContent + " [" + Math.round(b.x) + ", " + Math.round(b.x + b.width) + "] of " + w); }); var p = document.createElement("pre"); p.id = "clipped"; p.textContent = "CLIPPED " + document.querySelectorAll("svg.chart text.legend").length + " legends: " + JSON.stringify(bad); document.body.appendChild(p);</script></body>|' \
  "$T/run/report.html" > "$T/measure.html"
timeout 120 "$CHROMIUM" --headless --no-sandbox --disable-gpu --no-first-run --user-data-dir="$T/profile" \
  --virtual-time-budget=3000 --dump-dom "file://$T/measure.html" > "$T/dom.html" 2> "$T/chromium.log" || fail "chromium --dump-dom"
clipped=$(grep -o 'CLIPPED [0-9]* legends: .*\]' "$T/dom.html" || true)
echo "$clipped"
[[ "$clipped" =~ ^CLIPPED\ [1-9][0-9]*\ legends:\ \[\]$ ]] || fail "titles or legends reach past the chart's edge: $clipped"
ok "no title or legend clipped (Chromium's text boxes)"

# Bad input: a directory without metrics -> exit 2 naming it, one error line, nothing on stdout.
mkdir -p "$T/empty"
expect_error 2 "$T/empty/metrics.jsonl: no metrics file" "$BIN" report "$T/empty"
check "nothing on stdout" test ! -s "$T/out"
[ ! -e "$T/empty/report.html" ] || fail "report written despite the error"
echo "$pass passed, 0 failed"
