#include "model/stacked_linear.h"

#include <algorithm>

#include "model/widened_gemm.h"

namespace tessera::model::ops {

bool rows_adjacent(const std::vector<torch::Tensor>& ws) {
  if (ws.size() < 2) return false;
  const torch::Tensor& first = ws.front();
  const char* next = nullptr;
  for (const torch::Tensor& w : ws) {
    if (!w.defined() || w.is_meta() || w.dim() != 2 || !w.is_contiguous() || w.scalar_type() != first.scalar_type() ||
        w.device() != first.device() || w.size(1) != first.size(1) || !w.is_alias_of(first))
      return false;
    const char* at = static_cast<const char*>(w.data_ptr());
    if (next != nullptr && at != next) return false;
    next = at + w.numel() * w.element_size();
  }
  return true;
}

namespace {

// Up to three weights (c absent for two): the view of their rows, and in backward each its rows
// of the gradient.
struct StackedRows : public torch::autograd::Function<StackedRows> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& a, const torch::Tensor& b,
                               const c10::optional<torch::Tensor>& c) {
    std::vector<int64_t> rows = {a.size(0), b.size(0)};
    if (c) rows.push_back(c->size(0));
    int64_t total = 0;
    for (int64_t r : rows) total += r;
    ctx->saved_data["rows"] = rows;
    return a.as_strided({total, a.size(1)}, {a.size(1), 1}, a.storage_offset());  // forward records no history
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    const std::vector<int64_t> rows = ctx->saved_data["rows"].toIntVector();
    torch::autograd::variable_list out(3);
    if (!grad[0].defined()) return out;
    const std::vector<torch::Tensor> parts = grad[0].split_with_sizes(rows, 0);  // one operator for all
    std::copy(parts.begin(), parts.end(), out.begin());
    return out;
  }
};

}  // namespace

torch::Tensor stacked_rows(const std::vector<torch::Tensor>& ws) {
  if (ws.size() > 3 || !rows_adjacent(ws)) return {};
  return StackedRows::apply(ws[0], ws[1], ws.size() == 3 ? c10::optional<torch::Tensor>(ws[2]) : c10::nullopt);
}

std::vector<torch::Tensor> linear_stacked(const torch::Tensor& x, const std::vector<torch::Tensor>& ws) {
  const torch::Tensor w = stacked_rows(ws);
  std::vector<torch::Tensor> out;
  if (!w.defined()) {
    for (const torch::Tensor& wi : ws) out.push_back(ops::linear(x, wi));
    return out;
  }
  std::vector<int64_t> sizes;
  for (const torch::Tensor& wi : ws) sizes.push_back(wi.size(0));
  return ops::linear(x, w).split_with_sizes(sizes, -1);
}

}  // namespace tessera::model::ops
