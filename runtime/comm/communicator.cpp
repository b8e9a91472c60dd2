// Backend-independent parts of the Communicator seam: default timeout, the synchronous helpers
// (any / broadcast_string / agree_error) built on the virtual collectives, the argument checks
// every backend shares, and the size-1 "self" communicator.
#include "runtime/comm/communicator.h"

#include <torch/torch.h>

#include <atomic>
#include <cstring>
#include <mutex>

#include "runtime/comm/collective_checks.h"
#include "runtime/comm/flight_recorder.h"
#include "util/error.h"

namespace tessera::comm {

namespace {
std::atomic<int64_t> g_default_timeout_ms{600 * 1000};
}  // namespace

std::chrono::milliseconds default_timeout() { return std::chrono::milliseconds(g_default_timeout_ms.load()); }

void set_default_timeout(std::chrono::milliseconds t) {
  if (t.count() <= 0) throw TESSERA_INPUT_ERROR("comm.timeout_s must be positive, got " + std::to_string(t.count()) + " ms");
  g_default_timeout_ms.store(t.count());
}

void Work::wait() { wait(default_timeout()); }

// ---- default scatter ----------------------------------------------------------------------------

WorkPtr Communicator::scatter_into(at::Tensor out, at::Tensor in, int root) {
  const std::string where = "scatter_into on comm '" + name() + "' (rank " + std::to_string(rank()) + ")";
  if (root < 0 || root >= size()) throw TESSERA_INPUT_ERROR(where + ": root " + std::to_string(root) + " is not a rank");
  detail::check_contiguous(out, "scatter_into output", where);
  const int64_t chunk = out.numel();
  if (rank() == root) {
    detail::check_contiguous(in, "scatter_into input", where);
    if (in.numel() != chunk * size() || in.scalar_type() != out.scalar_type())
      throw TESSERA_INPUT_ERROR(where + ": input must have " + std::to_string(chunk * size()) +
                                " elements of the output's dtype, got " + std::to_string(in.numel()));
    at::NoGradGuard no_grad;
    out.view({-1}).copy_(in.view({-1}).narrow(0, root * chunk, chunk));
  }
  // One broadcast per non-root rank; operations complete in issue order, so the last one's Work
  // completes the scatter. Tensors are captured by the backend until their operation is done.
  WorkPtr last;
  at::Tensor scratch;
  for (int r = 0; r < size(); ++r) {
    if (r == root) continue;
    at::Tensor buf;
    if (rank() == root) {
      buf = in.view({-1}).narrow(0, r * chunk, chunk);
    } else if (rank() == r) {
      buf = out.view({-1});
    } else {
      if (!scratch.defined()) scratch = at::empty({chunk}, out.options());
      buf = scratch;
    }
    last = broadcast(buf, root);
  }
  return last ? last : barrier();
}

WorkPtr Communicator::scatter_pieces(std::vector<at::Tensor> out, std::vector<std::vector<at::Tensor>> pieces,
                                     int root) {
  const std::string where = "scatter_pieces on comm '" + name() + "' (rank " + std::to_string(rank()) + ")";
  detail::check_scatter_pieces(out, pieces, rank(), size(), root, where);
  if (size() != 1)
    throw TESSERA_INPUT_ERROR(where + ": the '" + backend() + "' backend does not implement scatter_pieces");
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < out.size(); ++i) out[i].view({-1}).copy_(pieces[0][i].view({-1}));
  return barrier();
}

// ---- synchronous helpers ------------------------------------------------------------------------

bool Communicator::any(bool flag) {
  at::Tensor t = at::full({1}, flag ? 1 : 0, at::TensorOptions().dtype(at::kByte).device(device()));
  all_reduce(t, ReduceOp::Max)->wait();
  return t.cpu().item<uint8_t>() != 0;
}

std::string Communicator::broadcast_string(const std::string& s, int root) {
  auto opts = at::TensorOptions().device(device());
  at::Tensor len = at::full({1}, static_cast<int64_t>(s.size()), opts.dtype(at::kLong));
  broadcast(len, root)->wait();
  int64_t n = len.cpu().item<int64_t>();
  if (n == 0) return "";
  at::Tensor bytes = at::empty({n}, at::TensorOptions().dtype(at::kByte));
  if (rank() == root) std::memcpy(bytes.data_ptr(), s.data(), n);
  bytes = bytes.to(device());
  broadcast(bytes, root)->wait();
  bytes = bytes.cpu();
  return std::string(static_cast<const char*>(bytes.data_ptr()), n);
}

CommPtr Communicator::split(int color, int /*key*/, const std::string& name) {
  TESSERA_CHECK(size() == 1, "comm '" + this->name() + "' (" + backend() + ") cannot split");
  return color < 0 ? nullptr : make_self_communicator(name);
}

