// nccl-tests-style collectives benchmark (see bench_collectives.h). Each collective is a small
// plug-in (how to size its buffers, its busbw factor, how Tessera / raw MPI / Gloo run it, what
// the right answer is) driven by one harness.
#include "benchmarks/bench_collectives.h"

#include <mpi.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <numeric>
#include <random>

#include "benchmarks/bench_util.h"
#include "launcher/bootstrap.h"
#include "launcher/cli.h"
#include "runtime/comm/mpi_bench_hooks.h"
#include "util/dtype_names.h"
#include "util/error.h"

// The Gloo baseline: where LibTorch's Gloo headers exist, unless the build opts out
// (-DTESSERA_GLOO_BASELINE=OFF; tests/gpu/run.sh does, as the c10d headers follow PyTorch's version).
#if !defined(TESSERA_NO_GLOO_BASELINE) && __has_include(<gloo/context.h>)
#define TESSERA_HAVE_GLOO 1
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO 1
#endif
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif

namespace tessera::bench {
namespace {

using comm::ReduceOp;
using Clock = std::chrono::steady_clock;
// Floating dtypes by their one set of names (util/dtype_names.h), plus the integer types the
// communicator carries for bookkeeping.
at::ScalarType parse_dtype(const std::string& s) {
  if (const auto t = util::float_type_named(s))
    return *t == util::FloatType::F32 ? at::kFloat : *t == util::FloatType::BF16 ? at::kBFloat16 : at::kHalf;
  if (s == "int32") return at::kInt;
  if (s == "int64") return at::kLong;
  if (s == "uint8") return at::kByte;
  throw TESSERA_INPUT_ERROR("--dtype '" + s + "' is not one of float, bfloat16, half, int32, int64, uint8");
}

MPI_Datatype raw_type(at::ScalarType t, bool reducing) {
  switch (t) {
    case at::kFloat: return MPI_FLOAT;
    case at::kInt: return MPI_INT32_T;
    case at::kLong: return MPI_INT64_T;
    case at::kByte: return MPI_UINT8_T;
    case at::kHalf:
    case at::kBFloat16: return reducing ? MPI_DATATYPE_NULL : MPI_UINT16_T;  // MPI cannot add them
    default: return MPI_DATATYPE_NULL;
  }
}

// The buffers of one measurement. nccl-tests convention: `bytes` is the full (gathered / reduced)
// buffer; all-gather sends bytes/n per rank, reduce-scatter receives bytes/n per rank.
struct Buffers {
  at::Tensor send, recv;  // out-of-place
  at::Tensor inplace;     // in-place: full buffer; own chunk is the all-gather input / RS output
  int64_t count = 0, chunk = 0;
};

// Rank r's input value at element i: small integers, exact in every dtype and every sum.
at::Tensor pattern(int64_t n, int r, int64_t offset, at::ScalarType dt) {
  return (at::remainder(at::arange(offset, offset + n, at::kLong), 7) + (r + 1)).to(dt);
}

// ---- the collectives: one small plug-in each (as nccl-tests' all_gather.cu, ...) ----------------

// Everything the harness needs to know of one collective. Buffers follow the nccl-tests
// convention: count is the full (gathered / reduced) buffer, chunk = count / n.
struct Collective {
  const char* name;  // --op value, table heading, and the MPI backend's op name (mpi_algorithm)
  bool reduces;      // raw MPI needs a type it can add
  bool send_chunk;   // the out-of-place input is one chunk (all-gather)
  bool recv_chunk;   // the output is one chunk (reduce-scatter), also in place (this rank's chunk)
  double (*busbw_factor)(int n);
  // Fills this rank's input (in place or not) with pattern() and returns the expected output.
  at::Tensor (*prepare)(Buffers& b, bool ip, int rank, int n, at::ScalarType dt);
  void (*tessera)(comm::Communicator& c, Buffers& b, bool ip);          // one call, completed
  int (*raw_mpi)(Buffers& b, bool ip, MPI_Datatype t, int rank, MPI_Comm mc);  // its MPI return code
#ifdef TESSERA_HAVE_GLOO
  void (*gloo)(c10d::ProcessGroupGloo& pg, Buffers& b, int n);  // out of place; null: n/a
#endif
};

// Rank r's pattern() summed over n ranks, in dt (exact: small integers).
at::Tensor sum_of_patterns(int64_t count, int n, at::ScalarType dt) {
  at::Tensor sum = at::zeros({count}, at::kDouble);
  for (int r = 0; r < n; ++r) sum += pattern(count, r, 0, at::kDouble);
  return sum.to(dt);
}

const Collective kAllGather{
    "all_gather", false, true, false, [](int n) { return double(n - 1) / n; },
    [](Buffers& b, bool ip, int rank, int n, at::ScalarType dt) {
      (ip ? b.inplace.narrow(0, rank * b.chunk, b.chunk) : b.send).copy_(pattern(b.chunk, rank, 0, dt));
      std::vector<at::Tensor> parts;
      for (int r = 0; r < n; ++r) parts.push_back(pattern(b.chunk, r, 0, dt));
      return at::cat(parts);
    },
    [](comm::Communicator& c, Buffers& b, bool ip) {
      if (ip) c.all_gather_into(b.inplace, b.inplace.narrow(0, c.rank() * b.chunk, b.chunk))->wait();
      else c.all_gather_into(b.recv, b.send)->wait();
    },
    [](Buffers& b, bool ip, MPI_Datatype t, int, MPI_Comm mc) {
      return ip ? MPI_Allgather(MPI_IN_PLACE, 0, t, b.inplace.data_ptr(), b.chunk, t, mc)
                : MPI_Allgather(b.send.data_ptr(), b.chunk, t, b.recv.data_ptr(), b.chunk, t, mc);
    },
#ifdef TESSERA_HAVE_GLOO
    [](c10d::ProcessGroupGloo& pg, Buffers& b, int n) {
      std::vector<std::vector<at::Tensor>> outs(1);
      for (int r = 0; r < n; ++r) outs[0].push_back(b.recv.narrow(0, r * b.chunk, b.chunk));
      std::vector<at::Tensor> ins{b.send};
      pg.allgather(outs, ins)->wait();
    },
#endif
};

const Collective kReduceScatter{
    "reduce_scatter", true, false, true, [](int n) { return double(n - 1) / n; },
    [](Buffers& b, bool ip, int rank, int n, at::ScalarType dt) {
      (ip ? b.inplace : b.send).copy_(pattern(b.count, rank, 0, dt));
      return sum_of_patterns(b.count, n, dt).narrow(0, rank * b.chunk, b.chunk);
    },
    [](comm::Communicator& c, Buffers& b, bool ip) {
      if (ip) c.reduce_scatter_into(b.inplace.narrow(0, c.rank() * b.chunk, b.chunk), b.inplace)->wait();
      else c.reduce_scatter_into(b.recv, b.send)->wait();
    },
    // MPI's in-place form leaves the result at the start of the buffer.
    [](Buffers& b, bool ip, MPI_Datatype t, int, MPI_Comm mc) {
      return ip ? MPI_Reduce_scatter_block(MPI_IN_PLACE, b.inplace.data_ptr(), b.chunk, t, MPI_SUM, mc)
                : MPI_Reduce_scatter_block(b.send.data_ptr(), b.recv.data_ptr(), b.chunk, t, MPI_SUM, mc);
    },
#ifdef TESSERA_HAVE_GLOO
    nullptr,  // Gloo in LibTorch 1.13 has no reduce_scatter: reported as n/a
#endif
};

const Collective kAllReduce{
    "all_reduce", true, false, false, [](int n) { return 2.0 * (n - 1) / n; },
    [](Buffers& b, bool ip, int rank, int n, at::ScalarType dt) {
      (ip ? b.inplace : b.send).copy_(pattern(b.count, rank, 0, dt));
      return sum_of_patterns(b.count, n, dt);
    },
    // Tessera's all_reduce is in place; out-of-place = copy, then reduce.
    [](comm::Communicator& c, Buffers& b, bool ip) {
      if (!ip) b.recv.copy_(b.send);
      c.all_reduce(ip ? b.inplace : b.recv)->wait();
    },
    [](Buffers& b, bool ip, MPI_Datatype t, int, MPI_Comm mc) {
      return ip ? MPI_Allreduce(MPI_IN_PLACE, b.inplace.data_ptr(), b.count, t, MPI_SUM, mc)
                : MPI_Allreduce(b.send.data_ptr(), b.recv.data_ptr(), b.count, t, MPI_SUM, mc);
    },
#ifdef TESSERA_HAVE_GLOO
    [](c10d::ProcessGroupGloo& pg, Buffers& b, int) {
      b.recv.copy_(b.send);
      std::vector<at::Tensor> t{b.recv};
      pg.allreduce(t)->wait();
    },
#endif
};

// Out of place, every implementation has the root copy send -> recv first.
const Collective kBroadcast{
    "broadcast", false, false, false, [](int) { return 1.0; },
    [](Buffers& b, bool ip, int rank, int, at::ScalarType dt) {
      (ip ? b.inplace : b.send).copy_(pattern(b.count, rank, 0, dt));
      return pattern(b.count, 0, 0, dt);
    },
    [](comm::Communicator& c, Buffers& b, bool ip) {
      if (!ip && c.rank() == 0) b.recv.copy_(b.send);
      c.broadcast(ip ? b.inplace : b.recv, 0)->wait();
    },
    [](Buffers& b, bool ip, MPI_Datatype t, int rank, MPI_Comm mc) {
      if (!ip && rank == 0) b.recv.copy_(b.send);
      return MPI_Bcast((ip ? b.inplace : b.recv).data_ptr(), b.count, t, 0, mc);
    },
#ifdef TESSERA_HAVE_GLOO
    [](c10d::ProcessGroupGloo& pg, Buffers& b, int) {
      if (pg.getRank() == 0) b.recv.copy_(b.send);
      std::vector<at::Tensor> t{b.recv};
      pg.broadcast(t)->wait();
    },
#endif
};

const Collective* const kCollectives[] = {&kAllGather, &kReduceScatter, &kAllReduce, &kBroadcast};

// ---- the harness ----------------------------------------------------------------------------------

struct Impl {
  std::function<void(Buffers&, bool in_place)> run;  // one collective, completed
  bool can_in_place = true;
  // Set when run() times itself (on another thread): seconds of its last call. Otherwise the
  // caller times run() on its own thread.
  std::shared_ptr<double> self_timed;
};

Impl tessera_impl(const Collective& op, comm::Communicator& c) {
  return {[&op, &c](Buffers& b, bool ip) { op.tessera(c, b, ip); }};
}

// Raw MPI on the communicator's own MPI communicator AND its communication thread, timed there
// (from the call to its return): Tessera's figure includes handing the call to that thread and
// waiting for it, the baseline has neither. On the same thread because alternating large
// transfers between two threads on one TCP connection slows one thread's calls by 1.5-1.8x (a
// plain MPI program shows it too; README, performance): a baseline on the main thread would
// measure that artifact, which a training run -- only the communication thread calls MPI -- never
// sees.
Impl raw_mpi_impl(const Collective& op, comm::Communicator& c, MPI_Datatype type) {
  Impl impl;
  impl.self_timed = std::make_shared<double>(-1);
  impl.run = [&op, &c, type, seconds = impl.self_timed](Buffers& b, bool ip) {
    int rc = MPI_SUCCESS;
    comm::mpi_run_ordered(c, [&](MPI_Comm mc) {
      const auto t0 = Clock::now();
      rc = op.raw_mpi(b, ip, type, c.rank(), mc);
      *seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    });
    if (rc != MPI_SUCCESS) throw Error(ErrorKind::Internal, "raw MPI baseline failed", __FILE__, __LINE__);
  };
  return impl;
}

#ifdef TESSERA_HAVE_GLOO
c10::intrusive_ptr<c10d::ProcessGroupGloo> make_gloo(comm::Communicator& c) {
  // Rendezvous through a FileStore whose path rank 0 picks (same host or shared file system).
  std::string path = c.broadcast_string(
      (std::filesystem::temp_directory_path() / ("tessera-gloo-" + std::to_string(getpid()) + "-" + c.name())).string(),
      0);
  auto store = c10::make_intrusive<c10d::FileStore>(path, c.size());
  auto opts = c10d::ProcessGroupGloo::Options::create();
  opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, c.rank(), c.size(), opts);
  c.barrier()->wait();
  if (c.rank() == 0) std::filesystem::remove(path);
  return pg;
}
#endif

Buffers make_buffers(const Collective& op, int64_t bytes, at::ScalarType dt, int n) {
  Buffers b;
  const int64_t esz = c10::elementSize(dt);
  b.count = std::max<int64_t>(bytes / esz / n, 1) * n;  // a multiple of n, as in nccl-tests
  b.chunk = b.count / n;
  auto o = at::TensorOptions().dtype(dt);
  b.send = at::zeros({op.send_chunk ? b.chunk : b.count}, o);
  b.recv = at::zeros({op.recv_chunk ? b.chunk : b.count}, o);
  b.inplace = at::zeros({b.count}, o);
  return b;
}

// Fills inputs with pattern(), runs once, counts wrong output elements on this rank.
int64_t count_wrong(const Collective& op, const Impl& impl, Buffers& b, bool ip, int rank, int n, at::ScalarType dt) {
  const at::Tensor expected = op.prepare(b, ip, rank, n, dt);
  b.recv.fill_(-1);
  impl.run(b, ip);
  at::Tensor got = ip ? b.inplace : b.recv;
  if (ip && op.recv_chunk) got = got.narrow(0, rank * b.chunk, b.chunk);
  return at::ne(got.to(at::kDouble), expected.to(at::kDouble)).sum().item<int64_t>();
}

// Times several (implementation, in-place) runs in interleaved rounds -- one iteration of each per
// round, each started by a barrier and timed to the slowest rank -- so that noise drifting over the
// run (other tenants of the machine, page cache, CPU frequency) hits every implementation alike.
// Each round takes the runs in its own shuffled order (the same on every rank: a fixed seed), as the
// position in a fixed order biases the figure: 4 ranks on 2 cores, 64 MiB in-place all-gather vs
// raw MPI, with Tessera first in every round (right after the previous round's Gloo) 0.85-1.04x
// over 16 runs (median 0.94x), with Tessera last 0.98-1.12x (3 runs), shuffled 0.90-1.05x (9 runs,
// median 1.00x). Per run, the median round is reported.
std::vector<double> time_interleaved(const std::vector<std::pair<Impl, bool>>& runs, Buffers& b, int warmup, int iters,
                                     const std::function<void(const std::function<void(MPI_Comm)>&)>& on_sync) {
  for (const auto& [impl, ip] : runs)
    for (int i = 0; i < warmup; ++i) impl.run(b, ip);
  std::vector<std::vector<double>> rounds(runs.size());
  std::vector<size_t> order(runs.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::mt19937 shuffle_rng(20261130);  // same sequence on every rank: they must issue the same collectives
  for (int i = 0; i < iters; ++i) {
    shuffle_order(order, shuffle_rng);
    for (size_t k : order) {
      on_sync([](MPI_Comm m) { MPI_Barrier(m); });
      const auto t0 = Clock::now();
      runs[k].first.run(b, runs[k].second);
      double t = std::chrono::duration<double>(Clock::now() - t0).count(), tmax = 0;
      if (runs[k].first.self_timed) t = *runs[k].first.self_timed;
      on_sync([&](MPI_Comm m) { MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, m); });
      rounds[k].push_back(tmax);
    }
  }
  std::vector<double> median;
  for (auto& r : rounds) median.push_back(median_of(r));
  return median;
}

struct Result {
  double time_s = -1;  // < 0: not measured
  int64_t wrong = 0;
};

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

}  // namespace

