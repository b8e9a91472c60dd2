// Glue between model/ (the family registry, model/registry.h) and runtime/ (FSDP, training): the
// only place that knows both. Nothing here names a family: everything comes from ModelConfig::spec().
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "model/activations.h"
#include "model/config.h"
#include "model/lora.h"
#include "runtime/fsdp/fsdp.h"
#include "runtime/planner/memory_formula.h"
#include "runtime/train/trainer.h"

namespace tessera::model {
class ModelDir;
}

namespace tessera::launcher {

// The model of `cfg`'s family built on the meta device (no memory), described to the runtime as a
// causal LM: unit 0 is the family's root (embeddings, final norm, head; a tied embedding is one
// tensor there), unit i+1 is decoder layer i; decay rule and FLOPs from the family.
// With LoRA (lora.enabled(), validated against cfg), every targeted Linear gains its adapters
// (ModelSpec::add_lora): each unit's adapters are its trainable parameters (UnitDef::params) and the
// base its frozen ones (UnitDef::frozen, requires_grad false); the root unit is all frozen.
// `varlen_attention` (model.varlen_attention): packed rows and sliding windows may run on the
// variable-length flash kernel where it runs (model::TokenLayout::varlen); false: the mask.
train::CausalLm make_causal_lm(const model::ModelConfig& cfg, const lora::Options& lora = {}, bool varlen_attention = true);

// The model as the memory model sees it: the same units (shapes, order) make_causal_lm hands the
// engine, which root parameters belong to the head, and the activation terms of
// model/activations.h for a micro-batch [B, T] in a compute dtype of `elem` bytes.
// With LoRA: the adapters as the units' parameters, the base as their frozen groups.
planner::ModelShape memory_shape(const model::ModelConfig& cfg, const lora::Options& lora = {});
// frozen_head: LoRA (model::activation_bytes).
planner::ActivationTerms activation_terms(const model::ModelConfig& cfg, int64_t B, int64_t T, int elem,
                                               model::Kernels kernels, bool frozen_head = false);

// Weights from the family's initialisation (seed): every rank generates only the parameters of the
// unit being loaded, one parameter at a time, identical on every rank and world size.
class InitWeightSource : public fsdp::WeightSource {
 public:
  InitWeightSource(const model::ModelConfig& cfg, uint64_t seed) : spec_(&cfg.spec()), seed_(seed) {}
  void read(const std::string& name, const std::vector<int64_t>& shape, int64_t offset, int64_t count,
            float* dst) override;

 private:
  const model::ModelSpec* spec_;
  uint64_t seed_;
  std::string cached_name_;
  at::Tensor cached_;
};

// LoRA: the adapters' starting values, every other tensor from `base` (which may be null on ranks
// that do not read: model.load=rank0). By default PEFT's initialisation (lora::init_adapter from
// `seed`, the run's train.seed); with `start`, the whole tensor it returns for an adapter's name and
// shape (`tessera train --adapter`: a PEFT adapter's A and B).
class AdapterInitSource : public fsdp::WeightSource {
 public:
  using Start = std::function<at::Tensor(const std::string& name, const std::vector<int64_t>& shape)>;
  AdapterInitSource(fsdp::WeightSource* base, uint64_t seed) : base_(base), seed_(seed) {}
  AdapterInitSource(fsdp::WeightSource* base, Start start) : base_(base), start_(std::move(start)) {}
  void read(const std::string& name, const std::vector<int64_t>& shape, int64_t offset, int64_t count,
            float* dst) override;
  at::Tensor view(const std::string& name, int64_t offset, int64_t count) override;
  void release(const std::string& name, int64_t offset, int64_t count) override;

 private:
  fsdp::WeightSource* base_;
  uint64_t seed_ = 0;
  Start start_;
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
