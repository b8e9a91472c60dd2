#include "launcher/cmd_model.h"

#include <torch/torch.h>

#include <iostream>

#include "launcher/cli.h"
#include "model/eval.h"
#include "model/registry.h"
#include "model/safetensors.h"
#include "util/error.h"

namespace tessera::launcher {

namespace {
std::string preset_list() {
  std::string s;
  for (const auto& name : model::ModelConfig::preset_names()) s += (s.empty() ? "" : ", ") + name;
  return s;
}
}  // namespace

int run_init_model(const std::vector<std::string>& args) {
  const std::string usage =
      "tessera init-model --preset NAME|--config config.json --out DIR [--dtype fp32|bf16|fp16] [--seed N] "
      "[--max-shard-size 2GB]";
  po::options_description desc("init-model options");
  desc.add_options()  //
      ("preset", po::value<std::string>(), ("built-in model: " + preset_list()).c_str())  //
      ("config", po::value<std::string>(), "Hugging Face config.json to take the dimensions from")  //
      ("out", po::value<std::string>()->required(), "output directory (must not exist, or be empty)")  //
      ("dtype", po::value<std::string>()->default_value("fp32"), "stored dtype: fp32, bf16 or fp16")  //
      ("seed", po::value<int64_t>()->default_value(0), "initialisation seed (normal std 0.02, norms 1)")  //
      ("max-shard-size", po::value<std::string>()->default_value("2GB"),
       "largest safetensors file before sharding with an index, e.g. 500MB");
  auto vm = parse_command(usage, desc, args);
  if (!vm) return 0;

  const bool has_preset = vm->count("preset"), has_config = vm->count("config");
  TESSERA_CHECK_INPUT(has_preset != has_config, "init-model needs exactly one of --preset or --config; see tessera init-model --help");
  const auto cfg = has_preset ? model::ModelConfig::preset((*vm)["preset"].as<std::string>())
                              : model::ModelConfig::load((*vm)["config"].as<std::string>());
  const auto dtype = model::dtype_from_cli((*vm)["dtype"].as<std::string>(), "--dtype");
  const int64_t seed = (*vm)["seed"].as<int64_t>();
  TESSERA_CHECK_INPUT(seed >= 0, "--seed must be non-negative, got " + std::to_string(seed));
  const uint64_t max_shard = parse_byte_size((*vm)["max-shard-size"].as<std::string>(), "--max-shard-size");
  TESSERA_CHECK_INPUT(max_shard > 0, "--max-shard-size must be positive");
  const std::string out = (*vm)["out"].as<std::string>();

  const model::ModelSpec& family = cfg.spec();
  const auto specs = family.tensor_specs(cfg);
  int64_t written = 0;
  model::write_safetensors_dir(out, cfg, specs, dtype, max_shard, [&](const model::TensorSpec& spec) {
    ++written;
    return family.init_tensor(spec, (uint64_t)seed);
  });
  std::cout << nlohmann::json{{"out", out},
                              {"model_type", cfg.model_type},
                              {"parameters", cfg.num_parameters()},
                              {"tensors", written},
                              {"dtype", model::dtype_name(dtype)}}
                   .dump()
            << std::endl;
  return 0;
}

}  // namespace tessera::launcher
