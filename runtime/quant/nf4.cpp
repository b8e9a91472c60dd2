// NF4 encode/decode on the CPU (the reference of the GPU kernel): see nf4.h for the format.
#include "runtime/quant/nf4.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "runtime/gpu/gpu.h"
#include "runtime/optim/quant8.h"
#include "util/error.h"

namespace tessera::quant {

const float kNf4Code[16] = {-1.0f,
                            -0.6961928009986877f,
                            -0.5250730514526367f,
                            -0.39491748809814453f,
                            -0.28444138169288635f,
                            -0.18477343022823334f,
                            -0.09105003625154495f,
                            0.0f,
                            0.07958029955625534f,
                            0.16093020141124725f,
                            0.24611230194568634f,
                            0.33791524171829224f,
                            0.44070982933044434f,
                            0.5626170039176941f,
                            0.7229568362236023f,
                            1.0f};

namespace {

struct Nf4Mid {
  float mid[15];
  Nf4Mid() {
    for (int j = 0; j < 15; ++j) mid[j] = (kNf4Code[j] + kNf4Code[j + 1]) * 0.5f;
  }
};
const Nf4Mid& nf4_mid() {
  static const Nf4Mid m;
  return m;
}

// The index of the code nearest to x: the number of midpoints strictly below x.
inline int nearest(const float* mid, int n_mid, float x) {
  return static_cast<int>(std::lower_bound(mid, mid + n_mid, x) - mid);
}

inline float load_f32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}
inline void store_f32(uint8_t* p, float v) { std::memcpy(p, &v, 4); }

// a * b then + c, each rounded to fp32 (the volatile keeps a compiler from fusing them).
inline float mul_then_add(float a, float b, float c) {
  volatile float prod = a * b;
  return prod + c;
}

void check_bytes(const at::Tensor& bytes, int64_t expect, const char* what) {
  TESSERA_CHECK_INPUT(bytes.defined() && bytes.scalar_type() == at::kByte && bytes.is_contiguous(),
                      std::string(what) + ": the NF4 bytes must be a contiguous uint8 tensor");
  TESSERA_CHECK_INPUT(bytes.numel() == expect, std::string(what) + ": " + std::to_string(bytes.numel()) +
                                                   " NF4 bytes where the layout needs " + std::to_string(expect));
}

void check_out_dtype(at::ScalarType t) {
  TESSERA_CHECK_INPUT(t == at::kFloat || t == at::kBFloat16 || t == at::kHalf,
                      std::string("nf4_decode: cannot decode into ") + c10::toString(t) + " (fp32, bf16 or fp16)");
}

// Double quantization of the block absmaxes into the segment's offset, group scales and q bytes.
void encode_scales(const std::vector<float>& absmax, const Nf4Layout& l, uint8_t* seg) {
  double sum = 0;
  for (float a : absmax) sum += a;
  const float offset = l.blocks ? static_cast<float>(sum / static_cast<double>(l.blocks)) : 0.0f;
  store_f32(seg + l.offset, offset);
  const auto& dyn = optim::q8::signed_map();
  for (int64_t g = 0; g < l.groups; ++g) {
    const int64_t b0 = g * kNf4ScaleBlock, b1 = std::min(l.blocks, b0 + kNf4ScaleBlock);
    float s = 0;
    for (int64_t j = b0; j < b1; ++j) s = std::max(s, std::fabs(absmax[j] - offset));
    store_f32(seg + l.group_scale + 4 * g, s);
    const float inv = s > 0 ? 1.0f / s : 0.0f;
    for (int64_t j = b0; j < b1; ++j) seg[l.qabsmax + j] = static_cast<uint8_t>(nearest(dyn.mid, 255, (absmax[j] - offset) * inv));
  }
}

// The fp32 absmax of every block of a segment, as decoding sees it.
std::vector<float> decode_scales(const uint8_t* seg, const Nf4Layout& l, bool double_quant) {
  std::vector<float> a(l.blocks);
  if (!double_quant) {
    for (int64_t j = 0; j < l.blocks; ++j) a[j] = load_f32(seg + l.absmax + 4 * j);
    return a;
  }
  const auto& dyn = optim::q8::signed_map();
  const float offset = load_f32(seg + l.offset);
  for (int64_t j = 0; j < l.blocks; ++j)
    a[j] = mul_then_add(dyn.code[seg[l.qabsmax + j]], load_f32(seg + l.group_scale + 4 * (j / kNf4ScaleBlock)), offset);
  return a;
}

template <typename T>
void decode_cpu(const uint8_t* seg, const Nf4Layout& l, bool double_quant, T* out) {
  const std::vector<float> absmax = decode_scales(seg, l, double_quant);
  at::parallel_for(0, l.blocks, 256, [&](int64_t b0, int64_t b1) {
    for (int64_t j = b0; j < b1; ++j) {
      const float a = absmax[j];
      const uint8_t* c = seg + j * (kNf4Block / 2);
      T* o = out + j * kNf4Block;
      for (int64_t i = 0; i < kNf4Block / 2; ++i) {
        o[2 * i] = static_cast<T>(kNf4Code[c[i] >> 4] * a);
        o[2 * i + 1] = static_cast<T>(kNf4Code[c[i] & 15] * a);
      }
    }
  });
}

}  // namespace

