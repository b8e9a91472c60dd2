// Links the NCCL backend on machines with a CPU-only LibTorch (CI), proving it compiles and links
// against /usr/local/cuda. It is never run there (no GPU).
#include "runtime/gpu/nccl.h"

int main(int argc, char**) {
  if (argc > 99) return tessera::gpu::nccl_available() ? 0 : 1;
  return 0;
}
