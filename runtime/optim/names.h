// The learning-rate schedules (schedule.h) and their names, in enum order (util/enum_names.h): one
// list that the schedule's validation and the configuration schema (train.schedule) read.
// Header-only and dependency-free.
#pragma once
#include "util/enum_names.h"

namespace tessera::optim {

enum class Schedule { Cosine, Linear, Constant };
TESSERA_ENUM_NAMES(schedule_names, "cosine", "linear", "constant")

}  // namespace tessera::optim
