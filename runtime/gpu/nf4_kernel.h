// The NF4 dequantize kernel's launch interface (nf4_dequant.cu), plain C++ so that nvcc compiles
// the kernel without LibTorch: the caller (nf4_cuda.cpp, for runtime/quant/nf4.cpp's
// nf4_decode_into) passes raw device pointers, the segment layout (nf4.h Nf4Layout's fields) and
// the code tables. Same semantics as the CPU decode in nf4.cpp, which is its reference: value =
// code[nibble] * absmax in fp32 (absmax = dyn[q] * s then + offset, unfused, with double
// quantization), rounded once to the output dtype.
#pragma once
#include <cstdint>

namespace tessera::gpu {

struct Nf4KernelLayout {
  int64_t count, blocks, absmax, offset, group_scale, qabsmax, bytes;  // as nf4.h Nf4Layout
};
struct Nf4Tables {
  float code[16];   // kNf4Code
  float dyn[256];   // bitsandbytes' signed dynamic map (fp32), for double quantization
};
enum class Nf4OutType { F32 = 0, BF16 = 1, F16 = 2 };

// Decodes `segments` consecutive segments of layout `l` at `bytes` (device memory) into `out`
// (device memory, segments * l.count elements of `type`), asynchronously on `stream` (a
// cudaStream_t). Returns the launch's cudaError_t as an int (0: launched).
int nf4_dequant_launch(const uint8_t* bytes, int64_t segments, const Nf4KernelLayout& l, bool double_quant,
                       const Nf4Tables& tables, Nf4OutType type, void* out, void* stream);

}  // namespace tessera::gpu
