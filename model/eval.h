// Evaluation helpers: token files and per-sequence next-token loss. Used by `tessera eval`.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/registry.h"

namespace tessera::model {

// Reads one sequence per line of whitespace-separated token ids; blank lines are skipped.
// ModelError "FILE:LINE: ..." for a non-integer, an id outside [0, vocab_size), a line with fewer
// than 2 tokens (no next-token target), or a file with no sequences.
std::vector<std::vector<int64_t>> read_token_file(const std::string& path, int64_t vocab_size);

struct SequenceLoss {
  double loss;          // mean cross entropy of predicting tokens 1..T-1 from their prefixes
  int64_t predictions;  // T - 1
};

// Loss of one sequence (no grad; logits upcast to fp32 for the cross entropy).
SequenceLoss sequence_loss(CausalLmModule& model, const std::vector<int64_t>& tokens);
// sequence_loss for each sequence, in order.
std::vector<double> sequence_losses(CausalLmModule& model, const std::vector<std::vector<int64_t>>& sequences);
// Token-weighted mean of per-sequence losses: sum(loss_i * (T_i - 1)) / sum(T_i - 1).
double mean_token_loss(const std::vector<double>& losses, const std::vector<std::vector<int64_t>>& sequences);

}  // namespace tessera::model
