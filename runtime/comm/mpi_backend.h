// MPI backend of the Communicator seam: CPU tensors (float32, bfloat16, float16, int32, int64,
// uint8), any MPI communicator (world, intra-node, inter-node).
//
// Each communicator owns a duplicate of the MPI communicator it was made from and ONE
// communication thread that runs its operations from a FIFO queue: issue order is execution order,
// and the caller's thread keeps computing while a collective is in flight (FSDP prefetch relies on
// this). MPI must be initialised with MPI_THREAD_MULTIPLE (the launcher's bootstrap does this).
// Errors raised on the communication thread are rethrown by Work::wait().
//
// Large reductions and broadcasts (reduce-scatter from 256 KiB, all-reduce and broadcast from
// 1 MiB) run the ring / chain algorithms of mpi_ring.h on MPI point-to-point instead of MPI's own
// collectives (2.4-5.7x faster reduce-scatter, 1.05-1.9x all-reduce, up to 1.7x broadcast at 64 MiB
// on 2-4 ranks); their fp32 reductions are deterministic and bitwise identical on every rank. For them each communicator
// keeps one scratch buffer as large as the largest per-rank block it has reduced (1/size of the
// largest reduction).
#pragma once
#include <mpi.h>

#include <cstdint>
#include <string>

#include "runtime/comm/communicator.h"

namespace tessera::comm {

// The MPI backend reduces 16-bit floats in fp32 through an accumulator of at most this many bytes
// (mpi_backend.cpp's widened ring reduce-scatter works in segments of it; the memory formula,
// runtime/planner/memory_formula.h, counts it).
constexpr int64_t kHostWidenedReductionBytes = int64_t(8) << 20;

// A communicator over a duplicate of `comm` (the caller keeps ownership of `comm`).
CommPtr make_mpi_communicator(MPI_Comm comm, const std::string& name);

}  // namespace tessera::comm
