// MPI backend: one communication thread per communicator running a FIFO of collectives on a
// private duplicate of the MPI communicator. Large reductions and broadcasts (thresholds below) use
// the ring/chain algorithms of mpi_ring.h (point-to-point, straight on the caller's buffers, uneven
// sizes included); everything else uses MPI's own collectives. 16-bit float reductions are computed in fp32
// and rounded once.
#include "runtime/comm/mpi_backend.h"

#include <torch/torch.h>

#include <climits>
#include <cstdlib>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <iomanip>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>

#include "runtime/comm/collective_checks.h"
#include "runtime/comm/flight_recorder.h"
#include "runtime/comm/mpi_bench_hooks.h"
#include "runtime/comm/mpi_ring.h"
#include "runtime/memory/tracker.h"
#include "util/error.h"

namespace tessera::comm {
namespace {

using detail::chunk_of;
using detail::overlaps;
using ring::check_mpi;

// From these sizes (bytes of the whole buffer; 16-bit float reductions count their fp32 size) on,
// reductions and broadcasts run the algorithms of mpi_ring.h; below, MPI's own (latency-optimised)
// collectives. Chosen from `tessera bench collectives` sweeps (4 KiB - 64 MiB, 2 and 4 ranks,
// shared memory and TCP; README, performance): the ring reduce-scatter wins from 64-256 KiB on,
// all-reduce and the chained broadcast from about 1 MiB. All-gather stays MPI_Allgather at every
// size: the ring measured no better at 64 MiB (0.85-1.10x in interleaved runs) and worse on 4 ranks
// at 1-8 MiB.
constexpr int64_t kRingReduceScatterMinBytes = 256 << 10;
constexpr int64_t kRingAllReduceMinBytes = 1 << 20;
constexpr int64_t kChainBroadcastMinBytes = 1 << 20;
// Segment of the chained broadcast.
constexpr int64_t kBroadcastSegmentBytes = 1 << 20;

enum class Collective { AllGather, ReduceScatter, AllReduce, Broadcast };
enum class Algorithm { Mpi, Ring, Chain };

// The one place that decides which algorithm a collective runs (mpi_algorithm() reports it).
Algorithm algorithm_for(Collective op, int64_t count, at::ScalarType dt, int size) {
  const bool reduction = op == Collective::ReduceScatter || op == Collective::AllReduce;
  const int64_t bytes = count * static_cast<int64_t>(reduction && detail::reduce_in_fp32(dt) ? 4 : c10::elementSize(dt));
  switch (op) {
    case Collective::ReduceScatter: return bytes >= kRingReduceScatterMinBytes ? Algorithm::Ring : Algorithm::Mpi;
    case Collective::AllReduce: return bytes >= kRingAllReduceMinBytes ? Algorithm::Ring : Algorithm::Mpi;
    case Collective::Broadcast:
      return bytes >= kChainBroadcastMinBytes && size > 1 ? Algorithm::Chain : Algorithm::Mpi;
    case Collective::AllGather: return Algorithm::Mpi;
  }
  return Algorithm::Mpi;
}

std::string seconds_text(std::chrono::milliseconds t) {
  std::ostringstream s;
  s << std::setprecision(6) << t.count() / 1000.0 << "s";
  return s.str();
}

std::chrono::milliseconds stop_ms() {
  return std::chrono::milliseconds(static_cast<int64_t>(flight::last_stop_s() * 10) * 100);  // 0.1 s
}

// ---- Work: completed by the communication thread, awaited by the caller -----------------------

class MpiWork : public Work {
 public:
  // `comm` and `recorder`: the communicator that runs the operation and its flight recorder, `seq`
  // the operation's sequence number there (for the timeout message).
  MpiWork(std::string what, std::weak_ptr<Communicator> comm, const flight::Recorder* recorder, uint64_t seq)
      : what_(std::move(what)), comm_(std::move(comm)), recorder_(recorder), seq_(seq) {}

