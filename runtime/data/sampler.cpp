#include "runtime/data/sampler.h"

#include <nlohmann/json.hpp>

#include <numeric>

#include "util/error.h"

namespace tessera::data {

uint64_t SplitMix64::next() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t SplitMix64::uniform(uint64_t n) {
  // Reject the top partial block of [0, 2^64) so that every residue is equally likely.
  const uint64_t limit = UINT64_MAX - (UINT64_MAX % n);
  uint64_t x;
  do x = next();
  while (x >= limit);
  return x % n;
}

std::vector<int64_t> permutation(int64_t n, uint64_t seed) {
  std::vector<int64_t> perm(n);
  std::iota(perm.begin(), perm.end(), int64_t{0});
  SplitMix64 rng(seed);
  for (int64_t i = n - 1; i > 0; --i) std::swap(perm[i], perm[rng.uniform(uint64_t(i) + 1)]);
  return perm;
}

DistributedSampler::DistributedSampler(int64_t num_sequences, int world_size, int rank, int micro_batch_size,
                                       int grad_accum, uint64_t seed, bool shuffle)
    : num_sequences_(num_sequences),
      world_size_(world_size),
      rank_(rank),
      micro_(micro_batch_size),
      accum_(grad_accum),
      seed_(seed),
      shuffle_(shuffle) {
  TESSERA_CHECK_INPUT(world_size > 0 && rank >= 0 && rank < world_size,
                      "sampler: rank " + std::to_string(rank) + " is outside world size " + std::to_string(world_size));
  TESSERA_CHECK_INPUT(micro_batch_size > 0, "micro batch size must be positive, got " + std::to_string(micro_batch_size));
  TESSERA_CHECK_INPUT(grad_accum > 0, "gradient accumulation must be positive, got " + std::to_string(grad_accum));
  global_batch_ = int64_t(world_size) * micro_batch_size * grad_accum;
  steps_per_epoch_ = num_sequences / global_batch_;
  TESSERA_CHECK_INPUT(steps_per_epoch_ > 0,
                      "the data has " + std::to_string(num_sequences) + " sequences, fewer than one global batch of " +
                          std::to_string(global_batch_) + " (data-parallel size " + std::to_string(world_size) +
                          " x micro batch " + std::to_string(micro_batch_size) + " x accumulation " +
                          std::to_string(grad_accum) + ")");
}

const std::vector<int64_t>& DistributedSampler::epoch_permutation(int64_t epoch) const {
  if (epoch != cached_epoch_) {
    if (shuffle_) {
      cached_perm_ = permutation(num_sequences_, seed_ + uint64_t(epoch));
    } else {
      cached_perm_.resize(num_sequences_);
      std::iota(cached_perm_.begin(), cached_perm_.end(), int64_t{0});
    }
    cached_epoch_ = epoch;
  }
  return cached_perm_;
}

std::vector<int64_t> DistributedSampler::micro_batch(int64_t step, int accum_index) const {
  TESSERA_CHECK(step >= 0, "negative step " + std::to_string(step));
  TESSERA_CHECK(accum_index >= 0 && accum_index < accum_,
                "accum index " + std::to_string(accum_index) + " of " + std::to_string(accum_));
  const auto& perm = epoch_permutation(epoch_of(step));
  const int64_t slot = int64_t(accum_index) * world_size_ + rank_;
  const int64_t begin = (step % steps_per_epoch_) * global_batch_ + slot * micro_;
  return std::vector<int64_t>(perm.begin() + begin, perm.begin() + begin + micro_);
}

std::vector<int64_t> DistributedSampler::global_batch_indices(int64_t step) const {
  TESSERA_CHECK(step >= 0, "negative step " + std::to_string(step));
  const auto& perm = epoch_permutation(epoch_of(step));
  const int64_t begin = (step % steps_per_epoch_) * global_batch_;
  return std::vector<int64_t>(perm.begin() + begin, perm.begin() + begin + global_batch_);
}

void DistributedSampler::set_step(int64_t step) {
  TESSERA_CHECK(step >= 0, "negative step " + std::to_string(step));
  step_ = step;
}

nlohmann::json DistributedSampler::state() const {
  return {{"step", step_},
          {"epoch", epoch_of(step_)},
          {"step_in_epoch", step_ % steps_per_epoch_},
          {"seed", seed_},
          {"shuffle", shuffle_},
          {"num_sequences", num_sequences_},
          {"global_batch", global_batch_}};
}

void DistributedSampler::load_state(const nlohmann::json& s) {
  const auto expect = [&](const char* key, const nlohmann::json& mine) {
    if (!s.contains(key)) throw TESSERA_INPUT_ERROR(std::string("sampler state: missing key \"") + key + "\"");
    if (s.at(key) != mine)
      throw TESSERA_INPUT_ERROR(std::string("sampler state: checkpoint has ") + key + " = " + s.at(key).dump() +
                                " but this run has " + mine.dump() + " (data or batch settings changed)");
  };
  expect("seed", seed_);
  expect("shuffle", shuffle_);
  expect("num_sequences", num_sequences_);
  expect("global_batch", global_batch_);
  if (!s.contains("step") || !s.at("step").is_number_integer() || s.at("step").get<int64_t>() < 0)
    throw TESSERA_INPUT_ERROR("sampler state: missing or invalid \"step\"");
  step_ = s.at("step").get<int64_t>();
}

}  // namespace tessera::data
