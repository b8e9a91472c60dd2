// AdamW's update of one element, one source for both compilers: the CPU loop (runtime/optim/adamw.cpp)
// and Tessera's kernel (adamw.cu) call the same function, so the kernel's CPU reference is this very
// code. Every product, sum, quotient and root is rounded once, in the order written: on the device
// through __f*_rn (nvcc would otherwise fuse a product and a sum into an FMA, which rounds once
// where the CPU rounds twice); on the CPU as plain float operations (Tessera's x86-64 build has no
// FMA contraction). So the kernel and the CPU loop give the same bits.
//
// The formula (torch::optim::AdamW, amsgrad off), with g read as g * grad_scale (clipping):
//   p *= decay (= 1 - lr * weight_decay, inside the decay ranges)
//   m  = m * beta1 + (1 - beta1) * g
//   v  = v * beta2 + ((1 - beta2) * g) * g
//   p += (-lr / (1 - beta1^t)) * (m / (sqrt(v) / sqrt(1 - beta2^t) + eps))
//
// Plain C++ when nvcc does not compile it (no CUDA header, no macro of the GPU switch).
#pragma once
#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define TESSERA_HOST_DEVICE __host__ __device__
#else
#define TESSERA_HOST_DEVICE
#endif

namespace tessera::gpu {

// A step's coefficients, computed on the host from the step count and the learning rate.
struct AdamWCoefficients {
  float decay, beta1, one_minus_beta1, beta2, one_minus_beta2, sqrt_bias_correction2, eps, neg_step_size;
  float grad_scale;  // gradient-norm clipping's coefficient, applied as each gradient is read
};

namespace adamw_ops {
TESSERA_HOST_DEVICE inline float mul(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
TESSERA_HOST_DEVICE inline float add(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
TESSERA_HOST_DEVICE inline float div(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
TESSERA_HOST_DEVICE inline float root(float a) {
#ifdef __CUDA_ARCH__
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}
}  // namespace adamw_ops

// The new parameter; m and v (fp32) are updated in place. `grad_scale` is c.grad_scale, or the
// device's coefficient where clipping stays on the device.
TESSERA_HOST_DEVICE inline float adamw_element(float p, float g, float& m, float& v, bool decayed,
                                               const AdamWCoefficients& c, float grad_scale) {
  using namespace adamw_ops;
  if (decayed) p = mul(p, c.decay);
  const float gi = mul(g, grad_scale);  // x * 1.0f == x: unclipped steps are unchanged
  m = add(mul(m, c.beta1), mul(c.one_minus_beta1, gi));
  v = add(mul(v, c.beta2), mul(mul(c.one_minus_beta2, gi), gi));
  const float denom = add(div(root(v), c.sqrt_bias_correction2), c.eps);
  return add(p, mul(c.neg_step_size, div(m, denom)));
}

// Whether element i lies in one of n (begin, length) ranges, sorted and disjoint, stored as pairs
// (the decay ranges): a binary search for the first range ending after i.
TESSERA_HOST_DEVICE inline bool in_ranges(const int64_t* pairs, int n, int64_t i) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (pairs[2 * mid] + pairs[2 * mid + 1] <= i) lo = mid + 1;
    else hi = mid;
  }
  return lo < n && pairs[2 * lo] <= i;
}

// The stored byte of the 8-bit code nearest to x (runtime/optim/quant8.h's Codebook::encode, which
// the CPU loop uses, with its bucket table; here a binary search): k = the number of the 255
// ascending midpoints below x, the code `zero` (the value 0) only for x == 0, shifted so that byte 0
// is the value 0.
TESSERA_HOST_DEVICE inline unsigned char q8_encode(const float* mid, int zero, float x) {
  int lo = 0, hi = 255;  // the first midpoint not below x
  while (lo < hi) {
    const int h = (lo + hi) / 2;
    if (mid[h] < x) lo = h + 1;
    else hi = h;
  }
  int k = lo;
  if (k == zero && x != 0.0f) k = x > 0.0f ? zero + 1 : (zero > 0 ? zero - 1 : zero);
  return static_cast<unsigned char>((k - zero) & 255);
}

}  // namespace tessera::gpu