  void wait(std::chrono::milliseconds timeout) override {
    // Clamp so that "wait forever" style values do not overflow the clock arithmetic.
    auto limit = std::min<std::chrono::milliseconds>(timeout, std::chrono::hours(24 * 365));
    const int64_t stops = flight::times_stopped();
    std::unique_lock<std::mutex> lk(m_);
    if (!cv_.wait_for(lk, limit, [&] { return done_; })) {
      lk.unlock();
      std::string op;
      if (CommPtr comm = comm_.lock()) {
        op = ", " + recorder_->describe(seq_) + ",";
        // Its thread may never come back from MPI: the communicator must outlive this process's
        // unwinding (no destructor may join that thread).
        detail::keep_alive_forever(comm);
      }
      std::string msg = what_ + op + " did not complete within " + seconds_text(timeout) +
                        (flight::times_stopped() != stops
                             ? " (this process itself was stopped for " + seconds_text(stop_ms()) + " while it waited)"
                             : " (collectives must be issued in the same order on every rank of the communicator)");
      flight::dump("timeout", msg);
      throw Error(ErrorKind::Timeout, msg, __FILE__, __LINE__);
    }
    if (error_) std::rethrow_exception(error_);
  }

  bool is_completed() override {
    std::lock_guard<std::mutex> lk(m_);
    return done_;
  }

  void finish(std::exception_ptr error) {
    std::lock_guard<std::mutex> lk(m_);
    done_ = true;
    error_ = error;
    cv_.notify_all();
  }

  const std::string& what() const { return what_; }

 private:
  std::string what_;  // "all_gather on comm 'world' (rank 0 of 2, host h)"
  std::weak_ptr<Communicator> comm_;
  const flight::Recorder* recorder_;  // alive while comm_ is
  uint64_t seq_;
  std::mutex m_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

// ---- dtype mapping ----------------------------------------------------------------------------

// The MPI type used to MOVE elements of `t` (16-bit floats travel as opaque 16-bit words).
MPI_Datatype move_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return MPI_FLOAT;
    case at::kDouble: return MPI_DOUBLE;
    case at::kHalf:
    case at::kBFloat16: return MPI_UINT16_T;
    case at::kInt: return MPI_INT32_T;
    case at::kLong: return MPI_INT64_T;
    case at::kByte: return MPI_UINT8_T;
    default: return MPI_DATATYPE_NULL;
  }
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Mean: return MPI_SUM;  // Mean divides by size afterwards
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Min: return MPI_MIN;
  }
  return MPI_SUM;
}

// World ranks of the members of `comm`, in its rank order (local; no communication).
std::vector<int> mpi_world_ranks(MPI_Comm comm) {
  int size = 0;
  MPI_Comm_size(comm, &size);
  std::vector<int> mine(size), world(size, -1);
  for (int r = 0; r < size; ++r) mine[r] = r;
  MPI_Group g = MPI_GROUP_NULL, wg = MPI_GROUP_NULL;
  MPI_Comm_group(comm, &g);
  MPI_Comm_group(MPI_COMM_WORLD, &wg);
  MPI_Group_translate_ranks(g, size, mine.data(), wg, world.data());
  MPI_Group_free(&g);
  MPI_Group_free(&wg);
  return world;
}

// ---- the communicator -------------------------------------------------------------------------

