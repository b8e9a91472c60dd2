"""NF4 quantization written from the QLoRA paper (Dettmers et al. 2023) and bitsandbytes' recipe,
independently of runtime/quant/nf4.cpp, for tests/unit/test_nf4.cpp. Not a test itself.

usage: nf4_reference.py IN.f32 COUNT_PER_SEGMENT DOUBLE_QUANT(0|1) OUT_PREFIX
  IN.f32: raw little-endian fp32 values, a whole number of segments of COUNT_PER_SEGMENT values.
  Writes OUT_PREFIX.bytes (the segments encoded one after the other, in the byte layout that
  runtime/quant/nf4.h documents), OUT_PREFIX.f32 (the decoded values, fp32) and OUT_PREFIX.code
  (the 16 NF4 code values, fp32).

The NF4 codes: quantiles of N(0, 1) at 8 points of linspace(0.9677083, 0.5) for the positive side
and 7 for the negative side (the paper's asymmetric table with an exact 0), normalised by the
largest. Computed as bitsandbytes' create_normal_map does (fp32 linspace, the inverse normal CDF in
double, fp32 values divided by their maximum). A value goes to the code at the smallest distance,
ties to the lower code. Double quantization: the block scales minus their mean, in groups of 256,
each group scaled by its absmax onto bitsandbytes' signed dynamic (tree) map.
"""
import struct
import sys

import torch
from torch.special import ndtri

BLOCK, GROUP = 64, 256


def nf4_codes():
    offset = 0.9677083
    pos = ndtri(torch.linspace(offset, 0.5, 9)[:-1].double())
    neg = -ndtri(torch.linspace(offset, 0.5, 8)[:-1].double())
    v = torch.cat([pos, torch.zeros(1, dtype=torch.float64), neg]).float().sort().values
    return v / v.max()


def dynamic_map_signed():
    # create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8): for exponent i, the means
    # of adjacent points of linspace(0.1, 1, 2^i + 1) times 10^(i - 6), both signs; then 0 and 1.
    data = []
    for i in range(7):
        b = torch.linspace(0.1, 1.0, 2 ** i + 1, dtype=torch.float64)
        means = ((b[:-1] + b[1:]) / 2).tolist()
        data += [10.0 ** (i - 6) * m for m in means] + [-(10.0 ** (i - 6)) * m for m in means]
    data += [0.0, 1.0]
    assert len(data) == 256
    return torch.tensor(sorted(data), dtype=torch.float64).float()


def nearest(table, x):
    # index of the table entry nearest to x (fp32); a tie takes the lower entry
    d = (x.unsqueeze(-1) - table).abs()
    best = d.min(dim=-1, keepdim=True).values
    return (d == best).int().argmax(dim=-1)  # the first (lowest) index at the minimum distance


def encode_segment(x, dq, code, dyn):
    blocks = x.reshape(-1, BLOCK)
    absmax = blocks.abs().max(dim=1).values
    inv = torch.where(absmax > 0, 1.0 / absmax, torch.zeros_like(absmax))
    idx = nearest(code, blocks * inv.unsqueeze(1)).flatten()
    packed = (idx[0::2] * 16 + idx[1::2]).to(torch.uint8).numpy().tobytes()
    if not dq:
        return packed + absmax.numpy().tobytes(), idx, absmax
    offset = absmax.double().mean().float()
    centered = absmax - offset
    scales, q = [], []
    for g in range(0, len(absmax), GROUP):
        c = centered[g:g + GROUP]
        s = c.abs().max()
        scales.append(s)
        q.append(nearest(dyn, c * (1.0 / s if s > 0 else torch.tensor(0.0))))
    s_t = torch.stack(scales)
    q_t = torch.cat(q)
    out = struct.pack("<f", offset.item()) + s_t.numpy().tobytes() + q_t.to(torch.uint8).numpy().tobytes()
    out += b"\0" * (-(len(packed) + len(out)) % 4)
    group_of_block = torch.arange(len(absmax)) // GROUP
    scale = dyn[q_t] * s_t[group_of_block]
    return packed + out, idx, scale + offset  # two fp32 roundings (torch never fuses these)


def main():
    src, count, dq, prefix = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4]
    x = torch.frombuffer(bytearray(open(src, "rb").read()), dtype=torch.float32)
    code, dyn = nf4_codes(), dynamic_map_signed()
    segs, decoded = [], []
    for s in range(0, x.numel(), count):
        b, idx, scale = encode_segment(x[s:s + count], dq, code, dyn)
        segs.append(b)
        decoded.append((code[idx].reshape(-1, BLOCK) * scale.unsqueeze(1)).flatten())
    open(prefix + ".bytes", "wb").write(b"".join(segs))
    open(prefix + ".f32", "wb").write(torch.cat(decoded).numpy().tobytes())
    open(prefix + ".code", "wb").write(code.numpy().tobytes())


if __name__ == "__main__":
    main()