namespace {

// `segments` segments of layout l at `bytes` (not on the CPU) into `out` by the GPU kernel.
void decode_device(const at::Tensor& bytes, int64_t segments, const Nf4Layout& l, bool double_quant, const at::Tensor& out) {
  if (bytes.device().is_cuda() && gpu::built()) {
    gpu::Nf4Tables tables;
    std::copy(kNf4Code, kNf4Code + 16, tables.code);
    std::copy(optim::q8::signed_map().code, optim::q8::signed_map().code + 256, tables.dyn);
    const gpu::Nf4KernelLayout kl{l.count, l.blocks, l.absmax, l.offset, l.group_scale, l.qabsmax, l.bytes};
    gpu::nf4_decode(bytes, segments, kl, double_quant, tables, out);
    return;
  }
  throw TESSERA_INPUT_ERROR(std::string("nf4_decode: the NF4 bytes are on ") + bytes.device().str() +
                            ", and this build has no NF4 kernel for it");
}

}  // namespace

Nf4Layout nf4_layout(int64_t count, bool double_quant) {
  TESSERA_CHECK_INPUT(count >= 0 && count % kNf4Block == 0,
                      "nf4: a weight of " + std::to_string(count) + " values is not a multiple of the NF4 block (" +
                          std::to_string(kNf4Block) + "); pad it to " +
                          std::to_string((std::max<int64_t>(count, 0) + kNf4Block - 1) / kNf4Block * kNf4Block));
  Nf4Layout l;
  l.count = count;
  l.blocks = count / kNf4Block;
  const int64_t codes = count / 2;
  if (!double_quant) {
    l.absmax = codes;
    l.bytes = codes + 4 * l.blocks;
    return l;
  }
  l.groups = (l.blocks + kNf4ScaleBlock - 1) / kNf4ScaleBlock;
  if (l.blocks == 0) return l;  // nothing stored
  l.offset = codes;
  l.group_scale = codes + 4;
  l.qabsmax = l.group_scale + 4 * l.groups;
  l.bytes = (l.qabsmax + l.blocks + 3) / 4 * 4;
  return l;
}

int64_t nf4_bytes(int64_t count, bool double_quant) { return nf4_layout(count, double_quant).bytes; }

