// NCCL backend (see nccl_backend.h). Raw device pointers come from tensor.data_ptr(); streams and
// events are driven through the CUDA runtime API, so this file builds with a CPU-only LibTorch too.
// Only what needs a CUDA LibTorch (its current stream, caching-allocator stream records, ATen ops
// on our stream for the fp32 widening of bf16/fp16 reductions) is under TESSERA_WITH_CUDA.
#include "runtime/comm/nccl_backend.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <torch/torch.h>

#include <atomic>
#include <condition_variable>
#include <list>
#include <mutex>
#include <thread>

#include "runtime/comm/collective_checks.h"
#include "runtime/comm/flight_recorder.h"
#include "runtime/comm/mpi_backend.h"
#include "runtime/error.h"

#ifdef TESSERA_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace tessera::comm {
namespace {

using detail::chunk_of;

void check_cuda(cudaError_t rc, const char* call, const std::string& who) {
  if (rc != cudaSuccess)
    throw Error(ErrorKind::Internal, who + ": " + call + " failed: " + cudaGetErrorString(rc), __FILE__, __LINE__);
}
void check_nccl(ncclResult_t rc, const char* call, const std::string& who) {
  if (rc != ncclSuccess)
    throw Error(ErrorKind::Internal, who + ": " + call + " failed: " + ncclGetErrorString(rc), __FILE__, __LINE__);
}
#define CUDA_OK(call, who) check_cuda((call), #call, (who))
#define NCCL_OK(call, who) check_nccl((call), #call, (who))

// The stream the caller computes on: LibTorch's current stream, or the legacy default stream.
cudaStream_t compute_stream(int device) {
#ifdef TESSERA_WITH_CUDA
  return c10::cuda::getCurrentCUDAStream(device).stream();
#else
  (void)device;
  return cudaStreamLegacy;
#endif
}

ncclDataType_t nccl_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kInt: return ncclInt32;
    case at::kLong: return ncclInt64;
    case at::kByte: return ncclUint8;
    default: return ncclNumTypes;
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Mean: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  return ncclSum;
}

bool reduce_in_fp32(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16; }

char* bytes(const at::Tensor& t) { return static_cast<char*>(t.data_ptr()); }

// An owned CUDA event (timing disabled).
struct Event {
  cudaEvent_t ev = nullptr;
  Event() { cudaEventCreateWithFlags(&ev, cudaEventDisableTiming); }
  ~Event() {
    if (ev) cudaEventDestroy(ev);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
};

class NcclCommunicator;

class NcclWork : public Work {
 public:
  NcclWork(std::shared_ptr<NcclCommunicator> comm, std::shared_ptr<Event> done, std::string what,
           std::vector<at::Tensor> keep, uint64_t seq)
      : comm_(std::move(comm)), done_(std::move(done)), what_(std::move(what)), keep_(std::move(keep)), seq_(seq) {}
  void wait(std::chrono::milliseconds timeout) override;
  bool is_completed() override;