namespace {

struct BenchArgs {
  uint64_t minb = 0, maxb = 0;
  int factor = 2, iters = 1, warmup = 0;
  at::ScalarType dt = at::kFloat;
  bool json = false, baselines = true;
  std::vector<const Collective*> ops;
  std::vector<comm::CommPtr> comms;
  std::string transport;  // which Open MPI transports carry the MPI traffic
};

BenchArgs bench_args(const launcher::po::variables_map& v) {
  BenchArgs a;
  a.minb = launcher::parse_byte_size(v["minbytes"].as<std::string>(), "-b", /*bare_bytes=*/true);
  a.maxb = launcher::parse_byte_size(v["maxbytes"].as<std::string>(), "-e", /*bare_bytes=*/true);
  a.factor = v["stepfactor"].as<int>(), a.iters = v["iters"].as<int>(), a.warmup = v["warmup_iters"].as<int>();
  TESSERA_CHECK_INPUT(a.minb > 0 && a.minb <= a.maxb, "-b must be positive and at most -e");
  TESSERA_CHECK_INPUT(a.factor >= 2, "-f must be at least 2");
  TESSERA_CHECK_INPUT(a.iters >= 1 && a.warmup >= 0, "-n must be >= 1 and -w >= 0");
  a.dt = parse_dtype(v["dtype"].as<std::string>());
  a.json = v["json"].as<bool>(), a.baselines = !v["no-baselines"].as<bool>();
  for (const Collective* o : kCollectives)
    if (v["op"].as<std::string>() == "all" || v["op"].as<std::string>() == o->name) a.ops.push_back(o);
  TESSERA_CHECK_INPUT(!a.ops.empty(), "--op '" + v["op"].as<std::string>() +
                                          "' is not one of all_gather, reduce_scatter, all_reduce, broadcast, all");
  const auto& groups = launcher::current().groups;
  for (const auto& g : {groups.world, groups.intra, groups.inter})
    if (g && (v["group"].as<std::string>() == "all" || v["group"].as<std::string>() == g->name())) a.comms.push_back(g);
  TESSERA_CHECK_INPUT(!a.comms.empty(), "--group '" + v["group"].as<std::string>() + "' is not one of world, intra, inter, all");
  // mpirun --mca btl X exports OMPI_MCA_btl to the ranks (figures differ a lot between shared
  // memory and TCP).
  const char* btl = std::getenv("OMPI_MCA_btl");
  a.transport = btl ? std::string("btl ") + btl : "Open MPI's default btl (shared memory within a host)";
  return a;
}

using SyncFn = std::function<void(const std::function<void(MPI_Comm)>&)>;

// One size of one collective: Tessera out of place and in place, and its baselines.
struct Row {
  double size_bytes = 0;
  int64_t count = 0;
  Result t_oop, t_ip, r_oop, r_ip, g_oop;
  int64_t wrong_all[2] = {0, 0};
};

// Tessera and its baselines, interleaved round by round (see time_interleaved).
Row measure_size(const Collective& op, comm::Communicator& c, uint64_t bytes, const BenchArgs& a, const SyncFn& on_sync,
                 void* gloo_pg) {
  const int n = c.size(), rank = c.rank();
  Buffers b = make_buffers(op, bytes, a.dt, n);
  Row row;
  row.size_bytes = double(b.count) * c10::elementSize(a.dt);
  row.count = b.count;
  Impl tess = tessera_impl(op, c);
  row.t_oop.wrong = count_wrong(op, tess, b, false, rank, n, a.dt);
  row.t_ip.wrong = count_wrong(op, tess, b, true, rank, n, a.dt);
  std::vector<std::pair<Impl, bool>> runs{{tess, false}, {tess, true}};
  std::vector<Result*> slots{&row.t_oop, &row.t_ip};
  MPI_Datatype rt = raw_type(a.dt, op.reduces);
  if (a.baselines && c.backend() == "mpi" && rt != MPI_DATATYPE_NULL) {
    Impl r = raw_mpi_impl(op, c, rt);
    runs.push_back({r, false});
    runs.push_back({r, true});
    slots.push_back(&row.r_oop);
    slots.push_back(&row.r_ip);
  }
#ifdef TESSERA_HAVE_GLOO
  if (gloo_pg && op.gloo) {
    auto* pg = static_cast<c10d::ProcessGroupGloo*>(gloo_pg);
    runs.push_back({Impl{[o = &op, pg, n](Buffers& b, bool) { o->gloo(*pg, b, n); }, false}, false});
    slots.push_back(&row.g_oop);
  }
#endif
  const std::vector<double> times = time_interleaved(runs, b, a.warmup, a.iters, on_sync);
  for (size_t k = 0; k < slots.size(); ++k) slots[k]->time_s = times[k];
  int64_t wrong[2] = {row.t_oop.wrong, row.t_ip.wrong};
  on_sync([&](MPI_Comm m) { MPI_Allreduce(wrong, row.wrong_all, 2, MPI_INT64_T, MPI_SUM, m); });
  return row;
}

double ratio(const Result& base, const Result& ours) {
  return base.time_s > 0 ? base.time_s / ours.time_s : -1.0;  // > 1: Tessera faster
}

nlohmann::json row_json(const Row& r, const Collective& op, const comm::Communicator& c, const BenchArgs& a,
                        const std::string& algo) {
  const int n = c.size();
  auto algbw = [&](double t) { return r.size_bytes / t / 1e9; };
  auto busbw = [&](double t) { return algbw(t) * op.busbw_factor(n); };
  auto opt = [](double x) { return x > 0 ? nlohmann::json(x) : nlohmann::json(nullptr); };
  return {{"group", c.name()}, {"ranks", n}, {"op", op.name}, {"dtype", c10::toString(a.dt)}, {"transport", a.transport},
          {"bytes", int64_t(r.size_bytes)}, {"count", r.count},
          {"oop", {{"time_us", r.t_oop.time_s * 1e6}, {"algbw", algbw(r.t_oop.time_s)},
                   {"busbw", busbw(r.t_oop.time_s)}, {"wrong", r.wrong_all[0]}}},
          {"ip", {{"time_us", r.t_ip.time_s * 1e6}, {"algbw", algbw(r.t_ip.time_s)},
                  {"busbw", busbw(r.t_ip.time_s)}, {"wrong", r.wrong_all[1]}}},
          {"raw_mpi_us", {{"oop", opt(r.r_oop.time_s * 1e6)}, {"ip", opt(r.r_ip.time_s * 1e6)}}},
          {"gloo_us", opt(r.g_oop.time_s * 1e6)},
          {"ratio_vs_raw", {{"oop", opt(ratio(r.r_oop, r.t_oop))}, {"ip", opt(ratio(r.r_ip, r.t_ip))}}},
          {"ratio_vs_gloo", opt(ratio(r.g_oop, r.t_oop))}, {"algorithm", algo}};
}

void print_row(const Row& r, const Collective& op, int n, at::ScalarType dt, const std::string& algo) {
  auto algbw = [&](double t) { return r.size_bytes / t / 1e9; };
  auto busbw = [&](double t) { return algbw(t) * op.busbw_factor(n); };
  auto us = [](const Result& x) { return x.time_s > 0 ? fmt("%9.1f", x.time_s * 1e6) : std::string("      n/a"); };
  auto x = [](double q) { return q > 0 ? fmt("%6.2fx", q) : std::string("    n/a"); };
  std::printf("%12lld %12lld %6s | %10.1f %8.3f %8.3f %6lld | %10.1f %8.3f %8.3f %6lld | %9s %9s %7s %7s | %9s %7s | %s\n",
              (long long)r.size_bytes, (long long)r.count, c10::toString(dt), r.t_oop.time_s * 1e6,
              algbw(r.t_oop.time_s), busbw(r.t_oop.time_s), (long long)r.wrong_all[0], r.t_ip.time_s * 1e6,
              algbw(r.t_ip.time_s), busbw(r.t_ip.time_s), (long long)r.wrong_all[1], us(r.r_oop).c_str(),
              us(r.r_ip).c_str(), x(ratio(r.r_oop, r.t_oop)).c_str(), x(ratio(r.r_ip, r.t_ip)).c_str(),
              us(r.g_oop).c_str(), x(ratio(r.g_oop, r.t_oop)).c_str(), algo.c_str());
}

// Every size of one collective on one communicator: a table (or JSON rows into `out`).
void bench_op(const Collective& op, comm::Communicator& c, const BenchArgs& a, const SyncFn& on_sync, void* gloo_pg,
              nlohmann::json& out) {
  const bool root = launcher::current().world_rank == 0;
  const int n = c.size();
  if (root && !a.json) {
    std::printf("#\n# %s on group '%s' (%s, %d ranks), dtype %s, %d iters, %d warm-up; times: median of rounds interleaved with the baselines\n", op.name,
                c.name().c_str(), c.backend().c_str(), n, c10::toString(a.dt), a.iters, a.warmup);
    std::printf("#%11s %12s %6s | %10s %8s %8s %6s | %10s %8s %8s %6s | %9s %9s %7s %7s | %9s %7s | %s\n", "size",
                "count", "type", "oop us", "algbw", "busbw", "#wrong", "ip us", "algbw", "busbw", "#wrong",
                "raw oop", "raw ip", "x raw", "x rawip", "gloo us", "x gloo", "algo");
  }
  double bus_sum = 0;
  int bus_count = 0;
  for (uint64_t bytes = a.minb; bytes <= a.maxb; bytes *= a.factor) {
    const Row r = measure_size(op, c, bytes, a, on_sync, gloo_pg);
    bus_sum += (r.size_bytes / r.t_oop.time_s + r.size_bytes / r.t_ip.time_s) / 1e9 * op.busbw_factor(n);
    bus_count += 2;
    if (!root) continue;
    // Which algorithm Tessera's backend ran: ring / chain (mpi_ring.h) or MPI's own collective.
    const std::string algo = c.backend() == "mpi" ? comm::mpi_algorithm(op.name, r.count, a.dt, n) : c.backend();
    if (a.json)
      out.push_back(row_json(r, op, c, a, algo));
    else
      print_row(r, op, n, a.dt, algo);
  }
  if (root && !a.json) std::printf("# Avg bus bandwidth    : %g GB/s\n", bus_count ? bus_sum / bus_count : 0.0);
}

}  // namespace

