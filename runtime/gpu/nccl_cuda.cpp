// NCCL backend of the Communicator seam (see nccl.h). Raw device pointers come from tensor.data_ptr(); streams and
// events are driven through the CUDA runtime API, so this file builds with a CPU-only LibTorch too.
// Only what needs a CUDA LibTorch (its current stream, caching-allocator stream records, ATen ops
// on our stream for the fp32 widening of bf16/fp16 reductions) is under TESSERA_WITH_CUDA.
//
// Threads: the caller's thread enqueues (issue(), the one place every operation goes through) and
// arms waits (wait_for()); one watchdog thread per communicator observes completions, asynchronous
// NCCL errors and deadlines (watch(), the one place an operation is seen to finish or fail); abort
// threads run ncclCommAbort. Every thread other than the caller's sets the rank's device first.
#include "runtime/gpu/nccl.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <iomanip>
#include <iostream>
#include <list>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "runtime/comm/collective_checks.h"
#include "runtime/comm/emulation.h"
#include "runtime/comm/flight_recorder.h"
#include "runtime/gpu/comm_delay.h"
#include "runtime/gpu/gpu.h"
#include "util/error.h"

#ifdef TESSERA_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace tessera::gpu {
using namespace tessera::comm;  // the seam this backend implements
namespace {

// set_comm_emulation's settings: written once at start-up, before any communicator issues.
comm::Emulation& emulation() {
  static comm::Emulation e;
  return e;
}

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

// ---- state shared by a communicator, its watchdog and abort threads --------------------------------

struct Watched {
  std::shared_ptr<Event> done;
  std::string what;
  std::chrono::milliseconds timeout;
  std::chrono::steady_clock::time_point deadline;
  uint64_t seq;  // in CommState::recorder
};

// What a communicator shares with its watchdog and abort threads; they hold it by shared_ptr, so it
// outlives a communicator destroyed while an abort still runs (error paths only).
//
// Locks. `m` guards the watch list, `failure` and `stop`. `enqueue_m` is held while operations are
// enqueued on `comm` and while `comm` is aborted or destroyed, so ncclCommAbort never frees the
// communicator under a concurrent enqueue (as c10d's NCCLComm mutex). A failure is always recorded
// (under m) before any abort takes enqueue_m, so an enqueue that finds enqueue_m taken by an abort
// throws the failure instead of waiting for the abort to return.
struct CommState {
  ncclComm_t comm = nullptr;
  int device = 0;
  std::string who;  // "comm 'world' (rank 0 of 8, host h) device cuda:0"
  // The communicator's flight record: enqueue on the caller's thread (issue), end on the watchdog
  // (or NcclWork::is_completed); NCCL has no host-side start, so scheduled -> completed / failed.
  std::unique_ptr<flight::Recorder> recorder;

  std::mutex enqueue_m;
  bool released = false;                  // under enqueue_m: comm aborted or destroyed
  std::atomic<bool> release_done{false};  // ncclCommAbort / ncclCommDestroy has returned

  std::mutex m;
  std::condition_variable cv;
  std::list<Watched> watched;
  std::exception_ptr failure;
  bool stop = false;

