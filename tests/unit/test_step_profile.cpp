// The step-time breakdown and the Chrome trace (runtime/profile/step_profile.h): parts are exclusive
// (a nested part's time is not also its parent's), parts + idle add up to the step, a part opened
// by another thread while the step's thread waits is not counted twice, and the trace holds one
// track per thread with the steps and parts as complete events. With a device clock (a scripted fake
// here) the parts are the device's intervals between the scopes' stamps, not host time; without one,
// or when a stamp fails, they are the host clock's.
// Also MFU's denominator (runtime/device/peak_flops.h): the GPU table by device name and the CPU
// formula on given /proc/cpuinfo texts.
#include <c10/core/Device.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "runtime/device/device.h"
#include "runtime/device/peak_flops.h"
#include "runtime/profile/step_profile.h"

namespace test_step_profile {  // the files of a gtest binary compile together (tests/CMakeLists.txt)

using namespace tessera;
using profile::Part;

namespace {
void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

double sum_of_parts(const profile::Breakdown& b) {
  double s = b.idle_s;
  for (double p : b.part_s) s += p;
  return s;
}

double sum_of_host_parts(const profile::Breakdown& b) {
  double s = b.host_idle_s;
  for (double p : b.host_part_s) s += p;
  return s;
}

// Installs a scripted device clock for one test; the tests after it run without one.
struct ScriptedClock {
  std::shared_ptr<profile::ScriptedDeviceClock> clock;
  explicit ScriptedClock(int capacity = 1 << 20) : clock(std::make_shared<profile::ScriptedDeviceClock>(capacity)) {
    profile::set_device_clock(clock);
  }
  ~ScriptedClock() { profile::set_device_clock(nullptr); }
  void advance_s(double s) { clock->advance(static_cast<int64_t>(s * 1e9)); }
};
}  // namespace

TEST(StepProfile, NestedPartsAreExclusiveAndAddUpToTheStep) {
  profile::begin_step(7);
  {
    profile::Scope forward(Part::Forward);
    sleep_ms(20);
    {
      profile::Scope wait(Part::GatherWait);
      sleep_ms(30);
    }
    sleep_ms(10);
  }
  sleep_ms(5);  // in no part: idle
  const profile::Breakdown b = profile::end_step();
  EXPECT_EQ(b.step, 7);
  EXPECT_GE(b.part(Part::Forward), 0.030);
  EXPECT_GE(b.part(Part::GatherWait), 0.030);
  EXPECT_GE(b.idle_s, 0.005);
  EXPECT_EQ(b.part(Part::Backward), 0.0);
  // Had the inner wait also been counted in forward, the parts would exceed the step by 30 ms.
  EXPECT_NEAR(sum_of_parts(b), b.step_s, 1e-9);
  EXPECT_NEAR(b.exposed_s, b.part(Part::GatherWait) + b.part(Part::ReduceWait), 1e-12);
  EXPECT_NEAR(b.compute_s(), b.part(Part::Forward), 1e-12);
  const nlohmann::json j = b.to_json();
  for (const char* k : {"step_s", "data_s", "forward_s", "backward_s", "recompute_s", "gather_wait_s", "reduce_wait_s",
                        "optimizer_s", "sync_wait_s", "idle_s", "comm_s", "exposed_comm_s", "overlap"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_NE(b.summary().find("gather wait"), std::string::npos);
  // No device clock: the host clock's parts, as they always were.
  EXPECT_EQ(b.clock, "host");
  EXPECT_EQ(b.part_s, b.host_part_s);
  EXPECT_EQ(b.step_s, b.host_step_s);
  EXPECT_FALSE(j.contains("host"));
}

TEST(StepProfile, APartOpenedByAThreadTheStepWaitsForIsCountedOnce) {
  // On a GPU autograd's device thread runs the engine's backward while the step's thread is blocked
  // in backward(): its gather wait comes out of backward, not on top of it.
  profile::begin_step(1);
  {
    profile::Scope backward(Part::Backward);
    std::thread t([] {
      profile::Scope wait(Part::GatherWait);
      sleep_ms(30);
    });
    t.join();
    sleep_ms(10);
  }
  const profile::Breakdown b = profile::end_step();
  EXPECT_GE(b.part(Part::GatherWait), 0.030);
  EXPECT_GE(b.part(Part::Backward), 0.010);
  EXPECT_NEAR(sum_of_parts(b), b.step_s, 1e-9);
}

TEST(StepProfile, BeginStepResetsAndMedianIsPerField) {
  profile::begin_step(1);
  {
    profile::Scope s(Part::Optimizer);
    sleep_ms(10);
  }
  profile::end_step();
  profile::begin_step(2);
  const profile::Breakdown b = profile::end_step();
  EXPECT_EQ(b.part(Part::Optimizer), 0.0);
  std::vector<profile::Breakdown> v(3);
  v[0].part_s[static_cast<int>(Part::Data)] = 3;
  v[1].part_s[static_cast<int>(Part::Data)] = 1;
  v[2].part_s[static_cast<int>(Part::Data)] = 2;
  v[0].step_s = 10, v[1].step_s = 30, v[2].step_s = 20;
  const profile::Breakdown m = profile::median(v);
  EXPECT_EQ(m.part(Part::Data), 2.0);
  EXPECT_EQ(m.step_s, 20.0);
}

TEST(StepProfile, TraceHasStepsPartsAndOneTrackPerThread) {
  char dir[] = "/tmp/tessera-trace-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/trace-rank-3.json";
  profile::begin_step(4);  // before the trace: not in it
  profile::end_step();
  profile::start_trace();
  EXPECT_TRUE(profile::tracing());
  for (int step : {5, 6}) {
    profile::begin_step(step);
    {
      profile::Scope forward(Part::Forward);
      sleep_ms(2);
    }
    profile::Scope backward(Part::Backward);
    std::thread([] { profile::Scope wait(Part::ReduceWait); }).join();
    (void)profile::end_step();
  }
  EXPECT_GT(profile::write_trace(path, 3), 0);
  EXPECT_FALSE(profile::tracing());
  std::ifstream in(path);
  const nlohmann::json t = nlohmann::json::parse(in);
  std::map<int, std::string> tracks;
  std::multiset<std::string> names;
  std::set<int> pids;
  for (const auto& e : t.at("traceEvents")) {
    pids.insert(e.at("pid").get<int>());
    if (e.at("ph") == "M" && e.at("name") == "thread_name") tracks[e.at("tid")] = e.at("args").at("name");
    if (e.at("ph") == "X") {
      names.insert(e.at("name").get<std::string>());
      EXPECT_GE(e.at("dur").get<double>(), 0.0);
    }
  }
  EXPECT_EQ(pids, std::set<int>{3});
  EXPECT_EQ(names.count("step 4"), 0u);
  EXPECT_EQ(names.count("step 5"), 1u);
  EXPECT_EQ(names.count("step 6"), 1u);
  EXPECT_EQ(names.count("forward"), 2u);
  EXPECT_EQ(names.count("reduce_wait"), 2u);
  // The steps' thread and the two helper threads: three compute tracks, the first named "compute".
  int compute_tracks = 0;
  for (const auto& [tid, name] : tracks) compute_tracks += name.rfind("compute", 0) == 0;
  EXPECT_EQ(compute_tracks, 3);
  EXPECT_EQ(tracks.at(1), "compute");
  // A step event carries its breakdown.
  for (const auto& e : t.at("traceEvents")) {
    if (e.at("name") == "step 5") {
      EXPECT_TRUE(e.at("args").contains("forward_s"));
    }
  }
  std::remove(path.c_str());
  rmdir(dir);
}

TEST(StepProfile, DeviceClockPartsAreTheDeviceIntervalsNotHostTime) {
  // The host scopes take microseconds; the device spends seconds in them (the host ran ahead).
  ScriptedClock dev;
  profile::begin_step(9);
  dev.advance_s(1);  // before any part: idle
  {
    profile::Scope forward(Part::Forward);
    dev.advance_s(20);
    {
      profile::Scope wait(Part::GatherWait);  // the compute stream blocked on an all-gather
      dev.advance_s(30);
    }
    dev.advance_s(10);
  }
  dev.advance_s(5);  // idle
  const profile::Breakdown b = profile::end_step();
  EXPECT_EQ(b.step, 9);
  EXPECT_EQ(b.clock, "scripted");
  EXPECT_TRUE(b.device_timed());
  EXPECT_NEAR(b.step_s, 66.0, 1e-9);
  EXPECT_NEAR(b.part(Part::Forward), 30.0, 1e-9);     // exclusive of the nested wait
  EXPECT_NEAR(b.part(Part::GatherWait), 30.0, 1e-9);
  EXPECT_NEAR(b.idle_s, 6.0, 1e-9);
  EXPECT_EQ(b.part(Part::Backward), 0.0);
  EXPECT_NEAR(sum_of_parts(b), b.step_s, 1e-9);
  EXPECT_NEAR(b.exposed_s, 30.0, 1e-9);  // the device's wait, not the host's ~0
  // end_step waited for the step's last stamp: begin, 2 per scope, end.
  EXPECT_EQ(dev.clock->stamps(), 6);
  EXPECT_EQ(dev.clock->last_waited(), 5);
  // The host clock's figures are kept beside them, and add up on their own.
  EXPECT_LT(b.host_step_s, 1.0);
  EXPECT_LT(b.host_part_s[static_cast<int>(Part::GatherWait)], 1.0);
  EXPECT_NEAR(sum_of_host_parts(b), b.host_step_s, 1e-9);
  const nlohmann::json j = b.to_json();
  EXPECT_EQ(j.at("clock"), "scripted");
  EXPECT_NEAR(j.at("forward_s").get<double>(), 30.0, 1e-9);
  EXPECT_NEAR(j.at("host").at("step").get<double>(), b.host_step_s, 1e-12);
  EXPECT_TRUE(j.at("host").contains("gather_wait"));
  double parts = 0;  // what tests/mpi/profile_trace.sh checks: a level's "_s" parts add up to step_s
  for (const auto& [k, v] : j.items())
    if (k.size() > 2 && k.compare(k.size() - 2, 2, "_s") == 0 && k != "step_s" && k != "comm_s" && k != "exposed_comm_s")
      parts += v.get<double>();
  EXPECT_NEAR(parts, j.at("step_s").get<double>(), 1e-9);
  EXPECT_NE(b.summary().find("| scripted clock | comm"), std::string::npos) << b.summary();
}

TEST(StepProfile, DeviceClockCountsAPartOfAnotherThreadOnce) {
  ScriptedClock dev;
  profile::begin_step(2);
  {
    profile::Scope backward(Part::Backward);
    dev.advance_s(4);
    std::thread t([&] {
      profile::Scope wait(Part::ReduceWait);
      dev.advance_s(3);
    });
    t.join();
    dev.advance_s(2);
  }
  const profile::Breakdown b = profile::end_step();
  EXPECT_NEAR(b.part(Part::Backward), 6.0, 1e-9);
  EXPECT_NEAR(b.part(Part::ReduceWait), 3.0, 1e-9);
  EXPECT_NEAR(b.idle_s, 0.0, 1e-9);
  EXPECT_NEAR(b.step_s, 9.0, 1e-9);
}

TEST(StepProfile, ClosingAnOuterScopeFirstEndsTheInnerOnesIntervalOnce) {
  // A scope of another thread that outlives the enclosing one: closing the outer closes both, the
  // interval since the last stamp going to the innermost.
  ScriptedClock dev;
  profile::begin_step(3);
  auto outer = std::make_unique<profile::Scope>(Part::Optimizer);
  dev.advance_s(1);
  auto inner = std::make_unique<profile::Scope>(Part::SyncWait);
  dev.advance_s(2);
  outer.reset();
  dev.advance_s(4);  // idle
  inner.reset();     // already closed: nothing
  const profile::Breakdown b = profile::end_step();
  EXPECT_NEAR(b.part(Part::Optimizer), 1.0, 1e-9);
  EXPECT_NEAR(b.part(Part::SyncWait), 2.0, 1e-9);
  EXPECT_NEAR(b.idle_s, 4.0, 1e-9);
  EXPECT_NEAR(sum_of_parts(b), b.step_s, 1e-9);
}

TEST(StepProfile, AFailedStampLeavesTheStepOnTheHostClock) {
  ScriptedClock dev(/*capacity=*/2);  // begin_step's stamp and one more
  profile::begin_step(4);
  {
    profile::Scope forward(Part::Forward);
    dev.advance_s(10);
    sleep_ms(5);
  }
  const profile::Breakdown b = profile::end_step();
  EXPECT_EQ(b.clock, "host");
  EXPECT_FALSE(b.device_timed());
  EXPECT_EQ(b.part_s, b.host_part_s);
  EXPECT_EQ(b.step_s, b.host_step_s);
  EXPECT_GE(b.part(Part::Forward), 0.005);
  EXPECT_LT(b.part(Part::Forward), 10.0);
  EXPECT_FALSE(b.to_json().contains("host"));
  // The next step tries the clock again.
  profile::begin_step(5);
  dev.advance_s(1);
  EXPECT_NEAR(profile::end_step().step_s, 1.0, 1e-9);
}

TEST(StepProfile, AClockTimesTheStepsThatBeginAfterItAndNoScopeOutsideAStep) {
  auto clock = std::make_shared<profile::ScriptedDeviceClock>();
  profile::begin_step(1);
  profile::set_device_clock(clock);  // mid-step: this step stays on the host clock
  { profile::Scope forward(Part::Forward); }
  EXPECT_EQ(profile::end_step().clock, "host");
  EXPECT_EQ(clock->stamps(), 0);
  EXPECT_EQ(profile::device_clock(), clock);
  profile::begin_step(2);
  EXPECT_EQ(profile::end_step().clock, "scripted");
  const int stamps = clock->stamps();
  { profile::Scope eval(Part::Forward); }  // between steps: no stamp
  EXPECT_EQ(clock->stamps(), stamps);
  profile::set_device_clock(nullptr);
  profile::begin_step(3);
  const profile::Breakdown b = profile::end_step();
  EXPECT_EQ(b.clock, "host");
  EXPECT_EQ(b.to_json().at("clock"), "host");
  EXPECT_EQ(b.summary().find(" clock"), std::string::npos);
  EXPECT_EQ(profile::device_clock(), nullptr);
  EXPECT_EQ(device::clock_for(c10::Device(c10::kCPU)), nullptr);
}

TEST(StepProfile, MedianKeepsTheClockAndTheHostFigures) {
  std::vector<profile::Breakdown> v(3);
  for (int i = 0; i < 3; ++i) {
    v[i].clock = "cuda";
    v[i].host_step_s = 1.0 + i;
    v[i].host_part_s[static_cast<int>(Part::SyncWait)] = 3.0 - i;
  }
  profile::Breakdown m = profile::median(v);
  EXPECT_EQ(m.clock, "cuda");
  EXPECT_EQ(m.host_step_s, 2.0);
  EXPECT_EQ(m.host_part_s[static_cast<int>(Part::SyncWait)], 2.0);
  v[1].clock = "host";
  EXPECT_EQ(profile::median(v).clock, "mixed");
}

// ---- MFU's peak -------------------------------------------------------------------------------
TEST(PeakFlops, GpuTableByDeviceName) {
  using device::gpu_peak;
  // Names as cudaGetDeviceProperties reports them; datasheet dense peaks.
  EXPECT_DOUBLE_EQ(gpu_peak("NVIDIA H100 80GB HBM3", at::kBFloat16).flops, 989e12);
  EXPECT_DOUBLE_EQ(gpu_peak("NVIDIA H100 80GB HBM3", at::kFloat).flops, 67e12);
  EXPECT_DOUBLE_EQ(gpu_peak("NVIDIA H100 PCIe", at::kBFloat16).flops, 756e12);
  EXPECT_DOUBLE_EQ(gpu_peak("NVIDIA H100 NVL", at::kHalf).flops, 835e12);
  EXPECT_DOUBLE_EQ(gpu_peak("NVIDIA H200", at::kBFloat16).flops, 989e12);
  EXPECT_DOUBLE_EQ(gpu_peak("NVIDIA A100-SXM4-80GB", at::kBFloat16).flops, 312e12);
  EXPECT_DOUBLE_EQ(gpu_peak("NVIDIA A100-PCIE-40GB", at::kFloat).flops, 19.5e12);
  EXPECT_DOUBLE_EQ(gpu_peak("NVIDIA L40S", at::kBFloat16).flops, 362e12);
  EXPECT_DOUBLE_EQ(gpu_peak("NVIDIA A10", at::kBFloat16).flops, 125e12);
  EXPECT_DOUBLE_EQ(gpu_peak("Tesla V100-SXM2-32GB", at::kHalf).flops, 125e12);
  EXPECT_DOUBLE_EQ(gpu_peak("Tesla V100-SXM2-32GB", at::kBFloat16).flops, 15.7e12);  // no bf16 tensor cores
  EXPECT_DOUBLE_EQ(gpu_peak("Tesla V100-PCIE-16GB", at::kFloat).flops, 14e12);
  EXPECT_NE(gpu_peak("NVIDIA H100 80GB HBM3", at::kBFloat16).source.find("vendor datasheet"), std::string::npos);
  // Whole words: an A10G is not an A10, an unknown GPU has no peak and says so.
  EXPECT_EQ(gpu_peak("NVIDIA A10G", at::kBFloat16).flops, 0);
  const device::Peak unknown = gpu_peak("NVIDIA GeForce RTX 3090", at::kBFloat16);
  EXPECT_EQ(unknown.flops, 0);
  EXPECT_NE(unknown.source.find("RTX 3090"), std::string::npos);
}

namespace {
// /proc/cpuinfo of `n` logical CPUs on `cores` physical cores with these flags.
std::string cpuinfo(int n, int cores, const std::string& flags, const char* mhz = "2600.000") {
  std::string s;
  for (int i = 0; i < n; ++i)
    s += "processor\t: " + std::to_string(i) + "\nmodel name\t: Test CPU\ncpu MHz\t\t: " + mhz +
         "\nphysical id\t: 0\ncore id\t\t: " + std::to_string(i % cores) + "\nflags\t\t: fpu sse sse2 " + flags + "\n\n";
  return s;
}
}  // namespace

TEST(PeakFlops, CpuFormula) {
  using device::cpu_peak;
  using device::parse_cpu_info;
  const auto avx512 = parse_cpu_info(cpuinfo(2, 2, "fma avx2 avx512f"), 0);
  EXPECT_EQ(avx512.logical_cpus, 2);
  EXPECT_EQ(avx512.physical_cores, 2);
  EXPECT_DOUBLE_EQ(avx512.mhz, 2600);
  // 2 cores x 16 lanes x 2 (FMA) x 2 units x 2.6 GHz
  EXPECT_DOUBLE_EQ(cpu_peak(avx512, 2, at::kFloat).flops, 2 * 64 * 2.6e9);
  EXPECT_DOUBLE_EQ(cpu_peak(avx512, 1, at::kFloat).flops, 64 * 2.6e9);
  EXPECT_DOUBLE_EQ(cpu_peak(avx512, 8, at::kFloat).flops, 2 * 64 * 2.6e9);  // at most the cores there are
  EXPECT_DOUBLE_EQ(cpu_peak(avx512, 2, at::kBFloat16).flops, 2 * 64 * 2.6e9);  // no bf16 instructions: fp32's
  const auto bf16 = parse_cpu_info(cpuinfo(2, 2, "fma avx2 avx512f avx512_bf16"), 0);
  EXPECT_DOUBLE_EQ(cpu_peak(bf16, 2, at::kBFloat16).flops, 2 * 128 * 2.6e9);
  const auto amx = parse_cpu_info(cpuinfo(2, 2, "fma avx2 avx512f avx512_bf16 amx_bf16 amx_tile"), 0);
  EXPECT_DOUBLE_EQ(cpu_peak(amx, 2, at::kBFloat16).flops, 2 * 1024 * 2.6e9);
  EXPECT_DOUBLE_EQ(cpu_peak(amx, 2, at::kFloat).flops, 2 * 64 * 2.6e9);
  // AVX2 + FMA: 8 lanes; SMT: 4 logical CPUs on 2 cores, 2 threads occupy one core's units.
  const auto avx2 = parse_cpu_info(cpuinfo(4, 2, "fma avx2"), 0);
  EXPECT_EQ(avx2.physical_cores, 2);
  EXPECT_DOUBLE_EQ(cpu_peak(avx2, 2, at::kFloat).flops, 1 * 32 * 2.6e9);
  EXPECT_DOUBLE_EQ(cpu_peak(avx2, 4, at::kFloat).flops, 2 * 32 * 2.6e9);
  // sysfs cpuinfo_max_freq (kHz) wins over "cpu MHz".
  const auto turbo = parse_cpu_info(cpuinfo(2, 2, "fma avx2 avx512f"), 3.5e6);
  EXPECT_DOUBLE_EQ(cpu_peak(turbo, 2, at::kFloat).flops, 2 * 64 * 3.5e9);
  EXPECT_NE(cpu_peak(turbo, 2, at::kFloat).source.find("cpuinfo_max_freq"), std::string::npos);
  // No x86 vector flags (another architecture) or no clock: unknown, not guessed.
  EXPECT_EQ(cpu_peak(parse_cpu_info("processor\t: 0\nFeatures\t: fp asimd\n", 0), 1, at::kFloat).flops, 0);
  EXPECT_EQ(cpu_peak(parse_cpu_info(cpuinfo(1, 1, "avx512f", "0"), 0), 1, at::kFloat).flops, 0);
  // The override wins over everything.
  EXPECT_DOUBLE_EQ(device::peak_flops(at::kCPU, at::kFloat, 2, 1e15).flops, 1e15);
}

}  // namespace test_step_profile
