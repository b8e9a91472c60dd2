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

#include "launcher/test_seams.h"
#include "runtime/comm/agree.h"
#include "runtime/comm/mpi_backend.h"
#include "util/error.h"

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

// Every rank stops with the lowest failing rank's message when any rank has a non-empty `error`.
void agree_or_throw(comm::Communicator& world, const std::string& error) {
  throw_if_any(world, error.empty() ? "" : encode_error(ErrorKind::Input, error));
}

Bootstrap single_process(Bootstrap b, const BootstrapOptions& opts) {
  b.layout_source = "single process (no MPI)";
  b.threads = opts.threads > 0 ? opts.threads : usable_cores();
  torch::set_num_threads(b.threads);
  b.groups = {comm::make_self_communicator("world"), comm::make_self_communicator("intra"),
              comm::make_self_communicator("inter")};
  set_process_identity(0, b.host);
  return b;
}

// MPI_Init_thread with MPI_THREAD_MULTIPLE (the communication threads and the caller's both call
// MPI), unless MPI is up already.
void init_mpi(int argc, char** argv) {
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (initialised) return;
  // Open MPI's progress loop spins while an operation waits for its peer; each rank has a compute
  // thread and communication threads, so a spinning thread takes the core the compute needs
  // (measured: bench step W=2 on 2 cores 342 -> 422 tokens/s, docs/PERFORMANCE.md). Yielding when
  // there is nothing to progress costs a sched_yield; the environment can still say otherwise.
  setenv("OMPI_MCA_mpi_yield_when_idle", "1", /*overwrite=*/0);
  // A process started without a launcher (`tessera train` as one process) is an MPI singleton, for
  // which Open MPI 4 forks an orted that a world of one never uses (measurements: docs/PERFORMANCE.md#build-suite-and-start-up-measurements). Isolated, it starts none; the
  // parameter means nothing under mpirun or srun.
  setenv("OMPI_MCA_ess_singleton_isolated", "1", /*overwrite=*/0);
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  g_mpi_initialised_here = true;
  // An error MPI raises on no communicator (Open MPI 5's TCP transport: "Socket closed" when a peer
  // is killed) goes to MPI_COMM_SELF's handler since MPI 4.0; fatal, it ended this rank before its
  // flight record was written. Returned instead, the rank's own collectives report the lost peer.
  MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
  if (provided < MPI_THREAD_MULTIPLE)
    throw Error(ErrorKind::Internal, "MPI does not provide MPI_THREAD_MULTIPLE", __FILE__, __LINE__);
}

// Which node this rank is on, as a key equal on the ranks of one node: explicit flag > launcher
// environment > MPI shared memory. `error` when the sources contradict each other.
struct NodeKey {
  long key = 0;
  std::string source, error;
};
NodeKey node_key(const Bootstrap& b, const BootstrapOptions& opts, bool under_mpirun, bool under_srun) {
  NodeKey k;
  if (opts.ranks_per_node > 0) {
    if (b.world_size % opts.ranks_per_node != 0)
      k.error = "--ranks-per-node " + std::to_string(opts.ranks_per_node) + " does not divide the world size " +
                std::to_string(b.world_size);
    k.key = b.world_rank / std::max(1, opts.ranks_per_node);
    k.source = "--ranks-per-node " + std::to_string(opts.ranks_per_node);
  } else if (under_srun) {
    // srun starts every task itself: its SLURM_PROCID/SLURM_NTASKS must match MPI's view.
    if (b.slurm.procid != b.world_rank || (b.slurm.ntasks > 0 && b.slurm.ntasks != b.world_size))
      k.error = "SLURM and MPI disagree: SLURM_PROCID=" + std::to_string(b.slurm.procid) +
                " SLURM_NTASKS=" + std::to_string(b.slurm.ntasks) + " but MPI rank " +
                std::to_string(b.world_rank) + " of " + std::to_string(b.world_size) +
                " (launch with srun --mpi=pmix, or mpirun inside the allocation)";
    k.key = b.slurm.nodeid;
    k.source = "slurm (SLURM_NODEID/SLURM_LOCALID)";
  } else {
    MPI_Comm shared;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, b.world_rank, MPI_INFO_NULL, &shared);
    int leader = b.world_rank;
    MPI_Allreduce(MPI_IN_PLACE, &leader, 1, MPI_INT, MPI_MIN, shared);
    MPI_Comm_free(&shared);
    k.key = leader;
    k.source = under_mpirun ? "mpi shared-memory split (under mpirun)" : "mpi shared-memory split";
  }
  return k;
}

