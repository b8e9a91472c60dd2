// NCCL backend of the Communicator seam: CUDA tensors on one device per process.
//
// One NCCL communicator per process group (unique id created by rank 0 and broadcast over the
// given host communicator), its own CUDA stream. Each operation first makes that stream wait for an
// event recorded on the caller's current (compute) stream, so collectives are ordered after the
// compute that produced their inputs; the Work records an event on the NCCL stream.
//
// Work::wait(timeout) makes the caller's current stream wait for that event: it does NOT block the
// host (no synchronisation in the training step); synchronise the device before reading a result on
// the host or expecting is_completed(). The timeout is enforced by a watchdog thread per
// communicator that polls the events and ncclCommGetAsyncError: an operation still incomplete
// `timeout` after its wait() (or an asynchronous NCCL error) aborts this and every other NCCL
// communicator of the process (their collectives may be stuck on the same peer), which unblocks the
// GPU, and every later call on any of them throws the recorded tessera::Error (Timeout naming
// operation, communicator, rank, host and device). ncclCommAbort never runs during an enqueue.
// Destruction joins the watchdog, destroys a drained communicator and aborts one with work still in
// flight (see ~NcclCommunicator); it never frees device memory with cudaFree (which would
// synchronise the whole device).
// Reductions of bf16/fp16 are computed in fp32 and rounded once, as in every backend.
//
// nccl_cuda.cpp compiles against the CUDA runtime and NCCL alone; code that needs a CUDA-enabled
// LibTorch (streams, allocator) is under TESSERA_WITH_CUDA there. A build without the GPU path links
// absent.cpp instead: nccl_available() is false and make_nccl_communicator refuses in one line.
#pragma once
#include <string>

#include "runtime/comm/communicator.h"

namespace tessera::gpu {

// True when NCCL is linked in and at least one CUDA device is visible.
bool nccl_available();

// Collective over `host` (a host-side communicator: "mpi", or "self" for one rank): an NCCL
// communicator over the same ranks in the same order, bound to CUDA `device`. It keeps `host` as its
// host companion (the unique id is broadcast over it; split() and host_duplicate() run over it).
// Throws tessera::Error(Input) naming rank, host and device if the device does not exist, and
// Error(Internal) if NCCL initialisation fails.
comm::CommPtr make_nccl_communicator(comm::CommPtr host, const std::string& name, int device);

}  // namespace tessera::gpu
