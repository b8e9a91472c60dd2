// Block-wise 8-bit quantization of AdamW's moments (optim.state_dtype = int8), as in Dettmers et
// al. 2021, "8-bit Optimizers via Block-wise Quantization" (bitsandbytes' AdamW8bit):
//
//   * A shard is cut into blocks of `block` elements counted from the shard's first element (the
//     last block may be shorter). Each block stores one fp32 scale, absmax = max |x| over the
//     block, and one byte per element: the index of the code nearest to x / absmax.
//   * The codes are the paper's DYNAMIC (tree) map, bitsandbytes' create_dynamic_map: a decimal
//     exponent (10^-6 .. 10^0) and a linear fraction, 256 values in [-1, 1]. The first moment uses
//     the signed map (127 negative values, 0, 128 positive values up to 1.0), the second moment
//     (never negative) the unsigned map (0, 254 values, 1.0). Both are computed here in double
//     from the formula and rounded to fp32 once. Small values keep their relative precision (the
//     exponent), which a linear map would flush to zero.
//   * "Nearest" means: x goes to code index k = the number of midpoints mid[j] = (c[j] + c[j+1]) / 2
//     (fp32 arithmetic) with mid[j] < x, so a value equal to a midpoint goes to the lower code.
//     The normalised value is x * (1 / absmax) in fp32 (0 when absmax is 0).
//   * Except that a value that is not 0 never becomes 0: where the nearest code is 0 it takes the
//     smallest code of its own sign. bitsandbytes does this for the first moment's sign; for the
//     second moment it is what matters (the "zero-point problem", Li et al. 2023, "Memory Efficient
//     Optimizers with 4-bit States"): an element whose v is below ~1.6e-7 of its block's absmax
//     would store v = 0, and its next update m / (sqrt(0.05 g^2) + eps) would be up to 4.5x the
//     fp32 one. Measured on the 58M Llama (benchmarks/int8_quality.sh): with v flushed to zero the
//     8-bit run's loss was 11% above fp32's after 50-100 steps.
//   * The stored byte is the code index shifted so that byte 0 is the value 0 ((k - zero) mod 256):
//     zero-initialised state, and elements a checkpoint does not store (FSDP padding), read as 0.
//
// FSDP alignment: with blocks counted from the shard start, a block never straddles two shards.
// When the engine's alignment (fsdp::Options::align) is a multiple of the block size, every shard
// starts at a multiple of the block in the unit's flat buffer and every parameter does too, so the
// blocks are the same at every world size (block j of a parameter is its elements [j*B, (j+1)*B))
// and a checkpoint reshards them without re-quantizing; the launcher sets that alignment
// (state_alignment()). Header-only constants and small functions; the codebooks are built once.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace tessera::optim::q8 {

constexpr int64_t kDefaultBlock = 2048;  // bitsandbytes' block size for 8-bit optimizer states
constexpr int64_t kMaxBlock = 8192;      // the fused CPU loop keeps one block of fp32 moments on its stack

// The 256 values of bitsandbytes' create_dynamic_map(signed), ascending, in double.
std::vector<double> dynamic_map(bool is_signed);

struct Codebook {
  float code[256];     // ascending code values (fp32)
  float mid[255];      // mid[j] = (code[j] + code[j + 1]) / 2 in fp32
  float value[256];    // value[b]: the code a stored byte b stands for (code[(b + zero) & 255])
  int zero = 0;        // index of 0.0 in code[]
  // Per value of x's top 16 bits (sign, exponent, 7 mantissa bits): how many midpoints lie below
  // every x with those bits, so encode() starts there and steps up at most a code or two.
  uint8_t start[1 << 16];

  // The stored byte of the code nearest to x (x normalised to [-1, 1], or [0, 1] for the
  // unsigned map; values outside go to the end codes).
  inline uint8_t encode(float x) const {
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    int k = start[bits >> 16];
    while (k < 255 && mid[k] < x) ++k;
    if (k == zero && x != 0.0f) k = x > 0.0f ? zero + 1 : (zero > 0 ? zero - 1 : zero);  // never 0 for x != 0
    return static_cast<uint8_t>((k - zero) & 255);
  }
  inline float decode(uint8_t b) const { return value[b]; }
};

const Codebook& signed_map();    // the first moment's
const Codebook& unsigned_map();  // the second moment's

// The codebook as device tensors for the tensor-op path: its values by stored byte (256 fp32) and
// its midpoints (255 fp32).
struct CodebookTensors {
  at::Tensor value, mid;
  int zero = 0;
};
CodebookTensors codebook_tensors(const Codebook& cb, const at::Device& device);

// Tensor-op quantization (GPUs; tests). x: fp32, numel a multiple of `block` (callers pad with
// zeros); returns the stored bytes (uint8, x's numel) and writes each block's absmax to `absmax`
// (fp32, numel / block elements).
at::Tensor quantize(const at::Tensor& x, int64_t block, const CodebookTensors& cb, const at::Tensor& absmax);
// codes (uint8, n) and absmax (fp32, ceil(n / block)) back to fp32 values, written into out[0, n)
// (out: fp32, numel a multiple of block, at least n).
void dequantize_into(const at::Tensor& codes, const at::Tensor& absmax, int64_t block, const CodebookTensors& cb,
                     const at::Tensor& out);

}  // namespace tessera::optim::q8
