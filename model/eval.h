// Evaluation helpers of `tessera eval`: token files and the token-weighted mean of per-sequence
// losses (the losses themselves come from the FSDP-sharded Trainer::sequence_losses).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace tessera::model {

// Reads one sequence per line of whitespace-separated token ids; blank lines are skipped.
// ModelError "FILE:LINE: ..." for a non-integer, an id outside [0, vocab_size), a line with fewer
// than min_tokens tokens (2 for eval: a next-token target; 1 for generate's prompts), or a file with
// no sequences.
std::vector<std::vector<int64_t>> read_token_text(const std::string& path, int64_t vocab_size, size_t min_tokens = 2);

// Token-weighted mean of per-sequence losses: sum(loss_i * (T_i - 1)) / sum(T_i - 1).
double mean_token_loss(const std::vector<double>& losses, const std::vector<std::vector<int64_t>>& sequences);

}  // namespace tessera::model
