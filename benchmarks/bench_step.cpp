#include "benchmarks/bench_step.h"

#include <mpi.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <iostream>

#include "launcher/bootstrap.h"
#include "launcher/cli.h"
#include "launcher/model_lm.h"
#include "model/registry.h"
#include "runtime/data/dataset.h"
#include "runtime/data/tokenizer.h"
#include "runtime/train/trainer.h"

namespace tessera::bench {
namespace {
using Clock = std::chrono::steady_clock;

// Waits at a barrier without spinning a core (Open MPI's blocking barrier busy-polls), so the
// single-process baseline on rank 0 has the whole machine.
void idle_barrier() {
  MPI_Request req;
  MPI_Ibarrier(MPI_COMM_WORLD, &req);
  int done = 0;
  while (!done) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (!done) usleep(2000);
  }
}
}  // namespace

int run_bench_step(const std::vector<std::string>& args) {
  using namespace tessera::launcher;
  po::options_description desc("bench step options");
  desc.add_options()("preset", po::value<std::string>()->default_value("small"), "model preset")(
      "seq-len", po::value<int64_t>()->default_value(256), "tokens per sequence")(
      "micro-batch", po::value<int64_t>()->default_value(2), "sequences per rank per step")(
      "steps", po::value<int>()->default_value(4), "timed steps (after one warm-up step)")(
      "strategy", po::value<std::string>()->default_value("full_shard"), "FSDP strategy")(
      "data", po::value<std::string>()->default_value("/usr/share/common-licenses"), "text to train on")(
      "json", "print one JSON object");
  auto vm = parse_command("tessera bench step [--preset small] [--seq-len 256] [--micro-batch 2] [--steps 4]", desc, args);
  if (!vm) return 0;
  const Bootstrap& b = current();
  const auto cfg = model::ModelConfig::preset((*vm)["preset"].as<std::string>());
  const int64_t T = (*vm)["seq-len"].as<int64_t>(), M = (*vm)["micro-batch"].as<int64_t>();
  const int steps = (*vm)["steps"].as<int>();
  data::ByteTokenizer tok;
  auto dataset = std::make_shared<data::TokenDataset>((*vm)["data"].as<std::string>(), T, &tok);
  const int W = b.world_size;
  const double global_tokens = static_cast<double>(W * M * T);
  int total_threads = 0;
  MPI_Allreduce(&b.threads, &total_threads, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);

  // ---- FSDP at W ranks ---------------------------------------------------------------------
  train::TrainOptions topts;
  topts.steps = steps + 1;
  topts.micro_batch = M;
  topts.seq_len = T;
  topts.quiet = true;
  fsdp::Options fopts;
  fopts.strategy = fsdp::parse_strategy((*vm)["strategy"].as<std::string>());
  double fsdp_tps = 0;
  {
    train::Trainer trainer(make_causal_lm(cfg), b.groups, fopts, topts, dataset, {});
    InitWeightSource src(cfg, 1);
    trainer.load_weights(src);
    trainer.train_step();  // warm-up
    MPI_Barrier(MPI_COMM_WORLD);
    auto t0 = Clock::now();
    for (int i = 0; i < steps; ++i) trainer.train_step();
    MPI_Barrier(MPI_COMM_WORLD);
    fsdp_tps = global_tokens * steps / std::chrono::duration<double>(Clock::now() - t0).count();
  }

  // ---- one plain process, same global batch, all the threads -------------------------------
  double single_tps = 0;
  if (b.world_rank == 0) {
    const int saved = torch::get_num_threads();
    torch::set_num_threads(total_threads);
    std::shared_ptr<model::CausalLmModule> m = cfg.spec().build(cfg, torch::kCPU);
    {
      torch::NoGradGuard no_grad;
      for (auto& [name, t] : m->named_hf_parameters()) t.copy_(cfg.spec().init_tensor({name, t.sizes().vec()}, 1));
    }
    torch::optim::AdamW opt(m->parameters(), torch::optim::AdamWOptions(topts.lr));
    std::vector<int64_t> idx(W * M);
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int64_t>(i);
    auto batch = dataset->batch(idx);
    auto in = batch.narrow(1, 0, T), tg = batch.narrow(1, 1, T);
    auto one_step = [&] {
      opt.zero_grad();
      auto logits = m->forward(in);
      auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), tg.reshape({-1}));
      loss.backward();
      torch::nn::utils::clip_grad_norm_(m->parameters(), 1.0);
      opt.step();
    };
    one_step();
    auto t0 = Clock::now();
    for (int i = 0; i < steps; ++i) one_step();
    single_tps = global_tokens * steps / std::chrono::duration<double>(Clock::now() - t0).count();
    torch::set_num_threads(saved);
  }
  idle_barrier();
  if (b.world_rank != 0) return 0;
  const double ratio = fsdp_tps / single_tps;
  if (vm->count("json")) {
    std::cout << nlohmann::json{{"preset", (*vm)["preset"].as<std::string>()}, {"world_size", W},
                                {"seq_len", T}, {"global_batch", W * M}, {"threads_total", total_threads},
                                {"strategy", (*vm)["strategy"].as<std::string>()},
                                {"fsdp_tokens_per_s", fsdp_tps}, {"single_tokens_per_s", single_tps},
                                {"ratio", ratio}, {"goal", 0.85}, {"goal_met", ratio >= 0.85}}
                     .dump()
              << std::endl;
  } else {
    printf("# bench step: preset %s, seq_len %ld, global batch %d x %ld sequences, %d threads in total\n",
           (*vm)["preset"].as<std::string>().c_str(), static_cast<long>(T), W, static_cast<long>(M), total_threads);
    printf("%-34s %12.1f tokens/s\n", ("FSDP " + (*vm)["strategy"].as<std::string>() + ", W=" + std::to_string(W)).c_str(), fsdp_tps);
    printf("%-34s %12.1f tokens/s\n", "single process (plain LibTorch)", single_tps);
    printf("ratio FSDP / single: %.3f (goal >= 0.85: %s)\n", ratio, ratio >= 0.85 ? "met" : "NOT met");
  }
  return 0;
}

}  // namespace tessera::bench
