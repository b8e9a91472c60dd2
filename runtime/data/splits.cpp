#include "runtime/data/splits.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>

#include "util/error.h"
#include "util/json.h"

namespace tessera::data {

namespace fs = std::filesystem;

namespace {

const std::vector<std::pair<std::string, std::vector<std::string>>>& keywords() {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> k = {
      {"train", {"train", "training"}},
      {"validation", {"validation", "valid", "dev", "val"}},
      {"test", {"test", "testing", "eval", "evaluation"}}};
  return k;
}

bool delimiter(char c) { return c == '-' || c == '.' || c == '_' || c == ' ' || (c >= '0' && c <= '9'); }

// `word` in `name` delimited before (start or a delimiter) and after (a delimiter, or the end of
// the name when `end_ok`): datasets' "[sep]keyword[sep]" patterns.
bool holds(const std::string& name, const std::string& word, bool end_ok) {
  for (size_t i = name.find(word); i != std::string::npos; i = name.find(word, i + 1)) {
    const size_t after = i + word.size();
    if ((i == 0 || delimiter(name[i - 1])) && (after == name.size() ? end_ok : delimiter(name[after]))) return true;
  }
  return false;
}

// The canonical splits (train, validation, test) whose keywords a file's folders (rule 2) or its
// name (rule 3) hold.
std::vector<std::string> keyword_splits(const fs::path& rel, bool folders) {
  std::vector<std::string> out;
  for (const auto& [split, words] : keywords()) {
    bool hit = false;
    for (const std::string& w : words) {
      if (folders)
        for (const auto& part : rel.parent_path()) hit |= holds(part.string(), w, true);
      else
        hit |= holds(rel.filename().string(), w, false);
    }
    if (hit) out.push_back(split);
  }
  return out;
}

// Rule 1: data/<split>-NNNNN-of-NNNNN....: the split, or "".
std::string shard_split(const fs::path& rel) {
  static const std::regex shard(R"(data/(\w+(?:\.\w+)*)-[0-9]{5}-of-[0-9]{5}[^/]*\.[^/]*)");
  std::smatch m;
  const std::string s = rel.generic_string();
  return std::regex_match(s, m, shard) ? m[1].str() : std::string();
}

// A Hugging Face save_to_disk DatasetDict: dataset_dict.json naming split folders that hold a
// save_to_disk dataset (state.json). Refused: its files are Arrow.
void refuse_dataset_dict(const std::string& dir) {
  std::error_code ec;
  const fs::path dd = fs::path(dir) / "dataset_dict.json";
  if (!fs::is_regular_file(dd, ec)) return;
  std::ifstream in(dd);
  const nlohmann::json j = util::parse_json_or_discarded(std::string(std::istreambuf_iterator<char>(in), {}));
  if (!j.is_object() || !j.contains("splits") || !j["splits"].is_array()) return;
  std::string names;
  bool arrow = false;
  for (const auto& s : j["splits"]) {
    if (!s.is_string()) continue;
    names += (names.empty() ? "" : ", ") + s.get<std::string>();
    arrow |= fs::exists(fs::path(dir) / s.get<std::string>() / "state.json", ec);
  }
  if (!arrow) return;
  throw TESSERA_INPUT_ERROR(
      "data directory " + dir + " is a Hugging Face save_to_disk DatasetDict (dataset_dict.json: splits " + names +
      ") stored as Arrow, which Tessera does not read: export its splits to JSON Lines, e.g. python3 -c \"import "
      "datasets; [d.to_json('" + dir + "-jsonl/%s.jsonl' % s) for s, d in datasets.load_from_disk('" + dir +
      "').items()]\", and give " + dir + "-jsonl");
}

// Assigns each file of `all` to its splits by `rule` (1, 2 or 3); false when no file matches it.
bool assign(Splits& out, const DataListing& all, int rule) {
  std::map<std::string, std::vector<DataFile>> files;
  for (const DataFile& f : all.files) {
    const fs::path rel = fs::path(f.path).lexically_relative(all.path);
    std::vector<std::string> splits;
    if (rule == 1) {
      if (std::string s = shard_split(rel); !s.empty()) splits.push_back(s);
    } else {
      splits = keyword_splits(rel, rule == 2);
    }
    for (const std::string& s : splits) files[s].push_back(f);
    if (splits.empty()) out.outside.push_back(rel.string());
  }
  if (files.empty()) {
    out.outside.clear();
    return false;
  }
  out.rule = rule == 1 ? "shards" : rule == 2 ? "folder names" : "file names";
  for (const auto& [split, words] : keywords())
    if (files.count(split)) out.names.push_back(split);
  for (const auto& [split, f] : files)  // the others (rule 1), sorted
    if (std::find(out.names.begin(), out.names.end(), split) == out.names.end()) out.names.push_back(split);
  for (auto& [split, f] : files) out.split[split] = DataListing{all.path + " split " + split, std::move(f), all.skipped};
  return true;
}

}  // namespace

std::string Splits::found() const {
  std::string s;
  for (const std::string& n : names) {
    const size_t k = split.at(n).files.size();
    s += (s.empty() ? "" : ", ") + n + " (" + std::to_string(k) + (k == 1 ? " file)" : " files)");
  }
  return s;
}

const DataListing& Splits::get(const std::string& name, const std::string& key) const {
  if (has(name)) return split.at(name);
  throw TESSERA_INPUT_ERROR(key + " " + name + ": data " + (rule.empty() ? "path " : "directory ") + path +
                            " has no split " + name + " (splits found: " + found() +
                            (rule.empty() ? "; no file or folder is named after a split: all of it is train" : "") + ")");
}

std::string Splits::chosen(const std::string& key, const std::string& name) const {
  if (rule.empty()) return "";
  std::string s = "has splits " + found() + " (by " + rule + "): " + key + " " + name;
  if (!outside.empty())
    s += "; in no split, not read: " + outside.front() +
         (outside.size() > 1 ? " and " + std::to_string(outside.size() - 1) + " more" : "");
  return s;
}

std::string Splits::validation(const std::string& wanted, const std::string& key, const std::string& except) const {
  if (wanted == "none") return "";
  if (!wanted.empty()) {
    get(wanted, key);  // refuses a split that is not there
    return wanted;
  }
  for (const char* n : {"validation", "test"})
    if (has(n) && n != except) return n;
  return "";
}

Splits find_splits(const std::string& path, DataFormat format) {
  Splits out;
  out.path = path;
  std::error_code ec;
  if (fs::is_directory(path, ec)) refuse_dataset_dict(path);
  DataListing all = list_data(path, format);
  if (fs::is_directory(path, ec))
    for (int rule = 1; rule <= 3; ++rule)
      if (assign(out, all, rule)) return out;
  out.names = {"train"};
  out.split["train"] = std::move(all);
  return out;
}

}  // namespace tessera::data
