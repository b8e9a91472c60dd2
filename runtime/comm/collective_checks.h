// Internal to runtime/comm: argument checks and size arithmetic shared by every backend, so the
// uneven-size contract of communicator.h is enforced identically for self, MPI and NCCL.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/comm/communicator.h"

namespace tessera::comm::detail {

// ceil(n / size): the per-rank chunk of a flat tensor of n elements.
inline int64_t chunk_of(int64_t n, int size) { return (n + size - 1) / size; }

const char* op_name(ReduceOp op);

// The MPI backend's reductions of 16-bit floats run in fp32 and are rounded once (communicator.h):
// MPI has no bf16, and summing raw bits would be wrong. (NCCL reduces them natively.)
inline bool reduce_in_fp32(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16; }

// "comm 'world' (rank 1 of 4, host h)": how every message names a communicator member.
std::string describe(const std::string& comm_name, int rank, int size, const std::string& host);

// Checks dtype equality, contiguity and the all-gather size rule; returns chunk (= in.numel()).
// `where` names the call for messages, e.g. "all_gather_into on comm 'world'".
int64_t check_all_gather(const at::Tensor& out, const at::Tensor& in, int size, const std::string& where);
// Checks dtype equality, contiguity and out.numel() == ceil(in.numel() / size); returns chunk.
int64_t check_reduce_scatter(const at::Tensor& out, const at::Tensor& in, ReduceOp op, int size,
                             const std::string& where);
// Checks that `t` is contiguous and that `op` makes sense for its dtype (no Mean on integers).
void check_reducible(const at::Tensor& t, ReduceOp op, const std::string& where);
void check_contiguous(const at::Tensor& t, const char* role, const std::string& where);

// scatter_pieces: root < size, every out contiguous; on root pieces.size() == size and
// pieces[r][i] contiguous with out's dtype, pieces[root] matching out one to one in element count.
void check_scatter_pieces(const std::vector<at::Tensor>& out, const std::vector<std::vector<at::Tensor>>& pieces,
                          int rank, int size, int root, const std::string& where);

// True when the byte ranges of a and b overlap.
bool overlaps(const at::Tensor& a, const at::Tensor& b);

// Keeps `comm` alive until the process ends (never destroyed): for a communicator whose thread may
// be stuck in an operation that timed out, so that no destructor joins that thread while the
// process unwinds to its error exit.
void keep_alive_forever(CommPtr comm);

}  // namespace tessera::comm::detail