CommPtr Communicator::host_duplicate(const std::string& name) {
  TESSERA_CHECK(size() == 1, "comm '" + this->name() + "' (" + backend() + ") has no host duplicate");
  return make_self_communicator(name);
}

Communicator::LowestError Communicator::lowest_error(const std::string& error) {
  // Lowest failing rank wins: every rank contributes its rank if it failed, else size().
  at::Tensor who = at::full({1}, error.empty() ? size() : rank(),
                            at::TensorOptions().dtype(at::kInt).device(device()));
  all_reduce(who, ReduceOp::Min)->wait();
  const int lowest = who.cpu().item<int32_t>();
  if (lowest == size()) return {};
  return {lowest, broadcast_string(error, lowest)};
}

std::string Communicator::agree_error(const std::string& error) {
  const LowestError e = lowest_error(error);
  return e.rank < 0 ? "" : "rank " + std::to_string(e.rank) + ": " + e.error;
}

// ---- checks shared by all backends -------------------------------------------------------------

namespace detail {

const char* op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Mean: return "mean";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}

std::string describe(const std::string& comm_name, int rank, int size, const std::string& host) {
  return "comm '" + comm_name + "' (rank " + std::to_string(rank) + " of " + std::to_string(size) +
         ", host " + (host.empty() ? "?" : host) + ")";
}

void check_contiguous(const at::Tensor& t, const char* role, const std::string& where) {
  if (!t.defined()) throw TESSERA_INPUT_ERROR(where + ": " + role + " tensor is undefined");
  if (!t.is_contiguous())
    throw TESSERA_INPUT_ERROR(where + ": " + role + " tensor must be contiguous (shape " +
                              c10::str(t.sizes()) + ", strides " + c10::str(t.strides()) + ")");
}

void check_scatter_pieces(const std::vector<at::Tensor>& out, const std::vector<std::vector<at::Tensor>>& pieces,
                          int rank, int size, int root, const std::string& where) {
  if (root < 0 || root >= size) throw TESSERA_INPUT_ERROR(where + ": root " + std::to_string(root) + " is not a rank");
  for (const auto& t : out) check_contiguous(t, "scatter_pieces output", where);
  if (rank != root) return;
  if (static_cast<int>(pieces.size()) != size)
    throw TESSERA_INPUT_ERROR(where + ": root must pass pieces for each of the " + std::to_string(size) +
                              " ranks, got " + std::to_string(pieces.size()));
  // The one dtype: the outputs' if root has any, else the first piece's.
  const at::Tensor* first = out.empty() ? nullptr : &out[0];
  for (const auto& list : pieces)
    if (!first && !list.empty()) first = &list[0];
  const at::ScalarType dtype = first ? first->scalar_type() : at::kFloat;
  for (const auto& list : pieces)
    for (const auto& t : list) {
      check_contiguous(t, "scatter_pieces piece", where);
      if (t.scalar_type() != dtype || !t.device().is_cpu())
        throw TESSERA_INPUT_ERROR(where + ": pieces must be CPU tensors of one dtype (" +
                                  std::string(c10::toString(dtype)) + "), got " + c10::str(t.scalar_type(), " on ", t.device()));
    }
  const auto& own = pieces[static_cast<size_t>(root)];
  bool match = own.size() == out.size();
  for (size_t i = 0; match && i < own.size(); ++i)
    match = own[i].numel() == out[i].numel() && own[i].scalar_type() == out[i].scalar_type();
  if (!match) throw TESSERA_INPUT_ERROR(where + ": root's own pieces do not match its outputs one to one");
}

static void check_same_dtype(const at::Tensor& out, const at::Tensor& in, const std::string& where) {
  if (out.scalar_type() != in.scalar_type() || out.device() != in.device())
    throw TESSERA_INPUT_ERROR(where + ": out is " + c10::str(out.scalar_type(), " on ", out.device()) +
                              " but in is " + c10::str(in.scalar_type(), " on ", in.device()));
}

int64_t check_all_gather(const at::Tensor& out, const at::Tensor& in, int size, const std::string& where) {
  check_contiguous(out, "out", where);
  check_contiguous(in, "in", where);
  check_same_dtype(out, in, where);
  int64_t chunk = in.numel(), n = out.numel();
  if (chunk_of(n, size) != chunk)
    throw TESSERA_INPUT_ERROR(where + ": out has " + std::to_string(n) + " elements, so each of the " +
                              std::to_string(size) + " ranks must contribute ceil(" + std::to_string(n) +
                              "/" + std::to_string(size) + ") = " + std::to_string(chunk_of(n, size)) +
                              " elements, but in has " + std::to_string(chunk));
  return chunk;
}

