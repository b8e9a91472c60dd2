#include "runtime/optim/quant8.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "util/error.h"

namespace tessera::optim::q8 {

std::vector<double> dynamic_map(bool is_signed) {
  // bitsandbytes' create_dynamic_map(signed, max_exponent_bits=7, total_bits=8): for exponent
  // i = 0..6, the means of consecutive points of linspace(0.1, 1, n_i) scaled by 10^(i - 6), with
  // n_i = 2^i + 1 (signed: each value also negated) or 2^(i + 1) + 1 (unsigned); then 0 and 1.
  std::vector<double> data;
  for (int i = 0; i < 7; ++i) {
    const int n = is_signed ? (1 << i) + 1 : (1 << (i + 1)) + 1;
    const double scale = std::pow(10.0, i - 6);
    for (int k = 0; k + 1 < n; ++k) {
      const double lo = 0.1 + 0.9 * k / (n - 1), hi = 0.1 + 0.9 * (k + 1) / (n - 1);
      data.push_back(scale * (lo + hi) / 2);
      if (is_signed) data.push_back(-scale * (lo + hi) / 2);
    }
  }
  data.push_back(0.0);
  data.push_back(1.0);
  TESSERA_CHECK(data.size() == 256, "dynamic map must have 256 values");
  std::sort(data.begin(), data.end());
  return data;
}

namespace {

Codebook make_codebook(bool is_signed) {
  Codebook cb;
  const std::vector<double> d = dynamic_map(is_signed);
  for (int k = 0; k < 256; ++k) {
    cb.code[k] = static_cast<float>(d[k]);
    if (d[k] == 0.0) cb.zero = k;
  }
  for (int k = 0; k < 255; ++k) cb.mid[k] = (cb.code[k] + cb.code[k + 1]) * 0.5f;
  for (int b = 0; b < 256; ++b) cb.value[b] = cb.code[(b + cb.zero) & 255];
  for (uint32_t h = 0; h < (1u << 16); ++h) {
    // The lowest fp32 value with these top bits: the bucket's first for positive numbers, its last
    // (most negative) for negative ones; NaN buckets compare false everywhere and start at 0.
    const uint32_t lo_bits = (h & 0x8000u) ? (h << 16) | 0xFFFFu : h << 16;
    float lo;
    std::memcpy(&lo, &lo_bits, sizeof lo);
    cb.start[h] = static_cast<uint8_t>(std::lower_bound(cb.mid, cb.mid + 255, lo) - cb.mid);
  }
  return cb;
}

}  // namespace

const Codebook& signed_map() {
  static const Codebook* cb = new Codebook(make_codebook(true));
  return *cb;
}

const Codebook& unsigned_map() {
  static const Codebook* cb = new Codebook(make_codebook(false));
  return *cb;
}

CodebookTensors codebook_tensors(const Codebook& cb, const at::Device& device) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  CodebookTensors t;
  t.value = at::from_blob(const_cast<float*>(cb.value), {256}, f32).to(device, /*non_blocking=*/false, /*copy=*/true);
  t.mid = at::from_blob(const_cast<float*>(cb.mid), {255}, f32).to(device, false, true);
  t.zero = cb.zero;
  return t;
}

at::Tensor quantize(const at::Tensor& x, int64_t block, const CodebookTensors& cb, const at::Tensor& absmax) {
  TESSERA_CHECK(x.numel() % block == 0 && absmax.numel() == x.numel() / block, "quantize: x must hold whole blocks");
  const at::Tensor blocks = x.view({-1, block});
  absmax.copy_(blocks.abs().amax(1));
  const at::Tensor inv = at::where(absmax > 0, absmax.reciprocal(), at::zeros_like(absmax));
  const at::Tensor xn = (blocks * inv.unsqueeze(1)).view(-1);
  at::Tensor idx = at::searchsorted(cb.mid, xn, /*out_int32=*/true, /*right=*/false);
  // A value that is not 0 never becomes 0: the smallest code of its sign (Codebook::encode).
  const at::Tensor at_zero = idx.eq(cb.zero).logical_and(xn.ne(0));
  idx.add_(at_zero.logical_and(xn.gt(0)).to(idx.scalar_type()));
  if (cb.zero > 0) idx.sub_(at_zero.logical_and(xn.lt(0)).to(idx.scalar_type()));
  if (cb.zero != 0) idx.sub_(cb.zero).bitwise_and_(255);
  return idx.to(at::kByte);
}

void dequantize_into(const at::Tensor& codes, const at::Tensor& absmax, int64_t block, const CodebookTensors& cb,
                     const at::Tensor& out) {
  const int64_t n = codes.numel(), nb = absmax.numel();
  TESSERA_CHECK(nb == (n + block - 1) / block && out.numel() >= nb * block, "dequantize: sizes do not match");
  at::Tensor vals = out.narrow(0, 0, n);
  at::index_select_out(vals, cb.value, 0, codes.to(at::kInt));
  out.narrow(0, 0, nb * block).view({nb, block}).mul_(absmax.view({nb, 1}));
}

}  // namespace tessera::optim::q8
