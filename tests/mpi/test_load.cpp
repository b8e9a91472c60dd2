// Weight loading under real mpirun (np 1, 2, 4): the three load modes give byte-identical master
// shards equal to the checkpoint's tensors (bf16 sharded checkpoint -> fp32 masters) for
// full_shard, no_shard and hybrid_shard; a failing read on the reading rank stops every rank with
// its message; scatter_into (MPI_Scatter and the base class's broadcast fallback); and Llama 2 70B
// planned for 16 ranks on the meta device, "on paper", allocating nothing.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <malloc.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "launcher/bootstrap.h"
#include "launcher/model_lm.h"
#include "model/errors.h"
#include "model/llama.h"
#include "model/safetensors.h"
#include "runtime/comm/mpi_backend.h"
#include "runtime/fsdp/loader.h"
#include "runtime/memory/tracker.h"
#include "util/error.h"
#include "tests/support/forwarding_comm.h"
#include "tests/support/test_support.h"
#include "util/file_tree.h"

namespace test_load {  // the files of a gtest binary compile together (tests/CMakeLists.txt)

using namespace tessera;
namespace fs = std::filesystem;
using fsdp::LoadMode;
using fsdp::Strategy;

namespace {

const comm::ProcessGroups& world_groups() { return launcher::current().groups; }
comm::Communicator& world() { return *world_groups().world; }

model::ModelConfig test_config() { return tessera::test::tiny_model(3); }

// 16 layers of 3.2 M parameters (12.6 MB fp32 each): the full model (206 MB fp32) is far larger
// than two units, so materialising it shows in the peak RSS.
model::ModelConfig memory_config() {
  model::ModelConfig c = model::ModelConfig::preset("tiny");
  c.vocab_size = 1000;
  c.hidden_size = 512;
  c.intermediate_size = 1376;
  c.num_hidden_layers = 16;
  c.num_attention_heads = c.num_key_value_heads = 8;
  return c;
}

// A bf16 checkpoint of `cfg` split into files of at most `max_shard_bytes` (with an index), written
// by rank 0 into a directory every rank sees; removed at exit.
std::string write_checkpoint(const std::string& tag, const model::ModelConfig& cfg, uint64_t max_shard_bytes,
                             model::DType dtype = model::DType::BF16) {
  static std::vector<std::string> written;
  std::string d;
  if (world().rank() == 0) {
    d = "/tmp/tessera-load-test-" + tag + "-" + std::to_string(getpid());
    model::write_safetensors_dir(d, cfg, model::hf_tensor_specs(cfg), dtype, max_shard_bytes,
                                 [](const model::TensorSpec& s) { return model::init_tensor(s, 77); });
    if (written.empty()) std::atexit([] { for (const auto& w : written) tessera::util::remove_tree(w); });
    written.push_back(d);
  }
  return world().broadcast_string(d, 0);
}

const std::string& checkpoint_dir() {
  static const std::string dir = write_checkpoint("small", test_config(), 100 * 1024);
  return dir;
}

comm::ProcessGroups groups_for(Strategy s) {
  comm::ProcessGroups g = world_groups();
  const int W = g.world->size(), r = g.world->rank();
  if (s == Strategy::HybridShard && W >= 4 && W % 2 == 0) {  // 2 emulated nodes
    g.intra = g.world->split(r / (W / 2), r, "intra");
    g.inter = g.world->split(r % (W / 2), r, "inter");
  }
  return g;
}

struct Loaded {
  train::CausalLm lm;
  std::unique_ptr<fsdp::Engine> engine;
};

Loaded make_engine(Strategy s, const model::ModelConfig& cfg = test_config()) {
  Loaded l;
  l.lm = launcher::make_causal_lm(cfg);
  fsdp::Options o;
  o.strategy = s;
  l.engine = std::make_unique<fsdp::Engine>(l.lm.units, l.lm.layer, groups_for(s), o, l.lm.decay);
  return l;
}

// A checkpoint source without in-memory views: rank0 mode must stage its units (read + scatter).
class NoViewSource : public fsdp::WeightSource {
 public:
  explicit NoViewSource(std::shared_ptr<model::ModelDir> dir) : inner_(std::move(dir)) {}
  void read(const std::string& name, const std::vector<int64_t>& shape, int64_t offset, int64_t count,
            float* dst) override {
    inner_.read(name, shape, offset, count, dst);
  }

