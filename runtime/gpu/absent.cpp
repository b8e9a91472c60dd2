// The GPU seam (gpu.h, nccl.h) in a build without the GPU path (TESSERA_WITH_CUDA off): nothing is
// built, nothing is measured, and what cannot be done without CUDA says so in one line.
#include "util/error.h"
#include "runtime/gpu/gpu.h"
#include "runtime/gpu/nccl.h"

namespace tessera::gpu {

namespace {
[[noreturn]] void not_built(const std::string& what) {
  throw Error(ErrorKind::Input, what + ": this tessera was built without CUDA (TESSERA_WITH_CUDA off)");
}
}  // namespace

bool built() { return false; }
int64_t peak_allocated_bytes(int) { return 0; }
void reset_peak(int) {}
std::string device_name(int) { return ""; }
std::shared_ptr<profile::DeviceClock> make_clock(int) { return nullptr; }

void nf4_decode(const at::Tensor& bytes, int64_t, const Nf4KernelLayout&, bool, const Nf4Tables&, const at::Tensor&) {
  not_built("nf4_decode of bytes on " + bytes.device().str());
}

void adamw_update(const std::vector<AdamWShard>&, const AdamWCoefficients&, const at::Tensor&, const at::Tensor&,
                  const Q8Codebooks*) {
  not_built("the AdamW kernel");
}

void set_comm_emulation(const comm::Emulation& e) {
  if (e.on()) not_built("comm.emulate_ranks (the delay runs on the NCCL communicator's stream)");
}

void install_kernels() {}  // nothing to install: the model runs LibTorch's composites

std::string kernels_unavailable(int) { return "this tessera was built without CUDA (TESSERA_WITH_CUDA off)"; }

bool nccl_available() { return false; }

comm::CommPtr make_nccl_communicator(comm::CommPtr, const std::string& name, int device) {
  not_built("NCCL communicator '" + name + "' on cuda:" + std::to_string(device));
}

}  // namespace tessera::gpu
