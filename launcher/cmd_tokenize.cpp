#include "launcher/cmd_tokenize.h"

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "launcher/cli.h"
#include "runtime/data/dataset.h"
#include "runtime/data/tokenizer.h"
#include "runtime/error.h"

namespace tessera::launcher {

int run_tokenize(const std::vector<std::string>& args) {
  po::options_description desc("Options");
  desc.add_options()
      ("input", po::value<std::vector<std::string>>()->required()->composing(),
       "text/JSONL file or directory to tokenise (repeatable; files of a directory in sorted order)")
      ("out", po::value<std::string>()->required(), "output token file (.bin)")
      ("tokenizer", po::value<std::string>()->default_value(""),
       "SentencePiece tokenizer.model or Hugging Face tokenizer.json (file or its directory); default: byte-level tokenizer, vocab 258")
      ("force", po::bool_switch(), "replace OUT if it exists");
  const auto vm = parse_command("tessera tokenize --input PATH --out FILE.bin [--tokenizer tokenizer.model|tokenizer.json]", desc, args);
  if (!vm) return 0;

  const auto inputs = (*vm)["input"].as<std::vector<std::string>>();
  const std::string out = (*vm)["out"].as<std::string>();
  std::error_code ec;
  if (std::filesystem::exists(out, ec) && !(*vm)["force"].as<bool>())
    throw TESSERA_INPUT_ERROR("output " + out + " already exists (pass --force to replace it)");

  const auto start = std::chrono::steady_clock::now();
  const auto tokenizer = data::make_tokenizer((*vm)["tokenizer"].as<std::string>());
  const data::TokenCorpus corpus = data::load_corpus(inputs, tokenizer.get());
  if (corpus.tokens.empty())
    throw TESSERA_INPUT_ERROR("input " + inputs.front() + (inputs.size() > 1 ? " (and others)" : "") +
                              " holds no text: 0 tokens in " + std::to_string(corpus.num_files) + " file(s)");
  data::write_token_file(out, corpus.tokens, static_cast<uint32_t>(corpus.vocab_size));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::printf("tokenized %lld file(s), %lld document(s) -> %lld tokens (tokenizer %s, vocab %lld) in %.2f s\n",
              (long long)corpus.num_files, (long long)corpus.num_documents, (long long)corpus.tokens.size(),
              tokenizer->name().c_str(), (long long)corpus.vocab_size, secs);
  std::printf("wrote %s\n", out.c_str());
  return 0;
}

}  // namespace tessera::launcher
