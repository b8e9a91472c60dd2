// Node topology as seen by one process: the NVIDIA GPUs on the PCI bus (bus id, NUMA node), NVLink
// connectivity between them (through NVML, loaded with dlopen at run time so there is no link
// dependency on the driver), the InfiniBand devices and ports with their state and rate, and the
// NCCL settings in force. Everything that reads the machine takes the sysfs root as a parameter, so
// tests run the same code on fake trees (tests/unit/fixtures/sysfs-*).
//
// Nothing here talks to other ranks: `tessera topo` probes on each node's local rank 0 and gathers.
#pragma once
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace tessera::launcher {

struct GpuInfo {
  int index = 0;           // position in PCI bus order (= NVML / CUDA_DEVICE_ORDER=PCI_BUS_ID order)
  std::string name;        // NVML name ("NVIDIA H200") when NVML is there, else "NVIDIA [10de:<device>]"
  std::string pci_bus_id;  // canonical "dddd:bb:dd.f", lower-case hex
  int numa_node = -1;      // -1: unknown / not NUMA
};

struct IbPort {
  std::string device;      // "mlx5_0"
  int port = 0;            // 1-based port number
  std::string state;       // as sysfs prints it: "4: ACTIVE", "1: DOWN"
  std::string rate;        // "200 Gb/sec (4X HDR)"
  std::string link_layer;  // "InfiniBand" or "Ethernet" (RoCE)
};

struct NodeTopology {
  std::vector<GpuInfo> gpus;
  // gpus.size() x gpus.size(): "X" on the diagonal, "NV<k>" for k NVLinks (direct or through the
  // same NVSwitch fabric), "none" for no NVLink; every off-diagonal entry is "unknown" when NVML is
  // not available.
  std::vector<std::vector<std::string>> nvlink;
  bool nvml_available = false;
  std::string nvml_status;  // why NVML is unavailable ("libnvidia-ml.so.1: cannot open ..."), or "ok"
  std::vector<IbPort> ib;
  // Every NCCL_* variable set, plus the important unset ones mapped to kNcclUnset.
  std::map<std::string, std::string> nccl_env;
};

// Value recorded in NodeTopology::nccl_env for an important NCCL variable that is not set.
inline constexpr const char* kNcclUnset = "(unset)";

// What NVML reports for one device; the input of the NVLink matrix (pure, unit-tested).
struct NvmlDevice {
  std::string pci_bus_id;                // canonical form (see canonical_pci_bus_id)
  std::string name;
  std::vector<std::string> nvlink_peers;  // remote PCI bus id of each ACTIVE link (GPU or NVSwitch)
};

// Probes the node. `nvml_library` is the library dlopen()ed for NVLink ("" skips NVML); `env` is an
// environ-style array (nullptr: this process's environment).
NodeTopology probe_topology(const std::string& sysfs_root = "/sys",
                            const std::string& nvml_library = "libnvidia-ml.so.1", char** env = nullptr);

// <root>/class/infiniband/<dev>/ports/<n>/{state,rate,link_layer}, sorted by device then port.
// A missing directory means no InfiniBand (empty result), not an error.
std::vector<IbPort> read_infiniband(const std::string& sysfs_root);

// <root>/bus/pci/devices/*/ with vendor 0x10de and class 0x030200 (3D controller) or 0x030000 (VGA),
// sorted by bus id and numbered in that order. NVSwitches (class 0x0680xx) are not GPUs.
std::vector<GpuInfo> read_pci_gpus(const std::string& sysfs_root);

// NCCL_* variables of an environ-style array plus the important unset ones (NCCL_IB_HCA,
// NCCL_SOCKET_IFNAME, ...), the latter mapped to kNcclUnset.
std::map<std::string, std::string> nccl_settings(char** env);

// "00000000:1B:00.0" (NVML) or "0000:1b:00.0" (sysfs) -> "0000:1b:00.0". Returns the input
// lower-cased when it does not look like a PCI address.
std::string canonical_pci_bus_id(const std::string& id);

// Adds NVML's view to the sysfs GPU list: names by bus id; devices NVML sees that sysfs does not
// are appended (numa_node -1). Returns the NVLink matrix over the resulting list: direct links are
// counted per GPU pair; links to a remote that is not a GPU (NVSwitch) connect every pair of GPUs
// attached to that same switch, with min(links of either GPU into the shared switches).
std::vector<std::vector<std::string>> merge_nvml(std::vector<GpuInfo>& gpus, const std::vector<NvmlDevice>& devs);

// Reads NVML through dlopen(library). Returns false with `why` set when the library or a symbol is
// missing or NVML fails to initialise.
bool query_nvml(const std::string& library, std::vector<NvmlDevice>& out, std::string& why);

// JSON for `tessera topo --json`: {"gpus": [...], "nvlink": matrix | "unknown", "nvml": status,
// "infiniband": [...], "nccl_env": {...}}.
nlohmann::json topology_to_json(const NodeTopology& t);

// Human-readable block (several lines, each ending in '\n') for the table form of `tessera topo`,
// every line prefixed with `indent`.
std::string format_topology(const nlohmann::json& topology_json, const std::string& indent = "  ");

}  // namespace tessera::launcher
