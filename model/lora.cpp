#include "model/lora.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "model/errors.h"
#include "model/llama.h"
#include "model/registry.h"

namespace tessera::lora {

const std::vector<std::string>& default_targets() {
  static const std::vector<std::string> names = {"q_proj", "k_proj", "v_proj", "o_proj",
                                                 "gate_proj", "up_proj", "down_proj"};
  return names;
}

namespace {

[[noreturn]] void refuse(const std::string& source, const std::string& what) {
  throw model::ModelError(source + ": " + what);
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// rank 0 (LoRA off) with another lora.* key away from its default: the user asked for something
// that would not happen.
void check_off(const Options& o, const std::string& source) {
  const Options d;
  const char* set = o.alpha != d.alpha ? "lora.alpha" : o.dropout != d.dropout ? "lora.dropout"
                    : o.targets != d.targets ? "lora.targets" : o.base_dtype != d.base_dtype ? "lora.base_dtype"
                    : o.double_quant != d.double_quant ? "lora.double_quant" : nullptr;
  if (set) refuse(source, std::string(set) + " is set but lora.rank is 0 (LoRA off): set lora.rank > 0 or drop " + set);
}

void check_model(const Options& o, const model::ModelConfig& m, const std::string& source) {
  const std::vector<TargetShape> shapes = m.spec().lora_targets(m);
  std::vector<std::string> names;
  for (const auto& t : shapes) names.push_back(t.name);
  int64_t smallest = INT64_MAX;
  std::string smallest_name;
  for (size_t i = 0; i < o.targets.size(); ++i) {
    const std::string& t = o.targets[i];
    const auto it = std::find(names.begin(), names.end(), t);
    if (it == names.end())
      refuse(source, "lora.targets names '" + t + "', a module the " + m.model_type + " model does not have (its Linear modules: " +
                         join(names) + ")");
    if (std::find(o.targets.begin(), o.targets.begin() + i, t) != o.targets.begin() + i)
      refuse(source, "lora.targets names '" + t + "' twice");
    const TargetShape& s = shapes[it - names.begin()];
    if (std::min(s.in, s.out) < smallest) smallest = std::min(s.in, s.out), smallest_name = t;
  }
  if (o.rank > smallest)
    refuse(source, "lora.rank " + std::to_string(o.rank) + " is above the smallest target dimension (" + smallest_name +
                       ": " + std::to_string(smallest) + ")");
}

}  // namespace

void validate(const Options& o, const model::ModelConfig* model, const std::string& source) {
  if (o.rank < 0) refuse(source, "lora.rank must be >= 0, got " + std::to_string(o.rank));
  if (o.rank == 0) return check_off(o, source);
  if (!(o.alpha > 0)) refuse(source, "lora.alpha must be > 0, got " + std::to_string(o.alpha));
  if (!(o.dropout >= 0 && o.dropout < 1)) refuse(source, "lora.dropout must be in [0, 1), got " + std::to_string(o.dropout));
  if (o.targets.empty()) refuse(source, "lora.targets is empty: name at least one module (e.g. q_proj)");
  static const std::vector<std::string> dtypes = {"", "fp32", "bf16", "fp16", "nf4"};
  if (std::find(dtypes.begin(), dtypes.end(), o.base_dtype) == dtypes.end())
    refuse(source, "lora.base_dtype is '" + o.base_dtype + "', expected one of fp32, bf16, fp16, nf4 (or empty: the compute dtype)");
  if (o.double_quant && o.base_dtype != "nf4")
    refuse(source, "lora.double_quant needs lora.base_dtype=nf4 (it quantizes NF4's scales)");
  if (model) check_model(o, *model, source);
}

bool quantized_weight(const std::string& name, const std::vector<TargetShape>& linears) {
  if (name.rfind("model.layers.", 0) != 0) return false;
  for (const TargetShape& t : linears) {
    const std::string tail = "." + t.path + ".weight";
    if (name.size() > tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0) return true;
  }
  return false;
}

bool is_adapter(const std::string& name) {
  return name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos;
}

torch::Tensor init_adapter(const std::string& name, const std::vector<int64_t>& shape, uint64_t seed) {
  TORCH_CHECK(is_adapter(name) && shape.size() == 2, "init_adapter: ", name, " is not a LoRA matrix");
  if (name.find(".lora_B.") != std::string::npos) return torch::zeros(shape, torch::kFloat32);
  // kaiming_uniform_(a=sqrt(5)): gain sqrt(2 / (1 + a^2)) = sqrt(1/3), bound gain * sqrt(3 / fan_in).
  const double bound = 1.0 / std::sqrt(static_cast<double>(shape[1]));
  auto gen = at::detail::createCPUGenerator(model::tensor_seed(seed, name));
  return torch::empty(shape, torch::kFloat32).uniform_(-bound, bound, gen);
}

torch::Tensor merged_weight(const torch::Tensor& W, const torch::Tensor& A, const torch::Tensor& B, double scale) {
  torch::NoGradGuard no_grad;
  auto delta = torch::matmul(B.to(torch::kFloat32), A.to(torch::kFloat32)) * scale;
  return (W.to(torch::kFloat32) + delta).to(W.scalar_type());
}

}  // namespace tessera::lora
