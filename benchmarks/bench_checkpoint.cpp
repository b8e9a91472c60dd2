#include "benchmarks/bench_checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include <ATen/ATen.h>

#include "launcher/bootstrap.h"
#include "launcher/cli.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/io.h"
#include "util/error.h"
#include "util/file_tree.h"

namespace fs = std::filesystem;

namespace tessera::bench {

namespace {

using Clock = std::chrono::steady_clock;

// Wall time of fn across the world: barrier, fn on every rank, barrier.
template <class Fn>
double timed(comm::Communicator& world, Fn&& fn) {
  world.barrier()->wait();
  const auto t0 = Clock::now();
  fn();
  world.barrier()->wait();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The baseline: `bytes` written sequentially in 8 MiB blocks and fsync'ed, then read back.
void dd_write(const std::string& path, uint64_t bytes) {
  std::vector<char> block(8u << 20, 'x');
  auto f = checkpoint::io::File::create(path);
  for (uint64_t done = 0; done < bytes;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(block.size(), bytes - done));
    f.write_all(block.data(), n);
    done += n;
  }
  f.fsync();
  f.close();
}
void dd_read(const std::string& path) {
  std::vector<char> block(8u << 20);
  auto f = checkpoint::io::File::open_read(path);
  while (f.read_some(block.data(), block.size()) > 0) {
  }
}

}  // namespace

namespace {

// Units of [rows, 1024] fp32 parameters sized so each rank stores ~mb MiB (3 x 4 bytes per element),
// and what a trainer saves: the masters and AdamW's two moments (all fp32 here).
struct BenchModel {
  std::unique_ptr<fsdp::Engine> engine;
  std::vector<NamedShards> kinds;
};

BenchModel make_bench_model(int64_t mb, int units, const comm::ProcessGroups& groups) {
  const int64_t cols = 1024;
  const int64_t rows = std::max<int64_t>(1, (mb << 20) * groups.world->size() / 12 / cols / units / 2);
  std::vector<fsdp::UnitDef> defs;
  for (int u = 0; u < units; ++u)
    defs.push_back({"unit." + std::to_string(u),
                    {{"unit" + std::to_string(u) + ".a", at::empty({rows, cols})},
                     {"unit" + std::to_string(u) + ".b", at::empty({rows, cols})}}});
  BenchModel m;
  m.engine = std::make_unique<fsdp::Engine>(defs, [](int64_t, const at::Tensor& h) { return h; }, groups,
                                            fsdp::Options{}, [](const std::string&) { return true; });
  m.kinds = {m.engine->named_state(), {"exp_avg", {}}, {"exp_avg_sq", {}}};
  for (const auto& s : m.engine->shards()) {
    s.master.normal_();
    m.kinds[1].per_unit.push_back(at::randn({s.plan.chunk}));
    m.kinds[2].per_unit.push_back(at::rand({s.plan.chunk}));
  }
  return m;
}

// The best (smallest) of each figure over the rounds, in seconds.
struct Figures {
  double dd_w = 1e30, dd_r = 1e30, save = 1e30, load = 1e30, blocked = 1e30, async_total = 1e30;
  int64_t my_bytes = 0;
};

// One round: sync save, load, dd write and read of the same bytes, async save. Every timed write
// lands on blocks the file system just freed, the way a training run with checkpoint.keep rotates:
// before each measured save the previous checkpoint of that kind is deleted, and before each dd write
// the previous dd file. Deletes and a sync(2) happen outside the timed region, so no figure pays for
// another's writeback or block allocation (on thin-provisioned disks a write to never-used blocks is
// several times slower than one to freed blocks).
struct Rounds {
  comm::Communicator& world;
  BenchModel& m;
  checkpoint::Checkpointer& sync_ck;
  checkpoint::Checkpointer& async_ck;
  std::string dd;
  bool verbose;
  nlohmann::json state = {{"step", 0}, {"bench", true}};
  std::string prev_sync, prev_async;
  Figures best;

  void settle(const std::string& remove_dir, const std::string& remove_file) {
    world.barrier()->wait();
    std::error_code ec;
    if (world.rank() == 0 && !remove_dir.empty()) tessera::util::remove_tree(remove_dir, ec);
    if (!remove_file.empty()) fs::remove(remove_file, ec);
    ::sync();
    world.barrier()->wait();
  }

