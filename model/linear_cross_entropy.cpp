#include "model/linear_cross_entropy.h"

#include <algorithm>

namespace tessera::model::ops {

int64_t linear_cross_entropy_chunk_rows(int64_t V) {
  return std::max<int64_t>(256, (int64_t{64} << 20) / (4 * std::max<int64_t>(V, 1)));
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct LinearCrossEntropy : public torch::autograd::Function<LinearCrossEntropy> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight,
                               const torch::Tensor& labels, int64_t ignore_index, int64_t chunk_rows) {
    const bool want_x = x.requires_grad(), want_w = weight.requires_grad();
    const int64_t N = x.size(0), H = x.size(1), V = weight.size(0);
    // The rows that count; the others neither add to the loss nor get a gradient.
    const torch::Tensor kept = (labels != ignore_index).nonzero().view({-1});
    const int64_t K = kept.numel();
    const bool all_kept = K == N;
    const torch::Tensor xk = all_kept ? x : x.index_select(0, kept);
    const torch::Tensor lk = all_kept ? labels : labels.index_select(0, kept);
    torch::Tensor gx = want_x ? torch::empty({K, H}, x.options()) : torch::Tensor();
    const bool w_fp32 = weight.scalar_type() == torch::kFloat;
    torch::Tensor gw = want_w ? torch::zeros({V, H}, weight.options().dtype(torch::kFloat)) : torch::Tensor();
    torch::Tensor loss = torch::zeros({}, x.options().dtype(torch::kDouble));  // on x's device: no sync per chunk
    const int64_t rows = std::min(K, chunk_rows > 0 ? chunk_rows : linear_cross_entropy_chunk_rows(V));
    // One fp32 buffer for every chunk's logits (one allocation of one size, whatever K is).
    const torch::Tensor zbuf = torch::empty({std::max<int64_t>(rows, 1), V}, x.options().dtype(torch::kFloat));
    for (int64_t r0 = 0; r0 < K; r0 += rows) {
      const int64_t c = std::min(rows, K - r0);
      const torch::Tensor xc = xk.narrow(0, r0, c), lc = lk.narrow(0, r0, c).unsqueeze(1);
      // The chunk's logits, then in place exp(z - max) (no logits-sized temporary, one exp pass).
      torch::Tensor z = zbuf.narrow(0, 0, c);  // [c, V]
      if (x.scalar_type() == torch::kFloat) torch::mm_out(z, xc, weight.t());
      else z.copy_(torch::mm(xc, weight.t()));
      const torch::Tensor zmax = std::get<0>(z.max(1, /*keepdim=*/true)), picked = z.gather(1, lc);
      z.sub_(zmax).exp_();
      const torch::Tensor sum = z.sum(1, /*keepdim=*/true);
      loss += (zmax + sum.log() - picked).sum(torch::kDouble);  // logsumexp - logit of the label
      if (!want_x && !want_w) continue;
      z.div_(sum);                                                       // softmax
      z.scatter_add_(1, lc, torch::full({c, 1}, -1.0f, z.options()));  // - one-hot
      if (want_x) {
        torch::Tensor rows_of_gx = gx.narrow(0, r0, c);
        torch::mm_out(rows_of_gx, z.to(x.scalar_type()), weight);  // z itself when fp32
      }
      // W's gradient in fp32 from the fp32 softmax gradient (x's rows widened when bf16: [c, H]).
      if (want_w) gw.addmm_(z.t(), xc.to(torch::kFloat));
    }
    if (want_x && !all_kept) gx = torch::zeros({N, H}, x.options()).index_copy_(0, kept, gx);
    if (want_w && !w_fp32) gw = gw.to(weight.scalar_type());
    ctx->saved_data["gx"] = gx;
    ctx->saved_data["gw"] = gw;
    return loss.to(torch::kFloat);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    TORCH_CHECK(ctx->saved_data.count("gx"),
                "linear_cross_entropy: backward ran twice through the same graph (its gradients are scaled in place)");
    torch::Tensor gx = ctx->saved_data["gx"].toTensor(), gw = ctx->saved_data["gw"].toTensor();
    ctx->saved_data.erase("gx");
    ctx->saved_data.erase("gw");
    const torch::Tensor& go = grad_out[0];
    if (gx.defined()) gx.mul_(go.to(gx.scalar_type()));
    if (gw.defined()) gw.mul_(go.to(gw.scalar_type()));
    return {gx, gw, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor linear_cross_entropy(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& labels,
                                   int64_t ignore_index, int64_t chunk_rows) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1),
              "linear_cross_entropy: x [N, H] and weight [V, H], got ", x.sizes(), " and ", weight.sizes());
  TORCH_CHECK(labels.dim() == 1 && labels.size(0) == x.size(0) && labels.scalar_type() == torch::kLong,
              "linear_cross_entropy: labels [N] int64, got ", labels.sizes(), " ", labels.scalar_type());
  return LinearCrossEntropy::apply(x, weight, labels, ignore_index, chunk_rows);
}

}  // namespace tessera::model::ops