 private:
  launcher::HfWeightSource inner_;
};

// Loads with `mode`; in rank0 mode only the reading rank gets a source (the others prove they
// need none). `staged`: the source offers no views (rank0 mode stages every unit).
Loaded load(Strategy s, LoadMode mode, fsdp::LoadStats* stats = nullptr, const std::string& path = checkpoint_dir(),
            bool staged = false, int64_t batch_elems = fsdp::kLoadBatchElems) {
  auto dir = std::make_shared<model::ModelDir>(path);
  Loaded l = make_engine(s, dir->config());
  launcher::HfWeightSource hf(dir);
  NoViewSource plain(dir);
  fsdp::WeightSource* src = staged ? static_cast<fsdp::WeightSource*>(&plain) : &hf;
  const bool reader = l.engine->shard_group().rank() == 0 && l.engine->replicate_group().rank() == 0;
  auto st = fsdp::load_weights(*l.engine, mode == LoadMode::Rank0 && !reader ? nullptr : src, mode, nullptr, batch_elems);
  if (stats) *stats = st;
  return l;
}

bool same_bytes(const at::Tensor& a, const at::Tensor& b) {
  return a.numel() == b.numel() && a.scalar_type() == b.scalar_type() &&
         std::memcmp(a.data_ptr(), b.data_ptr(), a.numel() * a.element_size()) == 0;
}

}  // namespace

// rank0 mode sends bf16/fp16 checkpoints as stored and widens them on the receivers in place inside
// their shards, fp32 ones without conversion, and stages units when the source has no views: every route, for every
// strategy, gives the checkpoint's values (gaps and padding zero) and the same bytes as the
// parallel and naive modes.
TEST(Load, ModesAreByteIdenticalAndEqualTheCheckpoint) {
  for (model::DType dtype : {model::DType::BF16, model::DType::F16, model::DType::F32}) {
    const std::string path = dtype == model::DType::BF16
                                 ? checkpoint_dir()
                                 : write_checkpoint(model::dtype_name(dtype), test_config(), 100 * 1024, dtype);
    model::ModelDir dir(path);
    ASSERT_GT(dir.tensor_names().size(), 0u);
    for (bool staged : {false, true}) {
      for (Strategy s : {Strategy::FullShard, Strategy::NoShard, Strategy::HybridShard}) {
        SCOPED_TRACE(std::string(model::dtype_name(dtype)) + (staged ? " staged " : " direct ") + fsdp::to_string(s));
        fsdp::LoadStats st;
        Loaded ref = load(s, LoadMode::Rank0, &st, path, staged);
        const auto& shards = ref.engine->shards();
        // Against the checkpoint: every slice equals the stored tensor converted to fp32, every
        // element outside the slices (alignment gaps, padding) is zero.
        for (const auto& u : shards) {
          at::Tensor expect = at::zeros({u.plan.chunk}, at::kFloat);
          for (const auto& sl : u.plan.slices(u.shard_rank)) {
            const auto& name = u.plan.params[sl.param].name;
            at::Tensor stored = dir.read(name);
            ASSERT_EQ(stored.scalar_type(), model::to_torch(dtype)) << name;
            expect.narrow(0, sl.shard_offset, sl.length).copy_(stored.reshape({-1}).narrow(0, sl.param_offset, sl.length));
          }
          EXPECT_TRUE(same_bytes(u.master, expect)) << u.name;
        }
        const bool reader = ref.engine->shard_group().rank() == 0 && ref.engine->replicate_group().rank() == 0;
        EXPECT_EQ(st.root, reader);
        EXPECT_EQ(st.elements_read > 0, reader);  // nobody else touched the checkpoint
        // Staged units use the root's two fp32 unit buffers; direct ones need nothing besides the
        // shards on any rank (receivers widen 16-bit slices in place).
        EXPECT_EQ(st.staging_bytes, reader && staged ? 2 * st.largest_unit_bytes : 0);
        if (staged) continue;
        for (LoadMode m : {LoadMode::Parallel, LoadMode::Naive}) {
          SCOPED_TRACE(fsdp::to_string(m));
          Loaded other = load(s, m, nullptr, path);
          for (size_t u = 0; u < shards.size(); ++u)
            EXPECT_TRUE(same_bytes(shards[u].master, other.engine->shards()[u].master)) << shards[u].name;
        }
        {  // many small batches whose edges cut slices anywhere (the default batch holds a test chunk whole)
          SCOPED_TRACE("rank0 in batches of 777 elements");
          ASSERT_GT(shards[0].plan.chunk, 10 * 777);
          Loaded batched = load(s, LoadMode::Rank0, nullptr, path, false, 777);
          for (size_t u = 0; u < shards.size(); ++u)
            EXPECT_TRUE(same_bytes(shards[u].master, batched.engine->shards()[u].master)) << shards[u].name;
        }
      }
    }
  }
}

// An engine whose groups live on a GPU loads in rank0 mode over the bootstrap's CPU groups: the
// loader picks the engine's shard/replicate layout out of them by strategy (here the same groups
// the engine got, so the result must equal a plain load) and refuses groups of another layout.
TEST(Load, Rank0OverHostGroupsPicksTheEnginesLayout) {
  auto dir = std::make_shared<model::ModelDir>(checkpoint_dir());
  for (Strategy s : {Strategy::FullShard, Strategy::ShardGradOp, Strategy::NoShard, Strategy::HybridShard}) {
    SCOPED_TRACE(fsdp::to_string(s));
    const comm::ProcessGroups g = groups_for(s);
    Loaded l;
    l.lm = launcher::make_causal_lm(dir->config());
    fsdp::Options o;
    o.strategy = s;
    l.engine = std::make_unique<fsdp::Engine>(l.lm.units, l.lm.layer, g, o, l.lm.decay);
    launcher::HfWeightSource src(dir);
    const bool reader = l.engine->shard_group().rank() == 0 && l.engine->replicate_group().rank() == 0;
    fsdp::load_weights(*l.engine, reader ? &src : nullptr, LoadMode::Rank0, &g);
    Loaded ref = load(s, LoadMode::Parallel);
    for (size_t u = 0; u < ref.engine->shards().size(); ++u)
      EXPECT_TRUE(same_bytes(l.engine->shards()[u].master, ref.engine->shards()[u].master)) << u;
    if (s == Strategy::HybridShard && world().size() == 4) {  // engine: 2 x 2; bootstrap groups: 1 x 4
      const comm::ProcessGroups other = world_groups();
      EXPECT_THROW(fsdp::load_weights(*l.engine, reader ? &src : nullptr, LoadMode::Rank0, &other), Error);
    }
  }
  world().barrier()->wait();
}

TEST(Load, ParallelReadsOnlyItsSlicesNaiveReadsEverything) {
  fsdp::LoadStats par, naive;
  load(Strategy::FullShard, LoadMode::Parallel, &par);
  load(Strategy::FullShard, LoadMode::Naive, &naive);
  const int64_t total = test_config().num_parameters();
  EXPECT_EQ(naive.elements_read, total);
  EXPECT_LE(par.elements_read, total / world().size() + 1024);
  // Summed over ranks, parallel reads the model exactly once.
  at::Tensor n = at::full({1}, par.elements_read, at::kLong);
  world().all_reduce(n)->wait();
  EXPECT_EQ(n.item<int64_t>(), total);
}

// Peak RSS growth while loading (VmHWM reset to VmRSS after the engine allocated its shards): the
// reading rank grows by at most its two staging units, the others by nothing; if any rank
// materialised the whole model (as naive does, measured last as the control) it would grow by the
// model's full fp32 size, far above those bounds.
TEST(Load, NoRankMaterialisesTheFullModel) {
  const std::string path = write_checkpoint("memory", memory_config(), 40ll << 20);
  const int64_t full_bytes = memory_config().num_parameters() * 4, slack = 24ll << 20;
  for (LoadMode m : {LoadMode::Rank0, LoadMode::Parallel, LoadMode::Naive}) {
    SCOPED_TRACE(fsdp::to_string(m));
    ::malloc_trim(0);
    Loaded l = make_engine(Strategy::FullShard, memory_config());
    auto dir = std::make_shared<model::ModelDir>(path);
    launcher::HfWeightSource src(dir);
    const bool reader = world().rank() == 0;
    world().barrier()->wait();
    ASSERT_TRUE(memory::reset_peak_rss());
    const int64_t base = memory::rss_bytes();
    const auto st = fsdp::load_weights(*l.engine, m == LoadMode::Rank0 && !reader ? nullptr : &src, m);
    const int64_t growth = memory::peak_rss_bytes() - base;
    ASSERT_GT(full_bytes, 2 * st.largest_unit_bytes + slack + (100ll << 20));  // the bound can tell
    if (m == LoadMode::Naive) {
      EXPECT_GT(growth, full_bytes * 9 / 10) << "the measurement must see a full model";
    } else {
      const int64_t bound = (m == LoadMode::Rank0 && reader ? 2 * st.largest_unit_bytes : 0) + slack;
      EXPECT_LE(growth, bound) << "rank " << world().rank() << " grew " << (growth >> 20) << " MiB; full model "
                               << (full_bytes >> 20) << " MiB, unit " << (st.largest_unit_bytes >> 20) << " MiB";
    }
    if (reader) std::printf("%s: rank 0 grew %lld MiB while loading (model %lld MiB fp32, unit %lld MiB)\n",
                            fsdp::to_string(m).c_str(), (long long)(growth >> 20), (long long)(full_bytes >> 20),
                            (long long)(st.largest_unit_bytes >> 20));
  }
}

namespace {
// Reads normally until the given unit's first parameter, then fails like a corrupt file would.
// With `views`, it also offers the mapped views (rank0 mode's direct route), failing the same way.
class FailingSource : public fsdp::WeightSource {
 public:
  // timeout: the read fails with Error(Timeout) (a stalled network file system) instead of a format error.
  FailingSource(std::shared_ptr<model::ModelDir> dir, std::string fail_on, bool views, bool timeout = false)
      : inner_(std::move(dir)), fail_on_(std::move(fail_on)), views_(views), timeout_(timeout) {}
  void read(const std::string& name, const std::vector<int64_t>& shape, int64_t offset, int64_t count,
            float* dst) override {
    if (name == fail_on_ && timeout_) throw Error(ErrorKind::Timeout, "bad.safetensors: reading '" + name + "' timed out");
    if (name == fail_on_) throw model::ModelError("bad.safetensors: tensor '" + name + "' is unreadable");
    inner_.read(name, shape, offset, count, dst);
  }
  at::Tensor view(const std::string& name, int64_t offset, int64_t count) override {
    if (!views_) return {};
    if (name == fail_on_) throw model::ModelError("bad.safetensors: tensor '" + name + "' is unreadable");
    return inner_.view(name, offset, count);
  }
  void release(const std::string& name, int64_t offset, int64_t count) override { inner_.release(name, offset, count); }

