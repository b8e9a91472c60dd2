#include "launcher/topology.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

extern char** environ;

namespace tessera::launcher {
namespace fs = std::filesystem;

namespace {

// First line of a sysfs attribute, without the trailing newline; "" when unreadable.
std::string read_attr(const fs::path& p) {
  std::ifstream in(p);
  std::string line;
  if (in) std::getline(in, line);
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r' || line.back() == ' ')) line.pop_back();
  return line;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// Sorted names of the entries of a directory; empty when it does not exist.
std::vector<std::string> list_dir(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) names.push_back(it->path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// Variables NCCL users tune most often; reported even when unset so the report shows the default.
const char* const kImportantNccl[] = {"NCCL_IB_HCA",        "NCCL_SOCKET_IFNAME", "NCCL_DEBUG",
                                      "NCCL_IB_DISABLE",    "NCCL_P2P_DISABLE",   "NCCL_NET_GDR_LEVEL",
                                      "NCCL_CROSS_NIC",     "NCCL_ALGO",          "NCCL_PROTO",
                                      "NCCL_NVLS_ENABLE",   "NCCL_TOPO_FILE",     "NCCL_IB_GID_INDEX"};

}  // namespace

std::string canonical_pci_bus_id(const std::string& id) {
  unsigned domain = 0, bus = 0, dev = 0, fn = 0;
  char tail = 0;
  if (std::sscanf(id.c_str(), "%x:%x:%x.%x%c", &domain, &bus, &dev, &fn, &tail) == 4) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%04x:%02x:%02x.%x", domain & 0xffffu, bus, dev, fn);
    return buf;
  }
  return lower(id);
}

std::vector<IbPort> read_infiniband(const std::string& sysfs_root) {
  std::vector<IbPort> out;
  const fs::path cls = fs::path(sysfs_root) / "class" / "infiniband";
  for (const auto& dev : list_dir(cls)) {
    std::vector<IbPort> ports;
    for (const auto& p : list_dir(cls / dev / "ports")) {
      const fs::path dir = cls / dev / "ports" / p;
      IbPort port;
      port.device = dev;
      try {
        port.port = std::stoi(p);
      } catch (const std::exception&) {
        continue;  // not a port directory
      }
      port.state = read_attr(dir / "state");
      port.rate = read_attr(dir / "rate");
      port.link_layer = read_attr(dir / "link_layer");
      ports.push_back(port);
    }
    // Directory order is lexical ("10" < "2"); ports are numbered.
    std::sort(ports.begin(), ports.end(), [](const IbPort& a, const IbPort& b) { return a.port < b.port; });
    out.insert(out.end(), ports.begin(), ports.end());
  }
  return out;
}

std::vector<GpuInfo> read_pci_gpus(const std::string& sysfs_root) {
  std::vector<GpuInfo> out;
  const fs::path devices = fs::path(sysfs_root) / "bus" / "pci" / "devices";
  for (const auto& bdf : list_dir(devices)) {
    const fs::path dir = devices / bdf;
    if (lower(read_attr(dir / "vendor")) != "0x10de") continue;
    const std::string cls = lower(read_attr(dir / "class"));
    if (cls != "0x030200" && cls != "0x030000") continue;
    GpuInfo g;
    g.pci_bus_id = canonical_pci_bus_id(bdf);
    const std::string device_id = lower(read_attr(dir / "device"));
    g.name = "NVIDIA [10de:" + (device_id.rfind("0x", 0) == 0 ? device_id.substr(2) : device_id) + "]";
    try {
      g.numa_node = std::stoi(read_attr(dir / "numa_node"));
    } catch (const std::exception&) {
      g.numa_node = -1;
    }
    out.push_back(g);
  }
  std::sort(out.begin(), out.end(), [](const GpuInfo& a, const GpuInfo& b) { return a.pci_bus_id < b.pci_bus_id; });
  for (size_t i = 0; i < out.size(); ++i) out[i].index = static_cast<int>(i);
  return out;
}

std::map<std::string, std::string> nccl_settings(char** env) {
  std::map<std::string, std::string> out;
  for (const char* name : kImportantNccl) out[name] = kNcclUnset;
  for (char** e = env ? env : environ; e && *e; ++e) {
    const std::string kv = *e;
    const size_t eq = kv.find('=');
    if (kv.rfind("NCCL_", 0) != 0 || eq == std::string::npos) continue;
    out[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return out;
}

std::vector<std::vector<std::string>> merge_nvml(std::vector<GpuInfo>& gpus, const std::vector<NvmlDevice>& devs) {
  std::map<std::string, size_t> gpu_of_bus;  // bus id -> index into gpus
  for (size_t i = 0; i < gpus.size(); ++i) gpu_of_bus[gpus[i].pci_bus_id] = i;
  std::vector<const NvmlDevice*> nvml_of(gpus.size(), nullptr);
  for (const auto& d : devs) {
    auto it = gpu_of_bus.find(d.pci_bus_id);
    if (it == gpu_of_bus.end()) {  // visible to NVML but not in sysfs (e.g. a restricted container)
      GpuInfo g;
      g.index = static_cast<int>(gpus.size());
      g.pci_bus_id = d.pci_bus_id;
      it = gpu_of_bus.emplace(d.pci_bus_id, gpus.size()).first;
      gpus.push_back(g);
      nvml_of.push_back(nullptr);
    }
    if (!d.name.empty()) gpus[it->second].name = d.name;
    nvml_of[it->second] = &d;
  }

  // Per GPU: direct links to each other GPU, and links into non-GPU remotes (NVSwitches).
  const size_t n = gpus.size();
  std::vector<std::vector<int>> direct(n, std::vector<int>(n, 0));
  std::vector<std::set<std::string>> switches(n);
  std::vector<int> switch_links(n, 0);
  for (size_t i = 0; i < n; ++i) {
    if (!nvml_of[i]) continue;
    for (const auto& peer : nvml_of[i]->nvlink_peers) {
      auto it = gpu_of_bus.find(peer);
      if (it != gpu_of_bus.end()) {
        ++direct[i][it->second];
      } else {
        switches[i].insert(peer);
        ++switch_links[i];
      }
    }
  }
  std::vector<std::vector<std::string>> m(n, std::vector<std::string>(n, "none"));
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      if (i == j) {
        m[i][j] = "X";
        continue;
      }
      // Links are reported from both ends; trust the smaller count if they disagree.
      int links = std::min(direct[i][j], direct[j][i]);
      bool shared_switch = std::any_of(switches[i].begin(), switches[i].end(),
                                       [&](const std::string& s) { return switches[j].count(s) > 0; });
      if (shared_switch) links += std::min(switch_links[i], switch_links[j]);
      if (links > 0) m[i][j] = "NV" + std::to_string(links);
    }
  }
  return m;
}

// ---- NVML through dlopen ---------------------------------------------------------------------
// The few NVML declarations used (nvml.h, stable ABI). nvmlPciInfo_t has a 16-byte bus-id string
// first and then domain/bus/device in both the v1 and v3 layouts; the buffer is sized for v3.
namespace {
using nvmlReturn_t = int;
using nvmlDevice_t = struct nvmlDevice_st*;
constexpr nvmlReturn_t NVML_SUCCESS = 0;
constexpr unsigned NVML_NVLINK_MAX_LINKS = 18;
constexpr int NVML_FEATURE_ENABLED = 1;
struct nvmlPciInfo_t {
  char busIdLegacy[16];
  unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
};

struct Nvml {
  void* lib = nullptr;
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  const char* (*error_string)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*count)(unsigned*) = nullptr;
  nvmlReturn_t (*handle)(unsigned, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*pci)(nvmlDevice_t, nvmlPciInfo_t*) = nullptr;
  nvmlReturn_t (*name)(nvmlDevice_t, char*, unsigned) = nullptr;
  nvmlReturn_t (*link_state)(nvmlDevice_t, unsigned, int*) = nullptr;
  nvmlReturn_t (*remote_pci)(nvmlDevice_t, unsigned, nvmlPciInfo_t*) = nullptr;

