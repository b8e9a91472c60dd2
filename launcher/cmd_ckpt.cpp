#include "launcher/cmd_ckpt.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>

#include "launcher/cli.h"
#include "launcher/data_setup.h"
#include "model/config.h"
#include "model/registry.h"
#include "model/safetensors.h"
#include "runtime/checkpoint/checkpoint.h"
#include "util/error.h"

namespace tessera::launcher {

void require_checkpoint(const std::string& dir, const std::string& what) {
  std::error_code ec;
  if (std::filesystem::exists(std::filesystem::path(dir) / "manifest.json", ec)) return;
  const auto steps = checkpoint::complete_checkpoints(dir);
  TESSERA_CHECK_INPUT(steps.empty(), what + " " + dir + " is a checkpoint.dir holding " + std::to_string(steps.size()) +
                                         " checkpoint(s), not one checkpoint: name one, e.g. " + steps.back());
}

namespace {

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", b, units[u]);
  return buf;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
}

// A single positional DIR argument.
std::optional<std::string> dir_argument(const std::string& usage, const std::vector<std::string>& args) {
  po::options_description desc("Options");
  desc.add_options()("dir", po::value<std::string>()->required(), "checkpoint directory (step-<N>)");
  po::positional_options_description pos;
  pos.add("dir", 1);
  const auto vm = parse_command(usage, desc, args, &pos);
  if (!vm) return std::nullopt;
  return (*vm)["dir"].as<std::string>();
}

int inspect(const std::vector<std::string>& args) {
  const auto dir = dir_argument("tessera ckpt inspect DIR", args);
  if (!dir) return 0;
  require_checkpoint(*dir, "ckpt inspect:");
  checkpoint::Reader r(*dir);
  const auto& m = r.manifest();
  uint64_t total = 0;
  for (const auto& f : r.files()) total += f.bytes;
  std::printf("checkpoint %s\n", dir->c_str());
  std::printf("  format      %s version %d\n", checkpoint::kFormatName, m.at("format_version").get<int>());
  std::printf("  step        %lld\n", (long long)r.step());
  std::printf("  world size  %d (strategy %s: shard group %d, replicate group %d)\n", m.value("world_size", 0),
              m.value("strategy", std::string("?")).c_str(), m.value("shard_group_size", 0),
              m.value("replicate_group_size", 0));
  std::printf("  files       %zu, %s\n", r.files().size(), human_bytes(double(total)).c_str());
  if (r.state().contains("model_config")) std::printf("  model       %s\n", r.state()["model_config"].dump().c_str());
  // One line per parameter; its AdamW moments are listed as present or not.
  std::map<std::string, std::vector<std::string>> kinds;
  for (const auto& t : r.tensors()) kinds[t.name].push_back(t.kind);
  int64_t params = 0;
  std::printf("  tensors (fp32; param + optimizer moments):\n");
  for (const auto& t : r.tensors()) {
    if (t.kind != "param") continue;
    params += t.numel;
    std::string ks;
    for (const auto& k : kinds[t.name]) ks += (ks.empty() ? "" : "+") + k;
    std::printf("    %-48s %-16s %12lld  %-10s  %s\n", t.name.c_str(), shape_str(t.shape).c_str(), (long long)t.numel,
                human_bytes(double(t.numel) * 4 * kinds[t.name].size()).c_str(), ks.c_str());
  }
  std::printf("  parameters  %lld\n", (long long)params);
  return 0;
}

void verify_one(const std::string& dir) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto rep = checkpoint::verify(dir);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("OK %s: %lld files (%s) match their CRC32C, %lld tensors each stored exactly once (%.2f s)\n",
              dir.c_str(), (long long)rep.files, human_bytes(double(rep.bytes)).c_str(), (long long)rep.tensors, s);
}

// One checkpoint, or every complete checkpoint of a checkpoint.dir (the first bad one stops it).
int verify(const std::vector<std::string>& args) {
  const auto dir = dir_argument("tessera ckpt verify DIR", args);
  if (!dir) return 0;
  std::error_code ec;
  const auto steps = std::filesystem::exists(std::filesystem::path(*dir) / "manifest.json", ec)
                         ? std::vector<std::string>{}
                         : checkpoint::complete_checkpoints(*dir);
  if (steps.empty()) {
    verify_one(*dir);
    return 0;
  }
  std::printf("%s is a checkpoint.dir: verifying its %zu checkpoints\n", dir->c_str(), steps.size());
  for (const auto& d : steps) verify_one(d);
  std::printf("OK: all %zu checkpoints of %s verified\n", steps.size(), dir->c_str());
  return 0;
}

// The tokenizer files of the run that saved `r` (from data.tokenizer, else model.path, as training
// took them: data_setup.h tokenizer_dir) copied into the export `out`, so that `tessera eval` and
// transformers read the text as training did. A line says what was copied, or why nothing was.
void copy_run_tokenizer_files(const checkpoint::Reader& r, const std::string& out) {
  namespace fs = std::filesystem;
  const nlohmann::json cfg = r.state().value("config", nlohmann::json::object());
  auto key = [&](const char* pointer) {
    const nlohmann::json::json_pointer p(pointer);
    return cfg.contains(p) && cfg.at(p).is_string() ? cfg.at(p).get<std::string>() : std::string();
  };
  const std::string dir = tokenizer_dir(key("/data/tokenizer"), key("/model/path"));
  std::error_code ec;
  if (dir.empty() || !fs::is_directory(dir, ec)) {
    std::printf("tokenizer files: none copied (%s)\n",
                dir.empty() ? "the run used byte-level tokens or a preset model without a tokenizer"
                            : (dir + ", the run's tokenizer directory, is not there: copy its tokenizer files into " +
                               out + " by hand").c_str());
    return;
  }
  copy_tokenizer_files(dir, out);
}

}  // namespace

