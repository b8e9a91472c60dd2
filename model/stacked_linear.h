// Adjacent weights as one product: q/k/v, and gate/up.
//
// FSDP lays a unit's parameters out one after another in its flat buffer (runtime/fsdp/shard_plan.h;
// the 16-element alignment falls between whole rows for Llama's shapes), so q_proj, k_proj and
// v_proj's weights are the rows of one [Hq + 2 Hkv, H] matrix, and gate_proj and up_proj's of one
// [2 I, H]. One GEMM over that view replaces three (or two) in forward, and its backward is one
// input-gradient GEMM and one weight-gradient GEMM: the small k and v products (Hkv = 256 columns for
// a GQA model) stop being GEMMs of their own, and the input's gradient is not summed from three.
//
// Autograd: StackedRows (stacked_linear.cpp) returns the [sum rows, in] view of the weights'
// storage, and its backward hands each weight its rows of the gradient (views, no copy); the product
// is ops::linear's (widened on CPUs without AVX-512, as every other product); split_with_sizes gives
// each weight's output as a view of one tensor, and its backward concatenates their gradients once.
// What autograd keeps: x and the weights (views of the gathered buffer, as separate products keep
// them). An output kept by a later operator keeps the whole product alive: the caller copies v,
// which attention keeps, out of it (model/activations.h counts that copy).
//
// Weights that are not adjacent (a plain model whose parameters are allocated one by one, biases
// between them, LoRA) take separate products: the same values, up to the order of the input
// gradient's sums.
//
// THREADS: pure functions of their arguments.
#pragma once

#include <torch/torch.h>

#include <vector>

namespace tessera::model::ops {

// Whether 2-D weights lie one after another in one storage (contiguous, same dtype, device and
// columns, each starting where the previous ends): what stacked_rows needs.
bool rows_adjacent(const std::vector<torch::Tensor>& ws);

// The [sum of rows, in] view of 2-D weights that lie one after another in one storage (contiguous,
// same dtype, device and columns, each starting where the previous ends); undefined otherwise.
// Differentiable: each weight gets its rows of the view's gradient.
torch::Tensor stacked_rows(const std::vector<torch::Tensor>& ws);

// x W_i^T for each weight W_i [out_i, in]: one product over stacked_rows(ws) split into views of
// it, or separate products where the weights are not adjacent.
std::vector<torch::Tensor> linear_stacked(const torch::Tensor& x, const std::vector<torch::Tensor>& ws);

}  // namespace tessera::model::ops
