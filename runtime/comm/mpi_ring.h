// Bandwidth-optimal large-message collectives on MPI point-to-point, used by the MPI backend above
// a size threshold (mpi_backend.cpp) instead of Open MPI's own collectives, which at 64 MiB on 2-4
// ranks measured 1.3-5x slower (Open MPI 4.1 picks reduce-then-scatter for MPI_Reduce_scatter_block,
// and 128 KiB-segment pipelines for MPI_Bcast that pay a rendezvous per segment over TCP):
//   - reduce_scatter: ring, n-1 steps; each rank sends (n-1)/n of the data once and reduces it once.
//   - all_gather: ring, n-1 steps (all_reduce's second half).
//   - all_reduce: ring reduce-scatter + ring all-gather (2(n-1)/n of the data each way).
//   - broadcast: pipelined chain from the root in segments.
// Every rank of `comm` must call the same function with the same layout; calls on one communicator
// must not interleave (the backend runs them one at a time on its communication thread). Results
// are deterministic: each block is reduced in ring order ((v[b+1] + v[b+2]) + ...) + v[b] on one
// rank and then copied. No LibTorch here: raw buffers, MPI datatypes and MPI ops.
#pragma once
#include <mpi.h>

#include <algorithm>
#include <cstdint>

namespace tessera::comm::ring {

// Throws Error(Internal) "<call> failed: <MPI's error string>" unless rc == MPI_SUCCESS.
void check_mpi(int rc, const char* call);

// A flat buffer of n elements cut into `parts` blocks of `chunk` = ceil(n / parts) elements:
// block i covers [i*chunk, min(n, (i+1)*chunk)), so trailing blocks may be short or empty (the
// communicator's uneven-size contract).
struct Blocks {
  int64_t n = 0, chunk = 0;
  int parts = 1;
  Blocks(int64_t n_, int parts_) : n(n_), chunk(parts_ > 0 ? (n_ + parts_ - 1) / parts_ : 0), parts(parts_) {}
  int64_t offset(int i) const { return std::min(n, i * chunk); }
  int64_t count(int i) const { return std::clamp<int64_t>(n - i * chunk, 0, chunk); }
};

// Rank r gets into `out` (count(r) elements; capacity chunk) the reduction over ranks of block r of
// their `in` (n elements laid out as `b`). With clobber_in, blocks of `in` serve as accumulators
// (the in-place form: `out` may be in's own block r, then nothing is copied) and `scratch` needs
// chunk elements; otherwise `in` is only read and `scratch` plus `out` alternate as accumulators.
void reduce_scatter(char* in, bool clobber_in, char* out, char* scratch, const Blocks& b, int elem_size,
                    MPI_Datatype type, MPI_Op op, MPI_Comm comm);

// `buf` (n elements, laid out as `b`) holds this rank's block in place; afterwards every block.
void all_gather(char* buf, const Blocks& b, int elem_size, MPI_Datatype type, MPI_Comm comm);

// In-place all-reduce of `n` elements; `scratch` needs ceil(n / ranks) elements.
void all_reduce(char* buf, int64_t n, char* scratch, int elem_size, MPI_Datatype type, MPI_Op op, MPI_Comm comm);

// Broadcast of `n` elements from `root` along the chain root, root+1, ... in segments of
// `segment` elements: each rank forwards a segment while the next arrives.
void broadcast(char* buf, int64_t n, int root, int64_t segment, int elem_size, MPI_Datatype type, MPI_Comm comm);

}  // namespace tessera::comm::ring