  ~Nvml() {
    if (lib) dlclose(lib);
  }
  // Versioned symbol first (what nvml.h maps the plain name to), then the plain one.
  template <typename F>
  bool sym(F& f, const char* versioned, const char* plain) {
    void* p = versioned ? dlsym(lib, versioned) : nullptr;
    if (!p) p = dlsym(lib, plain);
    f = reinterpret_cast<F>(p);
    return p != nullptr;
  }
  std::string err(nvmlReturn_t r) const {
    return error_string ? std::string(error_string(r)) : "NVML error " + std::to_string(r);
  }
};

std::string bus_id_of(const nvmlPciInfo_t& p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%04x:%02x:%02x.0", p.domain & 0xffffu, p.bus, p.device);
  return buf;
}
}  // namespace

bool query_nvml(const std::string& library, std::vector<NvmlDevice>& out, std::string& why) {
  out.clear();
  if (library.empty()) {
    why = "NVML not requested";
    return false;
  }
  Nvml nv;
  nv.lib = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!nv.lib) {
    const char* e = dlerror();
    why = e ? e : (library + ": cannot be loaded");
    return false;
  }
  nv.sym(nv.error_string, nullptr, "nvmlErrorString");
  if (!nv.sym(nv.init, "nvmlInit_v2", "nvmlInit") || !nv.sym(nv.shutdown, nullptr, "nvmlShutdown") ||
      !nv.sym(nv.count, "nvmlDeviceGetCount_v2", "nvmlDeviceGetCount") ||
      !nv.sym(nv.handle, "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex") ||
      !nv.sym(nv.pci, "nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo") ||
      !nv.sym(nv.name, nullptr, "nvmlDeviceGetName") ||
      !nv.sym(nv.link_state, nullptr, "nvmlDeviceGetNvLinkState") ||
      !nv.sym(nv.remote_pci, "nvmlDeviceGetNvLinkRemotePciInfo_v2", "nvmlDeviceGetNvLinkRemotePciInfo")) {
    why = library + ": missing NVML symbols";
    return false;
  }
  if (nvmlReturn_t r = nv.init(); r != NVML_SUCCESS) {
    why = "nvmlInit: " + nv.err(r);
    return false;
  }
  unsigned count = 0;
  nvmlReturn_t r = nv.count(&count);
  for (unsigned i = 0; r == NVML_SUCCESS && i < count; ++i) {
    nvmlDevice_t h = nullptr;
    nvmlPciInfo_t pci{};
    if ((r = nv.handle(i, &h)) != NVML_SUCCESS || (r = nv.pci(h, &pci)) != NVML_SUCCESS) break;
    NvmlDevice d;
    d.pci_bus_id = bus_id_of(pci);
    char name[96] = {0};
    if (nv.name(h, name, sizeof(name)) == NVML_SUCCESS) d.name = name;
    for (unsigned link = 0; link < NVML_NVLINK_MAX_LINKS; ++link) {
      int active = 0;
      nvmlPciInfo_t remote{};
      // Links past the device's count return an error; inactive links are skipped.
      if (nv.link_state(h, link, &active) != NVML_SUCCESS || active != NVML_FEATURE_ENABLED) continue;
      if (nv.remote_pci(h, link, &remote) == NVML_SUCCESS) d.nvlink_peers.push_back(bus_id_of(remote));
    }
    out.push_back(std::move(d));
  }
  nv.shutdown();
  if (r != NVML_SUCCESS) {
    why = "NVML device query: " + nv.err(r);
    out.clear();
    return false;
  }
  why = "ok";
  return true;
}

