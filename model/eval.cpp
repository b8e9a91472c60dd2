#include "model/eval.h"

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "model/errors.h"

namespace tessera::model {

std::vector<std::vector<int64_t>> read_token_text(const std::string& path, int64_t vocab_size, size_t min_tokens) {
  std::ifstream in(path);
  if (!in) throw ModelError(path + ": cannot open token file");
  std::vector<std::vector<int64_t>> seqs;
  std::string line, word;
  for (int64_t lineno = 1; std::getline(in, line); ++lineno) {
    const std::string where = path + ":" + std::to_string(lineno) + ": ";
    std::istringstream words(line);
    std::vector<int64_t> seq;
    while (words >> word) {
      errno = 0;
      char* end = nullptr;
      const long long id = std::strtoll(word.c_str(), &end, 10);
      if (*end != '\0' || errno == ERANGE) throw ModelError(where + "'" + word + "' is not an integer token id");
      if (id < 0 || id >= vocab_size)
        throw ModelError(where + "token id " + word + " is outside the vocabulary [0, " + std::to_string(vocab_size) +
                         ")");
      seq.push_back(id);
    }
    if (seq.empty()) continue;
    if (seq.size() < min_tokens)
      throw ModelError(where + (min_tokens == 2 ? "a sequence needs at least 2 tokens (1 given) to have a next-token loss"
                                                : "fewer than " + std::to_string(min_tokens) + " tokens"));
    seqs.push_back(std::move(seq));
  }
  if (seqs.empty()) throw ModelError(path + ": no token sequences");
  return seqs;
}

double mean_token_loss(const std::vector<double>& losses, const std::vector<std::vector<int64_t>>& sequences) {
  double sum = 0;
  int64_t n = 0;
  for (size_t i = 0; i < losses.size(); ++i) {
    const int64_t p = (int64_t)sequences[i].size() - 1;
    sum += losses[i] * p;
    n += p;
  }
  return n > 0 ? sum / n : 0.0;
}

}  // namespace tessera::model
