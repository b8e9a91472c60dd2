#include "runtime/profile/kernel_trace.h"
#include <ATen/record_function.h>
#include <c10/core/Device.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <unistd.h>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <exception>
#include <memory>
#include <set>
#include "util/error.h"
#include "util/output_file.h"

namespace tessera::profile {
namespace {

namespace kineto_api = torch::autograd::profiler;
namespace kineto_config = torch::profiler::impl;

std::atomic<bool> kernel_trace_running{false};  // set by the step's thread, read by any (annotate)

class RecordAnnotation : public KernelAnnotation {
 public:
  explicit RecordAnnotation(const std::string& name) { span_.before(name, c10::ArrayRef<const c10::IValue>{}); }

 private:
  at::RecordFunction span_{at::RecordScope::USER_SCOPE};  // its destructor ends the span
};

// What LibTorch says when it was built without Kineto (torch/csrc/profiler/kineto_shim.cpp).
bool says_no_kineto(const std::string& what) { return what.find("Kineto support") != std::string::npos; }

// Saves `result` at `path` through a fresh temporary beside it (create_fresh: whatever is at that
// name, a planted link too, is unlinked first, so Kineto's stream opens our own file), renamed
// over the name. "" when saved, else why not; a LibTorch without Kineto: its own message.
std::string save_kernel_trace(kineto_api::ProfilerResult& result, const std::string& path, bool& kineto) {
  kineto = true;
  const std::string tmp = path + ".tmp";
  const int fd = util::create_fresh(tmp.c_str());
  if (fd < 0) return util::output_error(tmp, errno);
  ::close(fd);
  std::string why;
  try {
    result.save(tmp);
  } catch (const c10::Error& e) {
    why = e.what_without_backtrace();
    kineto = !says_no_kineto(why);
  } catch (const std::exception& e) {  // Kineto's own (a file it cannot write)
    why = e.what();
  }
  if (why.empty() && std::rename(tmp.c_str(), path.c_str()) != 0) why = util::output_error(path, errno);
  if (!why.empty()) std::remove(tmp.c_str());
  return why;
}

}  // namespace

void start_kernel_trace(const c10::Device& device) {
  if (kernel_trace_running) return;
  std::set<kineto_config::ActivityType> activities{kineto_config::ActivityType::CPU};
  if (device.is_cuda()) activities.insert(kineto_config::ActivityType::CUDA);
  const kineto_config::ProfilerConfig config(kineto_config::ProfilerState::KINETO);
  kineto_api::prepareProfiler(config, activities);
  kineto_api::enableProfiler(config, activities);
  kernel_trace_running = true;
}

bool kernel_tracing() { return kernel_trace_running; }

std::unique_ptr<KernelAnnotation> annotate(const std::string& name) {
  if (!kernel_trace_running) return nullptr;
  return std::make_unique<RecordAnnotation>(name);
}

KernelTrace write_kernel_trace(const std::string& path) {
  KernelTrace t;
  if (!kernel_trace_running) {
    t.note = "kernel trace: the profiler was not running; " + path + " not written";
    return t;
  }
  kernel_trace_running = false;
  std::unique_ptr<kineto_api::ProfilerResult> result = kineto_api::disableProfiler();
  for (const kineto_api::KinetoEvent& e : result->events()) {
    const bool host = e.deviceType() == c10::DeviceType::CPU, span = host && e.name().rfind("tessera/", 0) == 0;
    ++(span ? t.spans : host ? t.host_ops : t.device_events);
  }
  bool kineto = true;
  const std::string why = save_kernel_trace(*result, path, kineto);
  if (!kineto) {
    t.note = "kernel trace: this LibTorch has no Kineto (built without USE_KINETO; PyTorch's pip and conda "
             "packages have it), so it recorded " + std::to_string(t.host_ops) + " operators and " +
             std::to_string(t.spans) + " Tessera spans but cannot save them; " + path + " not written";
    return t;
  }
  if (!why.empty()) throw TESSERA_INPUT_ERROR("cannot write the kernel trace " + path + ": " + why + " (train.profile_steps)");
  t.written = true;
  t.note = path + ": " + std::to_string(t.device_events) + " device kernels and copies, " + std::to_string(t.host_ops) +
           " operators on the host, " + std::to_string(t.spans) + " Tessera spans";
  return t;
}

}  // namespace tessera::profile
