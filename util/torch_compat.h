#pragma once
// The one place where LibTorch versions differ (1.13, Debian 12 and CI; 2.x, every GPU user's
// wheel, the LibTorch archive, Debian 13's 2.6). Code elsewhere calls what is here and has no #if on
// TORCH_VERSION_*. Each difference, and the version it appeared in:
//   - c10::Allocator (2.3): allocate(size_t) lost its const, and copy_data(dst, src, n) const became
//     pure virtual. Derive from compat::CpuAllocator and implement allocate_bytes().
//   - scaled_dot_product_attention (2.0): the fused attention kernels; 1.13 has none, and the model
//     then computes attention with explicit ops (kHasSdpa false).
//   - mean()'s backward: 1.13 keeps the reduced tensor for it (an RMS norm's x^2, fp32 [B, T, H]);
//     2.6 keeps only its sizes (kMeanSavesInput; measured on 1.13 and 2.6 with
//     torch.autograd.graph.saved_tensors_hooks; 2.0 is assumed as the first release without it,
//     2.0-2.5 are not measured).
//   - at::_fused_adamw_ (2.1): torch.optim.AdamW(fused=True)'s multi-tensor kernel (kHasFusedAdamW).
//   - scaled_dot_product_attention's enable_gqa (2.5): K and V of fewer heads than Q, on the flash
//     kernel only (kHasSdpaGqa; the other backends would fall back to the math kernel).
//   - at::_flash_attention_forward with windows (2.6): packed documents and sliding windows on
//     FlashAttention's variable-length kernel (kHasFlashVarlen).
// Header-only; includes only LibTorch headers, so model/, runtime/ and the tests can all use it.
#include <ATen/ATen.h>
#include <c10/core/Allocator.h>
#include <torch/version.h>

#include <optional>

#define TESSERA_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace tessera::compat {

inline constexpr int kTorchMajor = TORCH_VERSION_MAJOR;
inline constexpr int kTorchMinor = TORCH_VERSION_MINOR;

// A CPU allocator whose allocation is one non-virtual-override-free function on every version.
class CpuAllocator : public at::Allocator {
 public:
  virtual at::DataPtr allocate_bytes(size_t n) = 0;
#if TESSERA_TORCH_AT_LEAST(2, 3)
  at::DataPtr allocate(size_t n) override { return allocate_bytes(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#else
  // 1.13's allocate is const; the allocators here keep their state outside the object.
  at::DataPtr allocate(size_t n) const override { return const_cast<CpuAllocator*>(this)->allocate_bytes(n); }
#endif
};

// Whether autograd keeps mean()'s input for its backward (what model/activations.cpp counts).
inline constexpr bool kMeanSavesInput = !TESSERA_TORCH_AT_LEAST(2, 0);

// LibTorch's fused attention (SDPA, 2.0 and later); absent on 1.13 (kHasSdpa false: callers take
// their explicit path and never call this there).
inline constexpr bool kHasSdpa = TORCH_VERSION_MAJOR >= 2;
inline at::Tensor sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& attn_mask,
                       bool is_causal) {
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v, attn_mask.defined() ? c10::optional<at::Tensor>(attn_mask)
                                                                       : c10::optional<at::Tensor>(),
                                          /*dropout_p=*/0.0, is_causal);
#else
  (void)q, (void)k, (void)v, (void)attn_mask, (void)is_causal;
  TORCH_CHECK(false, "scaled_dot_product_attention needs LibTorch >= 2.0");
#endif
}