 private:
  std::shared_ptr<NcclCommunicator> comm_;
  std::shared_ptr<Event> done_;
  std::string what_;
  std::vector<at::Tensor> keep_;  // inputs, outputs and temporaries stay alive with the handle
  uint64_t seq_;                  // in the communicator's flight recorder
};

class NcclCommunicator : public Communicator, public std::enable_shared_from_this<NcclCommunicator> {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size, int device, std::string name, std::string host,
                   const std::vector<int>& world_ranks)
      : comm_(comm), rank_(rank), size_(size), device_(device), name_(std::move(name)), host_(std::move(host)),
        recorder_(name_, "nccl", rank, size, world_ranks) {
    const std::string who = describe("init");
    CUDA_OK(cudaSetDevice(device_), who);
    CUDA_OK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), who);
    CUDA_OK(cudaMalloc(&barrier_buf_, sizeof(float)), who);
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclCommunicator() override {
    {
      std::lock_guard<std::mutex> lk(m_);
      stop_ = true;
    }
    cv_.notify_all();
    watchdog_.join();
    if (!aborted_) ncclCommDestroy(comm_);
    cudaFree(barrier_buf_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }
  std::string name() const override { return name_; }
  at::Device device() const override { return at::Device(at::kCUDA, device_); }

  WorkPtr all_gather_into(at::Tensor out, at::Tensor in) override {
    std::string who = describe("all_gather");
    int64_t chunk = detail::check_all_gather(out, in, size_, who);
    ncclDataType_t type = check_device_tensor(in, who);
    return issue(who, flight::op_info(flight::Op::AllGather, out), {out, in}, [&](std::vector<at::Tensor>& keep) {
      const int64_t n = out.numel(), esz = in.element_size();
      if (n == chunk * size_) {  // NCCL handles in-place (in == out + rank*chunk) natively
        NCCL_OK(ncclAllGather(in.data_ptr(), out.data_ptr(), chunk, type, comm_, stream_), who);
        return;
      }
      at::Tensor full = at::empty({chunk * size_}, in.options());
      keep.push_back(full);
      NCCL_OK(ncclAllGather(in.data_ptr(), full.data_ptr(), chunk, type, comm_, stream_), who);
      CUDA_OK(cudaMemcpyAsync(out.data_ptr(), full.data_ptr(), n * esz, cudaMemcpyDeviceToDevice, stream_), who);
    });
  }

  WorkPtr reduce_scatter_into(at::Tensor out, at::Tensor in, ReduceOp op) override {
    std::string who = describe(std::string("reduce_scatter(") + detail::op_name(op) + ")");
    int64_t chunk = detail::check_reduce_scatter(out, in, op, size_, who);
    check_device_tensor(in, who);
    return issue(who, flight::op_info(flight::Op::ReduceScatter, in, static_cast<int>(op)), {out, in},
                 [&](std::vector<at::Tensor>& keep) {
      const int64_t n = in.numel(), padded = chunk * size_;
      const at::ScalarType red = reduce_in_fp32(in.scalar_type()) ? at::kFloat : in.scalar_type();
      at::Tensor src = in;
      if (red != in.scalar_type() || n != padded) {
        src = at::empty({padded}, in.options().dtype(red));
        keep.push_back(src);
        copy_on_stream(src.narrow(0, 0, n), in.view({-1}), who);
        CUDA_OK(cudaMemsetAsync(bytes(src) + n * src.element_size(), 0, (padded - n) * src.element_size(), stream_),
                who);
      }
      // NCCL allows out == src + rank*chunk; any other overlap, or a widened type, needs a temporary.
      bool native_in_place = bytes(out) == bytes(src) + rank_ * chunk * src.element_size();
      at::Tensor dst = out;
      if (red != out.scalar_type() || (!native_in_place && detail::overlaps(out, src))) {
        dst = at::empty({chunk}, src.options());
        keep.push_back(dst);
      }
      NCCL_OK(ncclReduceScatter(src.data_ptr(), dst.data_ptr(), chunk, nccl_type(red), nccl_op(op), comm_, stream_),
              who);
      if (!dst.is_same(out)) copy_on_stream(out.view({-1}), dst, who);
    });
  }

  WorkPtr all_reduce(at::Tensor t, ReduceOp op) override {
    std::string who = describe(std::string("all_reduce(") + detail::op_name(op) + ")");
    detail::check_reducible(t, op, who);
    check_device_tensor(t, who);
    return issue(who, flight::op_info(flight::Op::AllReduce, t, static_cast<int>(op)), {t}, [&](std::vector<at::Tensor>& keep) {
      at::Tensor buf = t;
      if (reduce_in_fp32(t.scalar_type())) {
        buf = at::empty(t.sizes(), t.options().dtype(at::kFloat));
        keep.push_back(buf);
        copy_on_stream(buf, t, who);
      }
      NCCL_OK(ncclAllReduce(buf.data_ptr(), buf.data_ptr(), buf.numel(), nccl_type(buf.scalar_type()), nccl_op(op),
                            comm_, stream_),
              who);
      if (!buf.is_same(t)) copy_on_stream(t, buf, who);
    });
  }

  WorkPtr broadcast(at::Tensor t, int root) override {
    std::string who = describe("broadcast");
    detail::check_contiguous(t, "broadcast", who);
    ncclDataType_t type = check_device_tensor(t, who);
    if (root < 0 || root >= size_) throw TESSERA_INPUT_ERROR(who + ": root " + std::to_string(root) + " is not a rank");
    return issue(who, flight::op_info(flight::Op::Broadcast, t, -1, root), {t}, [&](std::vector<at::Tensor>&) {
      NCCL_OK(ncclBroadcast(t.data_ptr(), t.data_ptr(), t.numel(), type, root, comm_, stream_), who);
    });
  }

  WorkPtr barrier() override {
    std::string who = describe("barrier");
    flight::OpInfo info;
    info.op = flight::Op::Barrier;
    return issue(who, info, {}, [&](std::vector<at::Tensor>&) {
      NCCL_OK(ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclFloat32, ncclSum, comm_, stream_), who);
    });
  }

  // Called by NcclWork::wait: order the caller's stream after `done` and arm the watchdog.
  void wait_for(const std::shared_ptr<Event>& done, const std::string& what, std::chrono::milliseconds timeout,
                uint64_t seq) {
    rethrow_failure();
    CUDA_OK(cudaStreamWaitEvent(compute_stream(device_), done->ev, 0), what);
    auto limit = std::min<std::chrono::milliseconds>(timeout, std::chrono::hours(24 * 365));
    std::lock_guard<std::mutex> lk(m_);
    watched_.push_back({done, what, timeout, std::chrono::steady_clock::now() + limit, seq});
    cv_.notify_all();
  }

  // The flight record of operation `seq` (NCCL has no host-side start: scheduled -> completed).
  flight::Recorder& recorder() { return recorder_; }

 private:
  std::string describe(const std::string& op) const {
    return op + " on " + detail::describe(name_, rank_, size_, host_) + " device cuda:" + std::to_string(device_);
  }

  ncclDataType_t check_device_tensor(const at::Tensor& t, const std::string& who) const {
    if (!t.device().is_cuda() || t.device().index() != device_)
      throw TESSERA_INPUT_ERROR(who + ": the NCCL backend takes tensors on cuda:" + std::to_string(device_) +
                                ", got one on " + t.device().str());
    ncclDataType_t type = nccl_type(t.scalar_type());
    if (type == ncclNumTypes)
      throw TESSERA_INPUT_ERROR(who + ": dtype " + std::string(c10::toString(t.scalar_type())) + " is not supported");
    return type;
  }

  // dst <- src on the NCCL stream: a raw copy for equal dtypes, an ATen conversion otherwise.
  void copy_on_stream(const at::Tensor& dst, const at::Tensor& src, const std::string& who) {
    if (dst.scalar_type() == src.scalar_type()) {
      CUDA_OK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), src.nbytes(), cudaMemcpyDeviceToDevice, stream_), who);
      return;
    }
