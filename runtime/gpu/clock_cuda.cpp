// The CUDA device clock of the step-time breakdown (step_profile.h, GPU TIMING): a stamp is a CUDA
// event recorded on the calling thread's current stream. Events are pooled: created with default
// flags (timing enabled) the first time a step needs that many, then re-recorded in later steps;
// reset() only rewinds the pool. gpu.h's make_clock; empty unless TESSERA_WITH_CUDA (the current
// stream is LibTorch's, c10/cuda).
#include "runtime/gpu/gpu.h"

#ifdef TESSERA_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <vector>

namespace tessera::gpu {
namespace {

// Stamps per step beyond which stamp() fails and the step is reported on the host clock (a
// runaway; a step takes a few dozen per layer).
constexpr int kMaxStamps = 1 << 16;

// A failed call leaves its error as CUDA's "last error"; clear it, so that LibTorch's next
// kernel-launch check does not report it as its own. Returns whether the call succeeded.
bool ok(cudaError_t rc) {
  if (rc == cudaSuccess) return true;
  (void)cudaGetLastError();
  return false;
}

class CudaClock final : public profile::DeviceClock {
 public:
  explicit CudaClock(int device) : device_(static_cast<c10::DeviceIndex>(device)) {}
  ~CudaClock() override {
    for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);  // at process exit cudart may be gone: ignored
  }
  std::string name() const override { return "cuda"; }

  int stamp() override {
    if (used_ >= kMaxStamps) return -1;
    c10::cuda::CUDAGuard guard(device_);  // events belong to the device current at creation
    if (used_ == static_cast<int>(events_.size())) {
      cudaEvent_t e = nullptr;
      if (!ok(cudaEventCreate(&e))) return -1;  // default flags: timing enabled
      events_.push_back(e);
    }
    if (!ok(cudaEventRecord(events_[used_], c10::cuda::getCurrentCUDAStream(device_).stream()))) return -1;
    return used_++;
  }

  // The last stamp; earlier ones on other streams are waited for by elapsed_ns if not reached yet.
  bool wait(int last) override { return last >= 0 && last < used_ && ok(cudaEventSynchronize(events_[last])); }

  std::optional<int64_t> elapsed_ns(int from, int to) override {
    if (from < 0 || to < 0 || from >= used_ || to >= used_) return std::nullopt;
    float ms = 0;
    cudaError_t rc = cudaEventElapsedTime(&ms, events_[from], events_[to]);
    if (rc == cudaErrorNotReady) {  // a stamp of another stream than the last one's
      (void)cudaGetLastError();
      if (!ok(cudaEventSynchronize(events_[from])) || !ok(cudaEventSynchronize(events_[to]))) return std::nullopt;
      rc = cudaEventElapsedTime(&ms, events_[from], events_[to]);
    }
    if (!ok(rc)) return std::nullopt;
    return static_cast<int64_t>(std::llround(static_cast<double>(ms) * 1e6));
  }

  void reset() override { used_ = 0; }

 private:
  c10::DeviceIndex device_;
  std::vector<cudaEvent_t> events_;  // the pool; events_[0..used_) are this step's stamps
  int used_ = 0;
};

}  // namespace

std::shared_ptr<profile::DeviceClock> make_clock(int device) {
  return std::make_shared<CudaClock>(device >= 0 ? device : static_cast<int>(c10::cuda::current_device()));
}

}  // namespace tessera::gpu
#endif
