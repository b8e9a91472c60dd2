#include "benchmarks/bench_generate.h"

#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <random>

#include <nlohmann/json.hpp>

#include "benchmarks/bench_util.h"
#include "launcher/bootstrap.h"
#include "launcher/cli.h"
#include "launcher/model_lm.h"
#include "model/config.h"
#include "runtime/fsdp/loader.h"
#include "runtime/generate/generator.h"
#include "util/error.h"

namespace tessera::bench {

namespace {

struct GenBench {
  model::ModelConfig mc;
  std::vector<int64_t> prompt;
  int64_t new_tokens = 0, recompute_tokens = 0;
  at::ScalarType dtype = at::kFloat;
};

std::unique_ptr<generate::Generator> make_generator(const GenBench& g, fsdp::Strategy strategy) {
  const launcher::Bootstrap& b = launcher::current();
  fsdp::Options o;
  o.strategy = strategy;
  o.param_dtype = g.dtype;
  auto gen = std::make_unique<generate::Generator>(launcher::make_causal_lm(g.mc), b.groups, o, b.groups.world);
  launcher::InitWeightSource src(g.mc, 1);
  fsdp::load_weights(gen->engine(), &src, fsdp::LoadMode::Parallel, &b.groups);
  gen->reserve(static_cast<int64_t>(g.prompt.size()) + g.new_tokens);
  return gen;
}

struct Round {
  double prefill = 0, decode_full = 0, decode_kept = 0, recompute = 0;  // tokens/s
};

// The recomputation of `n` new tokens: one whole-sequence forward each; tokens/s.
double recompute_rate(generate::Generator& gen, const GenBench& g, const std::vector<int64_t>& generated) {
  std::vector<int64_t> seq = g.prompt;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < g.recompute_tokens; ++i) {
    gen.recompute_last_logits(seq);
    seq.push_back(generated[i]);
  }
  return g.recompute_tokens / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

Round measure(generate::Generator& full, generate::Generator& kept, const GenBench& g) {
  Round r;
  const generate::Generation a = full.generate(g.prompt, g.new_tokens, {}, 0, {});
  const generate::Generation k = kept.generate(g.prompt, g.new_tokens, {}, 0, {});
  TESSERA_CHECK(a.tokens == k.tokens, "bench generate: full_shard and shard_grad_op generated different tokens");
  r.prefill = static_cast<double>(g.prompt.size()) / a.prefill_s;
  r.decode_full = static_cast<double>(a.tokens.size() - 1) / a.decode_s;
  r.decode_kept = static_cast<double>(k.tokens.size() - 1) / k.decode_s;
  r.recompute = recompute_rate(full, g, a.tokens);
  return r;
}

void report(const GenBench& g, const std::vector<Round>& rounds, bool json) {
  auto med = [&](double Round::*f) {
    std::vector<double> v;
    for (const Round& r : rounds) v.push_back(r.*f);
    return median_of(v);
  };
  const double prefill = med(&Round::prefill), full = med(&Round::decode_full), kept = med(&Round::decode_kept),
               recompute = med(&Round::recompute);
  const int world = launcher::current().world_size;
  if (json) {
    std::cout << nlohmann::json{{"world_size", world}, {"prompt_len", g.prompt.size()}, {"new_tokens", g.new_tokens},
                                {"prefill_tokens_per_s", prefill}, {"decode_tokens_per_s", full},
                                {"decode_kept_gathered_tokens_per_s", kept}, {"recompute_tokens_per_s", recompute},
                                {"kv_over_recompute", full / recompute}, {"kept_over_regathered", kept / full},
                                {"rounds", rounds.size()}}.dump()
              << std::endl;
    return;
  }
  std::printf("bench generate: %d rank(s), prompt %zu tokens, %lld new, %zu rounds (medians)\n", world,
              g.prompt.size(), (long long)g.new_tokens, rounds.size());
  std::printf("  prefill (KV cache)                               %10.1f tokens/s\n", prefill);
  std::printf("  decode, KV cache, layers re-gathered (full_shard) %9.1f tokens/s\n", full);
  std::printf("  decode, KV cache, layers kept (shard_grad_op)    %10.1f tokens/s  (x%.2f)\n", kept, kept / full);
  std::printf("  decode by recomputing the sequence (full_shard)  %10.1f tokens/s\n", recompute);
  std::printf("  KV cache / recompute                             x%.2f\n", full / recompute);
}

}  // namespace

int run_bench_generate(const std::vector<std::string>& args) {
  namespace po = launcher::po;
  po::options_description desc("Options");
  desc.add_options()("preset", po::value<std::string>()->default_value("small"), "model preset (initialised in place)")(
      "prompt-len", po::value<int64_t>()->default_value(128), "prompt tokens")(
      "new-tokens", po::value<int64_t>()->default_value(32), "tokens generated per round")(
      "recompute-tokens", po::value<int64_t>()->default_value(8), "of those, how many the recompute baseline redoes")(
      "rounds", po::value<int>()->default_value(3), "interleaved rounds (medians reported)")(
      "dtype", po::value<std::string>()->default_value("fp32"), "compute dtype: fp32 or bf16")(
      "json", po::bool_switch(), "one JSON object instead of the table");
  const auto vm = launcher::parse_command("tessera bench generate [--preset small] [--prompt-len 128] [--new-tokens 32] "
                                          "[--recompute-tokens 8] [--rounds 3] [--dtype fp32|bf16] [--json]", desc, args);
  if (!vm) return 0;
  GenBench g;
  launcher::collectively([&] {
    g.mc = model::ModelConfig::preset((*vm)["preset"].as<std::string>());
    g.new_tokens = (*vm)["new-tokens"].as<int64_t>();
    g.recompute_tokens = (*vm)["recompute-tokens"].as<int64_t>();
    const int64_t prompt_len = (*vm)["prompt-len"].as<int64_t>();
    TESSERA_CHECK_INPUT(prompt_len >= 1 && g.new_tokens >= 2 && (*vm)["rounds"].as<int>() >= 1,
                        "bench generate: --prompt-len and --rounds must be >= 1, --new-tokens >= 2");
    TESSERA_CHECK_INPUT(g.recompute_tokens >= 1 && g.recompute_tokens <= g.new_tokens,
                        "bench generate: --recompute-tokens must be in [1, --new-tokens]");
    TESSERA_CHECK_INPUT(prompt_len + g.new_tokens <= g.mc.max_position_embeddings,
                        "bench generate: --prompt-len + --new-tokens exceed the preset's max_position_embeddings " +
                            std::to_string(g.mc.max_position_embeddings));
    const std::string dtype = (*vm)["dtype"].as<std::string>();
    TESSERA_CHECK_INPUT(dtype == "fp32" || dtype == "bf16", "--dtype '" + dtype + "' must be fp32 or bf16");
    g.dtype = fsdp::parse_dtype(dtype);
    std::mt19937 rng(3);
    for (int64_t i = 0; i < prompt_len; ++i) g.prompt.push_back(static_cast<int64_t>(rng() % g.mc.vocab_size));
  });
  auto full = make_generator(g, fsdp::Strategy::FullShard), kept = make_generator(g, fsdp::Strategy::ShardGradOp);
  measure(*full, *kept, g);  // warm-up
  std::vector<Round> rounds;
  for (int r = 0; r < (*vm)["rounds"].as<int>(); ++r) rounds.push_back(measure(*full, *kept, g));
  if (launcher::current().world_rank == 0) report(g, rounds, (*vm)["json"].as<bool>());
  return 0;
}

}  // namespace tessera::bench
