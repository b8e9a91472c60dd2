#include "launcher/bootstrap.h"

#include <mpi.h>
#include <sched.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <set>
#include <thread>

#include "runtime/comm/mpi_backend.h"
#include "runtime/agree.h"
#include "runtime/error.h"

namespace tessera::launcher {
namespace {

Bootstrap g_boot;
bool g_mpi_initialised_here = false;

std::string hostname() {
  char buf[256] = {0};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

int usable_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

const char* env(const char* k) { return std::getenv(k); }

// All ranks' strings, gathered to every rank.
std::vector<std::string> allgather_strings(const std::string& s, int size) {
  int len = static_cast<int>(s.size());
  std::vector<int> lens(size);
  MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, MPI_COMM_WORLD);
  std::vector<int> displs(size, 0);
  for (int i = 1; i < size; ++i) displs[i] = displs[i - 1] + lens[i - 1];
  std::vector<char> all(displs[size - 1] + lens[size - 1] + 1);
  MPI_Allgatherv(s.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, MPI_COMM_WORLD);
  std::vector<std::string> out(size);
  for (int i = 0; i < size; ++i) out[i] = std::string(all.data() + displs[i], lens[i]);
  return out;
}

}  // namespace

const Bootstrap& current() { return g_boot; }

Bootstrap bootstrap(int argc, char** argv, const BootstrapOptions& opts) {
  Bootstrap b;
  b.host = hostname();
  b.slurm = read_slurm_env();
  if (!opts.init_mpi) {
    b.layout_source = "single process (no MPI)";
    b.threads = opts.threads > 0 ? opts.threads : usable_cores();
    torch::set_num_threads(b.threads);
    b.groups = {comm::make_self_communicator("world"), comm::make_self_communicator("intra"),
                comm::make_self_communicator("inter")};
    set_process_identity(0, b.host);
    g_boot = b;
    return g_boot;
  }

  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    g_mpi_initialised_here = true;
    if (provided < MPI_THREAD_MULTIPLE) {
      // The communication thread and the compute thread both call MPI.
      throw Error(ErrorKind::Internal, "MPI does not provide MPI_THREAD_MULTIPLE", __FILE__, __LINE__);
    }
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &b.world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &b.world_size);
  set_process_identity(b.world_rank, b.host);
  // The world communicator first: the agreements below (and collectively()) run over it.
  b.groups.world = comm::make_mpi_communicator(MPI_COMM_WORLD, "world");
  g_boot.world_rank = b.world_rank;  // known before any agreement below can throw
  g_boot.world_size = b.world_size;
  g_boot.host = b.host;
  g_boot.groups.world = b.groups.world;