 private:
  launcher::HfWeightSource inner_;
  std::string fail_on_;
  bool views_, timeout_;
};
}  // namespace

// A timeout on the reading rank is a timeout (exit code 3) on every rank, not an internal error.
TEST(Load, ReadTimeoutOnTheReadingRankIsATimeoutOnEveryRank) {
  Loaded l = make_engine(Strategy::FullShard);
  FailingSource src(std::make_shared<model::ModelDir>(checkpoint_dir()), "model.layers.1.mlp.up_proj.weight",
                    /*views=*/false, /*timeout=*/true);
  try {
    fsdp::load_weights(*l.engine, &src, LoadMode::Rank0);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Timeout) << e.what();
    EXPECT_EQ(e.exit_code(), 3);
    EXPECT_NE(std::string(e.what()).find("reading 'model.layers.1.mlp.up_proj.weight' timed out"), std::string::npos)
        << e.what();
  }
  world().barrier()->wait();
}

TEST(Load, ReadErrorOnTheReadingRankStopsEveryRank) {
  for (bool views : {true, false})
  for (Strategy s : {Strategy::FullShard, Strategy::HybridShard}) {
    SCOPED_TRACE(fsdp::to_string(s) + (views ? " direct" : " staged"));
    Loaded l = make_engine(s);
    FailingSource src(std::make_shared<model::ModelDir>(checkpoint_dir()), "model.layers.1.mlp.up_proj.weight", views);
    try {
      fsdp::load_weights(*l.engine, &src, LoadMode::Rank0);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_code(), 2);
      EXPECT_NE(std::string(e.what()).find("bad.safetensors: tensor 'model.layers.1.mlp.up_proj.weight'"),
                std::string::npos)
          << e.what();
    }
    world().barrier()->wait();  // every rank got here: nobody hangs in a scatter
  }
}

