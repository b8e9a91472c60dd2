// Glue between model/ (Llama 2) and runtime/ (FSDP, training): the only place that knows both.
#pragma once
#include <memory>
#include <string>

#include "model/config.h"
#include "runtime/fsdp/fsdp.h"
#include "runtime/memory/model.h"
#include "runtime/train/trainer.h"

namespace tessera::model {
class ModelDir;
}

namespace tessera::launcher {

// A Llama built on the meta device (no memory), described to the runtime as a causal LM: unit 0
// holds the embeddings, final norm and lm_head; unit i+1 is decoder layer i.
train::CausalLm make_llama_lm(const model::LlamaConfig& cfg);

// The Llama as the memory model sees it: the same units (shapes, order) make_llama_lm hands the
// engine, which root parameters belong to the head, and the activation terms of
// model/activations.h for a micro-batch [B, T] in a compute dtype of `elem` bytes.
memory::ModelShape llama_memory_shape(const model::LlamaConfig& cfg);
memory::ActivationTerms llama_activation_terms(const model::LlamaConfig& cfg, int64_t B, int64_t T, int elem,
                                               bool fused_attention);

// Weights from the Llama initialisation (seed): every rank generates only the parameters of the
// unit being loaded, one parameter at a time, identical on every rank and world size.
class InitWeightSource : public fsdp::WeightSource {
 public:
  explicit InitWeightSource(uint64_t seed) : seed_(seed) {}
  void read(const std::string& name, const std::vector<int64_t>& shape, int64_t offset, int64_t count,
            float* dst) override;

 private:
  uint64_t seed_;
  std::string cached_name_;
  at::Tensor cached_;
};

// Weights from a Hugging Face directory: reads only the requested byte ranges (F32/BF16/F16 -> fp32).
class HfWeightSource : public fsdp::WeightSource {
 public:
  explicit HfWeightSource(std::shared_ptr<model::ModelDir> dir) : dir_(std::move(dir)) {}
  void read(const std::string& name, const std::vector<int64_t>& shape, int64_t offset, int64_t count,
            float* dst) override;
  at::Tensor view(const std::string& name, int64_t offset, int64_t count) override;
  void release(const std::string& name, int64_t offset, int64_t count) override;

 private:
  std::shared_ptr<model::ModelDir> dir_;
};

}  // namespace tessera::launcher
