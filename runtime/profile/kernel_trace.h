// The device kernels of the profiled steps (train.profile_steps), from LibTorch's Kineto profiler.
//
// step_profile.h's trace shows the host side of a step (its parts, each communicator's thread);
// on a GPU the host runs ahead of the device and that trace cannot say which kernels ran or how
// long each took. Between start_kernel_trace() and write_kernel_trace() LibTorch's Kineto
// profiler (torch/csrc/autograd/profiler_kineto.h) records the LibTorch operators the step's
// thread runs (and the autograd threads it hands backward to) and, on a CUDA device, every kernel,
// memcpy and memset on the device (CUPTI, all streams: NCCL's kernels too); write_kernel_trace
// saves them as Kineto's Chrome trace (chrome://tracing, ui.perfetto.dev; device kernels have
// "cat": "kernel"). benchmarks/kernel_table.py groups the kernels' time per step into GEMM,
// attention, glue, copies, loss, optimizer and communication (docs/PERFORMANCE.md).
//
// KINETO. Kineto is a build option of LibTorch (USE_KINETO). PyTorch's pip and conda packages have
// it; Debian's LibTorch 1.13 does not: there the profiler still collects the operators, but
// cannot save them ("Saving a trace requires ... Kineto support"). Which one a program links is
// known only at run time, so write_kernel_trace tries, and when the LibTorch has no Kineto it
// writes nothing and says so in its note (the trainer prints it as a warning): the trace is never
// skipped silently. The header names only LibTorch's API that 1.13 and 2.x share.
//
// ANNOTATIONS. While the profiler runs, every profile::Phase (phase.h) also opens a named span in
// the trace (a LibTorch USER_SCOPE RecordFunction, which Kineto writes as a "user_annotation"
// event): "tessera/<part>" for a part of the step ("tessera/forward", "tessera/optimizer", ...),
// "tessera/<label>" for a memory label ("tessera/head and loss") and "tessera/<activity> <step>"
// for an activity ("tessera/train step 3"). A kernel's "External id" names the operator that
// launched it, and the spans around that operator say which part of the step it belongs to:
// kernel_table.py counts the optimizer's and the loss's kernels by them, and the steps.
//
// THREADS. The profiler is thread-local to the thread that starts it, with the state handed to
// the autograd threads that run its backward: start and write on the step's thread. annotate()
// may be called by any thread (a span on a thread the profiler does not observe records nothing).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

namespace c10 {
struct Device;
}

namespace tessera::profile {

struct KernelTrace {
  bool written = false;
  int64_t device_events = 0;  // kernels, memcpys and memsets on the device (0 on a CPU)
  int64_t host_ops = 0;       // LibTorch operators on the host
  int64_t spans = 0;          // Tessera's spans (ANNOTATIONS above)
  // One line: what was written ("<path>: 8123 device kernels and copies, 20456 operators on the
  // host, 310 Tessera spans"), or why nothing was ("kernel trace: this LibTorch has no Kineto
  // (...), so it recorded 5270 operators and 120 Tessera spans but cannot save them; <path> not
  // written").
  std::string note;
};

// Starts the profiler: operators on the host, and the device's kernels, memcpys and memsets when
// `device` is a CUDA device. Does nothing while one is running.
void start_kernel_trace(const c10::Device& device);
bool kernel_tracing();

// A span of the kernel trace (ANNOTATIONS above), open while the object lives.
class KernelAnnotation {
 public:
  virtual ~KernelAnnotation() = default;
};
// The span `name`; null while no kernel trace runs (one atomic load: call it unconditionally).
std::unique_ptr<KernelAnnotation> annotate(const std::string& name);

// Stops the profiler and saves its Chrome trace at `path` (replacing what is there, never writing
// through a link planted at the name: util/output_file.h). Without Kineto nothing is written (see
// KINETO above). A trace that cannot be written for any other reason is an input error naming
// the file. Without a running profiler: not written, and the note says so.
KernelTrace write_kernel_trace(const std::string& path);

}  // namespace tessera::profile
