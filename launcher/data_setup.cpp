#include "launcher/data_setup.h"

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <optional>

#include "runtime/data/splits.h"
#include "util/error.h"

namespace tessera::launcher {

namespace fs = std::filesystem;

bool TokenizerChoice::bpe() const {
  std::error_code ec;
  const fs::path p(path);
  return !bytes && (p.extension() == ".json" || (fs::is_directory(p, ec) && fs::exists(p / "tokenizer.json", ec) &&
                                                 !fs::exists(p / "tokenizer.model", ec)));
}

namespace {

// The tokenizer at `path`, with the tokenizer_config.json beside it when there is one.
TokenizerChoice tokenizer_at(const std::string& path) {
  std::error_code ec;
  const std::string config = text::tokenizer_config_beside(path);
  return {false, path, fs::exists(config, ec) ? config : ""};
}

}  // namespace

TokenizerChoice choose_tokenizer(const std::string& spec, const std::string& model_dir, const std::string& model_name,
                                 const model::ModelConfig& mc) {
  if (spec == "bytes") return {true, ""};
  if (!spec.empty()) return tokenizer_at(spec);
  std::error_code ec;
  for (const char* file : {"tokenizer.model", "tokenizer.json"})
    if (!model_dir.empty() && fs::is_regular_file(fs::path(model_dir) / file, ec))
      return tokenizer_at((fs::path(model_dir) / file).string());
  const auto& eos = mc.eos_token_ids;
  const bool byte_vocab = mc.bos_token_id == text::ByteTokenizer::kBos &&
                          std::find(eos.begin(), eos.end(), text::ByteTokenizer::kEos) != eos.end() &&
                          mc.vocab_size >= text::ByteTokenizer::kVocab;
  if (byte_vocab) return {true, ""};
  throw TESSERA_INPUT_ERROR(
      "data.tokenizer is empty and model " + model_name + " (vocab_size " + std::to_string(mc.vocab_size) + ") " +
      (model_dir.empty() ? "is a preset without a tokenizer" : "has no tokenizer.model or tokenizer.json in its directory") +
      ": set data.tokenizer to the model's tokenizer.model or tokenizer.json, or to \"bytes\" to train it on byte-level "
      "tokens (ids 0-257)");
}

text::ChatTemplateChoice chat_template_for(const TokenizerChoice& tc, text::ChatTemplateKind kind) {
  const std::string config = kind == text::ChatTemplateKind::Auto ? tc.config : "";
  // A rank that cannot see it (model.load=rank0 broadcasts a tokenizer.model) would silently fall
  // back to llama2 while rank 0 renders the model's template.
  std::error_code ec;
  TESSERA_CHECK_INPUT(config.empty() || fs::exists(config, ec),
                      "data.chat_template auto: " + config + " (beside the tokenizer) is not visible on this rank, so "
                      "its chat template cannot be read: make it visible to every rank, or set data.chat_template");
  return text::choose_chat_template(kind, config);
}

std::string tokenizer_dir(const std::string& spec, const std::string& model_dir) {
  if (spec == "bytes") return "";
  if (spec.empty()) return model_dir;
  std::error_code ec;
  return fs::is_directory(spec, ec) ? spec : fs::path(spec).parent_path().string();
}

namespace {

void print_read_warnings(const data::ReadStats& s, const std::string& what) {
  for (const auto& w : s.warnings) std::cerr << "tessera: warning: " << w << "\n";
  if (s.dropped > static_cast<int64_t>(s.warnings.size()))
    std::cerr << "tessera: warning: " << what << ": " << (s.dropped - static_cast<int64_t>(s.warnings.size()))
              << " more dropped examples not listed\n";
  if (s.dropped) std::cout << what << ": " << s.drop_summary() << std::endl;
}

// What data.path and the validation data stand for: a directory's splits (data.split; the
// validation split from data.val_path's splits, or from data.path's when data.val_path and
// data.val_fraction are unset) or all of a path without splits. `note`: the line that says so
// ("" when no split was involved).
struct DataChoice {
  data::DataListing train;
  std::optional<data::DataListing> val;
  std::string note;
};

DataChoice choose_data(const DataSection& cfg) {
  DataChoice c;
  const data::Splits splits = data::find_splits(cfg.path, cfg.format);
  c.train = splits.get(cfg.split, "data.split");
  if (!splits.rule.empty()) c.note = "data.path " + cfg.path + " " + splits.chosen("data.split", cfg.split);
  if (!cfg.val_path.empty()) {
    const data::Splits vs = data::find_splits(cfg.val_path, cfg.format);
    const std::string name =
        vs.rule.empty() && cfg.val_split.empty() ? "train" : vs.validation(cfg.val_split, "data.val_split", "");
    TESSERA_CHECK_INPUT(!name.empty() || cfg.val_split == "none",
                        "data.val_path " + cfg.val_path + " has splits " + vs.found() + " and none of them is validation "
                        "or test: name one in data.val_split");
    if (!name.empty()) c.val = vs.split.at(name);
    if (!vs.rule.empty() && !name.empty())
      c.note += std::string(c.note.empty() ? "" : "; ") + "validation: split " + name + " of data.val_path " + cfg.val_path;
  } else if (cfg.val_fraction == 0) {
    const std::string name = splits.validation(cfg.val_split, "data.val_split", cfg.split);
    if (!name.empty()) {
      c.val = splits.split.at(name);
      c.note += "; validation: split " + name + " (data.val_path is unset; data.val_split names another, none: no "
                "validation)";
    }
  } else {
    TESSERA_CHECK_INPUT(cfg.val_split.empty(), "data.val_split and data.val_fraction are both set: validate on a "
                                               "split or on a fraction of data.path, not both");
  }
  return c;
}

}  // namespace

DataSetup setup_data(const Config& cfg, const model::ModelConfig& mc, const TokenizerChoice& tc,
                     std::unique_ptr<text::Tokenizer> tokenizer, bool print_warnings) {
  DataSetup d;
  d.tokenizer = std::move(tokenizer);
  const text::Tokenizer& tok = *d.tokenizer;
  const std::string model_path = cfg.model.path;
  TESSERA_CHECK_INPUT(tok.vocab_size() <= mc.vocab_size,
                      "tokenizer " + tok.name() + " has a vocab of " + std::to_string(tok.vocab_size()) +
                          " tokens, more than the model's vocab_size " + std::to_string(mc.vocab_size) + " (" +
                          (model_path.empty() ? "preset " + cfg.model.preset : model_path + "/config.json") +
                          "): its ids would be outside the model's embedding (set data.tokenizer to the model's own)");
  text::ChatTemplateChoice chat = chat_template_for(tc, cfg.data.chat_template);
  if (print_warnings) std::cout << "data: chat template: " << chat.description << std::endl;
  d.chat = std::move(chat.chat);
  d.chat->check(tok);

  data::PackOptions po;
  po.seq_len = cfg.data.seq_len;
  po.packing = cfg.data.packing;
  po.truncation = cfg.data.truncation;
  po.train_on_all = cfg.data.train_on == TrainOn::All;
  po.vocab_limit = mc.vocab_size;
  const std::string path = cfg.data.path, val_path = cfg.data.val_path;
  const double fraction = cfg.data.val_fraction;
  TESSERA_CHECK_INPUT(fraction >= 0 && fraction < 1, "data.val_fraction must be in [0, 1), got " + std::to_string(fraction));
  TESSERA_CHECK_INPUT(val_path.empty() || fraction == 0,
                      "data.val_path and data.val_fraction are both set: hold out a fraction of data.path or give a "
                      "validation file, not both");

  // Reading: every rank reads and tokenises the text/JSONL files itself (token files are mapped).
  const DataChoice chosen = choose_data(cfg.data);
  if (print_warnings && !chosen.note.empty()) std::cout << "data: " << chosen.note << std::endl;
  auto load = [&](const data::DataListing& listing, const std::string& key) {
    data::ReadStats stats;
    auto stores = data::load_documents(std::vector<data::DataListing>{listing}, tok, *d.chat, stats);
    if (print_warnings) {
      for (const auto& in : stats.inputs) std::cout << key << " " << in << std::endl;  // the detected formats
      print_read_warnings(stats, key + " " + listing.path);
    }
    if (stats.documents == 0)
      throw TESSERA_INPUT_ERROR(key + " " + listing.path + " holds no trainable example (" +
                                (stats.dropped ? stats.drop_summary() : std::to_string(stats.files) + " file(s) without text") +
                                ")");
    d.read_stats.merge(stats);
    return stores;
  };
  auto stores = load(chosen.train, "data.path");
  po.val_fraction = chosen.val ? 0 : fraction;
  auto make = [&](const std::vector<std::shared_ptr<const data::DocStore>>& s, bool validation, const std::string& what) {
    data::PackOptions o = po;
    o.validation = validation;
    auto ds = std::make_shared<data::TokenDataset>(s, o);
    if (print_warnings) print_read_warnings(ds->stats(), what);
    return ds;
  };
  d.train = make(stores, false, "data.path " + path);
  if (chosen.val) {
    const std::string key = val_path.empty() ? "data.path" : "data.val_path";
    d.val = make(load(*chosen.val, key), false, key + " " + chosen.val->path);
  } else if (fraction > 0) {
    d.val = make(stores, true, "data.val_fraction split of " + path);
  }
  TESSERA_CHECK_INPUT(d.val || cfg.eval.every == 0,
                      "eval.every is " + std::to_string(cfg.eval.every) +
                          " but there is no validation data: set data.val_path or data.val_fraction");
  TESSERA_CHECK_INPUT(cfg.eval.every >= 0, "eval.every must be >= 0");
  TESSERA_CHECK_INPUT(d.val || !cfg.checkpoint.keep_best,
                      "checkpoint.keep_best needs validation data: set data.val_path or data.val_fraction");
  TESSERA_CHECK_INPUT(!cfg.checkpoint.keep_best || !cfg.checkpoint.dir.empty(),
                      "checkpoint.keep_best needs checkpoint.dir");
  return d;
}

}  // namespace tessera::launcher
