// bf16 matrix products computed in fp32 on a CPU without bf16 matrix instructions.
//
// LibTorch's CPU bf16 GEMM uses oneDNN only where the CPU has AVX-512 (avx512bw, vl, dq); elsewhere
// it runs a scalar loop: 1.6 GFLOP/s against 78 in fp32 on an AVX2 host (1024 x 512 x 32000: 20.4 s
// against 0.52 s). There the model's products widen their operands to fp32, run the fp32 GEMM and
// round the result to bf16 once: what a bf16 GEMM that accumulates in fp32 (cuBLAS, oneDNN, LibTorch's
// own loop) computes, up to the order of the sums.
//
// Autograd keeps exactly what torch::linear and torch::matmul keep (the bf16 operands, matmul's
// folded copies), so the saved-tensor formulas of model/activations.h do not change. The widened
// copies are transients, bounded below (a weight is widened at most kWidenBlockBytes at a time).
//
// THREADS: pure functions of their arguments; cpu_widens_bf16() is decided once (thread-safe static).
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace tessera::model::ops {

// fp32 bytes of a weight widened at once (rows of it; at least one row).
constexpr int64_t kWidenBlockBytes = 1 << 20;

// True when this CPU lacks what LibTorch needs for a fast bf16 GEMM (AVX-512 BW/VL/DQ on x86).
bool cpu_widens_bf16();
// True when a product with this operand is widened: bf16 on a CPU that cpu_widens_bf16().
bool widens(const torch::Tensor& t);

// x W^T (torch::linear without bias) for x [..., in], W [out, in]; widened when widens(x).
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& w);
// a b (torch::matmul) for a [..., n, k], b [..., k, m] with the same batch shape; widened when widens(a).
torch::Tensor matmul(const torch::Tensor& a, const torch::Tensor& b);
// The widened forms, whatever the CPU (tests compare them with LibTorch's own bf16 products).
torch::Tensor linear_widened(const torch::Tensor& x, const torch::Tensor& w);
torch::Tensor matmul_widened(const torch::Tensor& a, const torch::Tensor& b);

// Building blocks (no autograd), W widened in row blocks of kWidenBlockBytes:
// out [N, M] = a_f [N, K] (fp32) . W [M, K]^T, each block rounded to `round_to` first (bf16 to
// match a bf16 product; out's own dtype for none).
void mm_nt_widened(const torch::Tensor& a_f, const torch::Tensor& w, const torch::Tensor& out,
                   torch::ScalarType round_to);
// acc [N, K] (fp32) += g [N, M] . W [M, K], g's blocks rounded to `round_to` before widening.
void mm_nn_widened_acc(const torch::Tensor& g, const torch::Tensor& w, const torch::Tensor& acc,
                       torch::ScalarType round_to);

// Rows of a [rows, K] weight widened at once.
int64_t widen_block_rows(int64_t rows, int64_t K);
// Bytes a widened linear of x [N, in], W [out, in] holds beyond LibTorch's own, in forward and in
// backward alike: the widened input (or gradient accumulator) 4 N in, one widened weight block 4 nb in
// and its product block 4 N nb (plus its bf16 rounding, p N nb).
int64_t widened_linear_transient(int64_t N, int64_t in, int64_t out, int p);
// The same for a widened matmul of a (na elements), b (nb) into out (nout): all three in fp32.
int64_t widened_matmul_transient(int64_t na, int64_t nb, int64_t nout);

}  // namespace tessera::model::ops
