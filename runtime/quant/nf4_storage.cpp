#include "runtime/quant/nf4_storage.h"

#include <ATen/ATen.h>

#include "runtime/quant/nf4.h"

namespace tessera::quant {

namespace {

class Nf4Storage : public fsdp::FrozenStorage {
 public:
  explicit Nf4Storage(bool double_quant) : dq_(double_quant) {}
  std::string name() const override { return dq_ ? "nf4 (double quant)" : "nf4"; }
  at::ScalarType stored_dtype() const override { return at::kByte; }
  int64_t stored_numel(int64_t count) const override { return nf4_bytes(count, dq_); }
  int64_t align() const override { return kNf4Block; }
  // Quantized on the host (the loader's fp32 chunk), then copied where the shard lives.
  void encode(const at::Tensor& fp32_values, at::Tensor& out) const override {
    at::Tensor host = out.is_cpu() ? out : at::empty({out.numel()}, at::TensorOptions().dtype(at::kByte));
    nf4_encode(fp32_values.to(at::kCPU, at::kFloat).contiguous(), dq_, host);
    if (!out.is_cpu()) out.copy_(host);
  }
  void decode(const at::Tensor& stored, const at::Tensor& dst) const override {
    nf4_decode_into(stored, dst.numel(), dq_, dst);
  }

 private:
  bool dq_;
};

}  // namespace

std::shared_ptr<const fsdp::FrozenStorage> nf4_storage(bool double_quant) {
  return std::make_shared<Nf4Storage>(double_quant);
}

}  // namespace tessera::quant
