#include "runtime/device/gemm_probe.h"

#include <torch/torch.h>

#include <chrono>

#include "runtime/device/device.h"

namespace tessera::device {

// Matmul throughput of this rank in the compute dtype on its device, measured once: the
// denominator of metrics' "mfu_of_measured_gemm", a diagnostic. MFU itself divides by the
// hardware's peak (runtime/device/peak_flops.h).
double measure_gemm_flops(at::ScalarType dtype, at::Device device) {
  using Clock = std::chrono::steady_clock;
  auto seconds_since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  const int64_t n = device.is_cpu() ? 512 : 4096;
  auto a = torch::randn({n, n}).to(device, dtype), b = torch::randn({n, n}).to(device, dtype);
  torch::NoGradGuard ng;
  auto c = torch::matmul(a, b);  // warm up
  synchronize(device);
  int iters = 0;
  auto t0 = Clock::now();
  while (seconds_since(t0) < 0.15) {
    c = torch::matmul(a, b);
    ++iters;
  }
  synchronize(device);  // a device queues the matmuls; count them once they have run
  return 2.0 * n * n * n * iters / seconds_since(t0);
}

std::string unsupported_matmul(at::ScalarType dtype, at::Device device) {
  try {
    at::NoGradGuard no_grad;
    const at::Tensor a = at::ones({2, 2}, at::TensorOptions().dtype(dtype).device(device));
    at::matmul(a, a);
    at::addmm(a, a, a);  // nn::Linear's CPU kernel
    return "";
  } catch (const std::exception& e) {
    std::string msg = e.what();
    if (const auto nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
    return msg.empty() ? "matmul failed" : msg;
  }
}

}  // namespace tessera::device
