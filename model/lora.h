// LoRA (Hu et al. 2021) as PEFT defines it: a targeted Linear y = x W^T (+ b) becomes
//
//   y = x W^T (+ b) + (alpha / r) * dropout(x) A^T B^T,   A [r, in], B [out, r]
//
// with W frozen and A, B trainable. The adapters are submodules of the targeted Linear, so their
// names are the module tree's: "model.layers.<i>.self_attn.q_proj.lora_A.weight" ([r, in]) and
// "...q_proj.lora_B.weight" ([out, r]); PEFT's adapter files use the same names with the prefix
// "base_model.model.". Initialisation as PEFT's (init_lora_weights=True): A Kaiming-uniform with
// a = sqrt(5), i.e. U(-1/sqrt(in), 1/sqrt(in)), drawn from (seed, name) alone; B zero, so the
// adapted model's output equals the base model's until the first update.
//
// lora::Options is the one owner of the lora.* keys (the config schema binds them to it);
// lora::validate is their one check. A family gains adapters through its ModelSpec
// (ModelSpec::lora_targets / add_lora in model/registry.h); the runtime learns of none of this:
// launcher/model_lm.cpp hands the engine the adapters as the trainable group of each unit and the
// base as its frozen group (runtime/fsdp/fsdp.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace at {
class Tensor;  // the tensor functions below; the options need no LibTorch (the config fuzzers build without it)
}
namespace tessera::model {
struct ModelConfig;
}

namespace tessera::lora {

// The seven projections of a Llama decoder layer, PEFT's names (target_modules).
const std::vector<std::string>& default_targets();

struct Options {
  int64_t rank = 0;      // lora.rank: r; 0 = no LoRA (full fine-tuning)
  double alpha = 8.0;    // lora.alpha: the update is scaled by alpha / r (PEFT LoraConfig default 8)
  double dropout = 0.0;  // lora.dropout: on the adapter's input only (PEFT lora_dropout)
  std::vector<std::string> targets = default_targets();  // lora.targets: module names, e.g. q_proj
  std::string base_dtype;  // lora.base_dtype: "" the compute dtype; fp32 | bf16 | fp16 | nf4
  bool double_quant = false;  // lora.double_quant: NF4's scales quantized again (QLoRA)

  bool enabled() const { return rank > 0; }
  bool quantized() const { return base_dtype == "nf4"; }  // QLoRA
  double scale() const { return alpha / static_cast<double>(rank); }
};

// One Linear a family lets LoRA target: its module name ("q_proj") and its sizes.
struct TargetShape {
  std::string name;  // "q_proj"
  std::string path;  // its module path in a decoder layer: "self_attn.q_proj"
  int64_t in = 0, out = 0;
};

// QLoRA (base_dtype nf4) quantizes the weight of every Linear of a decoder layer that LoRA may
// target (`linears`: ModelSpec::lora_targets; the seven projections, targeted or not, as
// bitsandbytes' Linear4bit replaces each of them). Biases, norms, embeddings and the output head
// keep the compute dtype.
bool quantized_weight(const std::string& name, const std::vector<TargetShape>& linears);

// The one check of lora.* (Error text "<source>: lora.<key> ..."; thrown as model::ModelError, which
// the launcher turns into exit code 2): rank >= 0; with rank 0 every other key at its default; alpha
// > 0; 0 <= dropout < 1; base_dtype one of "", fp32, bf16, fp16, nf4; double_quant only with nf4.
// With `model` (the family's targets, ModelSpec::lora_targets): every target is one of the model's
// Linear modules, none twice, and rank <= the smallest in/out of the targets.
void validate(const Options& o, const model::ModelConfig* model, const std::string& source);

// True for an adapter's parameter name (".lora_A." / ".lora_B.").
bool is_adapter(const std::string& name);

// PEFT's initial value of adapter `name` (shape [r, in] for lora_A, [out, r] for lora_B), fp32 CPU:
// lora_A ~ U(-1/sqrt(in), 1/sqrt(in)) from (seed, name), lora_B = 0.
at::Tensor init_adapter(const std::string& name, const std::vector<int64_t>& shape, uint64_t seed);

// W + (alpha / r) B A: what `tessera lora merge` writes and what the adapted Linear computes (up to
// rounding), for W [out, in], A [r, in], B [out, r], in W's dtype (computed in fp32).
at::Tensor merged_weight(const at::Tensor& W, const at::Tensor& A, const at::Tensor& B, double scale);

}  // namespace tessera::lora