class MpiCommunicator : public Communicator, public std::enable_shared_from_this<MpiCommunicator> {
 public:
  // Takes ownership of `comm` (already a private duplicate).
  MpiCommunicator(MPI_Comm comm, std::string name) : comm_(comm), name_(std::move(name)) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);  // MPI failures become exceptions in wait()
    MPI_Comm_set_name(comm_, const_cast<char*>(("tessera:" + name_).c_str()));
    host_ = process_host();
    if (host_.empty()) {
      char buf[MPI_MAX_PROCESSOR_NAME];
      int len = 0;
      MPI_Get_processor_name(buf, &len);
      host_.assign(buf, len);
    }
    recorder_ = std::make_unique<flight::Recorder>(name_, "mpi", rank_, size_, mpi_world_ranks(comm_));
    worker_ = std::thread([this] { run_queue(); });
  }

  ~MpiCommunicator() override {
    {
      std::lock_guard<std::mutex> lk(qm_);
      stop_ = true;
    }
    qcv_.notify_all();
    worker_.join();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }
  std::string name() const override { return name_; }

  WorkPtr all_gather_into(at::Tensor out, at::Tensor in) override {
    std::string where = describe("all_gather");
    int64_t chunk = detail::check_all_gather(out, in, size_, where);
    MPI_Datatype type = check_movable(in, where);
    check_count(chunk * size_, where);
    return enqueue(where, flight::op_info(flight::Op::AllGather, out), [this, out, in, chunk, type] {
      const int64_t n = out.numel(), esz = in.element_size();
      if (n == 0) return;
      char* outp = static_cast<char*>(out.data_ptr());
      if (n == chunk * size_) {
        if (in.data_ptr() == outp + rank_ * chunk * esz) {  // in place: in is out's own chunk
          check_mpi(MPI_Allgather(MPI_IN_PLACE, 0, type, outp, chunk, type, comm_), "MPI_Allgather");
        } else {
          at::Tensor src = overlaps(in, out) ? in.clone() : in;
          check_mpi(MPI_Allgather(src.data_ptr(), chunk, type, outp, chunk, type, comm_), "MPI_Allgather");
        }
        return;
      }
      // Uneven: gather size*chunk elements, keep the first n.
      at::Tensor full = at::empty({chunk * size_}, in.options());
      check_mpi(MPI_Allgather(in.data_ptr(), chunk, type, full.data_ptr(), chunk, type, comm_), "MPI_Allgather");
      std::memcpy(outp, full.data_ptr(), n * esz);
    });
  }

  WorkPtr reduce_scatter_into(at::Tensor out, at::Tensor in, ReduceOp op) override {
    std::string where = describe(std::string("reduce_scatter(") + detail::op_name(op) + ")");
    int64_t chunk = detail::check_reduce_scatter(out, in, op, size_, where);
    check_movable(in, where);
    check_count(chunk * size_, where);
    return enqueue(where, flight::op_info(flight::Op::ReduceScatter, in, static_cast<int>(op)), [this, out, in, op, chunk] {
      const int64_t n = in.numel(), padded = chunk * size_;
      if (n == 0) return;
      const bool widen = detail::reduce_in_fp32(in.scalar_type());
      const auto red_dtype = widen ? at::kFloat : in.scalar_type();
      const bool in_place = out.data_ptr() == static_cast<char*>(in.data_ptr()) + rank_ * chunk * in.element_size();
      if (algorithm_for(Collective::ReduceScatter, n, in.scalar_type(), size_) == Algorithm::Ring &&
          (in_place || !overlaps(out, in))) {
        ring_reduce_scatter(out, in, op, widen, in_place);
        return;
      }
      // In place, even and unwidened: MPI leaves the result at the start of `in`; move it to this
      // rank's chunk (disjoint from the start for rank > 0). No temporary.
      if (!widen && n == padded && in_place) {
        check_mpi(MPI_Reduce_scatter_block(MPI_IN_PLACE, in.data_ptr(), chunk, move_type(red_dtype), mpi_op(op), comm_),
                  "MPI_Reduce_scatter_block");
        if (rank_ != 0) std::memcpy(out.data_ptr(), in.data_ptr(), chunk * in.element_size());
        if (op == ReduceOp::Mean) out.div_(size_);
        return;
      }
      // Source: the caller's buffer, unless it must be padded to size*chunk or widened to fp32.
      at::Tensor src = in;
      if (widen || n != padded) {
        src = at::empty({padded}, in.options().dtype(red_dtype));
        src.narrow(0, 0, n).copy_(in.view({-1}));
        src.narrow(0, n, padded - n).zero_();  // padding reduces to 0 in every op
      }
      // Destination: the caller's chunk, unless widened or aliasing the source (MPI forbids that).
      at::Tensor dst = (widen || overlaps(out, src)) ? at::empty({chunk}, src.options()) : out;
      MPI_Datatype type = move_type(red_dtype);
      check_mpi(MPI_Reduce_scatter_block(src.data_ptr(), dst.data_ptr(), chunk, type, mpi_op(op), comm_),
                "MPI_Reduce_scatter_block");
      if (op == ReduceOp::Mean) dst.div_(size_);
      if (!dst.is_same(out)) out.view({-1}).copy_(dst);  // rounds fp32 -> bf16/fp16 once
    });
  }

  WorkPtr all_reduce(at::Tensor t, ReduceOp op) override {
    std::string where = describe(std::string("all_reduce(") + detail::op_name(op) + ")");
    detail::check_reducible(t, op, where);
    check_movable(t, where);
    check_count(t.numel(), where);
    return enqueue(where, flight::op_info(flight::Op::AllReduce, t, static_cast<int>(op)), [this, t, op] {
      if (t.numel() == 0) return;
      at::Tensor buf = detail::reduce_in_fp32(t.scalar_type()) ? t.to(at::kFloat) : t;
      const MPI_Datatype type = move_type(buf.scalar_type());
      const int64_t n = buf.numel(), esz = buf.element_size();
      if (algorithm_for(Collective::AllReduce, n, t.scalar_type(), size_) == Algorithm::Ring) {
        ring::all_reduce(static_cast<char*>(buf.data_ptr()), n, scratch(chunk_of(n, size_) * esz),
                         static_cast<int>(esz), type, mpi_op(op), comm_);
      } else {
        check_mpi(MPI_Allreduce(MPI_IN_PLACE, buf.data_ptr(), n, type, mpi_op(op), comm_), "MPI_Allreduce");
      }
      if (op == ReduceOp::Mean) buf.div_(size_);
      if (!buf.is_same(t)) t.copy_(buf);
    });
  }

  WorkPtr broadcast(at::Tensor t, int root) override {
    std::string where = describe("broadcast");
    detail::check_contiguous(t, "broadcast", where);
    MPI_Datatype type = check_movable(t, where);
    check_count(t.numel(), where);
    if (root < 0 || root >= size_)
      throw TESSERA_INPUT_ERROR(where + ": root " + std::to_string(root) + " is not a rank");
    return enqueue(where, flight::op_info(flight::Op::Broadcast, t, -1, root), [this, t, root, type] {
      const int64_t n = t.numel(), esz = t.element_size();
      if (n == 0) return;
      if (algorithm_for(Collective::Broadcast, n, t.scalar_type(), size_) == Algorithm::Chain)
        ring::broadcast(static_cast<char*>(t.data_ptr()), n, root, kBroadcastSegmentBytes / esz, static_cast<int>(esz),
                        type, comm_);
      else
        check_mpi(MPI_Bcast(t.data_ptr(), n, type, root, comm_), "MPI_Bcast");
    });
  }

  WorkPtr scatter_into(at::Tensor out, at::Tensor in, int root) override {
    std::string where = describe("scatter");
    detail::check_contiguous(out, "scatter output", where);
    MPI_Datatype type = check_movable(out, where);
    const int64_t chunk = out.numel();
    check_count(chunk, where);
    if (root < 0 || root >= size_)
      throw TESSERA_INPUT_ERROR(where + ": root " + std::to_string(root) + " is not a rank");
    if (rank_ == root) {
      detail::check_contiguous(in, "scatter input", where);
      if (in.numel() != chunk * size_ || in.scalar_type() != out.scalar_type())
        throw TESSERA_INPUT_ERROR(where + ": input must have " + std::to_string(chunk * size_) +
                                  " elements of the output's dtype, got " + std::to_string(in.numel()));
    }
    return enqueue(where, flight::op_info(flight::Op::Scatter, out, -1, root), [this, out, in, root, type, chunk] {
      if (chunk == 0) return;
      const void* send = rank_ == root ? in.data_ptr() : nullptr;
      check_mpi(MPI_Scatter(send, static_cast<int>(chunk), type, out.data_ptr(), static_cast<int>(chunk), type, root,
                            comm_),
                "MPI_Scatter");
    });
  }

  WorkPtr scatter_pieces(std::vector<at::Tensor> out, std::vector<std::vector<at::Tensor>> pieces, int root) override {
    std::string where = describe("scatter_pieces");
    detail::check_scatter_pieces(out, pieces, rank_, size_, root, where);
    for (const auto& t : out) {
      check_movable(t, where);
      check_count(t.numel(), where);
    }
    for (const auto& list : pieces)
      for (const auto& t : list) {
        check_movable(t, where);
        check_count(t.numel(), where);
      }
    flight::OpInfo info = flight::op_info(flight::Op::ScatterPieces, out.empty() ? at::Tensor() : out[0], -1, root);
    info.count = info.bytes = 0;  // every piece this rank receives (sizes differ between ranks)
    for (const auto& t : out) info.count += t.numel(), info.bytes += static_cast<int64_t>(t.nbytes());
    return enqueue(where, info, [this, out = std::move(out), pieces = std::move(pieces), root] {
      // One message per piece, straight from/to the callers' buffers; MPI's non-overtaking rule
      // (same source, tag and communicator) matches them in order.
      std::vector<MPI_Request> reqs;
      if (rank_ == root) {
        for (int r = 0; r < size_; ++r) {
          if (r == root) continue;
          for (const auto& t : pieces[r]) {
            if (t.numel() == 0) continue;
            reqs.emplace_back();
            check_mpi(MPI_Isend(t.data_ptr(), static_cast<int>(t.numel()), move_type(t.scalar_type()), r, 0, comm_,
                                &reqs.back()),
                      "MPI_Isend");
          }
        }
        for (size_t i = 0; i < out.size(); ++i)  // an empty piece's data_ptr() is null: no memcpy (UB)
          if (out[i].numel() > 0)
            std::memcpy(out[i].data_ptr(), pieces[root][i].data_ptr(), out[i].numel() * out[i].element_size());
      } else {
        for (const auto& t : out) {
          if (t.numel() == 0) continue;
          reqs.emplace_back();
          check_mpi(MPI_Irecv(t.data_ptr(), static_cast<int>(t.numel()), move_type(t.scalar_type()), root, 0, comm_,
                              &reqs.back()),
                    "MPI_Irecv");
        }
      }
      // Polled politely rather than spun on: this thread shares cores with the caller's work
      // (e.g. the loader converting the root's own slices while the others receive).
      for (int done = 0;;) {
        check_mpi(MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE), "MPI_Testall");
        if (done) break;
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    });
  }

  WorkPtr barrier() override {
    flight::OpInfo info;
    info.op = flight::Op::Barrier;
    return enqueue(describe("barrier"), info, [this] { check_mpi(MPI_Barrier(comm_), "MPI_Barrier"); });
  }

  // Runs `fn(comm)` on the communication thread (ordered with the collectives) and waits for it.
  void run_ordered(const std::string& op, const std::function<void(MPI_Comm)>& fn) const {
    auto self = const_cast<MpiCommunicator*>(this);  // the queue is internally synchronised
    self->enqueue(describe(op), flight::OpInfo{}, [self, &fn] { fn(self->comm_); })->wait();
  }

  CommPtr split(int color, int key, const std::string& name) override {
    MPI_Comm split = MPI_COMM_NULL;
    int rc = MPI_SUCCESS;
    run_ordered("split", [&](MPI_Comm c) { rc = MPI_Comm_split(c, color < 0 ? MPI_UNDEFINED : color, key, &split); });
    TESSERA_CHECK(rc == MPI_SUCCESS, "MPI_Comm_split of comm '" + name_ + "' into '" + name + "' failed");
    if (split == MPI_COMM_NULL) return nullptr;
    return std::make_shared<MpiCommunicator>(split, name);
  }

  CommPtr host_duplicate(const std::string& name) override {
    MPI_Comm dup = MPI_COMM_NULL;
    int rc = MPI_SUCCESS;
    run_ordered("dup", [&](MPI_Comm c) { rc = MPI_Comm_dup(c, &dup); });
    TESSERA_CHECK(rc == MPI_SUCCESS, "MPI_Comm_dup of comm '" + name_ + "' into '" + name + "' failed");
    return std::make_shared<MpiCommunicator>(dup, name);
  }

 private:
  std::string describe(const std::string& op) const {
    return op + " on " + detail::describe(name_, rank_, size_, host_);
  }

  // Ring reduce-scatter (mpi_ring.h) of `in` into `out` (not overlapping, or in's own chunk). The
  // ring works on in's n elements directly (blocks past n are empty: out's padding is zeroed here).
  // 16-bit floats are widened into a temporary first, which then serves as the accumulator.
  void ring_reduce_scatter(const at::Tensor& out, const at::Tensor& in, ReduceOp op, bool widen, bool in_place) {
    const int64_t n = in.numel(), chunk = out.numel();
    const ring::Blocks b(n, size_);
    const MPI_Op mop = mpi_op(op);
    if (widen) {
      // In segments of at most kHostWidenedReductionBytes of fp32: segment j takes
      // elements [j s, j s + s) of every rank's block into an fp32 accumulator of `size` blocks of
      // s (zero past a block's end), ring-reduces it, and rounds this rank's part into `out` once.
      // Each element meets the same ranks in the same ring order as one whole-input pass, so the
      // result is the same; the fp32 copy is bounded instead of 4 bytes x the whole input.
      // TESSERA_WIDENED_REDUCTION_BYTES overrides the bound (tests use it to make segments small;
      // every rank must see the same value).
      const char* env = std::getenv("TESSERA_WIDENED_REDUCTION_BYTES");
      const int64_t budget = env && std::atoll(env) > 0 ? static_cast<int64_t>(std::atoll(env))
                                                          : kHostWidenedReductionBytes;
      const int64_t s = std::max<int64_t>(1, std::min<int64_t>(b.chunk, budget / (4 * static_cast<int64_t>(size_))));
      const ring::Blocks sb(s * size_, size_);
      at::Tensor acc = at::empty({s * size_}, in.options().dtype(at::kFloat));
      char* accp = static_cast<char*>(acc.data_ptr());
      for (int64_t j = 0; j < b.chunk; j += s) {
        for (int q = 0; q < size_; ++q) {
          const int64_t len = std::clamp<int64_t>(b.count(q) - j, 0, s);
          if (len > 0) acc.narrow(0, q * s, len).copy_(in.narrow(0, b.offset(q) + j, len));
          if (len < s) acc.narrow(0, q * s + len, s - len).zero_();
        }
        ring::reduce_scatter(accp, true, accp + static_cast<int64_t>(rank_) * s * 4, scratch(s * 4), sb, 4, MPI_FLOAT,
                             mop, comm_);
        const int64_t mine = std::clamp<int64_t>(b.count(rank_) - j, 0, s);
        if (mine == 0) continue;
        at::Tensor part = acc.narrow(0, rank_ * s, mine);
        if (op == ReduceOp::Mean) part.div_(size_);
        out.narrow(0, j, mine).copy_(part);  // rounds fp32 -> bf16/fp16 once
      }
    } else {
      const int esz = static_cast<int>(in.element_size());
      ring::reduce_scatter(static_cast<char*>(in.data_ptr()), in_place, static_cast<char*>(out.data_ptr()),
                           scratch(chunk * esz), b, esz, move_type(in.scalar_type()), mop, comm_);
      if (op == ReduceOp::Mean) out.narrow(0, 0, b.count(rank_)).div_(size_);
    }
    out.narrow(0, b.count(rank_), chunk - b.count(rank_)).zero_();
  }

  // This communicator's scratch buffer, at least `bytes` long; communication thread only. Kept
  // (and grown) across calls: fresh memory costs a page fault per 4 KiB on first touch, as much as
  // the transfer itself on a slow VM.
  char* scratch(int64_t bytes) {
    if (bytes > scratch_bytes_) {
      scratch_.reset(new char[bytes]);
      scratch_bytes_ = bytes;
    }
    return scratch_.get();
  }

  static MPI_Datatype check_movable(const at::Tensor& t, const std::string& where) {
    if (!t.device().is_cpu())
      throw TESSERA_INPUT_ERROR(where + ": the MPI backend takes CPU tensors, got one on " + t.device().str());
    MPI_Datatype type = move_type(t.scalar_type());
    if (type == MPI_DATATYPE_NULL)
      throw TESSERA_INPUT_ERROR(where + ": dtype " + std::string(c10::toString(t.scalar_type())) +
                                " is not supported (float32, bfloat16, float16, int32, int64, uint8)");
    return type;
  }

  static void check_count(int64_t count, const std::string& where) {
    if (count > INT_MAX)
      throw TESSERA_INPUT_ERROR(where + ": " + std::to_string(count) +
                                " elements exceed MPI's per-call count limit (2^31-1); split the tensor");
  }

  // Records the operation (caller's thread) and queues it for the communication thread.
  WorkPtr enqueue(std::string what, const flight::OpInfo& info, std::function<void()> fn) {
    const uint64_t seq = recorder_->enqueue(info);
    auto work = std::make_shared<MpiWork>(std::move(what), weak_from_this(), recorder_.get(), seq);
    {
      std::lock_guard<std::mutex> lk(qm_);
      queue_.push_back({std::move(fn), work, seq});
    }
    qcv_.notify_one();
    return work;
  }

  void run_queue() {
    memory::set_thread_default(memory::Category::CommBuffers);
    at::NoGradGuard no_grad;  // grad mode is thread-local: collectives never record autograd history
    for (;;) {
      Task task;
      {
        std::unique_lock<std::mutex> lk(qm_);
        qcv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stop_ and drained
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      std::exception_ptr error;
      recorder_->start(task.seq);
      try {
        task.fn();
      } catch (const Error& e) {
        error = std::make_exception_ptr(prefixed(e, task.work->what()));
      } catch (const std::exception& e) {
        error = std::make_exception_ptr(
            Error(ErrorKind::Internal, task.work->what() + ": " + e.what(), __FILE__, __LINE__));
      }
      recorder_->end(task.seq, !error);
      task.work->finish(error);
    }
  }

  // `e` with the operation and communicator named in front of its message; kind and source
  // location are kept.
  static Error prefixed(const Error& e, const std::string& prefix) {
    const std::string& loc = e.location();
    auto colon = loc.rfind(':');
    std::string file = colon == std::string::npos ? "" : loc.substr(0, colon);
    int line = colon == std::string::npos ? 0 : std::atoi(loc.c_str() + colon + 1);
    return Error(e.kind(), prefix + ": " + e.what(), file.empty() ? nullptr : file.c_str(), line);
  }

  struct Task {
    std::function<void()> fn;
    std::shared_ptr<MpiWork> work;
    uint64_t seq = 0;  // in recorder_
  };



  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  std::string name_, host_;
  std::mutex qm_;
  std::condition_variable qcv_;
  std::deque<Task> queue_;
  bool stop_ = false;
  std::unique_ptr<char[]> scratch_;
  int64_t scratch_bytes_ = 0;
  std::unique_ptr<flight::Recorder> recorder_;
  std::thread worker_;
};