  // ---- which node am I on? explicit flag > launcher environment > MPI shared memory ----------
  std::string err;
  const bool under_mpirun = env("OMPI_COMM_WORLD_RANK") != nullptr;
  const bool under_srun = !under_mpirun && b.slurm.in_step;
  long node_key = 0;
  if (opts.ranks_per_node > 0) {
    if (b.world_size % opts.ranks_per_node != 0)
      err = "--ranks-per-node " + std::to_string(opts.ranks_per_node) + " does not divide the world size " +
            std::to_string(b.world_size);
    node_key = b.world_rank / std::max(1, opts.ranks_per_node);
    b.layout_source = "--ranks-per-node " + std::to_string(opts.ranks_per_node);
  } else if (under_srun) {
    // srun starts every task itself: its SLURM_PROCID/SLURM_NTASKS must match MPI's view.
    if (b.slurm.procid != b.world_rank || (b.slurm.ntasks > 0 && b.slurm.ntasks != b.world_size))
      err = "SLURM and MPI disagree: SLURM_PROCID=" + std::to_string(b.slurm.procid) +
            " SLURM_NTASKS=" + std::to_string(b.slurm.ntasks) + " but MPI rank " +
            std::to_string(b.world_rank) + " of " + std::to_string(b.world_size) +
            " (launch with srun --mpi=pmix, or mpirun inside the allocation)";
    node_key = b.slurm.nodeid;
    b.layout_source = "slurm (SLURM_NODEID/SLURM_LOCALID)";
  } else {
    MPI_Comm shared;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, b.world_rank, MPI_INFO_NULL, &shared);
    int leader = b.world_rank;
    MPI_Allreduce(MPI_IN_PLACE, &leader, 1, MPI_INT, MPI_MIN, shared);
    MPI_Comm_free(&shared);
    node_key = leader;
    b.layout_source = under_mpirun ? "mpi shared-memory split (under mpirun)" : "mpi shared-memory split";
  }
  throw_if_any(*b.groups.world, err.empty() ? "" : encode_error(ErrorKind::Input, err));

  // Node ids: distinct node keys in order of their lowest world rank; local rank: order within node.
  std::vector<long> keys(b.world_size);
  MPI_Allgather(&node_key, 1, MPI_LONG, keys.data(), 1, MPI_LONG, MPI_COMM_WORLD);
  std::map<long, int> node_of_key;
  for (int r = 0; r < b.world_size; ++r)
    if (!node_of_key.count(keys[r])) node_of_key.emplace(keys[r], static_cast<int>(node_of_key.size()));
  b.num_nodes = static_cast<int>(node_of_key.size());
  b.node_id = node_of_key[node_key];
  b.local_rank = 0;
  b.local_size = 0;
  for (int r = 0; r < b.world_size; ++r) {
    if (keys[r] != node_key) continue;
    if (r < b.world_rank) ++b.local_rank;
    ++b.local_size;
  }
  if (under_srun && b.slurm.localid >= 0 && b.slurm.localid != b.local_rank)
    err = "SLURM_LOCALID=" + std::to_string(b.slurm.localid) + " but rank " + std::to_string(b.world_rank) +
          " is local rank " + std::to_string(b.local_rank) + " of node " + std::to_string(b.node_id);
  throw_if_any(*b.groups.world, err.empty() ? "" : encode_error(ErrorKind::Input, err));

  // ---- threads: the physical cores of a host are shared by every rank on that host ------------
  auto hosts = allgather_strings(b.host, b.world_size);
  int ranks_on_host = static_cast<int>(std::count(hosts.begin(), hosts.end(), b.host));
  b.threads = opts.threads > 0 ? opts.threads : std::max(1, usable_cores() / ranks_on_host);
  torch::set_num_threads(b.threads);

  // ---- device: local rank -> visible GPU (CUDA_VISIBLE_DEVICES already renumbers them) --------
  // Informational (tessera topo); whether a command runs on it, and the checks that go with that
  // (one GPU per local rank), are the command's: launcher/device_select.h for `train`.
  int gpus = static_cast<int>(torch::cuda::device_count());
  if (gpus > 0 && b.local_rank < gpus) {
    b.gpu = b.local_rank;
    b.gpu_source = env("CUDA_VISIBLE_DEVICES") ? "local rank over CUDA_VISIBLE_DEVICES" : "local rank";
  }

  // ---- process groups -------------------------------------------------------------------------
  MPI_Comm intra, inter;
  MPI_Comm_split(MPI_COMM_WORLD, b.node_id, b.world_rank, &intra);
  MPI_Comm_split(MPI_COMM_WORLD, b.local_rank, b.world_rank, &inter);
  b.groups.intra = comm::make_mpi_communicator(intra, "intra");
  b.groups.inter = comm::make_mpi_communicator(inter, "inter");
  MPI_Comm_free(&intra);
  MPI_Comm_free(&inter);
  g_boot = b;
  return g_boot;
}

void finalize() {
  g_boot.groups = {};  // communicator threads stop before MPI goes away
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin && g_mpi_initialised_here) MPI_Finalize();
}

void abort_all(int code) {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  fflush(stdout);
  fflush(stderr);
  if (init && !fin && g_boot.world_size > 1) {
    // MPI_Abort asks the launcher (mpirun, or srun through PMIx) to end every rank, stopped ones
    // included; should it not return, this process still ends with `code`.
    std::thread([code] {
      std::this_thread::sleep_for(std::chrono::seconds(10));
      std::_Exit(code);
    }).detach();
    MPI_Abort(MPI_COMM_WORLD, code);
  }
  std::_Exit(code);
}

}  // namespace tessera::launcher

namespace tessera::launcher {

void collectively(const std::function<void()>& fn) {
  std::string wire;  // encode_error() (runtime/agree.h); empty when fn succeeded
  try {
    fn();
  } catch (const Error& e) {
    // A timeout means some rank may never answer again: no agreement (it would wait for that rank);
    // this rank's own error path ends the world instead.
    if (e.kind() == ErrorKind::Timeout) throw;
    wire = encode_error(e);
  } catch (const std::exception& e) {
    wire = encode_error(e);
  }
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init || fin || g_boot.world_size == 1 || !g_boot.groups.world) {
    if (wire.empty()) return;
    const DecodedError d = decode_error(wire);
    throw CollectiveError(d.kind, d.message);
  }
  // The lowest failing rank's error, on every rank, over the world communicator (so
  // comm.timeout_s bounds the agreement too); messages of ranks other than 0 name their rank.
  const auto agreed = agree_on_error(*g_boot.groups.world, wire);
  if (!agreed) return;
  throw CollectiveError(agreed->kind, agreed->rank != 0 ? "rank " + std::to_string(agreed->rank) + ": " + agreed->message
                                                        : agreed->message);
}

}  // namespace tessera::launcher
