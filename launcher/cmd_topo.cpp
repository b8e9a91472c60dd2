// `tessera topo`: what the bootstrap discovered, gathered from every rank and printed by rank 0.
#include <mpi.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <iostream>
#include <map>

#include "launcher/bootstrap.h"
#include "launcher/cli.h"
#include "launcher/commands.h"
#include "launcher/topology.h"
#include "util/error.h"
#include "util/json.h"

namespace tessera::launcher {
namespace {

nlohmann::json rank_record(const Bootstrap& b) {
  return {{"rank", b.world_rank},          {"host", b.host},
          {"node", b.node_id},             {"local_rank", b.local_rank},
          {"local_size", b.local_size},    {"threads", b.threads},
          {"gpu", b.gpu},                  {"intra_rank", b.groups.intra->rank()},
          {"intra_size", b.groups.intra->size()}, {"inter_rank", b.groups.inter->rank()},
          {"inter_size", b.groups.inter->size()}, {"slurm_procid", b.slurm.procid},
          {"slurm_localid", b.slurm.localid},     {"slurm_nodeid", b.slurm.nodeid}};
}

// Every rank's JSON record, on rank 0 (empty elsewhere).
std::vector<nlohmann::json> gather_records(const nlohmann::json& mine, const Bootstrap& b) {
  std::string s = mine.dump();
  int len = static_cast<int>(s.size());
  std::vector<int> lens(b.world_size), displs(b.world_size, 0);
  MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::vector<char> all;
  if (b.world_rank == 0) {
    for (int i = 1; i < b.world_size; ++i) displs[i] = displs[i - 1] + lens[i - 1];
    all.resize(displs.back() + lens.back() + 1);
  }
  MPI_Gatherv(s.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, 0, MPI_COMM_WORLD);
  std::vector<nlohmann::json> out;
  if (b.world_rank == 0)
    for (int i = 0; i < b.world_size; ++i) out.push_back(util::parse_json(std::string_view(all.data() + displs[i], lens[i])));
  return out;
}

}  // namespace

int run_topo(const std::vector<std::string>& args) {
  po::options_description desc("topo options");
  desc.add_options()("json", "print one JSON document instead of a table");
  auto vm = parse_command("tessera topo [--json] [--ranks-per-node N]", desc, args);
  if (!vm) return 0;
  const Bootstrap& b = current();
  // Each node's local rank 0 probes the machine (GPUs, NVLink, InfiniBand, NCCL settings); its
  // record carries the result to rank 0, which files it under the node.
  nlohmann::json mine = rank_record(b);
  // TESSERA_SYSFS_ROOT points the probe at another sysfs tree (tests use tests/unit/fixtures).
  const char* sysfs = std::getenv("TESSERA_SYSFS_ROOT");
  if (b.local_rank == 0) mine["topology"] = topology_to_json(probe_topology(sysfs && *sysfs ? sysfs : "/sys"));
  auto records = gather_records(mine, b);
  if (b.world_rank != 0) return 0;
  std::map<int, nlohmann::json> topology_of_node;
  for (auto& r : records)
    if (r.contains("topology")) {
      topology_of_node[r["node"].get<int>()] = std::move(r["topology"]);
      r.erase("topology");
    }

  nlohmann::json nodes = nlohmann::json::array();
  std::map<int, std::vector<int>> ranks_of_node;
  std::map<int, std::string> host_of_node;
  for (const auto& r : records) {
    ranks_of_node[r["node"].get<int>()].push_back(r["rank"].get<int>());
    host_of_node[r["node"].get<int>()] = r["host"].get<std::string>();
  }
  for (const auto& [node, ranks] : ranks_of_node)
    nodes.push_back({{"node", node}, {"host", host_of_node[node]}, {"ranks", ranks}, {"topology", topology_of_node[node]}});
  nlohmann::json doc = {
      {"world_size", b.world_size},
      {"num_nodes", b.num_nodes},
      {"ranks_per_node", b.local_size},
      {"layout_source", b.layout_source},
      {"backend", b.groups.world->backend()},
      {"gpus", b.gpu >= 0 ? "cuda" : "none"},
      {"slurm", b.slurm.present ? nlohmann::json{{"job_id", b.slurm.job_id},
                                                 {"nnodes", b.slurm.nnodes},
                                                 {"ntasks", b.slurm.ntasks},
                                                 {"nodes", b.slurm.nodes},
                                                 {"tasks_per_node", b.slurm.tasks_per_node},
                                                 {"restart_count", b.slurm.restart_count}}
                                : nlohmann::json(nullptr)},
      {"nodes", nodes},
      {"ranks", records}};
  if (vm->count("json")) {
    std::cout << doc.dump(2) << std::endl;
    return 0;
  }
  std::cout << "world: " << b.world_size << " ranks on " << b.num_nodes << " node(s), "
            << b.local_size << " per node (layout from " << b.layout_source << "), backend "
            << b.groups.world->backend() << "\n";
  if (b.slurm.present)
    std::cout << "slurm: job " << b.slurm.job_id << ", " << b.slurm.nnodes << " node(s), " << b.slurm.ntasks
              << " task(s), nodelist expands to " << b.slurm.nodes.size() << " host(s)\n";
  for (const auto& n : nodes) {
    std::cout << "node " << n["node"] << " (" << n["host"].get<std::string>() << "): ranks " << n["ranks"].dump() << "\n";
    if (n["topology"].is_object()) std::cout << format_topology(n["topology"]);
  }
  std::cout << "rank  host              node  local  intra    inter    threads  gpu\n";
  for (const auto& r : records) {
    char line[256];
    snprintf(line, sizeof(line), "%4d  %-16s  %4d  %5d  %2d/%-5d  %2d/%-5d  %7d  %s\n", r["rank"].get<int>(),
             r["host"].get<std::string>().c_str(), r["node"].get<int>(), r["local_rank"].get<int>(),
             r["intra_rank"].get<int>(), r["intra_size"].get<int>(), r["inter_rank"].get<int>(),
             r["inter_size"].get<int>(), r["threads"].get<int>(),
             r["gpu"].get<int>() >= 0 ? std::to_string(r["gpu"].get<int>()).c_str() : "none");
    std::cout << line;
  }
  std::cout << "process groups: world (" << b.world_size << "), intra-node (" << b.local_size
            << " ranks each, " << b.num_nodes << " groups), inter-node (" << b.num_nodes << " ranks each, "
            << b.local_size << " groups)" << std::endl;
  return 0;
}

}  // namespace tessera::launcher
