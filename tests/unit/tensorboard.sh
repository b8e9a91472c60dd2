#!/usr/bin/env bash
# log.tensorboard and MFU, on a short single-process `tessera train` of the tiny preset.
#  - The event file (events.out.tfevents.<time>.<host> in log.dir) is read by an independent
#    decoder written here (Python stdlib: its own CRC-32C table and protobuf varint/field parsing):
#    every record's masked CRCs of length and data, the first event's file_version "brain.Event:2",
#    and at every logged step the scalars equal metrics.jsonl's (as float32): loss, val_loss, lr,
#    grad_norm, tokens_per_s, mfu, peak_rss_bytes.
#  - MFU = tokens_per_s x FLOPs per token (6 x the weights every token multiplies + 12 x layers x
#    hidden x seq, computed here from run_info.json's model config) / the peak, which on this CPU is
#    cores x FLOP/cycle x clock from /proc/cpuinfo (computed here too), and is at most 100%;
#    --peak-flops replaces the peak; log.tensorboard without log.dir is refused.
set -euo pipefail
BIN=${TESSERA_BIN:?}/tessera
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/../expect.bash"
PY=/usr/bin/python3
[ -x $PY ] || fail "$PY is missing"

# A small text file (the default data, the licence texts, take seconds to read).
$PY -c 'import sys; open(sys.argv[1], "w").write("\n\n".join(" ".join("w%d" % ((7 * d + 3 * i) % 50) for i in range(80)) for d in range(40)))' "$T/small.txt"
RUN=(train --set data.path="$T/small.txt" --set data.seq_len=32 --set train.steps=4 --set train.micro_batch=1 --set train.warmup_steps=1
     --set data.val_fraction=0.1 --set eval.every=2)
$BIN "${RUN[@]}" --set log.dir="$T/run" --set log.tensorboard=true > "$T/train.log"
cat "$T/train.log"
check "the peak is printed once" test "$(grep -c '^MFU: model FLOPs per token over a peak of .* per rank (CPU ' "$T/train.log")" = 1
check "progress lines show MFU in %" grep -q '| MFU [0-9.]*% |' "$T/train.log"
files=("$T"/run/events.out.tfevents.*)
check "one event file named events.out.tfevents.<time>.<host>" \
  $PY -c 'import re,sys,socket; sys.exit(not (len(sys.argv)==2 and re.fullmatch(r"events\.out\.tfevents\.\d+\."+re.escape(socket.gethostname()), sys.argv[1].rsplit("/",1)[1])))' "${files[@]}"

$PY - "${files[0]}" "$T/run/metrics.jsonl" "$T/run/run_info.json" <<'PY' || fail "event file / MFU check"
import json, os, struct, sys

# --- CRC-32C (tests/crc32c.py: from the definition, checked against the published value) and
# TFRecord's mask
sys.path.insert(0, os.path.join(os.environ["TESSERA_SRC"], "tests"))
from crc32c import crc32c
def masked(b):
    c = crc32c(b)
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF

# --- protobuf wire format
def varint(b, i):
    v = s = 0
    while True:
        x = b[i]; i += 1
        v |= (x & 0x7F) << s; s += 7
        if not x & 0x80:
            return v, i
def fields(b):
    i, out = 0, []
    while i < len(b):
        key, i = varint(b, i)
        num, wt = key >> 3, key & 7
        if wt == 0:   v, i = varint(b, i)
        elif wt == 1: v = b[i:i + 8]; i += 8
        elif wt == 5: v = b[i:i + 4]; i += 4
        elif wt == 2:
            n, i = varint(b, i); v = b[i:i + n]; i += n
        else: raise SystemExit("wire type %d" % wt)
        out.append((num, wt, v))
    assert i == len(b), "field overruns its message"
    return out

data = open(sys.argv[1], "rb").read()
events, i = [], 0
while i < len(data):
    head = data[i:i + 8]
    (n,) = struct.unpack("<Q", head)
    (lcrc,) = struct.unpack("<I", data[i + 8:i + 12])
    assert lcrc == masked(head), "length CRC of record at byte %d" % i
    body = data[i + 12:i + 12 + n]
    (dcrc,) = struct.unpack("<I", data[i + 12 + n:i + 16 + n])
    assert len(body) == n and dcrc == masked(body), "data CRC of record at byte %d" % i
    i += 16 + n
    ev = {"scalars": {}}
    for num, wt, v in fields(body):
        if num == 1: assert wt == 1; ev["wall_time"] = struct.unpack("<d", v)[0]
        elif num == 2: assert wt == 0; ev["step"] = v
        elif num == 3: assert wt == 2; ev["file_version"] = v.decode()
        elif num == 5:
            assert wt == 2
            for vn, vwt, val in fields(v):
                assert vn == 1 and vwt == 2
                tag = value = None
                for fn, fwt, fv in fields(val):
                    if fn == 1: tag = fv.decode()
                    elif fn == 2: assert fwt == 5; value = struct.unpack("<f", fv)[0]
                ev["scalars"][tag] = value
    assert ev["wall_time"] > 1.6e9, ev
    events.append(ev)
