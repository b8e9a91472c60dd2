// The names of the floating dtypes Tessera stores and computes in, in one place: what
// configuration keys (fsdp.mixed_precision, optim.state_dtype, ...) and command-line flags
// (--dtype) accept. Each caller maps FloatType to its own type (at::ScalarType, model::DType) and
// says which of the three it allows. Dependency-free, so model/ and runtime/ share it.
#pragma once
#include <optional>
#include <string>

#include "util/enum_names.h"

namespace tessera::util {

enum class FloatType { F32, BF16, F16 };

// The short names, in FloatType order: "fp32", "bf16", "fp16" (what configuration keys accept; a key
// that allows 32 and 16-bit brain float only takes the first two).
TESSERA_ENUM_NAMES(float_type_names, "fp32", "bf16", "fp16")

// fp32 | float32 | float | F32, bf16 | bfloat16 | BF16, fp16 | float16 | half | F16; nullopt for
// anything else.
std::optional<FloatType> float_type_named(const std::string& s);

// float_type_names()'s name of t: what messages and the configuration reference use.
const char* short_name(FloatType t);

}  // namespace tessera::util