#ifdef TESSERA_WITH_CUDA
    c10::cuda::CUDAStreamGuard guard(c10::cuda::getStreamFromExternal(stream_, device_));
    at::NoGradGuard no_grad;
    const_cast<at::Tensor&>(dst).copy_(src);
#else
    throw Error(ErrorKind::Internal, who + ": converting " + std::string(c10::toString(src.scalar_type())) +
                                         " needs a CUDA-enabled LibTorch (TESSERA_WITH_CUDA)", __FILE__, __LINE__);
#endif
  }

  // Orders our stream after the caller's compute, enqueues `body`, records the completion event.
  WorkPtr issue(const std::string& who, const flight::OpInfo& info, std::vector<at::Tensor> keep,
                const std::function<void(std::vector<at::Tensor>&)>& body) {
    rethrow_failure();
    const uint64_t seq = recorder_.enqueue(info);
    CUDA_OK(cudaSetDevice(device_), who);
    Event ready;
    CUDA_OK(cudaEventRecord(ready.ev, compute_stream(device_)), who);
    CUDA_OK(cudaStreamWaitEvent(stream_, ready.ev, 0), who);
    body(keep);
#ifdef TESSERA_WITH_CUDA
    // The caching allocator must not hand these blocks out again before our stream is done.
    for (auto& t : keep)
      if (t.defined() && t.is_cuda())
        c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(),
                                                      c10::cuda::getStreamFromExternal(stream_, device_));