int64_t check_reduce_scatter(const at::Tensor& out, const at::Tensor& in, ReduceOp op, int size,
                             const std::string& where) {
  check_contiguous(out, "out", where);
  check_reducible(in, op, where);
  check_same_dtype(out, in, where);
  int64_t chunk = chunk_of(in.numel(), size);
  if (out.numel() != chunk)
    throw TESSERA_INPUT_ERROR(where + ": in has " + std::to_string(in.numel()) + " elements, so out must have ceil(" +
                              std::to_string(in.numel()) + "/" + std::to_string(size) + ") = " +
                              std::to_string(chunk) + " elements, but it has " + std::to_string(out.numel()));
  return chunk;
}

void check_reducible(const at::Tensor& t, ReduceOp op, const std::string& where) {
  check_contiguous(t, "reduced", where);
  if (op == ReduceOp::Mean && !at::isFloatingType(t.scalar_type()))
    throw TESSERA_INPUT_ERROR(where + ": mean of a " + c10::str(t.scalar_type()) +
                              " tensor is not defined; use sum");
}

bool overlaps(const at::Tensor& a, const at::Tensor& b) {
  auto a0 = reinterpret_cast<uintptr_t>(a.data_ptr()), b0 = reinterpret_cast<uintptr_t>(b.data_ptr());
  auto a1 = a0 + a.nbytes(), b1 = b0 + b.nbytes();
  return a.nbytes() > 0 && b.nbytes() > 0 && a0 < b1 && b0 < a1;
}

void keep_alive_forever(CommPtr comm) {
  static std::mutex m;
  static auto* kept = new std::vector<CommPtr>();  // never destroyed, on purpose
  std::lock_guard<std::mutex> lk(m);
  for (const auto& c : *kept)
    if (c == comm) return;
  kept->push_back(std::move(comm));
}

}  // namespace detail

// ---- the size-1 communicator -------------------------------------------------------------------

namespace {

class CompletedWork : public Work {
 public:
  void wait(std::chrono::milliseconds) override {}
  bool is_completed() override { return true; }
};

// Every collective over one rank is a copy or nothing; it runs synchronously on the caller's thread
// (and is recorded there: enqueued, started and completed at once).
class SelfCommunicator : public Communicator {
 public:
  explicit SelfCommunicator(std::string name)
      : name_(std::move(name)), recorder_(name_, "self", 0, 1, {process_rank() < 0 ? 0 : process_rank()}) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "self"; }
  std::string name() const override { return name_; }

  WorkPtr all_gather_into(at::Tensor out, at::Tensor in) override {
    detail::check_all_gather(out, in, 1, where("all_gather_into"));
    Recorded r(recorder_, flight::op_info(flight::Op::AllGather, out));
    copy_flat(out, in);
    return done();
  }
  WorkPtr reduce_scatter_into(at::Tensor out, at::Tensor in, ReduceOp op) override {
    detail::check_reduce_scatter(out, in, op, 1, where("reduce_scatter_into"));
    Recorded r(recorder_, flight::op_info(flight::Op::ReduceScatter, in, static_cast<int>(op)));
    copy_flat(out, in);  // size 1: chunk == N, no padding; sum/mean/max/min of one value is itself
    return done();
  }
  WorkPtr all_reduce(at::Tensor t, ReduceOp op) override {
    detail::check_reducible(t, op, where("all_reduce"));
    Recorded r(recorder_, flight::op_info(flight::Op::AllReduce, t, static_cast<int>(op)));
    return done();
  }
  WorkPtr broadcast(at::Tensor t, int root) override {
    if (root != 0) throw TESSERA_INPUT_ERROR(where("broadcast") + ": root " + std::to_string(root) + " is not a rank");
    Recorded r(recorder_, flight::op_info(flight::Op::Broadcast, t, -1, root));
    return done();
  }
  WorkPtr barrier() override {
    flight::OpInfo info;
    info.op = flight::Op::Barrier;
    Recorded r(recorder_, info);
    return done();
  }

 private:
  // Records one synchronous operation: enqueued and started now, completed at scope exit.
  struct Recorded {
    Recorded(flight::Recorder& rec, const flight::OpInfo& info) : rec(rec), seq(rec.enqueue(info)) { rec.start(seq); }
    ~Recorded() { rec.end(seq, true); }
    flight::Recorder& rec;
    uint64_t seq;
  };
  std::string where(const char* op) const { return std::string(op) + " on comm '" + name_ + "' (self)"; }
  static void copy_flat(at::Tensor& out, const at::Tensor& in) {
    at::NoGradGuard no_grad;
    if (out.data_ptr() != in.data_ptr()) out.view({-1}).copy_(in.view({-1}));
  }
  static WorkPtr done() { return std::make_shared<CompletedWork>(); }
  std::string name_;
  flight::Recorder recorder_;
};

}  // namespace

CommPtr make_self_communicator(const std::string& name) { return std::make_shared<SelfCommunicator>(name); }

}  // namespace tessera::comm
