// train.device -> device: every accepted form and every refusal, on described machines (the pure
// choose_device(); the real binary's refusals on this CPU-only machine are in tests/unit/cli_errors.sh).
#include <gtest/gtest.h>

#include "launcher/device_select.h"
#include "model/activations.h"
#include "model/llama.h"
#include "runtime/device/device.h"
#include "runtime/gpu/gpu.h"
#include "util/error.h"
#include "util/torch_compat.h"
#include "tests/support/test_support.h"

namespace test_device_select {  // the files of a gtest binary compile together (tests/CMakeLists.txt)

using tessera::launcher::choose_device;
using tessera::launcher::DeviceContext;

namespace {

DeviceContext machine(bool cuda_built, int gpus, int local_rank, int local_size) {
  DeviceContext c;
  c.cuda_built = cuda_built;
  c.visible_gpus = gpus;
  c.local_rank = local_rank;
  c.local_size = local_size;
  c.host = "node7";
  return c;
}

// The one-line input error choose_device gives, or "no error (chose <device>)".
std::string error_of(const std::string& spec, const DeviceContext& ctx,
                     tessera::comm::DeviceBackend backend = tessera::comm::DeviceBackend::Nccl) {
  std::string chose;
  const std::string msg = tessera::test::error_of([&] { chose = choose_device(spec, ctx, backend).str(); });
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "message must be one line";
  return chose.empty() ? msg : "no error (chose " + chose + ")";
}

void expect_has(const std::string& msg, const std::string& needle) {
  EXPECT_NE(msg.find(needle), std::string::npos) << "'" << needle << "' not in: " << msg;
}

}  // namespace

TEST(DeviceSelect, CpuAlwaysWorks) {
  EXPECT_EQ(choose_device("cpu", machine(false, 0, 0, 1)), c10::Device(c10::kCPU));
  EXPECT_EQ(choose_device("cpu", machine(true, 8, 3, 16)), c10::Device(c10::kCPU));
}

TEST(DeviceSelect, AutoPicksTheLocalGpuOnlyOnACudaBuildWithGpus) {
  EXPECT_EQ(choose_device("auto", machine(false, 0, 0, 1)), c10::Device(c10::kCPU));
  EXPECT_EQ(choose_device("auto", machine(false, 8, 2, 8)), c10::Device(c10::kCPU));  // CPU build
  EXPECT_EQ(choose_device("auto", machine(true, 0, 0, 2)), c10::Device(c10::kCPU));   // no GPU
  EXPECT_EQ(choose_device("auto", machine(true, 8, 5, 8)), c10::Device(c10::kCUDA, 5));
  // auto with GPUs behaves like cuda, checks included.
  expect_has(error_of("auto", machine(true, 2, 2, 3)), "runs 3 local ranks");
}

TEST(DeviceSelect, CudaIsTheLocalRanksGpu) {
  EXPECT_EQ(choose_device("cuda", machine(true, 1, 0, 1)), c10::Device(c10::kCUDA, 0));
  EXPECT_EQ(choose_device("cuda", machine(true, 8, 7, 8)), c10::Device(c10::kCUDA, 7));
  EXPECT_EQ(choose_device("cuda:3", machine(true, 8, 0, 1)), c10::Device(c10::kCUDA, 3));
  EXPECT_EQ(choose_device("cuda:4", machine(true, 8, 2, 4)), c10::Device(c10::kCUDA, 6));
}

TEST(DeviceSelect, CudaOnACpuBuildNamesHostAndDevice) {
  std::string m = error_of("cuda", machine(false, 0, 1, 2));
  expect_has(m, "train.device=cuda");
  expect_has(m, "host node7");
  expect_has(m, "device cuda:1");
  expect_has(m, "built without CUDA");
}

TEST(DeviceSelect, CudaWithoutVisibleGpus) {
  DeviceContext c = machine(true, 0, 0, 1);
  c.cuda_visible_devices = "-1";
  std::string m = error_of("cuda", c);
  expect_has(m, "no GPU is visible");
  expect_has(m, "CUDA_VISIBLE_DEVICES=-1");
  expect_has(m, "device cuda:0");
}

TEST(DeviceSelect, GpuIndexThatDoesNotExist) {
  std::string m = error_of("cuda:5", machine(true, 2, 0, 1));
  expect_has(m, "train.device=cuda:5");
  expect_has(m, "device cuda:5");
  expect_has(m, "2 GPU(s) visible (cuda:0-1)");
  // cuda:1 with 2 local ranks needs GPUs 1 and 2.
  m = error_of("cuda:1", machine(true, 2, 0, 2));
  expect_has(m, "GPUs cuda:1-2 are needed for 2 local rank(s)");
}

TEST(DeviceSelect, MoreLocalRanksThanGpus) {
  // Every local rank refuses (rank 0 included), so every rank stops with the same message.
  for (int lr = 0; lr < 4; ++lr) {
    std::string m = error_of("cuda", machine(true, 2, lr, 4));
    expect_has(m, "host node7");
    expect_has(m, "device cuda:" + std::to_string(lr));
    expect_has(m, "runs 4 local ranks but has 2 GPU(s) visible");
    expect_has(m, "NCCL refuses two ranks on one GPU");
  }
}

TEST(DeviceSelect, StagedRanksShareGpus) {
  // comm.device_backend=staged: local rank r on GPU base + r mod (visible - base).
  const auto staged = tessera::comm::DeviceBackend::Staged;
  for (int lr = 0; lr < 4; ++lr) {
    EXPECT_EQ(choose_device("cuda", machine(true, 1, lr, 4), staged), c10::Device(c10::kCUDA, 0));
    EXPECT_EQ(choose_device("auto", machine(true, 2, lr, 4), staged), c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(lr % 2)));
    EXPECT_EQ(choose_device("cuda:1", machine(true, 2, lr, 4), staged), c10::Device(c10::kCUDA, 1));
  }
  expect_has(error_of("cuda:2", machine(true, 2, 0, 4), staged), "the host has 2 GPU(s) visible (cuda:0-1)");
  expect_has(error_of("cuda", machine(true, 0, 0, 4), staged), "no GPU is visible");
  // Staging is for GPU tensors: on the CPU it is refused, naming both keys.
  for (const auto& [spec, m] : {std::pair{"cpu", machine(true, 1, 0, 2)}, std::pair{"auto", machine(false, 0, 0, 2)}}) {
    const std::string msg = error_of(spec, m, staged);
    expect_has(msg, "comm.device_backend=staged");
    expect_has(msg, "train.device=" + std::string(spec) + " runs on the CPU on host node7");
  }
  // With NCCL the refusal says what would run instead.
  expect_has(error_of("cuda", machine(true, 1, 0, 2)), "or comm.device_backend=staged to share GPUs");
}