  bool failed() {
    std::lock_guard<std::mutex> lk(m);
    return failure != nullptr;
  }
  void fail(std::exception_ptr e) {
    std::lock_guard<std::mutex> lk(m);
    if (!failure) failure = std::move(e);
  }
  void rethrow_failure() {
    std::lock_guard<std::mutex> lk(m);
    if (failure) std::rethrow_exception(failure);
  }
  // Aborts (or destroys) the NCCL communicator, once; later calls return at once.
  void release(bool destroy) {
    std::lock_guard<std::mutex> lk(enqueue_m);
    if (released) return;
    released = true;
    cudaSetDevice(device);  // may run on any thread: never let NCCL/CUDA fall back to GPU 0
    if (destroy)
      ncclCommDestroy(comm);
    else
      ncclCommAbort(comm);
    release_done = true;
  }
};

// Every live communicator's state, for abort_all.
std::mutex g_live_m;
std::vector<std::weak_ptr<CommState>> g_live;

void register_live(const std::shared_ptr<CommState>& s) {
  std::lock_guard<std::mutex> lk(g_live_m);
  g_live.erase(std::remove_if(g_live.begin(), g_live.end(), [](const auto& w) { return w.expired(); }), g_live.end());
  g_live.push_back(s);
}

// One communicator failed (a deadline passed, an asynchronous NCCL error, or it was destroyed with a
// collective still in flight): every NCCL communicator of this process records a failure and is
// aborted, each from a thread of its own, all at once. One at a time would not do: ncclCommAbort
// frees device memory, cudaFree waits for every kernel on the device, and another communicator's
// collective may be blocked on the same missing peer (hybrid_shard runs world, intra and inter
// communicators on separate streams). From here the process is on its error path: the next call on
// any of its communicators throws. Never called with a CommState's `m` held.
void abort_all(const std::shared_ptr<CommState>& origin, const Error& error) {
  std::vector<std::shared_ptr<CommState>> all{origin};
  {
    std::lock_guard<std::mutex> lk(g_live_m);
    for (const auto& w : g_live)
      if (auto s = w.lock(); s && s != origin) all.push_back(s);
  }
  origin->fail(std::make_exception_ptr(error));
  for (size_t i = 1; i < all.size(); ++i)
    all[i]->fail(std::make_exception_ptr(
        Error(error.kind(), all[i]->who + " aborted: " + std::string(error.what()), __FILE__, __LINE__)));
  // Only now (every failure recorded, so no watchdog queries a communicator any more) the aborts.
  for (const auto& s : all) std::thread([s] { s->release(/*destroy=*/false); }).detach();
}

// Watchdog of one communicator: polls the armed waits; a deadline passed or an asynchronous NCCL
// error aborts every communicator of the process (abort_all), which releases the GPU kernels.
void watch(const std::shared_ptr<CommState>& s) {
  // The rank's device first: the event queries below act on the current device, and a new thread's
  // is GPU 0, so every rank's watchdog would otherwise create a context there.
  const cudaError_t set = cudaSetDevice(s->device);
  std::unique_lock<std::mutex> lk(s->m);
  if (set != cudaSuccess) {
    lk.unlock();
    abort_all(s, Error(ErrorKind::Internal, s->who + ": watchdog: cudaSetDevice failed: " + cudaGetErrorString(set),
                       __FILE__, __LINE__));
    return;
  }
  while (!s->stop) {
    s->cv.wait_for(lk, std::chrono::milliseconds(10));
    if (s->failure) {  // aborted (here or by another communicator's failure): nothing left to watch
      s->watched.clear();
      continue;
    }
    std::unique_ptr<Error> error;
    for (auto it = s->watched.begin(); it != s->watched.end();) {
      if (cudaEventQuery(it->done->ev) == cudaSuccess) {
        s->recorder->end(it->seq, true);
        it = s->watched.erase(it);
        continue;
      }
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(s->comm, &async);  // `m` is held: no abort of s->comm can have started
      const bool late = std::chrono::steady_clock::now() > it->deadline;
      if (async != ncclSuccess || late) {
        s->recorder->end(it->seq, false);
        std::ostringstream msg;
        if (late)
          msg << it->what << ", " << s->recorder->describe(it->seq) << ", did not complete within " << std::setprecision(6) << it->timeout.count() / 1000.0
              << "s; communicator aborted";
        else
          msg << it->what << ": NCCL asynchronous error: " << ncclGetErrorString(async);
        error = std::make_unique<Error>(late ? ErrorKind::Timeout : ErrorKind::Internal, msg.str(), __FILE__, __LINE__);
        break;
      }
      ++it;
    }
    if (error) {
      s->watched.clear();
      lk.unlock();
      abort_all(s, *error);
      lk.lock();
    }
  }
}

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
  NcclCommunicator(ncclComm_t comm, CommPtr host_group, int device, std::string name, std::string host,
                   const std::vector<int>& world_ranks)
      : s_(std::make_shared<CommState>()), host_group_(std::move(host_group)), rank_(host_group_->rank()),
        size_(host_group_->size()), device_(device), name_(std::move(name)), host_(std::move(host)) {
    s_->comm = comm;
    s_->device = device_;
    s_->who = describe_member();
    s_->recorder = std::make_unique<flight::Recorder>(name_, "nccl", rank_, size_, world_ranks);
    const std::string who = describe("init");
    cudaError_t rc = cudaSetDevice(device_);
    if (rc == cudaSuccess) rc = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
    if (rc != cudaSuccess) {
      ncclCommDestroy(comm);  // nothing was enqueued on it
      check_cuda(rc, "cudaStreamCreateWithFlags", who);
    }
    register_live(s_);
    watchdog_ = std::thread([s = s_] { watch(s); });
  }

