#include "launcher/device_select.h"

#include <cstdlib>

#include "runtime/comm/staged.h"
#include "runtime/device/device.h"
#include "runtime/gpu/gpu.h"
#include "runtime/gpu/nccl.h"
#include "util/error.h"

namespace tessera::launcher {

namespace {

std::string visible_note(const DeviceContext& ctx) {
  std::string s = std::to_string(ctx.visible_gpus) + " GPU(s) visible";
  if (ctx.visible_gpus > 0) s += " (cuda:0-" + std::to_string(ctx.visible_gpus - 1) + ")";
  if (!ctx.cuda_visible_devices.empty()) s += ", CUDA_VISIBLE_DEVICES=" + ctx.cuda_visible_devices;
  return s;
}

}  // namespace

c10::Device choose_device(const std::string& spec, const DeviceContext& ctx, comm::DeviceBackend backend) {
  const bool staged = backend == comm::DeviceBackend::Staged;
  // auto: a CUDA build that sees a GPU behaves like `cuda` (including its checks), else cpu.
  if (spec == "cpu" || (spec == "auto" && (!ctx.cuda_built || ctx.visible_gpus == 0))) {
    if (staged)
      throw TESSERA_INPUT_ERROR("comm.device_backend=staged stages the collectives of GPU tensors, but train.device=" + spec +
                                " runs on the CPU on host " + ctx.host + " (" + visible_note(ctx) +
                                "); use comm.device_backend=nccl (the default) or a GPU");
    return c10::Device(c10::kCPU);
  }
  int base = 0;
  if (spec == "auto" || spec == "cuda") {
    base = 0;
  } else if (spec.rfind("cuda:", 0) == 0) {
    const std::string idx = spec.substr(5);
    bool digits = !idx.empty() && idx.size() <= 4 && idx.find_first_not_of("0123456789") == std::string::npos;
    if (!digits)
      throw TESSERA_INPUT_ERROR("train.device '" + spec + "': expected cuda:N with N a GPU index (e.g. cuda:0)");
    base = std::stoi(idx);
  } else {
    throw TESSERA_INPUT_ERROR("train.device '" + spec + "' is not one of auto, cpu, cuda, cuda:N");
  }
  const int shared = staged ? ctx.visible_gpus - base : 0;  // GPUs the staged ranks share (cuda:N on)
  const int gpu = base + (shared > 0 ? ctx.local_rank % shared : ctx.local_rank);
  const std::string where = "train.device=" + spec + " on host " + ctx.host + " (local rank " +
                            std::to_string(ctx.local_rank) + ", device cuda:" + std::to_string(gpu) + "): ";
  if (!ctx.cuda_built)
    throw TESSERA_INPUT_ERROR(where + "this tessera was built without CUDA (CPU-only LibTorch); rebuild against a "
                                     "CUDA LibTorch with -DTESSERA_WITH_CUDA=ON, or use train.device=cpu");
  if (ctx.visible_gpus == 0)
    throw TESSERA_INPUT_ERROR(where + "no GPU is visible" +
                              (ctx.cuda_visible_devices.empty() ? std::string()
                                                                : " (CUDA_VISIBLE_DEVICES=" + ctx.cuda_visible_devices + ")") +
                              "; use train.device=cpu");
  if (staged && shared <= 0)
    throw TESSERA_INPUT_ERROR(where + "the host has " + visible_note(ctx));
  if (!staged && base + ctx.local_size > ctx.visible_gpus) {
    if (base == 0)
      throw TESSERA_INPUT_ERROR(where + "the host runs " + std::to_string(ctx.local_size) + " local ranks but has " +
                                visible_note(ctx) + "; one GPU per rank (NCCL refuses two ranks on one GPU), or "
                                "comm.device_backend=staged to share GPUs (collectives through host memory)");
    throw TESSERA_INPUT_ERROR(where + "GPUs cuda:" + std::to_string(base) + "-" +
                              std::to_string(base + ctx.local_size - 1) + " are needed for " +
                              std::to_string(ctx.local_size) + " local rank(s) but the host has " + visible_note(ctx));
  }
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(gpu));
}

std::string kernel_refusal(const KernelRequest& r) {
  const std::string rebuild = "rebuild for this GPU (-DCMAKE_CUDA_ARCHITECTURES)";
  if (!r.image_problem.empty() && r.fused_kernels)
    return "model.fused_kernels: Tessera's kernels cannot run on " + r.device + ": " + r.image_problem + "; " + rebuild +
           " or set model.fused_kernels=false (LibTorch's composites)";
  if (!r.image_problem.empty() && !r.own_optimizer_kernel.empty())
    return "optim.state_dtype " + r.own_optimizer_kernel + ": Tessera's AdamW kernel cannot run on " + r.device + ": " +
           r.image_problem + "; " + rebuild + " or set optim.state_dtype=fp32 (LibTorch's fused AdamW)";
  if (!r.varlen_problem.empty() && !r.varlen_for.empty())
    return "model.varlen_attention: " + r.varlen_for + " on " + r.device +
           " runs on FlashAttention's variable-length kernel, but " + r.varlen_problem +
           "; set model.varlen_attention=false (SDPA with a [B, 1, T, T] mask: slower, more memory)";
  return "";
}

DeviceContext device_context(const Bootstrap& b) {
  DeviceContext ctx;
  ctx.cuda_built = gpu::built();
  ctx.visible_gpus = ctx.cuda_built ? device::cuda_device_count() : 0;
  ctx.local_rank = b.local_rank;
  ctx.local_size = b.local_size;
  ctx.host = b.host;
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) ctx.cuda_visible_devices = v;
  return ctx;
}

comm::ProcessGroups device_groups(const Bootstrap& b, const c10::Device& device, comm::DeviceBackend backend) {
  if (device.is_cpu()) return b.groups;
  if (backend == comm::DeviceBackend::Staged) {  // the bootstrap's MPI groups, staged for the device
    device::set_current(device);
    auto stage = [&](const comm::CommPtr& c) { return c ? comm::make_staged_communicator(c, device) : nullptr; };
    return {stage(b.groups.world), stage(b.groups.intra), stage(b.groups.inter)};
  }
  if (!gpu::built())
    throw TESSERA_INPUT_ERROR("device " + device.str() + " on host " + b.host +
                              ": this tessera was built without CUDA (no NCCL process groups)");
  const int index = device.has_index() ? device.index() : 0;
  device::set_current(device);
  // Over the bootstrap's host groups, which stay their host companions.
  comm::ProcessGroups g;
  g.world = gpu::make_nccl_communicator(b.groups.world, "world", index);
  g.intra = gpu::make_nccl_communicator(b.groups.intra, "intra", index);
  g.inter = gpu::make_nccl_communicator(b.groups.inter, "inter", index);
  return g;
}

}  // namespace tessera::launcher