NodeTopology probe_topology(const std::string& sysfs_root, const std::string& nvml_library, char** env) {
  NodeTopology t;
  t.gpus = read_pci_gpus(sysfs_root);
  t.ib = read_infiniband(sysfs_root);
  t.nccl_env = nccl_settings(env);
  std::vector<NvmlDevice> devs;
  t.nvml_available = query_nvml(nvml_library, devs, t.nvml_status);
  if (t.nvml_available) {
    t.nvlink = merge_nvml(t.gpus, devs);
  } else {
    const size_t n = t.gpus.size();
    t.nvlink.assign(n, std::vector<std::string>(n, "unknown"));
    for (size_t i = 0; i < n; ++i) t.nvlink[i][i] = "X";
  }
  return t;
}

nlohmann::json topology_to_json(const NodeTopology& t) {
  nlohmann::json gpus = nlohmann::json::array(), ib = nlohmann::json::array();
  for (const auto& g : t.gpus)
    gpus.push_back({{"index", g.index}, {"name", g.name}, {"pci_bus_id", g.pci_bus_id}, {"numa_node", g.numa_node}});
  for (const auto& p : t.ib)
    ib.push_back({{"device", p.device}, {"port", p.port}, {"state", p.state}, {"rate", p.rate}, {"link_layer", p.link_layer}});
  return {{"gpus", gpus},
          {"nvlink", t.nvml_available ? nlohmann::json(t.nvlink) : nlohmann::json("unknown")},
          {"nvml", t.nvml_status},
          {"infiniband", ib},
          {"nccl_env", t.nccl_env}};
}

