#include "launcher/cmd_tokenize.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "launcher/cli.h"
#include "runtime/data/reader.h"
#include "runtime/data/splits.h"
#include "runtime/data/token_file.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "tools/report.h"
#include "util/error.h"
#include "util/parse_named.h"

namespace tessera::launcher {

namespace {

using Clock = std::chrono::steady_clock;

// Progress on stderr: a bar redrawn in place on a terminal, otherwise a line every 10%.
class ProgressBar {
 public:
  explicit ProgressBar(int64_t total) : total_(std::max<int64_t>(total, 1)), tty_(::isatty(2)), t0_(Clock::now()) {}
  void update(int64_t done, int64_t tokens, bool final = false) {
    const double secs = std::chrono::duration<double>(Clock::now() - t0_).count();
    const int pct = static_cast<int>(100.0 * static_cast<double>(done) / static_cast<double>(total_));
    if (tty_) {
      if (!final && secs - last_draw_ < 0.2) return;
      last_draw_ = secs;
    } else {
      if (!final && (pct >= 100 || pct / 10 <= last_decile_)) return;
      last_decile_ = pct / 10;
    }
    const int width = 30, filled = std::min(width, pct * width / 100);
    char line[200];
    std::snprintf(line, sizeof(line), "[%s%s] %3d%% %.1f/%.1f MB | %.1f MB/s | %.2fM tokens/s", std::string(filled, '#').c_str(),
                  std::string(width - filled, '.').c_str(), pct, done / 1e6, total_ / 1e6,
                  secs > 0 ? done / 1e6 / secs : 0.0, secs > 0 ? tokens / 1e6 / secs : 0.0);
    std::fprintf(stderr, tty_ ? "\r%s%s" : "%s%s", line, tty_ && !final ? "" : "\n");
    std::fflush(stderr);
  }

