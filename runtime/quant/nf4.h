// 4-bit NormalFloat (NF4) storage of frozen weights, as in Dettmers et al. 2023, "QLoRA: Efficient
// Finetuning of Quantized LLMs", and bitsandbytes' quantize_4bit(quant_type="nf4"):
//
//   * Values are cut into blocks of kNf4Block = 64 consecutive elements of the flattened weight.
//     Each block keeps one scale, absmax = max |x| over the block (fp32), and per element the 4-bit
//     index of the NF4 code nearest to x * (1 / absmax) (fp32 arithmetic; 0 when absmax is 0).
//   * The 16 NF4 codes (kNf4Code, ascending; index 7 is 0.0) are the paper's: the quantiles of
//     N(0, 1) at 8 points of linspace(0.9677083, 0.5) (positive side, 0 included) and 7 (negative
//     side), normalised to [-1, 1]; the fp32 values are bitsandbytes' table.
//   * "Nearest" = the number of midpoints mid[j] = (code[j] + code[j + 1]) * 0.5f (fp32) with
//     mid[j] < x: a value on a midpoint takes the lower code (bitsandbytes' decision tree has
//     the same strict comparisons).
//   * Decoding: value = code[index] * absmax in fp32, then rounded once (nearest even) to the
//     output dtype (fp32, bf16 or fp16).
//   * Double quantization (the paper's, bitsandbytes' compress_statistics=True): the fp32 absmax
//     values of a segment are centered by their mean (offset = sum in double / count, rounded to
//     fp32 once), c_j = absmax_j - offset (fp32), and stored as 8 bits in groups of
//     kNf4ScaleBlock = 256 blocks: each group keeps s = max |c_j| (fp32) and per block the index of
//     the code of bitsandbytes' signed dynamic map (create_dynamic_map(signed=True): 256 values in
//     [-1, 1], ascending, the same table as the 8-bit optimizer's, optim::q8::dynamic_map(true))
//     nearest to c_j * (1 / s) (the same "nearest" rule; 0 when s is 0). Decoded absmax_j =
//     dyn[q_j] * s then + offset, two fp32 roundings (never a fused multiply-add). Why that map
//     rather than linear int8: it is what bitsandbytes stores, so a model quantized by either has
//     the same scales; and the centered scales cluster near 0 where the dynamic map is dense.
//     Codes are always chosen against the exact fp32 absmax; only their scale is approximated.
//   * Error bounds (tests/unit/test_nf4.cpp checks them): single quantization, per block,
//     |x - dq(x)| <= absmax * (largest gap between adjacent codes) / 2; with double quantization,
//     <= that + |absmax - absmax'| (|code| <= 1), where |absmax - absmax'| <= s * (largest gap of
//     the dynamic map) / 2, plus fp32 rounding.
//
// Segments. nf4_encode turns `count` values (count a multiple of 64: callers pad, e.g. the FSDP
// shard plan's alignment; anything else is refused, naming the size) into one self-contained byte
// segment: it decodes alone, without its neighbours, so a buffer all-gathered from W ranks' equal
// segments decodes segment by segment (nf4_decode_segments) to the same values as decoding each.
// Byte layout of one segment (little-endian; nb = count / 64, n2 = ceil(nb / 256)):
//
//   [0, count/2)                 codes: byte i = code(2i) << 4 | code(2i+1)
//                                (first value in the high nibble, as bitsandbytes packs)
//   single quantization:
//   [count/2, count/2 + 4 nb)    fp32 absmax of block j at count/2 + 4 j
//   double quantization:
//   [count/2, +4)                fp32 offset (mean of the block absmaxes)
//   [count/2 + 4, +4 n2)         fp32 s of scale group g (blocks [256 g, 256 g + 256))
//   [count/2 + 4 + 4 n2, +nb)    uint8 dynamic-map index q_j of block j
//   then zero bytes up to a multiple of 4 (so the fp32 fields of every segment of a gathered
//   buffer stay 4-byte aligned).
//
// nf4_bytes(count, dq) is that size. The CPU code here is the reference of the GPU dequantize
// kernel (runtime/quant/nf4_dequant.cu, same semantics). All functions are pure and thread-safe;
// encode/decode of CPU tensors use ATen's intra-op thread pool.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace tessera::quant {

constexpr int64_t kNf4Block = 64, kNf4ScaleBlock = 256;

// The 16 NF4 code values, ascending (bitsandbytes' fp32 table).
extern const float kNf4Code[16];

// Offsets of the fields of one segment of `count` values (see the layout above).
struct Nf4Layout {
  int64_t count = 0, blocks = 0, groups = 0;  // values, 64-blocks, 256-groups (double quant)
  int64_t absmax = 0;                         // single: fp32 absmax[blocks]
  int64_t offset = 0, group_scale = 0, qabsmax = 0;  // double: fp32 offset, fp32 s[groups], u8 q[blocks]
  int64_t bytes = 0;                          // the segment's size
};
// Refuses (bad input, naming the size) a count that is negative or not a multiple of kNf4Block.
Nf4Layout nf4_layout(int64_t count, bool double_quant);
int64_t nf4_bytes(int64_t count, bool double_quant);

// Encodes fp32_values (fp32, CPU, any shape, numel a multiple of 64; non-finite values refused)
// into out_bytes_uint8: a contiguous uint8 CPU tensor of nf4_bytes(numel) elements (e.g. a slice of
// a shard buffer), or an undefined tensor, which is then allocated.
void nf4_encode(const at::Tensor& fp32_values, bool double_quant, at::Tensor& out_bytes_uint8);

// Decodes one segment (uint8, exactly nf4_bytes(count) elements) into a new 1-D tensor of `count`
// values of dtype `out` (kFloat, kBFloat16, kHalf) on the bytes' device. CUDA bytes go through the
// GPU kernel where Tessera is built with CUDA.
at::Tensor nf4_decode(const at::Tensor& bytes_uint8, int64_t count, bool double_quant, at::ScalarType out);
// The same into `out` (contiguous, `count` elements, fp32/bf16/fp16, the bytes' device).
void nf4_decode_into(const at::Tensor& bytes_uint8, int64_t count, bool double_quant, const at::Tensor& out);

// A gathered buffer of `segments` equal segments (uint8, segments * nf4_bytes(count_per_segment)
// bytes, e.g. an all-gather of W ranks' shards) decoded into one 1-D tensor of
// segments * count_per_segment values: segment r's values at [r * count_per_segment, ...).
at::Tensor nf4_decode_segments(const at::Tensor& gathered_uint8, int64_t segments, int64_t count_per_segment,
                               bool double_quant, at::ScalarType out);

}  // namespace tessera::quant
