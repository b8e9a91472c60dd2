// The Communicator seam: every collective Tessera issues goes through this interface.
//
// CONTRACT (as in c10d's ProcessGroup): collectives are issued in the SAME ORDER on every rank of
// the communicator. Each call enqueues one operation and returns a Work handle; operations on one
// communicator complete in issue order. Tensors passed to an operation must stay alive and
// untouched until its Work completes. wait(timeout) throws tessera::Error(Timeout) naming the
// operation, rank and host if the operation does not complete in time.
//
// Uneven sizes are handled here, not refused:
//  - reduce_scatter_into(out, in): in has N elements (any N); chunk = ceil(N / size) and
//    out.numel() == chunk. Rank r receives the reduction of in[r*chunk, min(N, (r+1)*chunk));
//    elements of out past the end of in are set to zero (padding).
//  - all_gather_into(out, in): out has N elements (any N) and in has chunk = ceil(N / size)
//    elements on every rank; out = concat(in_0, ..., in_{size-1}) truncated to N. This is the exact
//    inverse of reduce_scatter_into's sharding (trailing ranks' chunks may be pure padding).
//  - In-place: all_gather_into may be called with `in` a view of out's own chunk
//    (out[rank*chunk, ...)) and reduce_scatter_into with `out` a view of in's own chunk; backends
//    avoid the extra copy where they can, and an in-place reduce_scatter_into may overwrite the rest
//    of `in` (MPI's in-place form uses it). Otherwise out and in must not overlap, and `in` is kept.
// Supported dtypes: float32, bfloat16, float16 (plus int32/int64/uint8 for bookkeeping). Reductions
// of bf16/fp16 are never on raw bits: the MPI backend computes them in fp32 and rounds once; NCCL
// reduces them natively (half the traffic of widening; rounded at each step of its ring, as
// PyTorch's NCCL reductions are). An fp32 reduction is the caller's choice (fsdp.reduce_dtype).
//
// THREADS. Who calls what:
//  - Issuing (every collective, scatter_*, barrier, and the synchronous helpers any /
//    broadcast_string / agree_error, which issue and wait) is done by ONE thread per communicator
//    at a time: the thread that owns it (the main thread for the bootstrap's and the engine's
//    groups; on a GPU, autograd's device thread issues the engine's backward collectives while the
//    main thread is blocked in backward()). The backends lock their queue, so two issuing threads
//    would not corrupt memory, but their interleaving would differ between ranks and break the
//    same-order contract. A second thread that needs collectives gets its own communicator (the
//    async checkpoint writer uses a private duplicate of the world: runtime/checkpoint).
//  - Work::wait / is_completed may be called from any thread, once the Work exists; a Work and the
//    tensors it was given are shared with the backend until it completes.
//  - Execution happens elsewhere: the MPI backend runs each communicator's operations in issue
//    order on that communicator's own communication thread (mpi_backend.h; Work is completed under
//    a per-Work mutex, the queue is guarded by a per-communicator mutex); the NCCL backend enqueues
//    on the caller's thread onto its own CUDA stream under a per-communicator enqueue mutex, and a
//    watchdog thread per communicator observes completions and deadlines (nccl_backend.h); the self
//    communicator runs everything synchronously on the caller's thread.
//  - default_timeout / set_default_timeout are atomic (any thread); `tessera train` sets it from
//    comm.timeout_s while it sets up the run (launcher/cmd_train.cpp).
//  - A communicator is destroyed by its owning thread after its last Work has been waited for
//    (the MPI backend drains its queue and joins its thread; NCCL aborts a communicator with work
//    still in flight), and MPI communicators before MPI_Finalize.
#pragma once
#include <ATen/core/Tensor.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace tessera::comm {

enum class ReduceOp { Sum, Mean, Max, Min };

class Work {
 public:
  virtual ~Work() = default;
  // Orders the caller after the operation. CPU backends (mpi, self) block the host until it
  // completes and throw tessera::Error(Timeout) after `timeout`. The NCCL backend does NOT block the
  // host: it makes the caller's current CUDA stream wait for the operation and returns at once;
  // synchronise the device before reading results on the host or calling is_completed(). Its
  // timeout is enforced by a watchdog, and the Error(Timeout) is thrown by the next call on the
  // communicator (see nccl_backend.h).
  virtual void wait(std::chrono::milliseconds timeout) = 0;
  void wait();  // uses default_timeout()
  virtual bool is_completed() = 0;
};
using WorkPtr = std::shared_ptr<Work>;

