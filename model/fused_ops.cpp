#include "model/fused_ops.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

#include "util/device_kernels.h"

namespace tessera::model::ops {

namespace {

// x's dtype, as the kernel rounds: a float through T and back.
template <typename T>
float round_to(float v) {
  return static_cast<float>(static_cast<T>(v));
}

template <typename T>
void forward_rows(const T* x, const T* w, float eps, int64_t n, T* y, float* rstd, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* xr = x + r * n;
    float acc = 0.0f;
    for (int64_t j = 0; j < n; ++j) acc += static_cast<float>(xr[j]) * static_cast<float>(xr[j]);
    const float s = 1.0f / std::sqrt(acc / static_cast<float>(n) + eps);
    rstd[r] = s;
    for (int64_t j = 0; j < n; ++j)
      y[r * n + j] = static_cast<T>(static_cast<float>(w[j]) * round_to<T>(static_cast<float>(xr[j]) * s));
  }
}

template <typename T>
void backward_rows(const T* gy, const T* x, const T* w, const float* rstd, int64_t n, T* gx, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const T *gr = gy + r * n, *xr = x + r * n;
    float dot = 0.0f;
    for (int64_t j = 0; j < n; ++j) dot += round_to<T>(static_cast<float>(gr[j]) * static_cast<float>(w[j])) * static_cast<float>(xr[j]);
    const float s = rstd[r], coef = s * s * s * dot / static_cast<float>(n);
    for (int64_t j = 0; j < n; ++j) {
      const float g = round_to<T>(static_cast<float>(gr[j]) * static_cast<float>(w[j]));
      gx[r * n + j] = static_cast<T>(s * g - coef * static_cast<float>(xr[j]));
    }
  }
}

template <typename T>
void weight_grad(const T* gy, const T* x, const float* rstd, int64_t rows, int64_t n, float* gw) {
  at::parallel_for(0, n, 256, [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) {
      float acc = 0.0f;
      for (int64_t r = 0; r < rows; ++r)
        acc += static_cast<float>(gy[r * n + j]) * round_to<T>(static_cast<float>(x[r * n + j]) * rstd[r]);
      gw[j] = acc;
    }
  });
}

float sigmoid(float g) { return 1.0f / (1.0f + std::exp(-g)); }
float silu(float g) { return g / (1.0f + std::exp(-g)); }  // as LibTorch's silu

template <typename T>
void swiglu_rows(const T* gu, int64_t inter, T* h, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t j = 0; j < inter; ++j) {
      const float g = static_cast<float>(gu[r * 2 * inter + j]), u = static_cast<float>(gu[r * 2 * inter + inter + j]);
      h[r * inter + j] = static_cast<T>(round_to<T>(silu(g)) * u);
    }
}

template <typename T>
void swiglu_backward_rows(const T* gh, const T* gu, int64_t inter, T* ggu, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t j = 0; j < inter; ++j) {
      const int64_t a = r * 2 * inter + j, b = a + inter;
      const float d = static_cast<float>(gh[r * inter + j]), g = static_cast<float>(gu[a]), u = static_cast<float>(gu[b]);
      const float sg = sigmoid(g), gs = round_to<T>(d * u);
      ggu[b] = static_cast<T>(d * round_to<T>(silu(g)));
      ggu[a] = static_cast<T>(gs * sg * (1.0f + g * (1.0f - sg)));
    }
}

