#include "model/widened_gemm.h"

#include <algorithm>

namespace tessera::model::ops {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool cpu_widens_bf16() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool widen = !(__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                              __builtin_cpu_supports("avx512dq"));
  return widen;
#else
  return false;
#endif
}

bool widens(const torch::Tensor& t) {
  return t.defined() && t.is_cpu() && t.scalar_type() == torch::kBFloat16 && cpu_widens_bf16();
}

int64_t widen_block_rows(int64_t rows, int64_t K) {
  return std::max<int64_t>(1, std::min<int64_t>(rows, kWidenBlockBytes / (4 * std::max<int64_t>(K, 1))));
}

int64_t widened_linear_transient(int64_t N, int64_t in, int64_t out, int p) {
  if (p == 4) return 0;
  const int64_t nb = widen_block_rows(out, in);
  return 4 * (N * in + nb * in + N * nb);
}

int64_t widened_matmul_transient(int64_t na, int64_t nb, int64_t nout) { return 4 * (na + nb + nout); }

void mm_nt_widened(const torch::Tensor& a_f, const torch::Tensor& w, const torch::Tensor& out,
                   torch::ScalarType round_to) {
  const int64_t M = w.size(0), rows = widen_block_rows(M, w.size(1));
  for (int64_t m0 = 0; m0 < M; m0 += rows) {
    const int64_t n = std::min(rows, M - m0);
    torch::Tensor block = torch::mm(a_f, w.narrow(0, m0, n).to(torch::kFloat).t());
    if (round_to != out.scalar_type()) block = block.to(round_to);
    out.narrow(1, m0, n).copy_(block);
  }
}

void mm_nn_widened_acc(const torch::Tensor& g, const torch::Tensor& w, const torch::Tensor& acc,
                       torch::ScalarType round_to) {
  const int64_t M = w.size(0), rows = widen_block_rows(M, w.size(1));
  for (int64_t m0 = 0; m0 < M; m0 += rows) {
    const int64_t n = std::min(rows, M - m0);
    torch::Tensor gb = g.narrow(1, m0, n);
    if (gb.scalar_type() != round_to) gb = gb.to(round_to);
    acc.addmm_(gb.to(torch::kFloat), w.narrow(0, m0, n).to(torch::kFloat));
  }
}

namespace {

// out [M, K] = g [N, M]^T . a_f [N, K] (fp32), in row blocks of out, each rounded into out's dtype.
void mm_tn_widened(const torch::Tensor& g, const torch::Tensor& a_f, const torch::Tensor& out) {
  const int64_t M = out.size(0), rows = widen_block_rows(M, out.size(1));
  for (int64_t m0 = 0; m0 < M; m0 += rows) {
    const int64_t n = std::min(rows, M - m0);
    out.narrow(0, m0, n).copy_(torch::mm(g.narrow(1, m0, n).to(torch::kFloat).t(), a_f));
  }
}

struct WidenedLinear : public torch::autograd::Function<WidenedLinear> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w) {
    ctx->save_for_backward({x, w});
    const torch::Tensor x2 = x.reshape({-1, x.size(-1)});
    torch::Tensor y = torch::empty({x2.size(0), w.size(0)}, x.options());
    mm_nt_widened(x2.to(torch::kFloat), w, y, y.scalar_type());
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape.back() = w.size(0);
    return y.view(shape);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &w = saved[1];
    const torch::Tensor g = grad_out[0].reshape({-1, w.size(0)});
    torch::Tensor gx, gw;
    if (ctx->needs_input_grad(0)) {  // g W, accumulated in fp32 over blocks of W's rows
      torch::Tensor acc = torch::zeros({g.size(0), w.size(1)}, g.options().dtype(torch::kFloat));
      mm_nn_widened_acc(g, w, acc, g.scalar_type());
      gx = acc.to(x.scalar_type()).view(x.sizes());
    }
    if (ctx->needs_input_grad(1)) {  // g^T x, by blocks of W's rows
      gw = torch::empty_like(w, torch::MemoryFormat::Contiguous);
      mm_tn_widened(g, x.reshape({-1, x.size(-1)}).to(torch::kFloat), gw);
    }
    return {gx, gw};
  }
};

// Keeps what torch::matmul keeps for batched operands: both folded to [batch, rows, cols] (b's fold
// copies it when b is a transposed view, as matmul's reshape does).
struct WidenedMatmul : public torch::autograd::Function<WidenedMatmul> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& a, const torch::Tensor& b) {
    const int64_t n = a.size(-2), k = a.size(-1), m = b.size(-1);
    const torch::Tensor af = a.reshape({-1, n, k}), bf = b.reshape({-1, k, m});
    ctx->save_for_backward({af, bf});
    ctx->saved_data["a_shape"] = a.sizes().vec();
    ctx->saved_data["b_shape"] = b.sizes().vec();
    std::vector<int64_t> shape(a.sizes().begin(), a.sizes().end());
    shape.back() = m;
    return torch::bmm(af.to(torch::kFloat), bf.to(torch::kFloat)).to(a.scalar_type()).view(shape);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &af = saved[0], &bf = saved[1];
    const torch::Tensor g = grad_out[0].reshape({af.size(0), af.size(1), bf.size(2)});
    torch::Tensor ga, gb;
    if (ctx->needs_input_grad(0))
      ga = torch::bmm(g.to(torch::kFloat), bf.to(torch::kFloat).transpose(1, 2))
               .to(af.scalar_type())
               .view(ctx->saved_data["a_shape"].toIntVector());
    if (ctx->needs_input_grad(1))
      gb = torch::bmm(af.to(torch::kFloat).transpose(1, 2), g.to(torch::kFloat))
               .to(bf.scalar_type())
               .view(ctx->saved_data["b_shape"].toIntVector());
    return {ga, gb};
  }
};

}  // namespace

torch::Tensor linear_widened(const torch::Tensor& x, const torch::Tensor& w) { return WidenedLinear::apply(x, w); }

torch::Tensor matmul_widened(const torch::Tensor& a, const torch::Tensor& b) {
  TORCH_CHECK(a.dim() >= 2 && a.dim() == b.dim() && a.sizes().slice(0, a.dim() - 2) == b.sizes().slice(0, b.dim() - 2) &&
                  a.size(-1) == b.size(-2),
              "matmul_widened: a [..., n, k] and b [..., k, m] with the same batch shape, got ", a.sizes(), " and ",
              b.sizes());
  return WidenedMatmul::apply(a, b);
}

torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& w) {
  return widens(x) && widens(w) ? linear_widened(x, w) : torch::linear(x, w);
}

torch::Tensor matmul(const torch::Tensor& a, const torch::Tensor& b) {
  return widens(a) && widens(b) ? matmul_widened(a, b) : torch::matmul(a, b);
}

}  // namespace tessera::model::ops
