// The communication-time emulation's delay kernel (comm_delay.cu; runtime/comm/emulation.h), plain
// C++ so that nvcc compiles it without LibTorch: `blocks` thread blocks that wait on the GPU's
// nanosecond timer until `ns` have passed, on `stream` (a cudaStream_t), holding those SMs as NCCL's
// channels would. Returns the launch's cudaError_t as an int (0: launched).
#pragma once
#include <cstdint>

namespace tessera::gpu {

int comm_delay_launch(int64_t ns, int blocks, void* stream);

}  // namespace tessera::gpu