TEST(DeviceSelect, MalformedSpecs) {
  for (const char* bad : {"gpu", "CUDA", "cuda:", "cuda:-1", "cuda:x", "cuda:1:2", "", "mps"}) {
    std::string m = error_of(bad, machine(true, 8, 0, 1));
    expect_has(m, "train.device '" + std::string(bad) + "'");
  }
}

TEST(DeviceSelect, ThisBuildAndMachine) {
  // The device helpers answer without a GPU (CPU LibTorch here): no CUDA, no devices, 0 bytes.
  EXPECT_EQ(tessera::device::describe(c10::Device(c10::kCPU)), "cpu");
  EXPECT_EQ(tessera::device::describe(c10::Device(c10::kCUDA, 3)), "cuda:3");
  EXPECT_EQ(tessera::device::peak_memory_bytes(c10::Device(c10::kCPU)), 0);
  if (!tessera::gpu::built()) {
    EXPECT_EQ(choose_device("auto", tessera::launcher::device_context({})), c10::Device(c10::kCPU));
  }
}

// A kernel the run needs that the device or the LibTorch cannot run is refused in one line naming
// the key to set; nothing refused when the key that needs it is off (never silently slower, never
// refused for what the run does not use).
TEST(KernelRefusal, NamesTheKeyThatNeedsTheKernel) {
  using tessera::launcher::kernel_refusal;
  using tessera::launcher::KernelRequest;
  const std::string no_image = "cuda:0 (Tesla T4, sm_75) has no image of them in this build";
  KernelRequest r;
  r.device = "cuda:0";
  r.fused_kernels = true;
  EXPECT_EQ(kernel_refusal(r), "");  // the device runs them
  r.image_problem = no_image;
  std::string m = kernel_refusal(r);
  expect_has(m, "model.fused_kernels: Tessera's kernels cannot run on cuda:0: " + no_image);
  expect_has(m, "set model.fused_kernels=false");
  r.fused_kernels = false;
  EXPECT_EQ(kernel_refusal(r), "");  // LibTorch's composites, and LibTorch's fused AdamW
  r.own_optimizer_kernel = "bf16";
  m = kernel_refusal(r);
  expect_has(m, "optim.state_dtype bf16: Tessera's AdamW kernel cannot run on cuda:0");
  expect_has(m, "set optim.state_dtype=fp32");
  r = KernelRequest{};
  r.device = "cuda:1";
  r.varlen_problem = "this LibTorch (2.5) has no variable-length flash attention (2.6 and later)";
  EXPECT_EQ(kernel_refusal(r), "");  // no packed rows, no window (or model.varlen_attention=false)
  r.varlen_for = "data.packing";
  m = kernel_refusal(r);
  expect_has(m, "model.varlen_attention: data.packing on cuda:1 runs on FlashAttention's variable-length kernel, but " +
                    r.varlen_problem);
  expect_has(m, "set model.varlen_attention=false");
  EXPECT_EQ(m.find('\n'), std::string::npos);
}

// Why the variable-length kernel would not run, from this build's LibTorch and the run's dtype and
// head_dim: the reason the refusal above quotes.
TEST(KernelRefusal, VarlenReasonsFromLibTorchDtypeAndHeadDim) {
  namespace ops = tessera::model::ops;
  if (!tessera::compat::kHasFlashVarlen) {
    expect_has(ops::varlen_kernel_unavailable(torch::kBFloat16, 64), "has no variable-length flash attention (2.6 and later)");
    return;
  }
  EXPECT_EQ(ops::varlen_kernel_unavailable(torch::kBFloat16, 64), "");
  EXPECT_EQ(ops::varlen_kernel_unavailable(torch::kHalf, 256), "");
  expect_has(ops::varlen_kernel_unavailable(torch::kFloat32, 64), "bf16 or fp16");
  expect_has(ops::varlen_kernel_unavailable(torch::kBFloat16, 60), "head_dim a multiple of 8 up to 256, not 60");
  expect_has(ops::varlen_kernel_unavailable(torch::kBFloat16, 512), "not 512");
}

// model.varlen_attention reaches the activation formula: off, a GPU run plans the masked path.
TEST(KernelRefusal, VarlenOffPlansTheMaskedPath) {
  EXPECT_FALSE(tessera::model::run_kernels(/*gpu=*/true, /*packed=*/true, true, /*varlen=*/false).varlen_attention);
  EXPECT_EQ(tessera::model::run_kernels(true, true, true, true).varlen_attention, tessera::compat::kHasFlashVarlen);
  EXPECT_FALSE(tessera::model::run_kernels(/*gpu=*/false, true, true, true).varlen_attention);
}

}  // namespace test_device_select