 private:
  int64_t total_;
  bool tty_;
  Clock::time_point t0_;
  double last_draw_ = -1;
  int last_decile_ = -1;
};

// The files of the --input paths (of a directory with splits, split `split`'s), each input's listing
// printed; *total: their bytes.
std::vector<data::DataFile> input_files(const std::vector<std::string>& inputs, data::DataFormat format,
                                        const std::string& split, int64_t* total) {
  std::vector<data::DataFile> files;
  std::error_code ec;
  for (const auto& in : inputs) {
    const data::Splits splits = data::find_splits(in, format);
    const data::DataListing& listing = splits.get(split, "--split");
    if (!splits.rule.empty()) std::cout << "input " << in << " " << splits.chosen("--split", split) << std::endl;
    for (const auto& f : listing.files) {
      if (f.format == data::FileFormat::Tokens)
        throw TESSERA_INPUT_ERROR("input " + f.path + " is a token file already (train reads it as it is)");
      files.push_back(f);
      *total += static_cast<int64_t>(std::filesystem::file_size(f.path, ec));
    }
    std::cout << "input " << in << ": " << listing.summary() << std::endl;
  }
  return files;
}

}  // namespace

int run_tokenize(const std::vector<std::string>& args) {
  po::options_description desc("Options");
  desc.add_options()
      ("input", po::value<std::vector<std::string>>()->required()->composing(),
       "data file or directory to tokenise, in the formats of data.path (repeatable; files of a directory in sorted "
       "order)")
      ("format", po::value<std::string>()->default_value("auto"),
       "how the input files are read: auto (by content and extension, printed), jsonl, json or text (as data.format)")
      ("split", po::value<std::string>()->default_value("train"),
       "the split of an --input directory with splits to tokenise (files or folders named train / validation / test "
       "as Hugging Face datasets names them; as data.split): train by default; one that is not there is refused, "
       "naming the splits found")
      ("out", po::value<std::string>()->required(), "output token file (.bin)")
      ("tokenizer", po::value<std::string>()->default_value("bytes"),
       "SentencePiece tokenizer.model, Hugging Face tokenizer.json (file or its directory), or bytes (byte-level "
       "tokenizer, vocab 258)")
      ("chat-template", po::value<std::string>()->default_value("auto"),
       "how chat (messages) records are rendered: auto (the chat_template of the tokenizer_config.json beside "
       "--tokenizer, else llama2), llama2, llama3 or none (as data.chat_template)")
      ("force", po::bool_switch(), "replace OUT if it exists");
  const auto vm = parse_command(
      "tessera tokenize --input PATH [--split NAME] --out FILE.bin [--tokenizer tokenizer.model|tokenizer.json|bytes] "
      "[--chat-template auto] [--format auto]",
      desc, args);
  if (!vm) return 0;

  const auto inputs = (*vm)["input"].as<std::vector<std::string>>();
  const std::string out = (*vm)["out"].as<std::string>();
  std::error_code ec;
  if (std::filesystem::exists(out, ec) && !(*vm)["force"].as<bool>())
    throw TESSERA_INPUT_ERROR("output " + out + " already exists (pass --force to replace it)");

  const auto start = Clock::now();
  const auto tokenizer = text::make_tokenizer((*vm)["tokenizer"].as<std::string>());
  const std::string tokenizer_path = (*vm)["tokenizer"].as<std::string>();
  text::ChatTemplateChoice choice = text::choose_chat_template(
      util::parse_named<text::ChatTemplateKind>(text::chat_template_names(), (*vm)["chat-template"].as<std::string>(),
                                          "--chat-template"),
      text::tokenizer_config_beside(tokenizer_path));
  std::cout << "chat template: " << choice.description << std::endl;
  const auto chat = std::move(choice.chat);
  chat->check(*tokenizer);
  const auto format = util::parse_named<data::DataFormat>(data::data_format_names(), (*vm)["format"].as<std::string>(), "--format");
  int64_t total = 0;
  const std::vector<data::DataFile> files = input_files(inputs, format, (*vm)["split"].as<std::string>(), &total);

  for (const std::string& stale : data::TokenFileWriter::remove_stale_temporaries(out))
    std::cout << "removed " << stale << ", left by an interrupted tokenize" << std::endl;
  data::TokenFileWriter writer(out, static_cast<uint32_t>(tokenizer->vocab_size()));
  data::ReadStats stats;
  ProgressBar bar(total);
  int64_t base = 0;
  for (const auto& f : files) {
    data::read_file(f, *tokenizer, *chat, writer, stats,
                    [&](int64_t done, int64_t) { bar.update(done, writer.num_tokens()); }, base, total);
    base += static_cast<int64_t>(std::filesystem::file_size(f.path, ec));
  }
  bar.update(total, writer.num_tokens(), /*final=*/true);
  for (const auto& w : stats.warnings) std::cerr << "tessera: warning: " << w << "\n";
  if (stats.dropped > static_cast<int64_t>(stats.warnings.size()))
    std::cerr << "tessera: warning: " << (stats.dropped - static_cast<int64_t>(stats.warnings.size()))
              << " more dropped examples not listed\n";
  if (writer.num_documents() == 0)
    throw TESSERA_INPUT_ERROR("input " + inputs.front() + (inputs.size() > 1 ? " (and others)" : "") +
                              " holds no trainable example: 0 tokens in " + std::to_string(stats.files) + " file(s)" +
                              (stats.dropped ? "; " + stats.drop_summary() : ""));
  writer.finish();
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();

  std::printf("tokenized %lld file(s), %lld document(s) -> %lld tokens (tokenizer %s, vocab %lld) in %.2f s\n",
              (long long)stats.files, (long long)writer.num_documents(), (long long)writer.num_tokens(),
              tokenizer->name().c_str(), (long long)tokenizer->vocab_size(), secs);
  if (stats.dropped) std::printf("%s\n", stats.drop_summary().c_str());
  std::printf("wrote %s\n", out.c_str());
  return 0;
}

int run_report(const std::vector<std::string>& args) {
  po::options_description desc("Options");
  desc.add_options()("run-dir", po::value<std::string>()->required(), "the run's log.dir (metrics.jsonl, run_info.json)")(
      "out", po::value<std::string>()->default_value(""), "output HTML file (default: RUN_DIR/report.html)")(
      "force", "replace --out even when it exists and is not a Tessera report");
  po::positional_options_description pos;
  pos.add("run-dir", 1);
  const auto vm = parse_command("tessera report RUN_DIR [--out FILE.html [--force]]", desc, args, &pos);
  if (!vm) return 0;
  // The report first: on an error nothing is printed on stdout (std::cout << "wrote " << f() may
  // print "wrote " before f() throws).
  const std::string path = tools::write_report((*vm)["run-dir"].as<std::string>(), (*vm)["out"].as<std::string>(),
                                               vm->count("force") > 0);
  std::cout << "wrote " << path << std::endl;
  return 0;
}

}  // namespace tessera::launcher