namespace {
// Forwards every collective to a real MPI communicator but keeps the base class's scatter_into,
// so the broadcast-based fallback (what NCCL and other backends inherit) runs over real ranks.
class FallbackScatter : public test::ForwardingComm {
 public:
  using ForwardingComm::ForwardingComm;
  comm::WorkPtr scatter_into(at::Tensor out, at::Tensor in, int root) override {
    return comm::Communicator::scatter_into(out, in, root);
  }
  comm::WorkPtr scatter_pieces(std::vector<at::Tensor> out, std::vector<std::vector<at::Tensor>> pieces, int root) override {
    return comm::Communicator::scatter_pieces(std::move(out), std::move(pieces), root);
  }
  comm::CommPtr split(int color, int key, const std::string& name) override { return comm::Communicator::split(color, key, name); }
  comm::CommPtr host_duplicate(const std::string& name) override { return comm::Communicator::host_duplicate(name); }
};
}  // namespace

TEST(Load, ScatterIntoGivesEachRankItsChunk) {
  const int W = world().size(), r = world().rank();
  FallbackScatter fallback(world_groups().world);
  for (comm::Communicator* c : {static_cast<comm::Communicator*>(&world()), static_cast<comm::Communicator*>(&fallback)}) {
    for (int root : {0, W - 1}) {
      for (auto dtype : {at::kFloat, at::kBFloat16}) {
        const int64_t chunk = 37;
        at::Tensor in;
        if (r == root) in = at::arange(chunk * W, at::TensorOptions().dtype(at::kFloat)).to(dtype);
        at::Tensor out = at::full({chunk}, -1.0, at::TensorOptions().dtype(dtype));
        c->scatter_into(out, in, root)->wait();
        EXPECT_TRUE(at::equal(out, at::arange(r * chunk, (r + 1) * chunk, at::TensorOptions().dtype(at::kFloat)).to(dtype)))
            << "root " << root;
      }
    }
    if (r == 0) {
      at::Tensor out = at::empty({4});
      EXPECT_THROW(c->scatter_into(out, at::empty({4 * W + 1}), 0), Error);  // wrong input size on root
    }
  }
  world().barrier()->wait();
}