std::string format_topology(const nlohmann::json& t, const std::string& indent) {
  std::ostringstream os;
  const auto& gpus = t.at("gpus");
  os << indent << "gpus: " << gpus.size() << (gpus.empty() ? " (no NVIDIA GPU on the PCI bus)" : "") << "\n";
  for (const auto& g : gpus)
    os << indent << "  gpu " << g.at("index").get<int>() << "  " << g.at("pci_bus_id").get<std::string>() << "  numa "
       << g.at("numa_node").get<int>() << "  " << g.at("name").get<std::string>() << "\n";
  if (!gpus.empty()) {
    if (t.at("nvlink").is_string()) {
      os << indent << "nvlink: unknown (" << t.at("nvml").get<std::string>() << ")\n";
    } else {
      os << indent << "nvlink:";
      for (size_t j = 0; j < gpus.size(); ++j) os << "  " << std::setw(5) << ("gpu" + std::to_string(j));
      os << "\n";
      for (size_t i = 0; i < gpus.size(); ++i) {
        os << indent << "  gpu" << std::left << std::setw(3) << i << std::right;
        for (const auto& cell : t.at("nvlink")[i]) os << "  " << std::setw(5) << cell.get<std::string>();
        os << "\n";
      }
    }
  }
  const auto& ib = t.at("infiniband");
  os << indent << "infiniband: " << (ib.empty() ? "none" : std::to_string(ib.size()) + " port(s)") << "\n";
  for (const auto& p : ib)
    os << indent << "  " << p.at("device").get<std::string>() << " port " << p.at("port").get<int>() << "  "
       << p.at("state").get<std::string>() << "  " << p.at("rate").get<std::string>() << "  "
       << p.at("link_layer").get<std::string>() << "\n";
  std::string set, unset;
  for (const auto& [k, v] : t.at("nccl_env").items()) {
    if (v.get<std::string>() == kNcclUnset) unset += " " + k;
    else set += " " + k + "=" + v.get<std::string>();
  }
  os << indent << "nccl set:" << (set.empty() ? " (none)" : set) << "\n";
  if (!unset.empty()) os << indent << "nccl unset (defaults):" << unset << "\n";
  return os.str();
}

}  // namespace tessera::launcher
