// Slurm hostlist and tasks-per-node expansion, checked by hand-written cases and against
// `scontrol show hostnames` (the reference implementation) where Slurm is installed.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <unistd.h>

#include "launcher/slurm_env.h"
#include "util/error.h"
#include "tests/support/test_support.h"

namespace test_hostlist {  // the files of a gtest binary compile together (tests/CMakeLists.txt)

using tessera::launcher::expand_hostlist;
using tessera::launcher::expand_tasks_per_node;
using Hosts = std::vector<std::string>;
using tessera::test::expect_input_error;

TEST(Hostlist, PlainNamesAndLists) {
  EXPECT_EQ(expand_hostlist("login2"), Hosts({"login2"}));
  EXPECT_EQ(expand_hostlist("a,b,c"), Hosts({"a", "b", "c"}));
  EXPECT_EQ(expand_hostlist("node-1.cluster,n_2"), Hosts({"node-1.cluster", "n_2"}));
  EXPECT_EQ(expand_hostlist(""), Hosts{});
}

TEST(Hostlist, RangesKeepLowerBoundPadding) {
  EXPECT_EQ(expand_hostlist("gpu[001-004,010],login2"),
            Hosts({"gpu001", "gpu002", "gpu003", "gpu004", "gpu010", "login2"}));
  EXPECT_EQ(expand_hostlist("n[8-11]"), Hosts({"n8", "n9", "n10", "n11"}));
  EXPECT_EQ(expand_hostlist("n[08-11]"), Hosts({"n08", "n09", "n10", "n11"}));
  EXPECT_EQ(expand_hostlist("n[098-101]"), Hosts({"n098", "n099", "n100", "n101"}));
  EXPECT_EQ(expand_hostlist("n[01-3]"), Hosts({"n01", "n02", "n03"}));
  EXPECT_EQ(expand_hostlist("n[1-03]"), Hosts({"n1", "n2", "n3"}));  // upper bound's width is ignored
  EXPECT_EQ(expand_hostlist("n[0-0]"), Hosts({"n0"}));
  EXPECT_EQ(expand_hostlist("n[07]"), Hosts({"n07"}));
  EXPECT_EQ(expand_hostlist("n[1,3,5-6]"), Hosts({"n1", "n3", "n5", "n6"}));
  EXPECT_EQ(expand_hostlist("n[3,1]"), Hosts({"n3", "n1"}));  // order as written, no sorting
  EXPECT_EQ(expand_hostlist("a[1-2],a[1-2]"), Hosts({"a1", "a2", "a1", "a2"}));  // no de-duplication
  EXPECT_EQ(expand_hostlist("[1-2]"), Hosts({"1", "2"}));
}

TEST(Hostlist, SeveralBracketGroupsAreACartesianProduct) {
  EXPECT_EQ(expand_hostlist("r[1-2]-n[01-03]"),
            Hosts({"r1-n01", "r1-n02", "r1-n03", "r2-n01", "r2-n02", "r2-n03"}));
  EXPECT_EQ(expand_hostlist("a[1-2]b[1,3],c"), Hosts({"a1b1", "a1b3", "a2b1", "a2b3", "c"}));
  // Three or more groups: the last varies fastest, the others nest from the second-to-last down,
  // exactly as Slurm's hostlist.c orders them.
  EXPECT_EQ(expand_hostlist("x[0-1]y[0-1]z[0-1]"),
            Hosts({"x0y0z0", "x0y0z1", "x1y0z0", "x1y0z1", "x0y1z0", "x0y1z1", "x1y1z0", "x1y1z1"}));
  EXPECT_EQ(expand_hostlist("a[1-2]b[1-3]c[1-2]d[5]").size(), 12u);
  EXPECT_EQ(expand_hostlist("a[1-2]b[1-3]c[1-2]d[5]")[1], "a2b1c1d5");  // group a varies next-fastest
}

TEST(Hostlist, MalformedInputIsAnInputErrorNamingTheText) {
  expect_input_error([] { expand_hostlist("n[1-2"); }, {"n[1-2"});
  expect_input_error([] { expand_hostlist("n[1-2"); }, {"unclosed"});
  expect_input_error([] { expand_hostlist("n1-2]"); }, {"']' without '['"});
  expect_input_error([] { expand_hostlist("n[[1]]"); }, {"nested"});
  expect_input_error([] { expand_hostlist("n[]"); }, {"bad range"});
  expect_input_error([] { expand_hostlist("n[1,]"); }, {"bad range"});
  expect_input_error([] { expand_hostlist("n[1-]"); }, {"bad range"});
  expect_input_error([] { expand_hostlist("n[-1]"); }, {"bad range"});
  expect_input_error([] { expand_hostlist("n[1--2]"); }, {"bad range"});
  expect_input_error([] { expand_hostlist("n[a-b]"); }, {"bad range"});
  expect_input_error([] { expand_hostlist("n[3-1]"); }, {"backwards"});
  expect_input_error([] { expand_hostlist("n[1-2]-ib"); }, {"text after the last ']'"});
  expect_input_error([] { expand_hostlist("a,,b"); }, {"empty host name"});
  expect_input_error([] { expand_hostlist("a,"); }, {"empty host name"});
  expect_input_error([] { expand_hostlist("a b"); }, {"whitespace"});
  expect_input_error([] { expand_hostlist("a\nb"); }, {"'a\\x0ab'"});  // quoted escaped: still one line
  expect_input_error([] { expand_hostlist("n[0-99999999]"); }, {"too large"});
  expect_input_error([] { expand_hostlist("n[0-999][0-999][0-999]"); }, {"too many hosts"});
  expect_input_error([] { expand_hostlist("n[1-99999999999999999999]"); }, {"bad range"});
  // Found by tests/fuzz/fuzz_hostlist: a few KB of text expanded to gigabytes of names (the host
  // count limit alone let a 4000-character name times 10^6 through), and every group of
  // "[0-999999][0-999999]..." was expanded before the product was checked.
  expect_input_error([] { expand_hostlist(std::string(4000, 'x') + "[0-999999]"); }, {"MiB of host names"});
  expect_input_error([] {
    std::string many;
    for (int i = 0; i < 300; ++i) many += "[0-999999]";
    expand_hostlist(many);
  }, {"too many hosts"});
}

TEST(TasksPerNode, Expands) {
  EXPECT_EQ(expand_tasks_per_node("2(x3),1"), std::vector<int>({2, 2, 2, 1}));
  EXPECT_EQ(expand_tasks_per_node("4"), std::vector<int>({4}));
  EXPECT_EQ(expand_tasks_per_node("1,2,3"), std::vector<int>({1, 2, 3}));
  EXPECT_EQ(expand_tasks_per_node("8(x2)"), std::vector<int>({8, 8}));
  EXPECT_EQ(expand_tasks_per_node("3(x1),2(x2)"), std::vector<int>({3, 2, 2}));
}

TEST(TasksPerNode, MalformedIsAnInputError) {
  for (const char* bad : {"", "x", "2(x3", "2x3", "2(3)", "2(x)", "2(x0)", "0", "-1", "2(x3),", ",1", "2(x3)1", "1.5"})
    expect_input_error([&] { expand_tasks_per_node(bad); }, {std::string("'") + bad + "'"});
}

// --- oracle: scontrol show hostnames --------------------------------------------------------------

namespace {

// Runs `scontrol show hostnames LIST` without a controller (a throw-away slurm.conf is enough).
// Returns the hosts, or nullopt when scontrol rejected the list.
class Scontrol {
 public:
  static bool available() { return std::system("command -v scontrol >/dev/null 2>&1") == 0; }