// Causal attention of q [B, nh, T, D] against k, v [B, nkv, T, D] (nkv dividing nh) without repeating
// K and V, when SDPA would run it on its flash kernel (the only backend that takes GQA as it is:
// bf16/fp16 on sm80 and later, no mask); nullopt otherwise (the caller repeats K and V). LibTorch
// 2.5 and later (kHasSdpaGqa); nullopt always before.
inline constexpr bool kHasSdpaGqa = TESSERA_TORCH_AT_LEAST(2, 5);
inline std::optional<at::Tensor> sdpa_gqa_on_flash(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
#if TESSERA_TORCH_AT_LEAST(2, 5)
  constexpr int64_t kFlash = 1;  // sdp::SDPBackend::flash_attention
  if (!q.is_cuda() || k.size(1) == q.size(1) ||
      at::_fused_sdp_choice(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true, /*scale=*/c10::nullopt,
                            /*enable_gqa=*/true) != kFlash)
    return std::nullopt;
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true,
                                          /*scale=*/c10::nullopt, /*enable_gqa=*/true);
#else
  (void)q, (void)k, (void)v;
  return std::nullopt;
#endif
}

// FlashAttention-2's variable-length kernel (LibTorch 2.6 and later: at::_flash_attention_forward,
// whose autograd node runs _flash_attention_backward): q [N, nh, D] and k, v [N, nkv, D] (nkv dividing
// nh: GQA as it is), the tokens of several documents one after another, document i being rows
// cu_seqlens[i] .. cu_seqlens[i + 1] - 1 (int32 [documents + 1] on the device; max_seqlen its longest).
// Each query attends causally within its own document, and with window > 0 to its last `window` keys
// only (the kernel's left window window - 1). bf16/fp16 on sm80 and later, D a multiple of 8 up to 256.
inline constexpr bool kHasFlashVarlen = TESSERA_TORCH_AT_LEAST(2, 6);
inline at::Tensor flash_varlen(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cu_seqlens,
                               int64_t max_seqlen, int64_t window) {
#if TESSERA_TORCH_AT_LEAST(2, 6)
  std::optional<int64_t> left, right;
  if (window > 0) {
    left = window - 1;
    right = 0;
  }
  return std::get<0>(at::_flash_attention_forward(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, /*dropout_p=*/0.0,
                                                  /*is_causal=*/true, /*return_debug_mask=*/false, /*scale=*/std::nullopt,
                                                  left, right));
#else
  (void)q, (void)k, (void)v, (void)cu_seqlens, (void)max_seqlen, (void)window;
  TORCH_CHECK(false, "the variable-length flash attention kernel needs LibTorch >= 2.6");
#endif
}

// torch.optim.AdamW(fused=True)'s kernel (2.1 and later): one multi-tensor pass over lists of fp32
// tensors on one device, in place. Per element, in fp32: p -= lr * weight_decay * p; m = beta1 m +
// (1 - beta1) g; v = beta2 v + (1 - beta2) g^2; p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 -
// beta2^t) + eps), with t read from `steps` (one fp32 scalar tensor per tensor, on the device) and g
// the gradient divided by `grad_scale` when that is defined; a `found_inf` (fp32 scalar) of 1 makes the
// kernel return before it touches anything. Absent on 1.13 (kHasFusedAdamW false:
// callers take their own path and never call this there).
inline constexpr bool kHasFusedAdamW = TESSERA_TORCH_AT_LEAST(2, 1);
inline void fused_adamw(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                        at::TensorList steps, double lr, double beta1, double beta2, double weight_decay, double eps,
                        const at::Tensor& grad_scale, const at::Tensor& found_inf = at::Tensor()) {
#if TESSERA_TORCH_AT_LEAST(2, 1)
  auto optional = [](const at::Tensor& t) { return t.defined() ? c10::optional<at::Tensor>(t) : c10::optional<at::Tensor>(); };
  at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, lr, beta1, beta2, weight_decay, eps,
                    /*amsgrad=*/false, /*maximize=*/false, optional(grad_scale), optional(found_inf));
#else
  (void)params, (void)grads, (void)exp_avgs, (void)exp_avg_sqs, (void)steps, (void)lr, (void)beta1, (void)beta2,
      (void)weight_decay, (void)eps, (void)grad_scale, (void)found_inf;
  TORCH_CHECK(false, "at::_fused_adamw_ needs LibTorch >= 2.1");
#endif
}

}  // namespace tessera::compat