print("%d records, CRCs good" % len(events))
assert events[0].get("file_version") == "brain.Event:2", events[0]
metrics = [json.loads(l) for l in open(sys.argv[2])]
steps = [e for e in events[1:]]
assert [e["step"] for e in steps] == [m["step"] for m in metrics] == [1, 2, 3, 4], [e["step"] for e in steps]
f32 = lambda x: struct.unpack("<f", struct.pack("<f", x))[0]
for e, m in zip(steps, metrics):
    want = {k: m[k] for k in ("loss", "val_loss", "lr", "grad_norm", "tokens_per_s", "mfu", "peak_rss_bytes") if k in m}
    assert set(e["scalars"]) == set(want), (e["scalars"], want)
    for k, v in want.items():
        assert e["scalars"][k] == f32(v), (m["step"], k, e["scalars"][k], v)
assert "val_loss" in steps[1]["scalars"] and "val_loss" in steps[3]["scalars"] and "val_loss" not in steps[0]["scalars"]
print("scalars equal metrics.jsonl at steps", [e["step"] for e in steps])

# --- MFU: FLOPs per token of the model config, the CPU's peak from /proc/cpuinfo
info = json.load(open(sys.argv[3]))
c = info["model"]["config"]
h, L, V, I = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"], c["intermediate_size"]
hd = c.get("head_dim") or h // c["num_attention_heads"]
q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
T = info["config"]["data"]["seq_len"]
fpt = 6 * (L * (2 * h * q + 2 * h * kv + 3 * h * I) + V * h) + 12 * L * h * T
flags, mhz, logical, cores = set(), 0.0, 0, set()
phys = "0"
for line in open("/proc/cpuinfo"):
    k, _, v = line.partition(":"); k, v = k.strip(), v.strip()
    if k == "processor": logical += 1
    elif k == "physical id": phys = v
    elif k == "core id": cores.add((phys, v))
    elif k == "cpu MHz": mhz = max(mhz, float(v))
    elif k == "flags" and not flags: flags = set(v.split())
try:
    mhz = float(open("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").read()) / 1000
except OSError:
    pass
physical = len(cores) or logical
lanes = 16 if "avx512f" in flags else 8 if {"avx2", "fma"} <= flags else 0
assert lanes, "this test expects an x86 CPU with AVX2+FMA or AVX-512"
threads = info["topology"]["threads_per_rank"]
peak = min(physical, threads * physical / logical) * lanes * 2 * 2 * mhz * 1e6
for m in metrics:
    assert abs(m["mfu_peak"]["flops"] - peak) <= 1e-9 * peak, (m["mfu_peak"], peak)
    assert abs(m["mfu"] - m["tokens_per_s"] * fpt / peak) <= 1e-9 * m["mfu"], (m["mfu"], m["tokens_per_s"], fpt, peak)
    assert 0 < m["mfu"] <= 1, m["mfu"]
    assert m["mfu_of_measured_gemm"] > 0
print("MFU %.2f%%..%.2f%% of %.4g GFLOP/s (%s), %d FLOPs/token" % (100 * min(m["mfu"] for m in metrics),
      100 * max(m["mfu"] for m in metrics), peak / 1e9, metrics[0]["mfu_peak"]["source"], fpt))
PY
ok "event file: CRCs, file_version, scalars equal metrics.jsonl; MFU against the CPU's peak"

$BIN "${RUN[@]}" --set train.steps=1 --set log.dir="$T/over" --peak-flops 2e12 > "$T/over.log"
check "--peak-flops: the line names train.peak_flops" grep -q '^MFU: .* peak of 2 TFLOP/s per rank (train.peak_flops)' "$T/over.log"
check "--peak-flops: metrics divide by it" $PY -c '
import json, sys; m = json.loads(open(sys.argv[1]).readline())
sys.exit(not (m["mfu_peak"] == {"flops": 2e12, "source": "train.peak_flops"} and m["mfu"] > 0))' "$T/over/metrics.jsonl"
[ -z "$(ls "$T"/over/events.out.tfevents.* 2>/dev/null)" ] && ok "no event file without log.tensorboard"
expect_error 2 "log.tensorboard needs log.dir" $BIN "${RUN[@]}" --set log.tensorboard=true
echo "$pass passed, 0 failed"
