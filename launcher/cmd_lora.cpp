#include "launcher/cmd_lora.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>

#include "launcher/cli.h"
#include "launcher/cmd_ckpt.h"
#include "model/peft_adapter.h"
#include "model/registry.h"
#include "model/safetensors.h"
#include "runtime/checkpoint/checkpoint.h"
#include "util/error.h"

namespace tessera::launcher {

namespace {

namespace fs = std::filesystem;

// --out must be a new place: not the base directory, not inside it (also through links on the way),
// not a symbolic link itself.
void check_out_apart_from_base(const std::string& out, const std::string& base) {
  std::error_code ec;
  if (fs::is_symlink(out, ec))
    throw TESSERA_INPUT_ERROR("--out " + out + " is a symbolic link; Tessera never writes through a link: name a new directory");
  const fs::path b = fs::canonical(base, ec);
  if (ec) throw TESSERA_INPUT_ERROR("--model " + base + ": " + ec.message());
  const fs::path o = fs::weakly_canonical(fs::absolute(out), ec);
  if (ec) throw TESSERA_INPUT_ERROR("--out " + out + ": " + ec.message());
  const std::string bs = b.string(), os = o.string();
  if (os == bs || (os.size() > bs.size() && os.compare(0, bs.size(), bs) == 0 && os[bs.size()] == '/'))
    throw TESSERA_INPUT_ERROR("--out " + out + (os == bs ? " is" : " is inside") + " the base model directory " + base +
                              "; the merged model goes to a new directory");
}

int merge(const std::vector<std::string>& args) {
  po::options_description desc("Options");
  desc.add_options()("model", po::value<std::string>()->required(), "base Hugging Face model directory")(
      "adapter", po::value<std::string>()->required(), "PEFT LoRA adapter directory (adapter_config.json, adapter_model.safetensors)")(
      "out", po::value<std::string>()->required(), "merged Hugging Face model directory to create (must not exist or be empty)")(
      "dtype", po::value<std::string>(), "bf16 | fp16 | fp32 (default: the base's torch_dtype)")(
      "max-shard-size", po::value<std::string>()->default_value("2GB"), "split safetensors files above this size");
  const auto vm = parse_command(
      "tessera lora merge --model BASE --adapter ADAPTER_DIR --out HF_DIR [--dtype bf16|fp16|fp32] [--max-shard-size 2GB]",
      desc, args);
  if (!vm) return 0;
  const std::string base_dir = (*vm)["model"].as<std::string>(), adapter_dir = (*vm)["adapter"].as<std::string>(),
                    out = (*vm)["out"].as<std::string>();
  const uint64_t max_shard = parse_byte_size((*vm)["max-shard-size"].as<std::string>(), "--max-shard-size");
  const auto t0 = std::chrono::steady_clock::now();
  const model::ModelDir base(base_dir);
  check_out_apart_from_base(out, base_dir);
  base.validate();
  const model::ModelConfig& cfg = base.config();
  const model::DType dtype = model::dtype_from_cli(vm->count("dtype") ? (*vm)["dtype"].as<std::string>() : cfg.torch_dtype,
                                                   vm->count("dtype") ? "--dtype" : base_dir + "/config.json torch_dtype");
  const model::PeftAdapter adapter(adapter_dir, cfg, base_dir);
  std::map<std::string, const model::LoraTarget*> by_weight;
  for (const auto& t : adapter.targets()) by_weight[t.base_weight] = &t;

  // Streaming: one base tensor (fp32 when adapted) and its A, B at a time.
  model::write_safetensors_dir(out, cfg, model::hf_tensor_specs(cfg), dtype, max_shard, [&](const model::TensorSpec& spec) {
    const auto it = by_weight.find(spec.name);
    if (it == by_weight.end()) return base.read(spec.name);
    at::Tensor w = base.read(spec.name).to(at::kFloat);
    w.add_(adapter.delta(*it->second));
    return w;
  });
  copy_tokenizer_files(base_dir, out);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("merged %s into %s: %zu weights + (%g / %lld) B A -> %s as %s in %.2f s\n", adapter_dir.c_str(),
              base_dir.c_str(), adapter.targets().size(), adapter.config().lora_alpha, (long long)adapter.config().r,
              out.c_str(), model::dtype_name(dtype), s);
  return 0;
}

int export_action(const std::vector<std::string>& args) {
  po::options_description desc("Options");
  desc.add_options()("checkpoint", po::value<std::string>()->required(), "a LoRA checkpoint, DIR/step-N")(
      "out", po::value<std::string>()->required(), "PEFT adapter directory to create (must not exist or be empty)")(
      "dtype", po::value<std::string>()->default_value("fp32"), "fp32 | bf16 | fp16");
  const auto vm = parse_command("tessera lora export --checkpoint DIR/step-N --out ADAPTER_DIR [--dtype fp32|bf16|fp16]",
                                desc, args);
  if (!vm) return 0;
  const std::string ckpt = (*vm)["checkpoint"].as<std::string>(), out = (*vm)["out"].as<std::string>();
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t n = export_lora_checkpoint(ckpt, out, (*vm)["dtype"].as<std::string>());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("exported %lld adapted weights of %s -> %s (PEFT LoRA adapter) in %.2f s\n", (long long)n, ckpt.c_str(),
              out.c_str(), s);
  return 0;
}

// The PEFT config of a LoRA checkpoint's state.lora (launcher/lora_run.h writes it).
model::PeftConfig peft_config_of(const nlohmann::json& lora, const std::string& where) {
  try {
    model::PeftConfig c;
    c.r = lora.at("rank").get<int64_t>();
    c.lora_alpha = lora.at("alpha").get<double>();
    c.lora_dropout = lora.at("dropout").get<double>();
    c.target_modules = lora.at("targets").get<std::vector<std::string>>();
    c.base_model_name_or_path = lora.at("base").at("path").get<std::string>();
    return c;
  } catch (const nlohmann::json::exception& e) {
    throw TESSERA_INPUT_ERROR(where + ": state.lora is not what a LoRA run writes (" + e.what() + ")");
  }
}

}  // namespace

int64_t export_lora_checkpoint(const std::string& ckpt, const std::string& out, const std::string& dtype_name) {
  const model::DType dtype = model::dtype_from_cli(dtype_name, "--dtype");
  require_checkpoint(ckpt, "--checkpoint");
  checkpoint::verify(ckpt);  // a corrupted checkpoint must not turn into a plausible adapter
  const checkpoint::Reader r(ckpt);
  const std::string where = ckpt + "/manifest.json";
  TESSERA_CHECK_INPUT(r.state().contains("lora") && r.state()["lora"].is_object(),
                      "checkpoint " + ckpt + " is not a LoRA checkpoint (no state.lora in its manifest): it holds full "
                      "weights; tessera ckpt consolidate exports them");
  TESSERA_CHECK_INPUT(r.state().contains("model_config"), where + " has no state.model_config");
  const model::ModelConfig cfg = model::ModelConfig::from_json(r.state()["model_config"], where + " state.model_config");
  const model::PeftConfig pc = peft_config_of(r.state()["lora"], where);
  int64_t n = 0;
  model::write_peft_adapter(out, pc, cfg, dtype, [&](const model::TensorSpec& spec) {
    const auto* t = r.find(spec.name, "param");
    TESSERA_CHECK_INPUT(t && t->shape == spec.shape, "checkpoint " + ckpt + " lacks adapter " + spec.name + " of shape " +
                                                         model::shape_str(spec.shape) + " (state.lora says it has it)");
    at::Tensor full = at::empty(spec.shape, at::TensorOptions().dtype(at::kFloat));
    r.read(*t, 0, t->numel, full.data_ptr<float>());
    n += spec.name.find(".lora_A.") != std::string::npos;
    return full;
  });
  return n;
}

int run_lora(const std::vector<std::string>& args) {
  const std::string usage =
      "usage: tessera lora merge --model BASE --adapter ADAPTER_DIR --out HF_DIR [--dtype bf16|fp16|fp32] "
      "[--max-shard-size 2GB]\n"
      "       tessera lora export --checkpoint DIR/step-N --out ADAPTER_DIR [--dtype fp32|bf16|fp16]\n";
  return run_action("lora", usage, {{"merge", merge}, {"export", export_action}}, args);
}

}  // namespace tessera::launcher