int run_bench_collectives(const std::vector<std::string>& args) {
  namespace po = launcher::po;
  po::options_description desc("bench collectives options");
  desc.add_options()("minbytes,b", po::value<std::string>()->default_value("1M"), "smallest buffer (e.g. 8, 1M, 64MiB)")(
      "maxbytes,e", po::value<std::string>()->default_value("64M"), "largest buffer")(
      "stepfactor,f", po::value<int>()->default_value(2), "multiply the size by this each step")(
      "iters,n", po::value<int>()->default_value(20), "timed iterations per size")(
      "warmup_iters,w", po::value<int>()->default_value(5), "untimed warm-up iterations")(
      "op", po::value<std::string>()->default_value("all"), "all_gather|reduce_scatter|all_reduce|broadcast|all")(
      "group", po::value<std::string>()->default_value("world"), "world|intra|inter|all")(
      "dtype", po::value<std::string>()->default_value("float"), "float|bfloat16|half|int32|int64|uint8")(
      "no-baselines", po::bool_switch(), "skip the raw MPI and Gloo baselines")(
      "json", po::bool_switch(), "print one JSON document instead of the table");
  auto vm = launcher::parse_command("tessera bench collectives [-b MIN] [-e MAX] [-f F] [-n N] [-w W] ...", desc, args);
  if (!vm) return 0;
  const BenchArgs a = bench_args(*vm);
  const bool root = launcher::current().world_rank == 0;
  if (root && !a.json) std::printf("# MPI transport: %s\n", a.transport.c_str());
  nlohmann::json out = nlohmann::json::array();
  at::NoGradGuard no_grad;
  for (const auto& c : a.comms) {
    const bool is_mpi = c->backend() == "mpi";
    // The harness's own barriers and time reductions. For an MPI communicator they run on its
    // communication thread, ordered with the measured calls: over Open MPI's TCP transport, a
    // barrier from another thread between two large transfers made the next 64 MiB transfer 1.5-2x
    // slower (a plain MPI program shows it too; README, performance), an artifact a training run,
    // which calls MPI only from communication threads, never sees.
    const SyncFn on_sync = [&](const std::function<void(MPI_Comm)>& f) {
      if (is_mpi) comm::mpi_run_ordered(*c, f);
      else f(MPI_COMM_WORLD);
    };
    void* gloo_pg = nullptr;
#ifdef TESSERA_HAVE_GLOO
    c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo;
    if (a.baselines && is_mpi) gloo = make_gloo(*c);
    gloo_pg = gloo.get();
#else
    if (root && !a.json && a.baselines) std::printf("# Gloo baseline: not built (c10d Gloo needs the libgloo-dev headers)\n");
#endif
    for (const Collective* op : a.ops) bench_op(*op, *c, a, on_sync, gloo_pg, out);
  }
  if (root && a.json) std::cout << out.dump(2) << std::endl;
  std::fflush(stdout);
  return 0;
}

}  // namespace tessera::bench
