// NF4 storage (runtime/quant/nf4.h) against tests/support/nf4_reference.py, an implementation
// written from the QLoRA paper / bitsandbytes' recipe in Python (Debian's torch 1.13) that does not
// call Tessera: the code table, the encoded bytes (codes, nibble order, scales, double-quantized
// scales, padding: the documented layout) and the decoded values, bit for bit, for single and
// double quantization, one segment and several; the per-block error bounds; refusals.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/optim/quant8.h"
#include "runtime/quant/nf4.h"
#include "tests/support/test_support.h"

namespace test_nf4 {  // the files of a gtest binary compile together (tests/CMakeLists.txt)

using namespace tessera;
using namespace tessera::quant;
using tessera::test::read_file;
using tessera::test::TempDir;

namespace {

// Values with very different scales per block, all-zero blocks, a block with one non-zero value,
// negative-only and positive-only blocks, and exact code multiples.
at::Tensor test_values(int64_t count, uint64_t seed) {
  torch::manual_seed(seed);
  const int64_t blocks = count / kNf4Block;
  at::Tensor x = torch::randn({blocks, kNf4Block}) * torch::exp(torch::randn({blocks, 1}) * 3.0);
  if (blocks > 8) {
    x[1].zero_();
    x[2].zero_();
    x[2][17] = -3.5f;
    x[3] = x[3].abs();
    x[4] = -x[4].abs();
    for (int i = 0; i < 16; ++i) x[5][i] = kNf4Code[i] * 0.25f;
  }
  return x.flatten().contiguous();
}

at::Tensor bytes_tensor(const std::string& s) {
  at::Tensor t = torch::empty({static_cast<int64_t>(s.size())}, torch::kUInt8);
  std::memcpy(t.data_ptr<uint8_t>(), s.data(), s.size());
  return t;
}
at::Tensor f32_tensor(const std::string& s) {
  at::Tensor t = torch::empty({static_cast<int64_t>(s.size() / 4)}, torch::kFloat);
  std::memcpy(t.data_ptr<float>(), s.data(), s.size());
  return t;
}

struct Reference {
  at::Tensor bytes, decoded, code;
};
// The Python reference's encoding of x, cut into segments of `count` values.
Reference python_reference(const TempDir& dir, const at::Tensor& x, int64_t count, bool dq) {
  const std::string in = dir / "in.f32", out = dir / (dq ? "ref-dq" : "ref");
  tessera::test::write_file(in, std::string(static_cast<const char*>(x.data_ptr()), x.numel() * 4));
  const char* src = std::getenv("TESSERA_TEST_SRC");  // ctest sets it (tests/CMakeLists.txt)
  const std::string cmd = "/usr/bin/python3 " + std::string(src ? src : ".") +
                          "/tests/support/nf4_reference.py " + in + " " + std::to_string(count) + " " +
                          (dq ? "1 " : "0 ") + out;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return {bytes_tensor(read_file(out + ".bytes")), f32_tensor(read_file(out + ".f32")),
          f32_tensor(read_file(out + ".code"))};
}

// x's segments of `count` values encoded one by one and concatenated.
at::Tensor encode_segments(const at::Tensor& x, int64_t count, bool dq) {
  std::vector<at::Tensor> parts;
  for (int64_t s = 0; s < x.numel(); s += count) {
    at::Tensor b;
    nf4_encode(x.narrow(0, s, count), dq, b);
    parts.push_back(b);
  }
  return torch::cat(parts);
}

float load_f32(const at::Tensor& bytes, int64_t at) {
  float v;
  std::memcpy(&v, bytes.data_ptr<uint8_t>() + at, 4);
  return v;
}

float max_gap(const float* code, int n) {
  float g = 0;
  for (int i = 0; i + 1 < n; ++i) g = std::max(g, code[i + 1] - code[i]);
  return g;
}

}  // namespace

TEST(Nf4Reference, CodeTableIsThePapers) {
  TempDir dir("nf4");
  const Reference ref = python_reference(dir, test_values(kNf4Block, 1), kNf4Block, false);
  ASSERT_EQ(ref.code.numel(), 16);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(ref.code[i].item<float>(), kNf4Code[i]) << i;
  EXPECT_EQ(kNf4Code[7], 0.0f);
}

TEST(Nf4Reference, SingleAndDoubleQuantBitExact) {
  TempDir dir("nf4");
  // 600 blocks: three scale groups, the last one partial; and 4 segments of 320 values (5 blocks:
  // the double-quant fields end unaligned, so the padding is exercised).
  const at::Tensor x = test_values(600 * kNf4Block, 2);
  for (const int64_t count : {600 * kNf4Block, 5 * kNf4Block}) {
    for (const bool dq : {false, true}) {
      SCOPED_TRACE("count " + std::to_string(count) + (dq ? " double quant" : " single"));
      const at::Tensor xs = x.narrow(0, 0, count == 5 * kNf4Block ? 4 * count : x.numel());
      const Reference ref = python_reference(dir, xs, count, dq);
      const at::Tensor bytes = encode_segments(xs, count, dq);
      ASSERT_EQ(bytes.numel(), xs.numel() / count * nf4_bytes(count, dq));
      ASSERT_EQ(ref.bytes.numel(), bytes.numel());
      EXPECT_TRUE(torch::equal(bytes, ref.bytes)) << (bytes != ref.bytes).nonzero().slice(0, 0, 5);
      const at::Tensor dec = nf4_decode_segments(bytes, xs.numel() / count, count, dq, at::kFloat);
      EXPECT_TRUE(torch::equal(dec, ref.decoded)) << (dec - ref.decoded).abs().max();
      // bf16 / fp16 output: the fp32 value rounded once.
      EXPECT_TRUE(torch::equal(nf4_decode_segments(bytes, xs.numel() / count, count, dq, at::kBFloat16),
                               ref.decoded.to(at::kBFloat16)));
      EXPECT_TRUE(torch::equal(nf4_decode_segments(bytes, xs.numel() / count, count, dq, at::kHalf),
                               ref.decoded.to(at::kHalf)));
    }
  }
}

TEST(Nf4Layout, SizesAndPadding) {
  EXPECT_EQ(nf4_bytes(64, false), 32 + 4);
  EXPECT_EQ(nf4_bytes(4096, false), 2048 + 64 * 4);
  // double: codes + offset + one group scale + 1 q byte, padded to 4
  EXPECT_EQ(nf4_bytes(64, true), 32 + 4 + 4 + 4);
  EXPECT_EQ(nf4_bytes(257 * 64, true), 257 * 32 + 4 + 2 * 4 + 260);
  EXPECT_EQ(nf4_bytes(0, true), 0);
  for (int64_t count : {64, 320, 257 * 64}) EXPECT_EQ(nf4_bytes(count, true) % 4, 0);
}

TEST(Nf4Bounds, PerBlockErrorBound) {
  const at::Tensor x = test_values(700 * kNf4Block, 3);
  const float h4 = max_gap(kNf4Code, 16) / 2;
  std::vector<float> dyn_code;
  for (double d : optim::q8::dynamic_map(true)) dyn_code.push_back(static_cast<float>(d));
  const float hd = max_gap(dyn_code.data(), 256) / 2;
  for (const bool dq : {false, true}) {
    at::Tensor bytes;
    nf4_encode(x, dq, bytes);
    const at::Tensor err = (x - nf4_decode(bytes, x.numel(), dq, at::kFloat)).abs().view({-1, kNf4Block}).amax(1);
    const at::Tensor absmax = x.view({-1, kNf4Block}).abs().amax(1);
    const int64_t blocks = absmax.numel(), codes = x.numel() / 2;
    for (int64_t j = 0; j < blocks; ++j) {
      const float a = absmax[j].item<float>();
      float bound = a * h4 * (1 + 1e-6f);
      if (dq) {
        const float offset = load_f32(bytes, codes), s = load_f32(bytes, codes + 4 + 4 * (j / kNf4ScaleBlock));
        bound += s * hd + 1e-6f * (a + std::fabs(offset) + s);
      }
      ASSERT_LE(err[j].item<float>(), bound) << "block " << j << (dq ? " double quant" : "");
    }
    if (!dq) {  // a zero block decodes to zeros exactly; the one-value block keeps its value
      const at::Tensor d = nf4_decode(bytes, x.numel(), dq, at::kFloat);
      EXPECT_TRUE(torch::equal(d.narrow(0, 64, 128), x.narrow(0, 64, 128)));
    }
  }
}

TEST(Nf4Segments, GatheredBufferDecodesAsEachSegment) {
  const int64_t count = 3 * kNf4Block, world = 4;
  const at::Tensor x = test_values(world * count, 4) * torch::arange(1, world * count + 1).to(torch::kFloat);
  for (const bool dq : {false, true}) {
    const at::Tensor gathered = encode_segments(x, count, dq);
    std::vector<at::Tensor> each;
    for (int64_t r = 0; r < world; ++r)
      each.push_back(nf4_decode(gathered.narrow(0, r * nf4_bytes(count, dq), nf4_bytes(count, dq)).clone(), count, dq,
                                at::kBFloat16));
    EXPECT_TRUE(torch::equal(nf4_decode_segments(gathered, world, count, dq, at::kBFloat16), torch::cat(each)));
    // into a slice of a bigger buffer
    at::Tensor out = torch::full({count + 10}, 7.0f);
    nf4_decode_into(gathered.narrow(0, 0, nf4_bytes(count, dq)), count, dq, out.narrow(0, 5, count));
    EXPECT_TRUE(torch::equal(out.narrow(0, 5, count).to(at::kBFloat16), each[0]));  // fp32 rounded once
    EXPECT_EQ(out[4].item<float>(), 7.0f);
    EXPECT_EQ(out[count + 5].item<float>(), 7.0f);
  }
}

TEST(Nf4Refusals, BadSizesAndValues) {
  EXPECT_INPUT_ERROR(nf4_bytes(100, false), "100", "multiple of the NF4 block (64)", "pad it to 128");
  EXPECT_INPUT_ERROR(nf4_bytes(-64, true), "-64");
  auto encode = [](const at::Tensor& x, bool dq) {
    at::Tensor b;  // undefined: allocated by nf4_encode
    nf4_encode(x, dq, b);
    return b;
  };
  EXPECT_INPUT_ERROR(encode(torch::ones({65}), false), "65 values", "not a multiple");
  EXPECT_INPUT_ERROR(encode(torch::ones({64}, torch::kDouble), false), "fp32");
  at::Tensor wrong = torch::empty({10}, torch::kUInt8);
  EXPECT_INPUT_ERROR(nf4_encode(torch::ones({64}), false, wrong), "10 NF4 bytes", "needs 36");
  at::Tensor x = torch::ones({256});
  x[130] = NAN;
  EXPECT_INPUT_ERROR(encode(x, true), "non-finite", "block 2");
  x[130] = INFINITY;
  EXPECT_INPUT_ERROR(encode(x, false), "non-finite", "block 2");
  const at::Tensor b = encode(torch::ones({128}), false);
  EXPECT_INPUT_ERROR(nf4_decode(b, 128, true, at::kFloat), "NF4 bytes", "needs " + std::to_string(nf4_bytes(128, true)));
  EXPECT_INPUT_ERROR(nf4_decode(b, 192, false, at::kFloat), "needs");
  EXPECT_INPUT_ERROR(nf4_decode(b, 128, false, at::kInt), "Int");
  EXPECT_INPUT_ERROR(nf4_decode_segments(b, 2, 128, false, at::kFloat), "needs " + std::to_string(2 * nf4_bytes(128, false)));
  EXPECT_INPUT_ERROR(nf4_decode(torch::empty({36}, torch::dtype(torch::kUInt8).device(torch::kMeta)), 64, false, at::kFloat),
                     "the NF4 bytes are on meta", "no NF4 kernel");
}

// The GPU dequantize kernel (runtime/quant/nf4_dequant.cu) against the CPU decode, its reference:
// the same bits in every output dtype, one segment and a gathered buffer of several. Skipped where
// no GPU is visible (bytes on a device without a kernel are refused: Nf4Refusals, the meta device).
TEST(Nf4Gpu, KernelEqualsCpuDecode) {
  const int64_t count = 300 * kNf4Block, world = 3;
  const at::Tensor x = test_values(world * count, 5);
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "no GPU: nf4_dequant.cu is compiled (tessera_cuda_kernel_check), not run";
  }
  for (const bool dq : {false, true}) {
    const at::Tensor bytes = encode_segments(x, count, dq);
    const at::Tensor dev = bytes.to(torch::kCUDA);
    for (const at::ScalarType t : {at::kFloat, at::kBFloat16, at::kHalf}) {
      SCOPED_TRACE(std::string(c10::toString(t)) + (dq ? " double quant" : ""));
      EXPECT_TRUE(torch::equal(nf4_decode_segments(dev, world, count, dq, t).cpu(),
                               nf4_decode_segments(bytes, world, count, dq, t)));
      EXPECT_TRUE(torch::equal(nf4_decode(dev.narrow(0, 0, nf4_bytes(count, dq)), count, dq, t).cpu(),
                               nf4_decode(bytes.narrow(0, 0, nf4_bytes(count, dq)), count, dq, t)));
    }
  }
}

}  // namespace test_nf4