void copy_tokenizer_files(const std::string& dir, const std::string& out) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string copied;
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                           "generation_config.json"}) {
    const fs::path from = fs::path(dir) / name;
    if (!fs::is_regular_file(from, ec)) continue;
    fs::copy_file(from, fs::path(out) / name, ec);
    if (ec) throw TESSERA_INPUT_ERROR("cannot copy " + from.string() + " into " + out + ": " + ec.message());
    copied += (copied.empty() ? "" : ", ") + std::string(name);
  }
  std::printf("tokenizer files from %s: %s\n", dir.c_str(), copied.empty() ? "none there" : copied.c_str());
}

namespace {

int consolidate(const std::vector<std::string>& args) {
  po::options_description desc("Options");
  desc.add_options()("checkpoint", po::value<std::string>()->required(), "sharded checkpoint directory (step-<N>)")(
      "out", po::value<std::string>()->required(), "Hugging Face model directory to create (must not exist or be empty)")(
      "dtype", po::value<std::string>()->default_value("bf16"), "bf16 | fp16 | fp32")(
      "max-shard-size", po::value<std::string>()->default_value("2GB"), "split safetensors files above this size");
  const auto vm = parse_command(
      "tessera ckpt consolidate --checkpoint DIR --out HFDIR [--dtype bf16|fp32] [--max-shard-size 2GB]", desc, args);
  if (!vm) return 0;
  const std::string dir = (*vm)["checkpoint"].as<std::string>(), out = (*vm)["out"].as<std::string>();
  const model::DType dtype = model::dtype_from_cli((*vm)["dtype"].as<std::string>(), "--dtype");
  const uint64_t max_shard = parse_byte_size((*vm)["max-shard-size"].as<std::string>(), "--max-shard-size");
  require_checkpoint(dir, "--checkpoint");
  const auto t0 = std::chrono::steady_clock::now();

  // Checksums first: a corrupted checkpoint must not turn into a plausible model.
  checkpoint::verify(dir);
  checkpoint::Reader r(dir);
  if (!r.state().contains("model_config"))
    throw TESSERA_INPUT_ERROR("checkpoint " + dir + " has no state.model_config in its manifest; cannot write config.json");
  const model::ModelConfig cfg = model::ModelConfig::from_json(r.state()["model_config"], dir + "/manifest.json state.model_config");
  // The checkpoint must hold exactly the config's tensors (Hugging Face names), in file order.
  const std::vector<model::TensorSpec> specs = model::hf_tensor_specs(cfg);
  size_t params_in_ckpt = 0;
  for (const auto& t : r.tensors()) params_in_ckpt += t.kind == "param";
  for (const auto& s : specs) {
    const auto* t = r.find(s.name, "param");
    if (!t) throw TESSERA_INPUT_ERROR("checkpoint " + dir + " lacks tensor " + s.name + " of its model_config");
    if (t->shape != s.shape)
      throw TESSERA_INPUT_ERROR("checkpoint " + dir + ": tensor " + s.name + " has shape " + shape_str(t->shape) +
                                ", its model_config says " + shape_str(s.shape));
  }
  if (params_in_ckpt != specs.size())
    throw TESSERA_INPUT_ERROR("checkpoint " + dir + " has " + std::to_string(params_in_ckpt) +
                              " parameters, its model_config defines " + std::to_string(specs.size()));

  // Streaming: one fp32 tensor assembled at a time (plus the writer's converted copy).
  int64_t done = 0;
  model::write_safetensors_dir(out, cfg, specs, dtype, max_shard, [&](const model::TensorSpec& spec) {
    const auto* t = r.find(spec.name, "param");
    at::Tensor full = at::empty(spec.shape, at::TensorOptions().dtype(at::kFloat));
    r.read(*t, 0, t->numel, full.data_ptr<float>());
    done += t->numel;
    return full;
  });
  copy_run_tokenizer_files(r, out);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("consolidated %s (step %lld, %zu tensors, %lld parameters) -> %s as %s in %.2f s\n", dir.c_str(),
              (long long)r.step(), specs.size(), (long long)done, out.c_str(), model::dtype_name(dtype), s);
  return 0;
}

}  // namespace

int run_ckpt(const std::vector<std::string>& args) {
  const std::string usage =
      "usage: tessera ckpt consolidate --checkpoint DIR --out HFDIR [--dtype bf16|fp32] [--max-shard-size 2GB]\n"
      "       tessera ckpt inspect DIR     (step, world size, strategy, tensors and sizes)\n"
      "       tessera ckpt verify DIR      (every checksum; every tensor element stored exactly once)\n";
  return run_action("ckpt", usage, {{"consolidate", consolidate}, {"inspect", inspect}, {"verify", verify}}, args);
}

}  // namespace tessera::launcher