// scatter_pieces: rank r receives root's pieces[r] (of varying sizes, some empty, taken from
// arbitrary places of one buffer) into its outputs, in order, for both roots and dtypes; the base
// class (what a backend without its own implementation inherits) serves size 1 only.
TEST(Load, ScatterPiecesGivesEachRankItsPieces) {
  const int W = world().size(), r = world().rank();
  auto sizes_of = [](int rank) { return std::vector<int64_t>{5 + rank, 0, 130 + 7 * rank, 1}; };
  auto start_of = [&](int rank, size_t i) { return static_cast<int64_t>(1000 * rank + 200 * i + 3); };
  for (int root : {0, W - 1}) {
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      SCOPED_TRACE("root " + std::to_string(root) + " " + std::string(c10::toString(dtype)));
      const auto opt = at::TensorOptions().dtype(dtype);
      at::Tensor source = at::arange(1000 * W, at::TensorOptions().dtype(at::kFloat)).to(dtype);
      std::vector<std::vector<at::Tensor>> pieces;
      if (r == root) {
        pieces.resize(W);
        for (int d = 0; d < W; ++d)
          for (size_t i = 0; i < sizes_of(d).size(); ++i) pieces[d].push_back(source.narrow(0, start_of(d, i), sizes_of(d)[i]));
      }
      std::vector<at::Tensor> out;
      for (int64_t n : sizes_of(r)) out.push_back(at::full({n}, -1.0, opt));
      world().scatter_pieces(out, pieces, root)->wait();
      for (size_t i = 0; i < out.size(); ++i)
        EXPECT_TRUE(at::equal(out[i], source.narrow(0, start_of(r, i), sizes_of(r)[i]))) << "piece " << i;
    }
  }
  FallbackScatter fallback(world_groups().world);
  std::vector<at::Tensor> out{at::zeros({3})};
  std::vector<std::vector<at::Tensor>> pieces;
  if (r == 0) pieces.assign(W, {at::ones({3})});
  if (W == 1) {
    fallback.scatter_pieces(out, pieces, 0)->wait();
    EXPECT_TRUE(at::equal(out[0], at::ones({3})));
  } else {
    EXPECT_THROW(fallback.scatter_pieces(out, pieces, 0), Error);  // refused, not silently wrong
  }
  if (r == 0) {  // root's own pieces must match its outputs
    std::vector<std::vector<at::Tensor>> bad(W, {at::ones({4})});
    EXPECT_THROW(world().scatter_pieces(out, bad, 0), Error);
  }
  world().barrier()->wait();
}