// RoPE over the [B, H, T, D] view `x` (strides sx) into `o` (strides so), one (b, h, t) row at a time:
// forward (sign +1) out1 = x1 c1 - x2 s1, out2 = x2 c2 + x1 s2; backward (sign -1) g1 c1 + g2 s2,
// g2 c2 - g1 s1 -- each product rounded, then the sum (the composite's roundings).
struct RopeGeometry {
  int64_t B, H, T, D, R;
  int64_t sx[4], so[4];
};
template <typename T>
void rope_rows(const T* x, const T* cs, const T* sn, const RopeGeometry& g, bool backward, T* o, int64_t r0, int64_t r1) {
  const int64_t half = g.D / 2;
  for (int64_t r = r0; r < r1; ++r) {  // r = (b H + h) T + t
    const int64_t t = r % g.T, h = (r / g.T) % g.H, b = r / (g.T * g.H);
    const T* xr = x + b * g.sx[0] + h * g.sx[1] + t * g.sx[2];
    T* orow = o + b * g.so[0] + h * g.so[1] + t * g.so[2];
    const int64_t row = g.R == g.B * g.T ? b * g.T + t : t;
    const T *c = cs + row * g.D, *s = sn + row * g.D;
    for (int64_t j = 0; j < half; ++j) {
      const float x1 = static_cast<float>(xr[j]), x2 = static_cast<float>(xr[j + half]);
      const float c1 = static_cast<float>(c[j]), c2 = static_cast<float>(c[j + half]);
      const float s1 = static_cast<float>(s[j]), s2 = static_cast<float>(s[j + half]);
      if (!backward) {
        orow[j] = static_cast<T>(round_to<T>(x1 * c1) - round_to<T>(x2 * s1));
        orow[j + half] = static_cast<T>(round_to<T>(x2 * c2) + round_to<T>(x1 * s2));
      } else {
        orow[j] = static_cast<T>(round_to<T>(x1 * c1) + round_to<T>(x2 * s2));
        orow[j + half] = static_cast<T>(round_to<T>(x2 * c2) - round_to<T>(x1 * s1));
      }
    }
  }
}

// Calls f.template operator()<T>() for x's dtype (fp32, bf16, fp16).
template <typename F>
void on_dtype(const at::Tensor& x, F&& f) {
  switch (x.scalar_type()) {
    case at::kFloat: return f(float{});
    case at::kBFloat16: return f(c10::BFloat16{});
    case at::kHalf: return f(c10::Half{});
    default: TORCH_CHECK(false, "rms_norm: fp32, bf16 or fp16, got ", x.scalar_type());
  }
}

struct FusedRmsNorm : public torch::autograd::Function<FusedRmsNorm> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w,
                               double eps) {
    const int64_t n = x.size(-1);
    const torch::Tensor x2 = x.reshape({-1, n}).contiguous(), w1 = w.contiguous();
    torch::Tensor y = torch::empty_like(x2);
    torch::Tensor rstd = torch::empty({x2.size(0)}, x2.options().dtype(torch::kFloat));
    if (x2.is_cpu()) rms_norm_reference_forward(x2, w1, eps, y, rstd);
    else util::device_kernels().rms_norm_forward(x2, w1, eps, y, rstd);
    ctx->save_for_backward({x2, w1, rstd});
    return y.view(x.sizes());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grad) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &x2 = saved[0], &w = saved[1], &rstd = saved[2];
    const torch::Tensor gy = grad[0].reshape({-1, x2.size(1)}).contiguous();
    torch::Tensor gx = torch::empty_like(x2);
    torch::Tensor gw = torch::empty({x2.size(1)}, x2.options().dtype(torch::kFloat));
    if (x2.is_cpu()) rms_norm_reference_backward(gy, x2, w, rstd, gx, gw);
    else util::device_kernels().rms_norm_backward(gy, x2, w, rstd, gx, gw);
    return {gx.view(grad[0].sizes()), gw.to(w.scalar_type()), torch::Tensor()};
  }
};

struct FusedSwiglu : public torch::autograd::Function<FusedSwiglu> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& gu) {
    const int64_t two_i = gu.size(-1);
    const torch::Tensor gu2 = gu.reshape({-1, two_i}).contiguous();
    torch::Tensor h = torch::empty({gu2.size(0), two_i / 2}, gu2.options());
    if (gu2.is_cpu()) swiglu_reference_forward(gu2, h);
    else util::device_kernels().swiglu_forward(gu2, h);
    ctx->save_for_backward({gu2});
    std::vector<int64_t> shape = gu.sizes().vec();
    shape.back() = two_i / 2;
    return h.view(shape);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grad) {
    const torch::Tensor gu2 = ctx->get_saved_variables()[0];
    const torch::Tensor gh = grad[0].reshape({-1, gu2.size(1) / 2}).contiguous();
    torch::Tensor ggu = torch::empty_like(gu2);
    if (gu2.is_cpu()) swiglu_reference_backward(gh, gu2, ggu);
    else util::device_kernels().swiglu_backward(gh, gu2, ggu);
    std::vector<int64_t> shape = grad[0].sizes().vec();
    shape.back() = gu2.size(1);
    return {ggu.view(shape)};
  }
};