// Default timeout for wait(); settable from config (`comm.timeout_s`).
std::chrono::milliseconds default_timeout();
void set_default_timeout(std::chrono::milliseconds t);

class Communicator;
using CommPtr = std::shared_ptr<Communicator>;

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "mpi", "nccl", "self"
  virtual std::string name() const = 0;     // "world", "intra", "inter", ...
  // Where this communicator's tensors live (CPU for "mpi"/"self", the bound GPU for "nccl"); the
  // helpers below allocate their small tensors there.
  virtual at::Device device() const { return at::Device(at::kCPU); }

  virtual WorkPtr all_gather_into(at::Tensor out, at::Tensor in) = 0;
  virtual WorkPtr reduce_scatter_into(at::Tensor out, at::Tensor in, ReduceOp op = ReduceOp::Sum) = 0;
  virtual WorkPtr all_reduce(at::Tensor t, ReduceOp op = ReduceOp::Sum) = 0;
  virtual WorkPtr broadcast(at::Tensor t, int root) = 0;
  // Rank r receives in[r*chunk, (r+1)*chunk) of root's `in` into out (chunk = out.numel(), equal
  // on every rank); `in` is read on root only (chunk * size() elements, same dtype, contiguous) and
  // may be undefined elsewhere. The default implementation broadcasts chunk by chunk (non-root ranks
  // use a chunk-sized scratch buffer); backends override it with a real scatter (MPI_Scatter).
  virtual WorkPtr scatter_into(at::Tensor out, at::Tensor in, int root);
  // A scatter whose source need not be one buffer: rank r receives root's pieces[r][i] into its
  // out[i] for every i (same dtype and element count, contiguous). Root passes pieces for every rank
  // (pieces.size() == size(), its own pieces[root] are copied into its out); the others pass {}.
  // Pieces are only read, so they may point straight into a read-only memory-mapped file: root
  // makes no staging copy. The default implementation serves size 1 only (a copy) and refuses
  // larger groups; the MPI backend posts one send per piece.
  virtual WorkPtr scatter_pieces(std::vector<at::Tensor> out, std::vector<std::vector<at::Tensor>> pieces, int root);
  virtual WorkPtr barrier() = 0;

  // ---- communicators made from this one (collective over it, ordered with its other operations) --
  // Ranks passing the same color (>= 0) form a new communicator of this backend, ranked by `key`
  // (ties by rank); a rank passing a negative color takes part and gets nullptr. How the launcher
  // builds the intra- and inter-node groups from the world, whatever the backend.
  virtual CommPtr split(int color, int key, const std::string& name);
  // A new communicator over the same ranks in the same order whose tensors live on the host (an
  // MPI duplicate for "mpi" and for "nccl", whose host side it is; "self" for "self"): for a second
  // issuing thread (the async checkpoint writer) or host-side bookkeeping, whatever the backend.
  virtual CommPtr host_duplicate(const std::string& name);
  // The defaults (the self communicator's) serve size 1 only.

  // ---- synchronous helpers built on the collectives above (same ordering contract) ----
  // True on every rank if `flag` is true on any rank.
  bool any(bool flag);
  // Rank `root`'s string on every rank.
  std::string broadcast_string(const std::string& s, int root);
  // Error agreement: the lowest rank whose `error` is non-empty and its string, on every rank
  // (rank -1 and "" when no rank has one). Used before side effects so that bad input stops all
  // ranks together with the same one-line message; runtime/comm/agree.h builds its typed agreement
  // (kind and exit code kept) on it.
  struct LowestError {
    int rank = -1;
    std::string error;
  };
  LowestError lowest_error(const std::string& error);
  // The same as one line: "rank R: <error>" of the lowest failing rank, else "".
  std::string agree_error(const std::string& error);
};

// The three process groups the runtime uses. intra: ranks on the same node; inter: ranks with the
// same local rank across nodes. For a single node inter has size 1; with one rank per node intra
// has size 1.
struct ProcessGroups {
  CommPtr world, intra, inter;
};

// A communicator of size 1 (no MPI): for single-process runs and pure unit tests.
CommPtr make_self_communicator(const std::string& name = "self");

}  // namespace tessera::comm