  // Teardown, in this order; nothing here waits for the GPU without a bound, so an error path that
  // unwinds through here (before the launcher aborts the world) cannot hang:
  //  1. the watchdog stops and is joined (it never blocks: it polls events and async errors);
  //  2. a communicator whose stream drains within a grace period is destroyed (ncclCommDestroy;
  //     every rank destroys its communicators in the same order, ProcessGroups' inter, intra,
  //     world). One with a collective still in flight -- a peer gone, or this rank unwinding from an
  //     error -- is aborted, with every other NCCL communicator of the process (abort_all), and
  //     waited for at most 10 s;
  //  3. the stream is released (release_stream: kept in CUDA builds, else destroyed).
  // No cudaFree anywhere: it synchronises the whole device, another communicator's stuck kernel
  // included. Tensors (the barrier's too) come from LibTorch's caching allocator, stream-recorded.
  ~NcclCommunicator() override {
    {
      std::lock_guard<std::mutex> lk(s_->m);
      s_->stop = true;
    }
    s_->cv.notify_all();
    watchdog_.join();
    if (cudaSetDevice(device_) == cudaErrorCudartUnloading) return;  // process exit: leave it to the OS
    if (!s_->failed()) {
      if (drained_within(std::uncaught_exceptions() > 0 ? std::chrono::milliseconds(5000) : default_timeout()))
        s_->release(/*destroy=*/true);
      else
        abort_all(s_, Error(ErrorKind::Internal, describe("destroy") + ": a collective was still in flight",
                            __FILE__, __LINE__));
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!s_->release_done && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (s_->release_done)
      release_stream();
    else
      std::cerr << "tessera: " << s_->who << ": ncclCommAbort did not return within 10s; left to process exit"
                << std::endl;
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }
  std::string name() const override { return name_; }
  at::Device device() const override { return at::Device(at::kCUDA, device_); }

  // Both run over the host companion this communicator was made from (its rank order).
  CommPtr split(int color, int key, const std::string& name) override {
    CommPtr host = host_group_->split(color, key, name + ":host");
    return host ? make_nccl_communicator(host, name, device_) : nullptr;
  }
  CommPtr host_duplicate(const std::string& name) override { return host_group_->host_duplicate(name); }

  WorkPtr all_gather_into(at::Tensor out, at::Tensor in) override {
    std::string who = describe("all_gather");
    int64_t chunk = detail::check_all_gather(out, in, size_, who);
    ncclDataType_t type = check_device_tensor(in, who);
    return issue(who, flight::op_info(flight::Op::AllGather, out), {out, in},
                 [&](ncclComm_t comm, std::vector<at::Tensor>& keep) {
      const int64_t n = out.numel(), esz = in.element_size();
      if (n == chunk * size_) {  // NCCL handles in-place (in == out + rank*chunk) natively
        NCCL_OK(ncclAllGather(in.data_ptr(), out.data_ptr(), chunk, type, comm, stream_), who);
        return;
      }
      at::Tensor full = at::empty({chunk * size_}, in.options());
      keep.push_back(full);
      NCCL_OK(ncclAllGather(in.data_ptr(), full.data_ptr(), chunk, type, comm, stream_), who);
      CUDA_OK(cudaMemcpyAsync(out.data_ptr(), full.data_ptr(), n * esz, cudaMemcpyDeviceToDevice, stream_), who);
    });
  }

  WorkPtr reduce_scatter_into(at::Tensor out, at::Tensor in, ReduceOp op) override {
    std::string who = describe(std::string("reduce_scatter(") + detail::op_name(op) + ")");
    int64_t chunk = detail::check_reduce_scatter(out, in, op, size_, who);
    check_device_tensor(in, who);
    return issue(who, flight::op_info(flight::Op::ReduceScatter, in, static_cast<int>(op)), {out, in},
                 [&](ncclComm_t comm, std::vector<at::Tensor>& keep) {
      const int64_t n = in.numel(), padded = chunk * size_;
      const at::ScalarType red = in.scalar_type();  // bf16/fp16 natively (communicator.h)
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
      NCCL_OK(ncclReduceScatter(src.data_ptr(), dst.data_ptr(), chunk, nccl_type(red), nccl_op(op), comm, stream_),
              who);
      if (!dst.is_same(out)) copy_on_stream(out.view({-1}), dst, who);
    });
  }

  WorkPtr all_reduce(at::Tensor t, ReduceOp op) override {
    std::string who = describe(std::string("all_reduce(") + detail::op_name(op) + ")");
    detail::check_reducible(t, op, who);
    check_device_tensor(t, who);
    return issue(who, flight::op_info(flight::Op::AllReduce, t, static_cast<int>(op)), {t},
                 [&](ncclComm_t comm, std::vector<at::Tensor>& keep) {
      // bf16/fp16 natively (communicator.h); `keep` needs nothing: t is the buffer
      (void)keep;
      NCCL_OK(ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t.scalar_type()), nccl_op(op), comm,
                            stream_),
              who);
    });
  }

  WorkPtr broadcast(at::Tensor t, int root) override {
    std::string who = describe("broadcast");
    detail::check_contiguous(t, "broadcast", who);
    ncclDataType_t type = check_device_tensor(t, who);
    if (root < 0 || root >= size_) throw TESSERA_INPUT_ERROR(who + ": root " + std::to_string(root) + " is not a rank");
    return issue(who, flight::op_info(flight::Op::Broadcast, t, -1, root), {t}, [&](ncclComm_t comm, std::vector<at::Tensor>&) {
      NCCL_OK(ncclBroadcast(t.data_ptr(), t.data_ptr(), t.numel(), type, root, comm, stream_), who);
    });
  }

  WorkPtr barrier() override {
    std::string who = describe("barrier");
    // A one-element all-reduce of an uninitialised scratch value (only completion matters).
    at::Tensor scratch = at::empty({1}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, device_));
    flight::OpInfo info;  // recorded as the MPI backend records a barrier: no buffer
    info.op = flight::Op::Barrier;
    return issue(who, info, {scratch}, [&](ncclComm_t comm, std::vector<at::Tensor>&) {
      NCCL_OK(ncclAllReduce(scratch.data_ptr(), scratch.data_ptr(), 1, ncclFloat32, ncclSum, comm, stream_), who);
    });
  }

  // Called by NcclWork::wait: order the caller's stream after `done` and arm the watchdog.
  void wait_for(const std::shared_ptr<Event>& done, const std::string& what, std::chrono::milliseconds timeout,
                uint64_t seq) {
    s_->rethrow_failure();
    CUDA_OK(cudaStreamWaitEvent(compute_stream(device_), done->ev, 0), what);
    auto limit = std::min<std::chrono::milliseconds>(timeout, std::chrono::hours(24 * 365));
    std::lock_guard<std::mutex> lk(s_->m);
    s_->watched.push_back({done, what, timeout, std::chrono::steady_clock::now() + limit, seq});
    s_->cv.notify_all();
  }

  flight::Recorder& recorder() { return *s_->recorder; }

 private:
  std::string describe_member() const {
    return detail::describe(name_, rank_, size_, host_) + " device cuda:" + std::to_string(device_);
  }
  std::string describe(const std::string& op) const { return op + " on " + describe_member(); }

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

  // Communication-time emulation (set_comm_emulation): the time the emulated ranks would take, as a
  // delay kernel on our stream before the collective (whose own time at world size 1 is a copy).
  void emulate_time(const flight::OpInfo& info, const std::string& who) {
    const double s = emulated_seconds(emulation(), info.op, info.bytes);
    if (s <= 0) return;
#ifdef TESSERA_WITH_CUDA
    CUDA_OK(static_cast<cudaError_t>(comm_delay_launch(static_cast<int64_t>(s * 1e9), kEmulatedChannels, stream_)), who);
#else
    throw Error(ErrorKind::Internal, who + ": communication-time emulation needs the CUDA build's kernels", __FILE__, __LINE__);
#endif
  }

  // The one enqueue point of every operation: orders our stream after the caller's compute, runs
  // `body` (the NCCL calls, given the communicator) under the enqueue lock, records the completion
  // event and returns the Work. The operation gets its flight-recorder sequence number here (`info`:
  // what it is), once it is sure to be handed to NCCL; a failure while enqueueing marks it failed.
  WorkPtr issue(const std::string& who, const flight::OpInfo& info, std::vector<at::Tensor> keep,
                const std::function<void(ncclComm_t, std::vector<at::Tensor>&)>& body) {
    s_->rethrow_failure();
    // Not while an abort holds the lock: its failure is recorded already, so throw that instead.
    std::unique_lock<std::mutex> enqueue(s_->enqueue_m, std::defer_lock);
    while (!enqueue.try_lock()) {
      s_->rethrow_failure();
      std::this_thread::yield();
    }
    if (s_->released) {
      s_->rethrow_failure();
      throw Error(ErrorKind::Internal, who + ": the NCCL communicator was already released", __FILE__, __LINE__);
    }
    const uint64_t seq = s_->recorder->enqueue(info);
    try {
      CUDA_OK(cudaSetDevice(device_), who);
      Event ready;
      CUDA_OK(cudaEventRecord(ready.ev, compute_stream(device_)), who);
      CUDA_OK(cudaStreamWaitEvent(stream_, ready.ev, 0), who);
      emulate_time(info, who);
      body(s_->comm, keep);
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
    } catch (...) {
      s_->recorder->end(seq, false);
      throw;
    }
  }

  // True when everything enqueued on our stream has completed within `grace` (false on an
  // asynchronous NCCL error or a CUDA error).
  bool drained_within(std::chrono::milliseconds grace) {
    const auto until = std::chrono::steady_clock::now() + grace;
    for (;;) {
      const cudaError_t rc = cudaStreamQuery(stream_);
      if (rc == cudaSuccess) return true;
      ncclResult_t async = ncclSuccess;
      {
        std::lock_guard<std::mutex> lk(s_->enqueue_m);  // another communicator's abort_all may abort ours
        if (s_->released) return false;
        ncclCommGetAsyncError(s_->comm, &async);
      }
      if (rc != cudaErrorNotReady || async != ncclSuccess || std::chrono::steady_clock::now() >= until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  // With a CUDA LibTorch the stream is never destroyed. The caching allocator keeps the
  // recordStream uses of issue()'s tensors and records an event on this stream when such a block is
  // freed, which can be after the communicator is gone (a tensor its caller still holds): on a
  // destroyed stream that event record crashes inside the driver (seen on an H200, torch 2.11: a
  // segfault in cudaEventRecord under TensorImpl's destructor). One stream per communicator, a few
  // per process, is what stays. Without a CUDA LibTorch nothing is stream-recorded: destroyed.
  void release_stream() {
#ifndef TESSERA_WITH_CUDA
    cudaStreamDestroy(stream_);
#endif
  }

  std::shared_ptr<CommState> s_;
  CommPtr host_group_;  // the host communicator over the same ranks (make_nccl_communicator's)
  int rank_, size_, device_;
  std::string name_, host_;
  cudaStream_t stream_ = nullptr;
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

CommPtr make_nccl_communicator(CommPtr host, const std::string& name, int device) {
  TESSERA_CHECK(host && host->device().is_cpu(), "make_nccl_communicator('" + name + "') needs a host communicator");
  const int rank = host->rank(), size = host->size();
  std::string host_name = process_host();
  const std::string who = "NCCL init of " + detail::describe(name, rank, size, host_name) + " device cuda:" +
                          std::to_string(device);
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  // Every rank agrees before anyone enters ncclCommInitRank, so a bad device cannot leave others hanging.
  const bool bad = device < 0 || device >= count;
  const bool any_bad = host->any(bad);
  if (bad)
    throw TESSERA_INPUT_ERROR(who + ": device does not exist (" + std::to_string(count) + " CUDA devices visible)");
  if (any_bad) throw TESSERA_INPUT_ERROR(who + ": another rank's CUDA device does not exist");
  CUDA_OK(cudaSetDevice(device), who);
  ncclUniqueId id;
  at::Tensor id_bytes = at::zeros({static_cast<int64_t>(sizeof(id))}, at::TensorOptions().dtype(at::kByte));
  if (rank == 0) {
    NCCL_OK(ncclGetUniqueId(&id), who);
    std::memcpy(id_bytes.data_ptr(), &id, sizeof(id));
  }
  host->broadcast(id_bytes, 0)->wait();
  std::memcpy(&id, id_bytes.data_ptr(), sizeof(id));
  // World ranks of the members (the flight recorder's), from each process's identity.
  at::Tensor world = at::empty({size}, at::TensorOptions().dtype(at::kInt));
  host->all_gather_into(world, at::full({1}, process_rank(), at::TensorOptions().dtype(at::kInt)))->wait();
  const std::vector<int> world_ranks(world.data_ptr<int>(), world.data_ptr<int>() + size);
  ncclComm_t nccl = nullptr;
  NCCL_OK(ncclCommInitRank(&nccl, size, id, rank), who);
  return std::make_shared<NcclCommunicator>(nccl, std::move(host), device, name, host_name, world_ranks);
}

void set_comm_emulation(const comm::Emulation& e) { emulation() = e; }

}  // namespace tessera::gpu
