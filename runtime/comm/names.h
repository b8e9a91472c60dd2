// The communication enum that configuration names (comm.device_backend) and its names, in enum order
// (util/enum_names.h). Header-only and dependency-free (the config fuzz harness compiles config.cpp
// without the runtime).
#pragma once
#include "util/enum_names.h"

namespace tessera::comm {

// How the collectives of GPU tensors run: NCCL, one GPU per rank (it refuses two ranks on one
// GPU); or staged through host memory over MPI (runtime/comm/staged.h), which lets ranks share GPUs.
enum class DeviceBackend { Nccl, Staged };
TESSERA_ENUM_NAMES(device_backend_names, "nccl", "staged")

}  // namespace tessera::comm
