// Widening 16-bit floats (bfloat16, float16) to float32: the hot loop of loading a checkpoint.
// Dependency-free so that both model/ (safetensors reads) and runtime/ (the loader's in-place
// widening) use the one implementation.
#pragma once
#include <cstdint>

namespace tessera::util {

enum class Float16Kind { BF16, F16 };

// dst[i] = float(src[i]) for i < n, exactly (every bf16/fp16 value is an fp32 value). Outputs of
// kStreamBytes or more are written with streaming (non-temporal) stores where the CPU has them:
// a freshly loaded master shard is not read back soon, and ordinary stores first read every
// destination cache line from memory (measured here: 135 M elements in 25 ms instead of 80-130).
// Smaller outputs stay in cache for the caller. Pointers need not be aligned.
// In place: src may overlap dst when it starts at least 2n bytes past dst (e.g. the upper half of
// dst's own 4n bytes): every path runs forward and reads each input before a write reaches it.
constexpr int64_t kStreamBytes = int64_t(1) << 20;
void widen_to_f32(const uint16_t* src, Float16Kind kind, float* dst, int64_t n);

}  // namespace tessera::util
