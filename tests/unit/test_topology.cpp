// Topology probing on fake sysfs trees (tests/unit/fixtures/sysfs-*) and on NVML results given as
// data: the test machine has neither GPUs, InfiniBand nor NVML.
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "launcher/topology.h"

namespace test_topology {  // the files of a gtest binary compile together (tests/CMakeLists.txt)

using namespace tessera::launcher;

namespace {

std::string fixture(const std::string& name) {
  const char* src = std::getenv("TESSERA_TEST_SRC");
  return std::string(src ? src : ".") + "/tests/unit/fixtures/" + name;
}

// The eight H200 bus ids of the sysfs-dgx fixture, in PCI order.
const std::vector<std::string> kDgxBus = {"0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0",
                                          "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0"};

TEST(Topology, FixturesArePresent) {
  ASSERT_NE(std::getenv("TESSERA_TEST_SRC"), nullptr) << "run through ctest (sets TESSERA_TEST_SRC)";
  // A typo in the path would otherwise make every "empty" expectation pass vacuously.
  ASSERT_FALSE(read_pci_gpus(fixture("sysfs-dgx")).empty());
}

TEST(Topology, CanonicalPciBusId) {
  EXPECT_EQ(canonical_pci_bus_id("00000000:1B:00.0"), "0000:1b:00.0");  // NVML form
  EXPECT_EQ(canonical_pci_bus_id("0000:1b:00.0"), "0000:1b:00.0");      // sysfs form
  EXPECT_EQ(canonical_pci_bus_id("0001:DB:1F.3"), "0001:db:1f.3");
  EXPECT_EQ(canonical_pci_bus_id("not-a-bus-id"), "not-a-bus-id");
}

TEST(Topology, InfinibandPortsWithStateRateAndLinkLayer) {
  auto ib = read_infiniband(fixture("sysfs-dgx"));
  ASSERT_EQ(ib.size(), 3u);
  EXPECT_EQ(ib[0].device, "mlx5_0");
  EXPECT_EQ(ib[0].port, 1);
  EXPECT_EQ(ib[0].state, "4: ACTIVE");
  EXPECT_EQ(ib[0].rate, "200 Gb/sec (4X HDR)");
  EXPECT_EQ(ib[0].link_layer, "InfiniBand");
  EXPECT_EQ(ib[1].device, "mlx5_1");
  EXPECT_EQ(ib[1].port, 1);
  EXPECT_EQ(ib[1].state, "1: DOWN");
  EXPECT_EQ(ib[1].rate, "10 Gb/sec (4X SDR)");
  EXPECT_EQ(ib[2].device, "mlx5_1");
  EXPECT_EQ(ib[2].port, 2);
  EXPECT_EQ(ib[2].state, "4: ACTIVE");
  EXPECT_EQ(ib[2].link_layer, "Ethernet");
}

TEST(Topology, EightGpusOnTwoNumaNodesSkippingSwitchesBmcAndNics) {
  auto gpus = read_pci_gpus(fixture("sysfs-dgx"));
  ASSERT_EQ(gpus.size(), 8u);  // not the 4 NVSwitches (0x0680), the ASPEED VGA or the mlx5 HCAs
  for (size_t i = 0; i < gpus.size(); ++i) {
    EXPECT_EQ(gpus[i].index, static_cast<int>(i));
    EXPECT_EQ(gpus[i].pci_bus_id, kDgxBus[i]);
    EXPECT_EQ(gpus[i].numa_node, i < 4 ? 0 : 1) << gpus[i].pci_bus_id;
    EXPECT_EQ(gpus[i].name, "NVIDIA [10de:2335]");
  }
}

TEST(Topology, VgaClassGpuWithoutNuma) {
  auto gpus = read_pci_gpus(fixture("sysfs-workstation"));
  ASSERT_EQ(gpus.size(), 1u);  // the HDMI audio function (class 0x0403) is not a GPU
  EXPECT_EQ(gpus[0].pci_bus_id, "0000:01:00.0");
  EXPECT_EQ(gpus[0].numa_node, -1);
  EXPECT_TRUE(read_infiniband(fixture("sysfs-workstation")).empty());
}

TEST(Topology, EmptyAndMissingTreesMeanNothingFound) {
  for (const auto& root : {fixture("sysfs-empty"), fixture("does-not-exist")}) {
    EXPECT_TRUE(read_pci_gpus(root).empty()) << root;
    EXPECT_TRUE(read_infiniband(root).empty()) << root;
  }
  auto t = probe_topology(fixture("sysfs-empty"), "");
  EXPECT_TRUE(t.gpus.empty());
  EXPECT_TRUE(t.nvlink.empty());
  EXPECT_FALSE(t.nvml_available);
}

TEST(Topology, NcclSettingsListSetVariablesAndImportantUnsetOnes) {
  std::string a = "NCCL_IB_HCA=mlx5_0:1,mlx5_1:1", b = "NCCL_DEBUG=INFO", c = "PATH=/usr/bin",
              d = "NCCL_MY_TUNABLE=7", e = "XNCCL_IB_HCA=no";
  char* env[] = {a.data(), b.data(), c.data(), d.data(), e.data(), nullptr};
  auto s = nccl_settings(env);
  EXPECT_EQ(s.at("NCCL_IB_HCA"), "mlx5_0:1,mlx5_1:1");
  EXPECT_EQ(s.at("NCCL_DEBUG"), "INFO");
  EXPECT_EQ(s.at("NCCL_MY_TUNABLE"), "7");              // any NCCL_* variable that is set
  EXPECT_EQ(s.at("NCCL_SOCKET_IFNAME"), kNcclUnset);    // important, not set
  EXPECT_EQ(s.count("PATH"), 0u);
  EXPECT_EQ(s.count("XNCCL_IB_HCA"), 0u);
}

TEST(Topology, WithoutNvmlNvlinkIsUnknown) {
  auto t = probe_topology(fixture("sysfs-dgx"), "libnvidia-ml-does-not-exist.so.1");
  EXPECT_FALSE(t.nvml_available);
  EXPECT_NE(t.nvml_status.find("libnvidia-ml-does-not-exist.so.1"), std::string::npos) << t.nvml_status;
  ASSERT_EQ(t.nvlink.size(), 8u);
  EXPECT_EQ(t.nvlink[0][0], "X");
  EXPECT_EQ(t.nvlink[0][7], "unknown");
  auto j = topology_to_json(t);
  EXPECT_EQ(j["nvlink"], "unknown");
  EXPECT_EQ(j["gpus"].size(), 8u);
  EXPECT_EQ(j["gpus"][4]["numa_node"], 1);
  EXPECT_EQ(j["infiniband"][1]["state"], "1: DOWN");
  const std::string text = format_topology(j);
  EXPECT_NE(text.find("nvlink: unknown"), std::string::npos) << text;
  EXPECT_NE(text.find("mlx5_0 port 1  4: ACTIVE  200 Gb/sec (4X HDR)  InfiniBand"), std::string::npos) << text;
  EXPECT_NE(text.find("gpu 7  0000:db:00.0  numa 1"), std::string::npos) << text;
  EXPECT_NE(text.find("nccl unset (defaults): NCCL_ALGO"), std::string::npos) << text;
}

// HGX H200: every GPU has 18 active links spread over 4 NVSwitches (NVML reports the switch's bus id
// as the remote end); all pairs are NV18, as nvidia-smi topo -m shows.
TEST(Topology, NvswitchFabricConnectsAllPairs) {
  auto gpus = read_pci_gpus(fixture("sysfs-dgx"));
  std::vector<NvmlDevice> devs;
  const std::vector<std::string> switches = {"0000:05:00.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0"};
  for (const auto& bus : kDgxBus) {
    NvmlDevice d;
    // NVML's own spelling: 8-digit domain, upper case.
    d.pci_bus_id = canonical_pci_bus_id("0000" + bus);
    d.name = "NVIDIA H200";
    for (int link = 0; link < 18; ++link) d.nvlink_peers.push_back(switches[link % 4]);
    devs.push_back(d);
  }
  auto m = merge_nvml(gpus, devs);
  ASSERT_EQ(gpus.size(), 8u);
  EXPECT_EQ(gpus[3].name, "NVIDIA H200");
  ASSERT_EQ(m.size(), 8u);
  for (size_t i = 0; i < 8; ++i)
    for (size_t j = 0; j < 8; ++j) EXPECT_EQ(m[i][j], i == j ? "X" : "NV18") << i << "," << j;
}

// Direct GPU-to-GPU links (e.g. 4-GPU boards): counted per pair; pairs without a link are "none";
// a device NVML sees but sysfs does not is appended.
TEST(Topology, DirectLinksCountedPerPair) {
  std::vector<GpuInfo> gpus = read_pci_gpus(fixture("sysfs-workstation"));  // 0000:01:00.0
  const std::string g0 = "0000:01:00.0", g1 = "0000:02:00.0", g2 = "0000:03:00.0";
  std::vector<NvmlDevice> devs = {
      {g0, "GPU-A", {g1, g1, g1, g1}},
      {g1, "GPU-B", {g0, g0, g0, g0, g2, g2}},
      {g2, "GPU-C", {g1, g1}},
  };
  auto m = merge_nvml(gpus, devs);
  ASSERT_EQ(gpus.size(), 3u);
  EXPECT_EQ(gpus[0].name, "GPU-A");
  EXPECT_EQ(gpus[0].numa_node, -1);
  EXPECT_EQ(gpus[2].pci_bus_id, g2);
  EXPECT_EQ(gpus[2].index, 2);
  EXPECT_EQ(m[0][1], "NV4");
  EXPECT_EQ(m[1][0], "NV4");
  EXPECT_EQ(m[1][2], "NV2");
  EXPECT_EQ(m[0][2], "none");
  EXPECT_EQ(m[2][0], "none");
  EXPECT_EQ(m[2][2], "X");

  NodeTopology t;
  t.gpus = gpus;
  t.nvlink = m;
  t.nvml_available = true;
  t.nvml_status = "ok";
  auto j = topology_to_json(t);
  ASSERT_TRUE(j["nvlink"].is_array());
  EXPECT_EQ(j["nvlink"][0][1], "NV4");
  const std::string text = format_topology(j);
  EXPECT_NE(text.find("NV4"), std::string::npos) << text;
  EXPECT_NE(text.find("infiniband: none"), std::string::npos) << text;
}

}  // namespace

}  // namespace test_topology