#endif
    auto done = std::make_shared<Event>();
    CUDA_OK(cudaEventRecord(done->ev, stream_), who);
    return std::make_shared<NcclWork>(shared_from_this(), done, who, std::move(keep), seq);
  }

  void rethrow_failure() {
    std::lock_guard<std::mutex> lk(m_);
    if (failure_) std::rethrow_exception(failure_);
  }

  // Watchdog: polls armed waits; on a deadline passed or an asynchronous NCCL error it aborts the
  // communicator (which releases the GPU kernels) and records the error for the next call.
  void watch() {
    std::unique_lock<std::mutex> lk(m_);
    while (!stop_) {
      cv_.wait_for(lk, std::chrono::milliseconds(10));
      if (aborted_) continue;
      for (auto it = watched_.begin(); it != watched_.end();) {
        if (cudaEventQuery(it->done->ev) == cudaSuccess) {
          recorder_.end(it->seq, true);
          it = watched_.erase(it);
          continue;
        }
        ncclResult_t async = ncclSuccess;
        ncclCommGetAsyncError(comm_, &async);
        bool late = std::chrono::steady_clock::now() > it->deadline;
        if (async != ncclSuccess || late) {
          recorder_.end(it->seq, false);
          std::string msg = late ? it->what + ", " + recorder_.describe(it->seq) + ", did not complete within " +
                                       std::to_string(it->timeout.count() / 1000.0) + "s; communicator aborted"
                                 : it->what + ": NCCL asynchronous error: " + ncclGetErrorString(async);
          failure_ = std::make_exception_ptr(
              Error(late ? ErrorKind::Timeout : ErrorKind::Internal, msg, __FILE__, __LINE__));
          ncclCommAbort(comm_);
          aborted_ = true;
          watched_.clear();
          break;
        }
        ++it;
      }
    }
  }

  struct Watched {
    std::shared_ptr<Event> done;
    std::string what;
    std::chrono::milliseconds timeout;
    std::chrono::steady_clock::time_point deadline;
    uint64_t seq;  // in recorder_
  };

  ncclComm_t comm_;
  int rank_, size_, device_;
  std::string name_, host_;
  cudaStream_t stream_ = nullptr;
  float* barrier_buf_ = nullptr;
  std::mutex m_;
  std::condition_variable cv_;
  std::list<Watched> watched_;
  std::exception_ptr failure_;
  bool stop_ = false, aborted_ = false;
  flight::Recorder recorder_;
  std::thread watchdog_;
};

void NcclWork::wait(std::chrono::milliseconds timeout) { comm_->wait_for(done_, what_, timeout, seq_); }

bool NcclWork::is_completed() {
  if (cudaEventQuery(done_->ev) != cudaSuccess) return false;
  comm_->recorder().end(seq_, true);
  return true;
}

}  // namespace

bool nccl_available() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

CommPtr make_nccl_communicator(MPI_Comm comm, const std::string& name, int device) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  std::string host = process_host();
  const std::string who = "NCCL init of " + detail::describe(name, rank, size, host) + " device cuda:" +
                          std::to_string(device);
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  // Every rank agrees before anyone enters ncclCommInitRank, so a bad device cannot leave others hanging.
  int bad = (device < 0 || device >= count) ? 1 : 0, any_bad = 0;
  MPI_Allreduce(&bad, &any_bad, 1, MPI_INT, MPI_MAX, comm);
  if (bad)
    throw TESSERA_INPUT_ERROR(who + ": device does not exist (" + std::to_string(count) + " CUDA devices visible)");
  if (any_bad) throw TESSERA_INPUT_ERROR(who + ": another rank's CUDA device does not exist");
  CUDA_OK(cudaSetDevice(device), who);
  ncclUniqueId id;
  if (rank == 0) NCCL_OK(ncclGetUniqueId(&id), who);
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, comm);
  ncclComm_t nccl = nullptr;
  NCCL_OK(ncclCommInitRank(&nccl, size, id, rank), who);
  return std::make_shared<NcclCommunicator>(nccl, rank, size, device, name, host, mpi_world_ranks(comm));
}

}  // namespace tessera::comm