  void run(int i) {
    checkpoint::SaveTiming st;
    settle(prev_sync, "");
    const double save = timed(world, [&] { st = sync_ck.save(i, *m.engine, m.kinds, state); });
    prev_sync = st.dir;
    best.my_bytes = st.bytes;
    char file[32];
    std::snprintf(file, sizeof file, "rank-%05d.bin", m.engine->shard_group().rank());
    checkpoint::io::drop_page_cache(st.dir + "/" + file);  // its pages are clean after fsync
    const double load = timed(world, [&] { checkpoint::load(st.dir, *m.engine, m.kinds); });
    settle("", dd);
    const double dd_w = timed(world, [&] { dd_write(dd, static_cast<uint64_t>(best.my_bytes)); });
    checkpoint::io::drop_page_cache(dd);
    const double dd_r = timed(world, [&] { dd_read(dd); });
    double blocked = 0;
    settle(prev_async, "");
    const double async_total = timed(world, [&] {
      blocked = async_ck.save(i, *m.engine, m.kinds, state).blocked_s;
      prev_async = async_ck.wait().dir;
    });
    at::Tensor b = at::full({1}, blocked, at::TensorOptions().dtype(at::kDouble));  // the worst rank's
    world.all_reduce(b, comm::ReduceOp::Max)->wait();
    best.save = std::min(best.save, save), best.load = std::min(best.load, load);
    best.dd_w = std::min(best.dd_w, dd_w), best.dd_r = std::min(best.dd_r, dd_r);
    best.async_total = std::min(best.async_total, async_total), best.blocked = std::min(best.blocked, b.item<double>());
    if (world.rank() == 0 && verbose)
      std::printf("  repeat %d: save %.3f s, load %.3f s, dd write %.3f s, dd read %.3f s, async total %.3f s\n", i, save,
                  load, dd_w, dd_r, async_total);
  }
};

void print_figures(const Figures& f, int W, double gb, int units, int repeat, const std::string& scratch) {
  std::printf("checkpoint benchmark: %d ranks, %.3f GB per checkpoint (%d units), best of %d, dir %s\n", W, gb, units,
              repeat, scratch.c_str());
  std::printf("  %-28s %10s %10s\n", "", "seconds", "GB/s");
  std::printf("  %-28s %10.3f %10.3f\n", "dd write + fsync (baseline)", f.dd_w, gb / f.dd_w);
  std::printf("  %-28s %10.3f %10.3f\n", "checkpoint save (sync)", f.save, gb / f.save);
  std::printf("  %-28s %10.3f %10.3f\n", "dd read (baseline)", f.dd_r, gb / f.dd_r);
  std::printf("  %-28s %10.3f %10.3f\n", "checkpoint load", f.load, gb / f.load);
  std::printf("  %-28s %10.3f %10.3f\n", "async save, total", f.async_total, gb / f.async_total);
  std::printf("  save / dd write ratio  %.2f  (goal >= 0.7)\n", f.dd_w / f.save);
  std::printf("  load / dd read ratio   %.2f  (goal >= 0.7)\n", f.dd_r / f.load);
  std::printf("  async blocked / sync save  %.3f s / %.3f s = %.3f  (goal <= 0.2)\n", f.blocked, f.save,
              f.blocked / f.save);
}

}  // namespace

int run_bench_checkpoint(const std::vector<std::string>& args) {
  launcher::po::options_description desc("Options");
  desc.add_options()("dir", launcher::po::value<std::string>()->default_value("/tmp"), "where to write (a scratch dir is made inside)")(
      "mb-per-rank", launcher::po::value<int64_t>()->default_value(256), "checkpoint bytes per rank (params + 2 moments), MiB")(
      "units", launcher::po::value<int>()->default_value(8), "FSDP units (like decoder layers)")(
      "repeat", launcher::po::value<int>()->default_value(4), "measurements per figure (best is reported)")(
      "verbose", "print every measurement, not only the best");
  const auto vm = launcher::parse_command("tessera bench checkpoint [--dir DIR] [--mb-per-rank 256] [--units 8] [--repeat 4] [--verbose]", desc, args);
  if (!vm) return 0;
  const auto& groups = launcher::current().groups;
  comm::Communicator& world = *groups.world;
  const int W = world.size(), rank = world.rank();
  const int64_t mb = (*vm)["mb-per-rank"].as<int64_t>();
  const int units = (*vm)["units"].as<int>(), repeat = (*vm)["repeat"].as<int>();
  TESSERA_CHECK_INPUT(mb > 0 && units > 0 && repeat > 0, "--mb-per-rank, --units and --repeat must be positive");
  BenchModel m = make_bench_model(mb, units, groups);
  std::string scratch;
  if (rank == 0) {
    scratch = (fs::path((*vm)["dir"].as<std::string>()) / ("tessera-bench-ckpt-" + std::to_string(::getpid()))).string();
    fs::create_directories(scratch);
  }
  scratch = world.broadcast_string(scratch, 0);
  {
    checkpoint::Policy sync_policy, async_policy;
    sync_policy.dir = scratch + "/sync", async_policy.dir = scratch + "/async";
    sync_policy.keep = async_policy.keep = repeat + 1;
    async_policy.async = true;
    checkpoint::Checkpointer sync_ck(sync_policy, groups);
    checkpoint::Checkpointer async_ck(async_policy, groups);
    Rounds rounds{world, m, sync_ck, async_ck, scratch + "/dd-" + std::to_string(rank) + ".bin", vm->count("verbose") > 0};
    for (int i = 0; i < repeat; ++i) rounds.run(i);
    at::Tensor total = at::full({1}, rounds.best.my_bytes, at::TensorOptions().dtype(at::kLong));
    world.all_reduce(total, comm::ReduceOp::Sum)->wait();
    if (rank == 0) print_figures(rounds.best, W, static_cast<double>(total.item<int64_t>()) / 1e9, units, repeat, scratch);
  }
  world.barrier()->wait();
  if (rank == 0) tessera::util::remove_tree(scratch);
  return 0;
}

}  // namespace tessera::bench