// Llama 2 70B built on the meta device and planned for 16 ranks: nothing is allocated, and each
// rank's shard is ~8.6 GB in bf16 (69.0e9 parameters / 16 x 2 bytes, plus alignment padding).
TEST(Load, Llama70bOnPaperAllocatesNothing) {
  const int64_t hwm0 = memory::peak_rss_bytes();
  const auto cfg = model::ModelConfig::preset("llama2-70b");
  auto lm = launcher::make_causal_lm(cfg);
  const auto sizes = fsdp::plan_sizes(lm.units, 16, 16);
  const int64_t hwm1 = memory::peak_rss_bytes();
  EXPECT_LT(hwm1 - hwm0, 64ll << 20) << "building 70B on the meta device allocated memory";
  EXPECT_EQ(sizes.total_elements, cfg.num_parameters());
  EXPECT_GT(cfg.num_parameters(), 68'900'000'000ll);
  EXPECT_LT(cfg.num_parameters(), 69'000'000'000ll);
  const double bf16_per_rank = 2.0 * static_cast<double>(sizes.per_rank_elements);
  EXPECT_NEAR(bf16_per_rank / 1e9, 8.62, 0.01);
  // Padding is at most world*align elements per unit (81 units).
  EXPECT_GE(sizes.per_rank_elements * 16, sizes.total_elements);
  EXPECT_LE(sizes.per_rank_elements * 16 - sizes.total_elements, 81 * 16 * 16);
  // The largest unit bounds rank 0's staging: a decoder layer (q,o 8192^2; k,v 1024x8192 with 8 KV
  // heads; gate,up,down 28672x8192; 2 norms), already a multiple of 16 x 16, bigger than the root
  // unit (embeddings + lm_head + norm = 524,296,192).
  EXPECT_EQ(sizes.largest_unit_elements, 2ll * 8192 * 8192 + 2ll * 1024 * 8192 + 3ll * 28672 * 8192 + 2 * 8192);
  if (world().rank() == 0)
    std::printf("llama2-70b on 16 ranks: %.3f GB bf16 (%.3f GB fp32) per rank, largest unit %.2f GB fp32\n",
                bf16_per_rank / 1e9, 2 * bf16_per_rank / 1e9, 4.0 * sizes.largest_unit_elements / 1e9);
}

}  // namespace test_load
