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

#include <functional>
#include <string>
#include <vector>

#include "runtime/comm/communicator.h"

namespace tessera::comm {

// A communicator over a duplicate of `comm` (the caller keeps ownership of `comm`).
CommPtr make_mpi_communicator(MPI_Comm comm, const std::string& name);

// MPI_Comm_split of an MPI communicator (collective over `parent`, ordered with its other
// operations): ranks with the same `color` form one communicator, ordered by `key`. A rank passing
// color MPI_UNDEFINED gets nullptr. Throws Error(Input) if `parent` is not an MPI communicator.
CommPtr mpi_split(const Communicator& parent, int color, int key, const std::string& name);

// A fresh duplicate of the MPI communicator behind `comm` (collective over `comm`, ordered with
// its other operations), e.g. for raw-MPI baselines or NCCL's unique-id broadcast. The caller
// frees it with MPI_Comm_free. Throws Error(Input) if `comm` is not an MPI communicator.
MPI_Comm mpi_comm_dup(const Communicator& comm);

// World ranks of the members of `comm`, in its rank order (local; no communication).
std::vector<int> mpi_world_ranks(MPI_Comm comm);

// The algorithm the MPI backend runs for `op` ("all_gather", "reduce_scatter", "all_reduce",
// "broadcast") on a tensor of `count` elements of `dtype` over `size` ranks: "ring" or "chain"
// (mpi_ring.h) for large messages, else "mpi" (MPI's own collective). `tessera bench collectives`
// reports it per row. Throws Error(Input) for any other op name.
std::string mpi_algorithm(const std::string& op, int64_t count, at::ScalarType dtype, int size);

// Runs fn(c) on `comm`'s communication thread, ordered with its other operations, and waits for it;
// c is the MPI communicator `comm` itself uses. For raw-MPI baselines that must run on the same
// thread as the communicator's own calls (see `tessera bench collectives`). Exceptions from fn are
// rethrown here. Throws Error(Input) if `comm` is not an MPI communicator.
void mpi_run_ordered(const Communicator& comm, const std::function<void(MPI_Comm)>& fn);

}  // namespace tessera::comm
