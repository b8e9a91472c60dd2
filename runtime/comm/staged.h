// A device communicator staged through host memory: the collectives of tensors on a GPU run on a
// host communicator (MPI) over copies in host memory. What lets several ranks share one GPU, which
// NCCL refuses ("Duplicate GPU detected"): `comm.device_backend = staged` (launcher/device_select.h).
//
// Each operation copies its device inputs into fresh host buffers (pinned for a CUDA tensor; the
// copy waits for the caller's stream, so the inputs are what the compute before it produced),
// issues the host communicator's operation on them, and returns a Work whose wait() waits for it and
// copies the results back into the device outputs on the caller's current stream. Same results as
// the host communicator on the same values, bit for bit (mpi.test_comm_conformance runs every case
// on a staged communicator too, over CPU tensors, where the staging is a copy all the same); the
// host is synchronised at every issue, so it trades speed for running at all.
//
// THREADS: as the host communicator's (communicator.h): one issuing thread; wait() from any thread,
// once (the copy back happens in the first wait that sees the operation complete).
#pragma once
#include <c10/core/Device.h>

#include "runtime/comm/communicator.h"

namespace tessera::comm {

// Collectives of tensors on `device` over `host` (a host communicator: "mpi" or "self"); split()
// stages the host communicator's split, host_duplicate() is the host communicator's.
CommPtr make_staged_communicator(CommPtr host, at::Device device);

}  // namespace tessera::comm