void nf4_encode(const at::Tensor& fp32_values, bool double_quant, at::Tensor& out_bytes_uint8) {
  TESSERA_CHECK_INPUT(fp32_values.defined() && fp32_values.scalar_type() == at::kFloat && fp32_values.device().is_cpu(),
                      "nf4_encode: the values must be an fp32 CPU tensor");
  const Nf4Layout l = nf4_layout(fp32_values.numel(), double_quant);
  if (!out_bytes_uint8.defined()) out_bytes_uint8 = at::empty({l.bytes}, at::TensorOptions().dtype(at::kByte));
  check_bytes(out_bytes_uint8, l.bytes, "nf4_encode");
  TESSERA_CHECK_INPUT(out_bytes_uint8.device().is_cpu(), "nf4_encode: the output bytes must be on the CPU");
  const at::Tensor x = fp32_values.contiguous();
  const float* v = x.data_ptr<float>();
  uint8_t* seg = out_bytes_uint8.data_ptr<uint8_t>();
  std::fill(seg, seg + l.bytes, uint8_t(0));
  std::vector<float> absmax(l.blocks);
  const float* mid = nf4_mid().mid;
  at::parallel_for(0, l.blocks, 256, [&](int64_t b0, int64_t b1) {
    for (int64_t j = b0; j < b1; ++j) {
      const float* xb = v + j * kNf4Block;
      float a = 0;
      bool finite = true;
      for (int64_t i = 0; i < kNf4Block; ++i) {
        a = std::max(a, std::fabs(xb[i]));
        finite = finite && std::isfinite(xb[i]);
      }
      absmax[j] = finite ? a : NAN;  // refused below, outside the thread pool
      const float inv = a > 0 ? 1.0f / a : 0.0f;
      uint8_t* c = seg + j * (kNf4Block / 2);
      for (int64_t i = 0; i < kNf4Block / 2; ++i)
        c[i] = static_cast<uint8_t>(nearest(mid, 15, xb[2 * i] * inv) << 4 | nearest(mid, 15, xb[2 * i + 1] * inv));
    }
  });
  for (int64_t j = 0; j < l.blocks; ++j)
    TESSERA_CHECK_INPUT(std::isfinite(absmax[j]), "nf4_encode: a non-finite value in block " + std::to_string(j) +
                                                      " (values " + std::to_string(j * kNf4Block) + ".." +
                                                      std::to_string((j + 1) * kNf4Block - 1) + ")");
  if (double_quant) {
    encode_scales(absmax, l, seg);
  } else {
    for (int64_t j = 0; j < l.blocks; ++j) store_f32(seg + l.absmax + 4 * j, absmax[j]);
  }
}

void nf4_decode_into(const at::Tensor& bytes_uint8, int64_t count, bool double_quant, const at::Tensor& out) {
  const Nf4Layout l = nf4_layout(count, double_quant);
  check_bytes(bytes_uint8, l.bytes, "nf4_decode");
  TESSERA_CHECK_INPUT(out.defined() && out.is_contiguous() && out.numel() == count && out.device() == bytes_uint8.device(),
                      "nf4_decode: the output must be a contiguous tensor of " + std::to_string(count) +
                          " values on the bytes' device");
  const at::ScalarType t = out.scalar_type();
  check_out_dtype(t);
  if (count == 0) return;
  if (!bytes_uint8.device().is_cpu()) return decode_device(bytes_uint8, 1, l, double_quant, out);
  const uint8_t* seg = bytes_uint8.data_ptr<uint8_t>();
  if (t == at::kFloat) decode_cpu(seg, l, double_quant, out.data_ptr<float>());
  if (t == at::kBFloat16) decode_cpu(seg, l, double_quant, out.data_ptr<c10::BFloat16>());
  if (t == at::kHalf) decode_cpu(seg, l, double_quant, out.data_ptr<c10::Half>());
}

at::Tensor nf4_decode(const at::Tensor& bytes_uint8, int64_t count, bool double_quant, at::ScalarType out) {
  at::Tensor o = at::empty({count}, bytes_uint8.options().dtype(out));
  nf4_decode_into(bytes_uint8, count, double_quant, o);
  return o;
}

at::Tensor nf4_decode_segments(const at::Tensor& gathered_uint8, int64_t segments, int64_t count_per_segment,
                               bool double_quant, at::ScalarType out) {
  const int64_t seg_bytes = nf4_bytes(count_per_segment, double_quant);
  TESSERA_CHECK_INPUT(segments >= 1, "nf4_decode_segments: " + std::to_string(segments) + " segments");
  check_bytes(gathered_uint8, segments * seg_bytes, "nf4_decode_segments");
  const at::Tensor flat = gathered_uint8.reshape({-1});
  check_out_dtype(out);
  at::Tensor o = at::empty({segments * count_per_segment}, gathered_uint8.options().dtype(out));
  if (!flat.device().is_cpu() && count_per_segment > 0) {  // one launch for every segment
    decode_device(flat, segments, nf4_layout(count_per_segment, double_quant), double_quant, o);
    return o;
  }
  for (int64_t r = 0; r < segments; ++r)
    nf4_decode_into(flat.narrow(0, r * seg_bytes, seg_bytes), count_per_segment, double_quant,
                    o.narrow(0, r * count_per_segment, count_per_segment));
  return o;
}

}  // namespace tessera::quant
