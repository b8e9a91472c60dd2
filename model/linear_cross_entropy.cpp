#include "model/linear_cross_entropy.h"

#include <algorithm>

#include "model/widened_gemm.h"
#include "util/device_kernels.h"

namespace tessera::model::ops {

int64_t linear_cross_entropy_chunk_rows(int64_t V, bool device) {
  const int64_t budget = int64_t{device ? 512 : 64} << 20;
  return std::max<int64_t>(256, budget / (4 * std::max<int64_t>(V, 1)));
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// TF32 for the fp32 GEMM of W's gradient while in scope, on a GPU with a lower-precision compute
// dtype (the fp32 accumulation is kept; tensor cores do the products). fp32 runs keep full fp32
// (the CPU-vs-GPU equivalence test compares them), and the CPU has no TF32: no effect there. The
// flag is process-wide: the head runs on the step's thread while no other GEMM is in flight.
class Tf32Scope {
 public:
  explicit Tf32Scope(bool on) : prev_(at::globalContext().allowTF32CuBLAS()), set_(on) {
    if (set_) at::globalContext().setAllowTF32CuBLAS(true);
  }
  ~Tf32Scope() {
    if (set_) at::globalContext().setAllowTF32CuBLAS(prev_);
  }

 private:
  bool prev_, set_;
};

// What the chunk loop reads: the rows that count, either compacted (CPU: the ignored rows are
// dropped, costing nothing, but finding them is a nonzero(), a host synchronisation on a GPU) or
// all rows with a 0/1 weight (a device: no synchronisation; ignored rows are computed and zeroed).
struct Rows {
  torch::Tensor x, labels, weight;  // weight [K, 1] float, undefined when compacted
  torch::Tensor kept;               // compacted: indices of the kept rows in x; else undefined
  int64_t count = 0;
};

Rows select_rows(const torch::Tensor& x, const torch::Tensor& labels, int64_t ignore_index, bool compact) {
  Rows r;
  const torch::Tensor keep = labels != ignore_index;
  if (!compact) {
    r.x = x;
    r.labels = labels.masked_fill(keep.logical_not(), 0);  // any valid index; its row weighs 0
    r.weight = keep.to(torch::kFloat).unsqueeze(1);
    r.count = x.size(0);
    return r;
  }
  const torch::Tensor kept = keep.nonzero().view({-1});
  r.count = kept.numel();
  const bool all = r.count == x.size(0);
  r.x = all ? x : x.index_select(0, kept);
  r.labels = all ? labels : labels.index_select(0, kept);
  if (!all) r.kept = kept;
  return r;
}

// z [c, V] (fp32) rounded to W's 16-bit dtype, times W [V, H]: in fp32 over blocks of W's rows.
torch::Tensor widened_z_w(const torch::Tensor& z, const torch::Tensor& weight) {
  torch::Tensor acc = torch::zeros({z.size(0), weight.size(1)}, z.options());
  mm_nn_widened_acc(z, weight, acc, weight.scalar_type());
  return acc;
}

// A chunk's loss (weighted rows summed in double) and, with `grad`, z [c, V] in place becoming the
// gradient of the loss by the logits: (softmax - one-hot) * row weight * grad_scale, in fp32. On a
// device where Tessera's row-wise kernel is installed (util/device_kernels.h) one kernel; else the
// composite's passes (max, gather, exp, sum, log, divide, one-hot, weights, scale).
torch::Tensor softmax_gradient(const torch::Tensor& z, const torch::Tensor& lc, const torch::Tensor& wc, double grad_scale,
                               bool grad) {
  const util::CrossEntropyRows kernel = z.is_cpu() ? nullptr : util::device_kernels().cross_entropy_rows;
  torch::Tensor row_loss;
  if (kernel != nullptr) {
    row_loss = torch::empty({z.size(0), 1}, z.options());
    kernel(z, lc.view({-1}), wc.defined() ? wc.view({-1}) : torch::Tensor(), grad_scale, grad, row_loss);
  } else {
    const torch::Tensor zmax = std::get<0>(z.max(1, /*keepdim=*/true)), picked = z.gather(1, lc);
    z.sub_(zmax).exp_();
    const torch::Tensor sum = z.sum(1, /*keepdim=*/true);
    row_loss = zmax + sum.log() - picked;  // logsumexp - logit of the label
    if (grad) {
      z.div_(sum);                                                               // softmax
      z.scatter_add_(1, lc, torch::full({z.size(0), 1}, -1.0f, z.options()));  // - one-hot
      if (wc.defined()) z.mul_(wc);                                              // ignored rows: no gradient
      if (grad_scale != 1.0) z.mul_(grad_scale);                                 // the loss scale, before rounding
    }
  }
  return (wc.defined() ? row_loss * wc : row_loss).sum(torch::kDouble);
}

struct LinearCrossEntropy : public torch::autograd::Function<LinearCrossEntropy> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight,
                               const torch::Tensor& labels, int64_t ignore_index, int64_t chunk_rows, bool compact,
                               double grad_scale) {
    const bool want_x = x.requires_grad(), want_w = weight.requires_grad();
    const int64_t N = x.size(0), H = x.size(1), V = weight.size(0);
    const Rows k = select_rows(x, labels, ignore_index, compact);
    const int64_t K = k.count;
    // fp16 keeps the gradients in fp32 until backward has applied the incoming (loss-scaled) gradient.
    const bool fp16 = x.scalar_type() == torch::kHalf;
    torch::Tensor gx = want_x ? torch::empty({K, H}, x.options().dtype(fp16 ? torch::kFloat : x.scalar_type()))
                              : torch::Tensor();
    torch::Tensor gw = want_w ? torch::zeros({V, H}, weight.options().dtype(torch::kFloat)) : torch::Tensor();
    torch::Tensor loss = torch::zeros({}, x.options().dtype(torch::kDouble));  // on x's device: no sync per chunk
    const int64_t rows = std::min(K, chunk_rows > 0 ? chunk_rows : linear_cross_entropy_chunk_rows(V, !x.is_cpu()));
    // One fp32 buffer for every chunk's logits (one allocation of one size, whatever K is).
    const torch::Tensor zbuf = torch::empty({std::max<int64_t>(rows, 1), V}, x.options().dtype(torch::kFloat));
    const bool device_lowp = !x.is_cpu() && x.scalar_type() != torch::kFloat;
    const bool widen = widens(x) && widens(weight);  // bf16 products in fp32 (model/widened_gemm.h)
    Tf32Scope tf32(device_lowp && want_w);
    for (int64_t r0 = 0; r0 < K; r0 += rows) {
      const int64_t c = std::min(rows, K - r0);
      const torch::Tensor xc = k.x.narrow(0, r0, c), lc = k.labels.narrow(0, r0, c).unsqueeze(1);
      const torch::Tensor wc = k.weight.defined() ? k.weight.narrow(0, r0, c) : torch::Tensor();
      // The chunk's logits, then in place exp(z - max) (no logits-sized temporary, one exp pass).
      torch::Tensor z = zbuf.narrow(0, 0, c);  // [c, V]
      // x's rows widened (bf16): for the widened logits and for W's gradient.
      const torch::Tensor xc_f = x.scalar_type() == torch::kFloat || !(widen || want_w) ? xc : xc.to(torch::kFloat);
      if (x.scalar_type() == torch::kFloat) torch::mm_out(z, xc, weight.t());
      else if (widen) mm_nt_widened(xc_f, weight, z, x.scalar_type());  // rounded to bf16 as a bf16 product
      else z.copy_(torch::mm(xc, weight.t()));
      loss += softmax_gradient(z, lc, wc, grad_scale, want_x || want_w);
      if (want_x) {
        torch::Tensor rows_of_gx = gx.narrow(0, r0, c);
        if (widen) rows_of_gx.copy_(widened_z_w(z, weight));
        else if (fp16) rows_of_gx.copy_(torch::mm(z.to(x.scalar_type()), weight));
        else torch::mm_out(rows_of_gx, z.to(x.scalar_type()), weight);  // z itself when fp32
      }
      // W's gradient in fp32 from the fp32 softmax gradient (x's rows widened when bf16: [c, H]).
      if (want_w) gw.addmm_(z.t(), xc_f);
    }
    if (want_x && k.kept.defined()) gx = torch::zeros({N, H}, gx.options()).index_copy_(0, k.kept, gx);
    if (want_w && weight.scalar_type() != torch::kFloat && !fp16) gw = gw.to(weight.scalar_type());
    ctx->saved_data["gx"] = gx;
    ctx->saved_data["gw"] = gw;
    ctx->saved_data["grad_scale"] = grad_scale;
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(weight.scalar_type());
    return loss.to(torch::kFloat);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    TORCH_CHECK(ctx->saved_data.count("gx"),
                "linear_cross_entropy: backward ran twice through the same graph (its gradients are scaled in place)");
    torch::Tensor gx = ctx->saved_data["gx"].toTensor(), gw = ctx->saved_data["gw"].toTensor();
    const double grad_scale = ctx->saved_data["grad_scale"].toDouble();
    const auto x_dtype = static_cast<torch::ScalarType>(ctx->saved_data["x_dtype"].toInt());
    const auto w_dtype = static_cast<torch::ScalarType>(ctx->saved_data["w_dtype"].toInt());
    ctx->saved_data.erase("gx");
    ctx->saved_data.erase("gw");
    // The incoming gradient already carries the loss scale the forward applied: divide it out once.
    const torch::Tensor go = grad_scale != 1.0 ? grad_out[0] / grad_scale : grad_out[0];
    if (gx.defined()) gx.mul_(go.to(gx.scalar_type()));
    if (gw.defined()) gw.mul_(go.to(gw.scalar_type()));
    if (gx.defined() && gx.scalar_type() != x_dtype) gx = gx.to(x_dtype);  // fp16: rounded once, scaled
    if (gw.defined() && gw.scalar_type() != w_dtype) gw = gw.to(w_dtype);
    return {gx, gw, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor linear_cross_entropy(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& labels,
                                   int64_t ignore_index, int64_t chunk_rows, LceRows rows, double grad_scale) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1),
              "linear_cross_entropy: x [N, H] and weight [V, H], got ", x.sizes(), " and ", weight.sizes());
  TORCH_CHECK(labels.dim() == 1 && labels.size(0) == x.size(0) && labels.scalar_type() == torch::kLong,
              "linear_cross_entropy: labels [N] int64, got ", labels.sizes(), " ", labels.scalar_type());
  TORCH_CHECK(grad_scale > 0, "linear_cross_entropy: grad_scale must be positive, got ", grad_scale);
  const bool compact = rows == LceRows::Compact || (rows == LceRows::Auto && x.is_cpu());
  return LinearCrossEntropy::apply(x, weight, labels, ignore_index, chunk_rows, compact, grad_scale);
}

}  // namespace tessera::model::ops
