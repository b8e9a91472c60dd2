#include "util/dtype_names.h"

namespace tessera::util {

std::optional<FloatType> float_type_named(const std::string& s) {
  if (s == "fp32" || s == "float32" || s == "float" || s == "F32") return FloatType::F32;
  if (s == "bf16" || s == "bfloat16" || s == "BF16") return FloatType::BF16;
  if (s == "fp16" || s == "float16" || s == "half" || s == "F16") return FloatType::F16;
  return std::nullopt;
}

const char* short_name(FloatType t) { return name_of(float_type_names(), t).c_str(); }

}  // namespace tessera::util
