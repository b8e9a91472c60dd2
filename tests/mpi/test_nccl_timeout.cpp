// The NCCL watchdog on a real GPU (skipped where this build has no CUDA path or no GPU is visible):
// an operation that cannot complete is reported, within its timeout plus a few seconds, by the next
// call on the communicator as one line naming the operation, communicator, rank, host and device;
// the communicator is aborted and refuses further work. The stall is made on this rank's own GPU --
// a host function holds the caller's stream, so the collective queued behind it cannot start --
// because one GPU cannot hold two NCCL ranks; it therefore runs at world size 1 only
// (tests/gpu/run.sh adds a stalled-peer `tessera train` where two GPUs exist).
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "launcher/bootstrap.h"
#include "runtime/comm/communicator.h"
#include "runtime/device/device.h"
#include "util/error.h"
#ifdef TESSERA_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include "runtime/gpu/nccl.h"
#endif

namespace test_nccl_timeout {  // the files of a gtest binary compile together (tests/CMakeLists.txt)

#ifdef TESSERA_WITH_CUDA
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::atomic<bool> g_release{false};
// Runs on CUDA's host-callback thread and holds the stream until released (120 s at most, so that a
// failing test cannot wedge the GPU). Makes no CUDA call, as host functions must not.
void CUDART_CB hold_stream(void*) {
  const auto until = Clock::now() + std::chrono::seconds(120);
  while (!g_release && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

}  // namespace
#endif

TEST(NcclWatchdog, StalledCollectiveTimesOutWithOneLineError) {
#ifndef TESSERA_WITH_CUDA
  GTEST_SKIP() << "this build has no CUDA path (TESSERA_WITH_CUDA)";
#else
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (!torch::cuda::is_available() || !tessera::gpu::nccl_available()) GTEST_SKIP() << "no GPU visible";
  if (size != 1) GTEST_SKIP() << "the stall is made on one rank's own GPU: world size 1 only";
  const int gpu = tessera::launcher::current().gpu >= 0 ? tessera::launcher::current().gpu : 0;
  const c10::Device device(c10::kCUDA, static_cast<c10::DeviceIndex>(gpu));
  tessera::device::set_current(device);
  auto comm = tessera::gpu::make_nccl_communicator(tessera::launcher::current().groups.world, "nccl-timeout", gpu);
  at::Tensor t = at::ones({1000}, at::TensorOptions().dtype(at::kFloat).device(device));

  // A healthy collective first (its completed wait leaves the watchdog's list).
  comm->all_reduce(t)->wait(std::chrono::seconds(2));
  EXPECT_EQ(t.sum().item<double>(), 1000.0);

  // The caller's stream held: the all_reduce queued behind it cannot start.
  g_release = false;
  ASSERT_EQ(cudaLaunchHostFunc(c10::cuda::getCurrentCUDAStream(gpu).stream(), hold_stream, nullptr), cudaSuccess);
  const auto timeout = std::chrono::seconds(2);
  tessera::comm::WorkPtr work = comm->all_reduce(t);
  const auto t0 = Clock::now();
  work->wait(timeout);  // does not block the host; arms the watchdog
  EXPECT_LT(seconds_since(t0), 1.0) << "wait() blocked the host";
  std::string msg;
  tessera::ErrorKind kind = tessera::ErrorKind::Internal;
  bool thrown = false;
  while (!thrown && seconds_since(t0) < 2.0 + 10.0) {
    try {
      work->wait(timeout);  // the next call on the communicator reports the watchdog's finding
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    } catch (const tessera::Error& e) {
      msg = e.what();
      kind = e.kind();
      thrown = true;
    }
  }
  const double after = seconds_since(t0);
  g_release = true;  // the stream goes on before any assertion can end the test
  ASSERT_TRUE(thrown) << "no error within 12 s of a 2 s timeout";
  EXPECT_GE(after, 2.0);
  EXPECT_LE(after, 2.0 + 10.0);
  EXPECT_EQ(kind, tessera::ErrorKind::Timeout) << msg;
  for (const std::string& needle :
       {"all_reduce(sum) on comm 'nccl-timeout' (rank 0 of 1, host " + tessera::process_host() + ")",
        "device cuda:" + std::to_string(gpu), std::string("did not complete within 2s")})
    EXPECT_NE(msg.find(needle), std::string::npos) << "'" << needle << "' not in: " << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  // Aborted: every later operation is refused with the same error, before anything is enqueued.
  try {
    comm->barrier();
    ADD_FAILURE() << "barrier() on an aborted communicator did not throw";
  } catch (const tessera::Error& e) {
    EXPECT_EQ(std::string(e.what()), msg);
  }
  tessera::device::synchronize(device);
  const auto t1 = Clock::now();
  comm.reset();
  work.reset();  // the last reference: the communicator's destructor waits for the abort (<= 10 s)
  EXPECT_LT(seconds_since(t1), 11.0);
#endif
}

}  // namespace test_nccl_timeout
