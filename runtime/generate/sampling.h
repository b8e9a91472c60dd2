// How the next token is chosen from a position's logits (`tessera generate`, runtime/generate/generator.h).
//
//   temperature 0       greedy: the id of the largest logit (the lowest such id on a tie).
//   temperature t > 0   a draw from softmax(logits / t), restricted as Hugging Face's logits warpers
//                       restrict it, in their order (temperature, top-k, top-p), then renormalised:
//     top_k k > 0       only the tokens whose logit is at least the k-th largest (ties with it kept);
//     top_p p < 1       nucleus: the tokens in order of decreasing probability (a tie: lower id
//                       first), each kept while the probability of those before it is below p --
//                       the smallest such prefix whose probability reaches p (at least one token).
// A draw is one uniform number u in [0, 1) from a splitmix64 stream of (seed, stream): the first id,
// in id order, whose cumulative probability exceeds u. So a run is reproducible from its seed on any
// machine, and the same on every world size (rank 0 draws; generator.h).
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace tessera::generate {

struct Sampling {
  double temperature = 0;  // >= 0; 0: greedy
  int64_t top_k = 0;       // >= 0; 0: no top-k
  double top_p = 1;        // in (0, 1]; 1: no top-p
  uint64_t seed = 0;
};

// Error(Input) naming the flag (--temperature, --top-k, --top-p) for a value outside its range.
void validate(const Sampling& s);

// The distribution a draw is taken from: fp64 probabilities [V] of fp32/bf16 logits [V] (all zero
// but one 1 for greedy).
at::Tensor probabilities(const at::Tensor& logits, const Sampling& s);

// splitmix64: uniform doubles in [0, 1), a pure function of (seed, stream) and the draws so far.
class Rng {
 public:
  Rng(uint64_t seed, uint64_t stream);
  double uniform();

 private:
  uint64_t state_;
};

// The next token: argmax for greedy, else a draw from probabilities(logits, s) with one rng.uniform().
int64_t sample(const at::Tensor& logits, const Sampling& s, Rng& rng);

}  // namespace tessera::generate