RopeGeometry rope_geometry(const at::Tensor& x, const at::Tensor& table, const at::Tensor& o) {
  TORCH_CHECK(x.dim() == 4 && x.stride(3) == 1 && x.size(3) % 2 == 0 && table.dim() == 2 && table.size(1) == x.size(3) &&
                  table.is_contiguous() && o.sizes() == x.sizes() && o.stride(3) == 1,
              "rope: x [B, H, T, D] with D even and contiguous, tables [R, D]");
  RopeGeometry g{x.size(0), x.size(1), x.size(2), x.size(3), table.size(0), {}, {}};
  TORCH_CHECK(g.R == g.T || g.R == g.B * g.T, "rope: tables of T or B T rows, got ", g.R);
  for (int d = 0; d < 4; ++d) g.sx[d] = x.stride(d), g.so[d] = o.stride(d);
  return g;
}

void rope_reference(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& o, bool backward) {
  const RopeGeometry g = rope_geometry(x, cos, o);
  on_dtype(x, [&](auto t) {
    using T = decltype(t);
    const T *xp = x.data_ptr<T>(), *c = cos.data_ptr<T>(), *s = sin.data_ptr<T>();
    T* op = o.data_ptr<T>();
    at::parallel_for(0, g.B * g.H * g.T, 64, [&](int64_t r0, int64_t r1) { rope_rows(xp, c, s, g, backward, op, r0, r1); });
  });
}

// An output laid out [B, T, H, D], viewed [B, H, T, D] (the composite's layout for a transposed x).
torch::Tensor bthd_like(const torch::Tensor& x) {
  return torch::empty({x.size(0), x.size(2), x.size(1), x.size(3)}, x.options()).transpose(1, 2);
}

// The tables as [R, D] rows: [T, D] as they are, [B, 1, T, D] (packed positions) as B T rows.
torch::Tensor table_rows(const torch::Tensor& t) { return t.reshape({-1, t.size(-1)}).contiguous(); }

struct FusedRope : public torch::autograd::Function<FusedRope> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& cos,
                               const torch::Tensor& sin) {
    const torch::Tensor c = table_rows(cos), s = table_rows(sin);
    torch::Tensor out = bthd_like(x);
    if (x.is_cpu()) rope_reference_forward(x, c, s, out);
    else util::device_kernels().rope_forward(x, c, s, out);
    ctx->save_for_backward({c, s});
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grad) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor g = grad[0].stride(3) == 1 ? grad[0] : grad[0].contiguous();
    torch::Tensor gx = bthd_like(g);
    if (g.is_cpu()) rope_reference_backward(g, saved[0], saved[1], gx);
    else util::device_kernels().rope_backward(g, saved[0], saved[1], gx);
    return {gx, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

void rope_reference_forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& out) {
  rope_reference(x, cos, sin, out, false);
}
void rope_reference_backward(const at::Tensor& gout, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& gx) {
  rope_reference(gout, cos, sin, gx, true);
}

void cross_entropy_rows_reference(const at::Tensor& z, const at::Tensor& labels, const at::Tensor& weights, double scale,
                                  bool grad, const at::Tensor& loss_rows) {
  const int64_t rows = z.size(0), V = z.size(1);
  float* zp = z.data_ptr<float>();
  const int64_t* lp = labels.data_ptr<int64_t>();
  const float* wp = weights.defined() ? weights.data_ptr<float>() : nullptr;
  float* out = loss_rows.data_ptr<float>();
  const float fs = static_cast<float>(scale);
  at::parallel_for(0, rows, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* zr = zp + r * V;
      float m = zr[0], s = 0.0f;
      for (int64_t j = 1; j < V; ++j) m = std::max(m, zr[j]);
      for (int64_t j = 0; j < V; ++j) s += std::exp(zr[j] - m);
      out[r] = (m + std::log(s)) - zr[lp[r]];
      if (!grad) continue;
      const float w = wp ? wp[r] : 1.0f;
      for (int64_t j = 0; j < V; ++j) zr[j] = ((std::exp(zr[j] - m) / s - (j == lp[r] ? 1.0f : 0.0f)) * w) * fs;
    }
  });
}