  std::optional<Hosts> expand(const std::string& list) const {
    const std::string cmd = "SLURM_CONF=" + conf_ + " scontrol show hostnames '" + list + "' 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) return std::nullopt;
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    pclose(p);
    // scontrol exits 0 even on bad lists; it says so on stderr instead.
    if (out.find("Invalid hostlist") != std::string::npos || out.find("error") != std::string::npos)
      return std::nullopt;
    Hosts hosts;
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) hosts.push_back(line);
    return hosts;
  }

 private:
  const tessera::test::TempDir dir_{"tessera-hostlist"};
  const std::string conf_ = dir_.write("slurm.conf", "ClusterName=oracle\nSlurmctldHost=localhost\nNodeName=n1 CPUs=1\n"
                                                       "PartitionName=p Nodes=n1\n");
};

}  // namespace

TEST(HostlistOracle, AgreesWithScontrolOnValidLists) {
  if (!Scontrol::available()) GTEST_SKIP() << "scontrol not installed";
  Scontrol oracle;
  std::vector<std::string> lists = {
      "gpu[001-004,010],login2", "r[1-2]-n[01-03]", "n[8-12],m[09-11]", "n[098-101]", "n[01-3]",
      "n[1-03]",                 "n[1,3,5-6]",     "a[1-2]b[1-2],c",   "a[1-3]-[1-2]", "n-1,n[2]",
      "a[1-2],a[1-2]",           "x[0-1]y[0-1]z[0-1]", "a[1-2]b[1-3]c[1-2]d[5-6]"};
  // Random lists: 1-3 items, each 0-3 bracket groups of 1-3 ranges with random padding.
  std::mt19937 rng(1234);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int k = 0; k < 40; ++k) {
    std::string list;
    for (int item = pick(1, 3); item > 0; --item) {
      if (!list.empty()) list += ",";
      list += std::string(1, char('a' + pick(0, 5))) + (pick(0, 1) ? "n" : "-");
      const int groups = pick(0, 3);
      for (int g = 0; g < groups; ++g) {
        list += "[";
        for (int r = pick(1, 3); r > 0; --r) {
          const int lo = pick(0, 120), hi = lo + pick(0, 4), width = pick(1, 4);
          std::string los = std::to_string(lo);
          if (static_cast<int>(los.size()) < width) los.insert(0, width - los.size(), '0');
          list += los + (hi > lo ? "-" + std::to_string(hi) : "") + (r > 1 ? "," : "");
        }
        list += "]";
        if (g + 1 < groups) list += "-";
      }
    }
    lists.push_back(list);
  }
  for (const auto& list : lists) {
    const auto want = oracle.expand(list);
    ASSERT_TRUE(want.has_value()) << "scontrol rejected test list " << list;
    EXPECT_EQ(expand_hostlist(list), *want) << list;
  }
}

TEST(HostlistOracle, RejectsWhatScontrolRejects) {
  if (!Scontrol::available()) GTEST_SKIP() << "scontrol not installed";
  Scontrol oracle;
  for (const char* bad : {"n[3-1]", "n[]", "n[[1]]", "n[x-y]", "n[1--2]", "n[-1]", "n[1,]", "n[1-2]-ib"}) {
    EXPECT_FALSE(oracle.expand(bad).has_value()) << "scontrol accepted " << bad;
    EXPECT_THROW(expand_hostlist(bad), tessera::Error) << bad;
  }
}

}  // namespace test_hostlist
