// What `tessera bench collectives` needs of the MPI backend beyond the Communicator seam: the
// algorithm a collective runs (its `algo` column) and a hook that runs raw-MPI baselines on a
// communicator's own thread. Benchmarks and tests only; the runtime never includes this header.
// Implemented in mpi_backend.cpp.
#pragma once
#include <mpi.h>

#include <functional>
#include <string>

#include "runtime/comm/communicator.h"

namespace tessera::comm {

// The algorithm the MPI backend runs for `op` ("all_gather", "reduce_scatter", "all_reduce",
// "broadcast") on a tensor of `count` elements of `dtype` over `size` ranks: "ring" or "chain"
// (mpi_ring.h) for large messages, else "mpi" (MPI's own collective). Throws Error(Input) for any
// other op name.
std::string mpi_algorithm(const std::string& op, int64_t count, at::ScalarType dtype, int size);

// Runs fn(c) on `comm`'s communication thread, ordered with its other operations, and waits for it;
// c is the MPI communicator `comm` itself uses. Exceptions from fn are rethrown here. Throws
// Error(Input) if `comm` is not an MPI communicator.
void mpi_run_ordered(const Communicator& comm, const std::function<void(MPI_Comm)>& fn);

}  // namespace tessera::comm
