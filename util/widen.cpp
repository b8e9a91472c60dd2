#include "util/widen.h"

#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace tessera::util {
namespace {

uint32_t bf16_bits(uint16_t v) { return static_cast<uint32_t>(v) << 16; }  // bf16 is fp32's upper half

// IEEE binary16 -> binary32 bits, exact (subnormals normalised, inf/NaN kept).
uint32_t f16_bits(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  if (exp == 0x1f) return sign | 0x7f800000u | (man << 13);
  if (exp == 0) {
    if (man == 0) return sign;
    int shift = 0;
    while (!(man & 0x400)) {
      man <<= 1;
      ++shift;
    }
    return sign | (static_cast<uint32_t>(113 - shift) << 23) | ((man & 0x3ff) << 13);
  }
  return sign | ((exp + 112) << 23) | (man << 13);
}

void widen_scalar(const uint16_t* src, Float16Kind kind, float* dst, int64_t n) {
  auto* out = reinterpret_cast<unsigned char*>(dst);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t v;
    std::memcpy(&v, src + i, 2);
    const uint32_t w = kind == Float16Kind::BF16 ? bf16_bits(v) : f16_bits(v);
    std::memcpy(out + 4 * i, &w, 4);
  }
}

#if defined(__x86_64__)
// Scalar head up to dst's `align`-byte boundary; returns how many elements it did.
int64_t head(const uint16_t* src, Float16Kind kind, float* dst, int64_t n, uintptr_t align) {
  int64_t i = 0;
  while (i < n && (reinterpret_cast<uintptr_t>(dst + i) & (align - 1))) ++i;
  widen_scalar(src, kind, dst, i);
  return i;
}

void stream_bf16(const uint16_t* src, float* dst, int64_t n) {  // SSE2: every x86-64
  int64_t i = head(src, Float16Kind::BF16, dst, n, 16);
  const __m128i zero = _mm_setzero_si128();
  for (; i + 8 <= n; i += 8) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), _mm_unpacklo_epi16(zero, v));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 4), _mm_unpackhi_epi16(zero, v));
  }
  _mm_sfence();
  widen_scalar(src + i, Float16Kind::BF16, dst + i, n - i);
}

__attribute__((target("avx,f16c"))) void stream_f16(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = head(src, Float16Kind::F16, dst, n, 32);
  for (; i + 8 <= n; i += 8)
    _mm256_stream_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  _mm_sfence();
  widen_scalar(src + i, Float16Kind::F16, dst + i, n - i);
}

bool has_f16c() {  // cpuid, not __builtin_cpu_supports("f16c"): clang 14 does not know that name
  static const bool yes = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __builtin_cpu_supports("avx") && __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
  }();
  return yes;
}
#endif

}  // namespace

void widen_to_f32(const uint16_t* src, Float16Kind kind, float* dst, int64_t n) {
#if defined(__x86_64__)
  if (n * 4 >= kStreamBytes) {
    if (kind == Float16Kind::BF16) return stream_bf16(src, dst, n);
    if (has_f16c()) return stream_f16(src, dst, n);
  }
#endif
  widen_scalar(src, kind, dst, n);
}

}  // namespace tessera::util
