// The learning-rate schedules (schedule.h) and their names, in enum order (util/enum_names.h): one
// list that the schedule's validation and the configuration schema (train.schedule) read.
// Header-only and dependency-free.
#pragma once
#include "util/enum_names.h"

namespace tessera::optim {

enum class Schedule { Cosine, Linear, Constant };
TESSERA_ENUM_NAMES(schedule_names, "cosine", "linear", "constant")

// optim.state_dtype: AdamW's moments in fp32, bf16, or 8-bit block-wise quantized (quant8.h).
enum class StateDtype { F32, BF16, Int8 };
TESSERA_ENUM_NAMES(state_dtype_names, "fp32", "bf16", "int8")

}  // namespace tessera::optim
