#include "runtime/device/peak_flops.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include "runtime/gpu/gpu.h"

namespace tessera::device {
namespace {

std::vector<std::string> upper_words(const std::string& s) {
  std::vector<std::string> words(1);
  for (char c : s) {
    if (std::isalnum(static_cast<unsigned char>(c))) words.back() += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    else if (!words.back().empty()) words.emplace_back();
  }
  if (words.back().empty()) words.pop_back();
  return words;
}

std::string tflops_text(double tflops) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", tflops);
  return buf;
}

const char* dtype_name(c10::ScalarType dtype) {
  return dtype == c10::kBFloat16 ? "bf16" : dtype == c10::kHalf ? "fp16" : "fp32";
}

bool has_flag(const CpuInfo& cpu, const char* flag) {
  return std::find(cpu.flags.begin(), cpu.flags.end(), flag) != cpu.flags.end();
}

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t\r");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

}  // namespace

// Dense peaks (no structured sparsity) from the vendors' datasheets.
const std::vector<GpuPeakEntry>& gpu_peak_table() {
  static const std::vector<GpuPeakEntry> table = {
      {{"H200", "NVL"}, "NVIDIA H200 NVL", 835, 60},
      {{"H200"}, "NVIDIA H200 (SXM)", 989, 67},
      {{"H100", "NVL"}, "NVIDIA H100 NVL", 835, 60},
      {{"H100", "PCIE"}, "NVIDIA H100 PCIe", 756, 51},
      {{"H100"}, "NVIDIA H100 SXM", 989, 67},
      {{"A100"}, "NVIDIA A100", 312, 19.5},
      {{"L40S"}, "NVIDIA L40S", 362, 91.6},
      {{"L40"}, "NVIDIA L40", 181, 90.5},
      {{"L4"}, "NVIDIA L4", 121, 30.3},
      {{"A40"}, "NVIDIA A40", 149.7, 37.4},
      {{"A10"}, "NVIDIA A10", 125, 31.2},
      {{"V100S"}, "NVIDIA V100S PCIe", 130, 16.4, false},
      {{"V100", "PCIE"}, "NVIDIA V100 PCIe", 112, 14, false},
      {{"V100"}, "NVIDIA V100 SXM2", 125, 15.7, false},
  };
  return table;
}

Peak gpu_peak(const std::string& name, c10::ScalarType dtype) {
  const std::vector<std::string> words = upper_words(name);
  for (const GpuPeakEntry& e : gpu_peak_table()) {
    const bool all = std::all_of(e.match.begin(), e.match.end(), [&](const std::string& m) {
      return std::find(words.begin(), words.end(), m) != words.end();
    });
    if (!all) continue;
    const bool half = dtype == c10::kHalf || (dtype == c10::kBFloat16 && e.bf16);
    const double tf = half ? e.half_tflops : e.fp32_tflops;
    return {tf * 1e12, "vendor datasheet: " + e.name + " dense " + std::string(half ? dtype_name(dtype) : "fp32") +
                           " " + tflops_text(tf) + " TFLOP/s"};
  }
  return {0, "GPU '" + name + "' is not in the peak table (runtime/device/peak_flops.cpp)"};
}

CpuInfo parse_cpu_info(const std::string& text, double max_freq_khz) {
  CpuInfo cpu;
  std::set<std::pair<std::string, std::string>> cores;  // (physical id, core id)
  std::string physical, line;
  std::istringstream in(text);
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = trim(line.substr(0, colon)), value = trim(line.substr(colon + 1));
    if (key == "processor") ++cpu.logical_cpus;
    else if (key == "physical id") physical = value;
    else if (key == "core id") cores.insert({physical, value});
    else if (key == "model name" && cpu.model.empty()) cpu.model = value;
    else if (key == "cpu MHz") cpu.mhz = std::max(cpu.mhz, std::atof(value.c_str()));
    else if (key == "flags" && cpu.flags.empty()) {
      std::istringstream words(value);
      for (std::string w; words >> w;) cpu.flags.push_back(w);
    }
  }
  cpu.physical_cores = cores.empty() ? cpu.logical_cpus : static_cast<int>(cores.size());
  cpu.freq_source = cpu.mhz > 0 ? "/proc/cpuinfo cpu MHz" : "";
  if (max_freq_khz > 0) {
    cpu.mhz = max_freq_khz / 1000.0;
    cpu.freq_source = "cpuinfo_max_freq";
  }
  return cpu;
}

CpuInfo read_cpu_info() {
  std::ifstream in("/proc/cpuinfo");
  std::stringstream text;
  text << in.rdbuf();
  double khz = 0;
  std::ifstream freq("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq");
  if (freq) freq >> khz;
  return parse_cpu_info(text.str(), khz);
}

double cpu_flops_per_cycle(const CpuInfo& cpu, c10::ScalarType dtype) {
  double fp32 = 0;
  if (has_flag(cpu, "avx512f")) fp32 = 16 * 2 * 2;  // lanes x FMA x 2 units
  else if (has_flag(cpu, "avx2") && has_flag(cpu, "fma")) fp32 = 8 * 2 * 2;
  else if (has_flag(cpu, "sse2")) fp32 = 4 * 2;  // one mul and one add unit
  if (fp32 == 0) return 0;
  if (dtype == c10::kBFloat16) {
    if (has_flag(cpu, "amx_bf16")) return 1024;
    if (has_flag(cpu, "avx512_bf16")) return 2 * fp32;
  } else if (dtype == c10::kHalf) {
    if (has_flag(cpu, "amx_fp16")) return 1024;
    if (has_flag(cpu, "avx512_fp16")) return 2 * fp32;
  }
  return fp32;
}

Peak cpu_peak(const CpuInfo& cpu, int threads, c10::ScalarType dtype) {
  const double per_cycle = cpu_flops_per_cycle(cpu, dtype);
  if (per_cycle == 0 || cpu.mhz <= 0 || cpu.logical_cpus <= 0)
    return {0, "CPU peak unknown (" + std::string(per_cycle == 0 ? "no x86 vector flags" : "no frequency") +
                   " in /proc/cpuinfo)"};
  const double cores = std::min<double>(cpu.physical_cores,
                                        double(std::max(threads, 1)) * cpu.physical_cores / cpu.logical_cpus);
  char buf[256];
  std::snprintf(buf, sizeof buf, "CPU %s: %g core(s) x %g %s FLOP/cycle x %g GHz (%s)", cpu.model.c_str(), cores,
                per_cycle, dtype_name(dtype), cpu.mhz / 1000.0, cpu.freq_source.c_str());
  return {cores * per_cycle * cpu.mhz * 1e6, buf};
}

Peak peak_flops(const c10::Device& device, c10::ScalarType dtype, int threads, double override_flops) {
  if (override_flops > 0) return {override_flops, "train.peak_flops"};
  if (device.is_cpu()) return cpu_peak(read_cpu_info(), threads, dtype);
  if (device.is_cuda()) return gpu_peak(gpu::device_name(device.has_index() ? device.index() : -1), dtype);
  return {0, "no peak known for device " + device.str()};
}

}  // namespace tessera::device