const MpiCommunicator& as_mpi(const Communicator& c, const char* what) {
  auto* mpi = dynamic_cast<const MpiCommunicator*>(&c);
  if (!mpi)
    throw TESSERA_INPUT_ERROR(std::string(what) + ": comm '" + c.name() + "' uses the '" + c.backend() +
                              "' backend, not 'mpi'");
  return *mpi;
}

}  // namespace

CommPtr make_mpi_communicator(MPI_Comm comm, const std::string& name) {
  int initialized = 0, level = 0;
  MPI_Initialized(&initialized);
  TESSERA_CHECK(initialized, "make_mpi_communicator('" + name + "') called before MPI_Init_thread");
  MPI_Query_thread(&level);
  TESSERA_CHECK(level == MPI_THREAD_MULTIPLE,
                "the MPI backend runs collectives on a communication thread and needs MPI_THREAD_MULTIPLE "
                "(MPI was initialised with level " + std::to_string(level) + ")");
  MPI_Comm dup = MPI_COMM_NULL;
  TESSERA_CHECK(MPI_Comm_dup(comm, &dup) == MPI_SUCCESS, "MPI_Comm_dup failed for comm '" + name + "'");
  return std::make_shared<MpiCommunicator>(dup, name);
}


std::string mpi_algorithm(const std::string& op, int64_t count, at::ScalarType dtype, int size) {
  static const std::pair<const char*, Collective> kNames[] = {{"all_gather", Collective::AllGather},
                                                              {"reduce_scatter", Collective::ReduceScatter},
                                                              {"all_reduce", Collective::AllReduce},
                                                              {"broadcast", Collective::Broadcast}};
  for (const auto& [name, c] : kNames)
    if (op == name) {
      switch (algorithm_for(c, count, dtype, size)) {
        case Algorithm::Ring: return "ring";
        case Algorithm::Chain: return "chain";
        case Algorithm::Mpi: return "mpi";
      }
    }
  throw TESSERA_INPUT_ERROR("mpi_algorithm: '" + op + "' is not one of all_gather, reduce_scatter, all_reduce, broadcast");
}

void mpi_run_ordered(const Communicator& comm, const std::function<void(MPI_Comm)>& fn) {
  as_mpi(comm, "mpi_run_ordered").run_ordered("run_ordered", fn);
}

}  // namespace tessera::comm