bool fused_rope_runs(const torch::Tensor& x) {
  return !x.is_cpu() && util::device_kernels().rope_forward != nullptr && util::device_kernels().rope_backward != nullptr;
}

torch::Tensor fused_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  TORCH_CHECK(x.is_cpu() || fused_rope_runs(x), "fused_rope: no kernel installed for ", x.device());
  TORCH_CHECK(cos.scalar_type() == x.scalar_type() && sin.scalar_type() == x.scalar_type(), "fused_rope: tables of x's dtype");
  return FusedRope::apply(x, cos, sin);
}

void swiglu_reference_forward(const at::Tensor& gu, const at::Tensor& h) {
  const int64_t rows = gu.size(0), inter = gu.size(1) / 2;
  on_dtype(gu, [&](auto t) {
    using T = decltype(t);
    const T* g = gu.data_ptr<T>();
    T* hp = h.data_ptr<T>();
    at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) { swiglu_rows(g, inter, hp, r0, r1); });
  });
}

void swiglu_reference_backward(const at::Tensor& gh, const at::Tensor& gu, const at::Tensor& ggu) {
  const int64_t rows = gu.size(0), inter = gu.size(1) / 2;
  on_dtype(gu, [&](auto t) {
    using T = decltype(t);
    const T *d = gh.data_ptr<T>(), *g = gu.data_ptr<T>();
    T* out = ggu.data_ptr<T>();
    at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) { swiglu_backward_rows(d, g, inter, out, r0, r1); });
  });
}

bool fused_swiglu_runs(const torch::Tensor& x) {
  return !x.is_cpu() && util::device_kernels().swiglu_forward != nullptr && util::device_kernels().swiglu_backward != nullptr;
}

torch::Tensor fused_swiglu(const torch::Tensor& gu) {
  TORCH_CHECK(gu.is_cpu() || fused_swiglu_runs(gu), "fused_swiglu: no kernel installed for ", gu.device());
  TORCH_CHECK(gu.size(-1) % 2 == 0, "fused_swiglu: gate and up side by side, an even last dimension");
  return FusedSwiglu::apply(gu);
}

void rms_norm_reference_forward(const at::Tensor& x, const at::Tensor& w, double eps, const at::Tensor& y,
                                const at::Tensor& rstd) {
  const int64_t rows = x.size(0), n = x.size(1);
  on_dtype(x, [&](auto t) {
    using T = decltype(t);
    const T *xp = x.data_ptr<T>(), *wp = w.data_ptr<T>();
    T* yp = y.data_ptr<T>();
    float* sp = rstd.data_ptr<float>();
    at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) { forward_rows(xp, wp, static_cast<float>(eps), n, yp, sp, r0, r1); });
  });
}

void rms_norm_reference_backward(const at::Tensor& gy, const at::Tensor& x, const at::Tensor& w, const at::Tensor& rstd,
                                 const at::Tensor& gx, const at::Tensor& gw) {
  const int64_t rows = x.size(0), n = x.size(1);
  on_dtype(x, [&](auto t) {
    using T = decltype(t);
    const T *gp = gy.data_ptr<T>(), *xp = x.data_ptr<T>(), *wp = w.data_ptr<T>();
    const float* sp = rstd.data_ptr<float>();
    T* gxp = gx.data_ptr<T>();
    at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) { backward_rows(gp, xp, wp, sp, n, gxp, r0, r1); });
    weight_grad(gp, xp, sp, rows, n, gw.data_ptr<float>());
  });
}

bool fused_rms_norm_runs(const torch::Tensor& x) {
  return !x.is_cpu() && util::device_kernels().rms_norm_forward != nullptr && util::device_kernels().rms_norm_backward != nullptr;
}

torch::Tensor fused_rms_norm(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  TORCH_CHECK(x.is_cpu() || fused_rms_norm_runs(x), "fused_rms_norm: no kernel installed for ", x.device());
  TORCH_CHECK(w.dim() == 1 && w.size(0) == x.size(-1) && w.scalar_type() == x.scalar_type(),
              "fused_rms_norm: weight [", x.size(-1), "] of x's dtype");
  return FusedRmsNorm::apply(x, w, eps);
}

}  // namespace tessera::model::ops