// node_id, num_nodes, local_rank, local_size from every rank's node key (gathered over the world):
// node ids number the distinct keys in order of their lowest world rank; the local rank is the
// order within the node.
void place_on_node(Bootstrap& b, long key) {
  at::Tensor keys = at::empty({b.world_size}, at::kLong);
  b.groups.world->all_gather_into(keys, at::full({1}, static_cast<int64_t>(key), at::kLong))->wait();
  const int64_t* k = keys.data_ptr<int64_t>();
  std::map<int64_t, int> node_of_key;
  for (int r = 0; r < b.world_size; ++r)
    if (!node_of_key.count(k[r])) node_of_key.emplace(k[r], static_cast<int>(node_of_key.size()));
  b.num_nodes = static_cast<int>(node_of_key.size());
  b.node_id = node_of_key[key];
  b.local_rank = 0;
  b.local_size = 0;
  for (int r = 0; r < b.world_size; ++r) {
    if (k[r] != key) continue;
    if (r < b.world_rank) ++b.local_rank;
    ++b.local_size;
  }
}

// Torch intra-op threads: the physical cores of a host are shared by every rank on that host.
int threads_per_rank(const Bootstrap& b, const BootstrapOptions& opts) {
  if (opts.threads > 0) return opts.threads;
  auto hosts = allgather_strings(b.host, b.world_size);
  const int ranks_on_host = static_cast<int>(std::count(hosts.begin(), hosts.end(), b.host));
  return std::max(1, usable_cores() / ranks_on_host);
}

}  // namespace

const Bootstrap& current() { return g_boot; }

Bootstrap bootstrap(int argc, char** argv, const BootstrapOptions& opts) {
  Bootstrap b;
  b.host = hostname();
  b.slurm = read_slurm_env();
  if (!opts.init_mpi) return g_boot = single_process(b, opts);

  init_mpi(argc, argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &b.world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &b.world_size);
  set_process_identity(b.world_rank, b.host);
  // The world communicator first: the agreements below (and collectively()) run over it.
  b.groups.world = comm::make_mpi_communicator(MPI_COMM_WORLD, "world");
  g_boot.world_rank = b.world_rank;  // known before any agreement below can throw
  g_boot.world_size = b.world_size;
  g_boot.host = b.host;
  g_boot.groups.world = b.groups.world;
  comm::Communicator& world = *b.groups.world;

  const bool under_mpirun = env("OMPI_COMM_WORLD_RANK") != nullptr;
  const bool under_srun = !under_mpirun && b.slurm.in_step;
  const NodeKey key = node_key(b, opts, under_mpirun, under_srun);
  b.layout_source = key.source;
  agree_or_throw(world, key.error);
  place_on_node(b, key.key);
  agree_or_throw(world, under_srun && b.slurm.localid >= 0 && b.slurm.localid != b.local_rank
                            ? "SLURM_LOCALID=" + std::to_string(b.slurm.localid) + " but rank " +
                                  std::to_string(b.world_rank) + " is local rank " + std::to_string(b.local_rank) +
                                  " of node " + std::to_string(b.node_id)
                            : "");

  b.threads = threads_per_rank(b, opts);
  torch::set_num_threads(b.threads);

  // Device: local rank -> visible GPU (CUDA_VISIBLE_DEVICES already renumbers them). Informational
  // (tessera topo); whether a command runs on it, and the checks that go with that (one GPU per
  // local rank), are the command's: launcher/device_select.h for `train`.
  int gpus = static_cast<int>(torch::cuda::device_count());
  if (gpus > 0 && b.local_rank < gpus) {
    b.gpu = b.local_rank;
    b.gpu_source = env("CUDA_VISIBLE_DEVICES") ? "local rank over CUDA_VISIBLE_DEVICES" : "local rank";
  }

  // ---- process groups -------------------------------------------------------------------------
  b.groups.intra = b.groups.world->split(b.node_id, b.world_rank, "intra");
  b.groups.inter = b.groups.world->split(b.local_rank, b.world_rank, "inter");
  b.groups = with_test_seams(b.groups);  // test binaries' fault decorators (test_seams.h); else unchanged
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
  std::string wire;  // encode_error() (runtime/comm/agree.h); empty when fn succeeded
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
