// The hardware's peak FLOP/s for one rank in its compute dtype: the denominator of MFU (model
// FLOPs utilisation = achieved model FLOP/s / peak). Never measured: a measured GEMM is not the
// hardware's peak (it made MFU read 115-416%, issue 35).
//   - GPU: a table of vendor datasheet dense peaks (no sparsity) by device name (gpu_peak_table()):
//     bf16/fp16 tensor-core rate, fp32 the non-tensor rate (LibTorch does not use TF32 for fp32
//     matmuls by default). A name not in the table has no peak (MFU not reported).
//   - CPU: cores x FLOP per cycle per core x frequency, from /proc/cpuinfo (and sysfs):
//       fp32 FLOP/cycle = lanes x 2 (an FMA is 2 FLOPs) x FMA units, lanes 16 with avx512f, 8 with
//       avx2+fma (SSE without fma: 4 lanes, one mul and one add unit = 8); ASSUMED 2 FMA units per
//       core (Intel Xeon Gold/Platinum from Skylake on, Haswell and later, AMD Zen 2-5; Xeon
//       Silver/Bronze and AMD Zen 4's 512-bit double pumping have half: set the override there).
//       bf16: amx_bf16 -> 1024 FLOP/cycle (Intel's AMX rate); avx512_bf16 (vdpbf16ps) -> 2x the fp32
//       rate; neither -> the fp32 rate: the model's bf16 products are widened to fp32 there
//       (model/widened_gemm.h; LibTorch 1.13's own bf16 GEMM ran at 1.6 GFLOP/s against 78 in fp32
//       on an AVX2 host). fp16 alike with amx_fp16 / avx512_fp16.
//       Frequency: cpuinfo_max_freq (sysfs), else the highest "cpu MHz" in /proc/cpuinfo: the
//       highest clock, so the peak is an upper bound (AVX-512 code runs slower) and MFU conservative.
//       Cores: this rank's compute threads, counted as the physical cores they occupy
//       (threads x physical / logical CPUs, at most the physical cores).
//       Other architectures (no x86 flags or no frequency): no peak.
//   - an override (train.peak_flops / --peak-flops, FLOP/s per rank) replaces both.
#pragma once
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <string>
#include <vector>

namespace tessera::device {

struct Peak {
  double flops = 0;    // FLOP/s of one rank; 0: unknown (MFU is then not reported)
  std::string source;  // how it was found, e.g. "vendor datasheet: NVIDIA H100 SXM bf16 989 TFLOP/s"
};

// One GPU of the table: the first entry whose every `match` word is a word of the device name
// (words split at anything not a letter or digit, case-insensitive: "A10" is not "A100" nor "A10G")
// is taken, so more specific entries come first.
struct GpuPeakEntry {
  std::vector<std::string> match;  // e.g. {"H100", "PCIE"}
  std::string name;                // e.g. "NVIDIA H100 PCIe"
  double half_tflops = 0;          // dense fp16 / bf16 tensor-core peak
  double fp32_tflops = 0;          // fp32 without tensor cores
  bool bf16 = true;                // false: no bf16 tensor cores (V100): bf16 gets the fp32 rate
};
const std::vector<GpuPeakEntry>& gpu_peak_table();
// The peak of a GPU called `name` (as cudaGetDeviceProperties reports it) in `dtype`; flops 0
// when the name is not in the table.
Peak gpu_peak(const std::string& name, c10::ScalarType dtype);

// What the CPU formula needs, read from the machine (read_cpu_info) or given by a test.
struct CpuInfo {
  int logical_cpus = 0, physical_cores = 0;
  std::vector<std::string> flags;  // /proc/cpuinfo "flags" of the first processor
  double mhz = 0;                  // highest clock in MHz (0: unknown)
  std::string freq_source;         // "cpuinfo_max_freq" or "/proc/cpuinfo cpu MHz"
  std::string model;               // "model name"
};
// Parses /proc/cpuinfo text; max_freq_khz > 0 (sysfs cpuinfo_max_freq) wins over "cpu MHz".
CpuInfo parse_cpu_info(const std::string& proc_cpuinfo, double max_freq_khz);
CpuInfo read_cpu_info();  // this machine
// FLOP per cycle of one core in `dtype` (0: no x86 vector flags known).
double cpu_flops_per_cycle(const CpuInfo& cpu, c10::ScalarType dtype);
// Peak of `threads` compute threads on this CPU (see the formula above).
Peak cpu_peak(const CpuInfo& cpu, int threads, c10::ScalarType dtype);

// The peak of one rank computing in `dtype` on `device` with `threads` CPU threads; override > 0
// replaces it ("train.peak_flops").
Peak peak_flops(const c10::Device& device, c10::ScalarType dtype, int threads, double override_flops);

}  // namespace tessera::device
