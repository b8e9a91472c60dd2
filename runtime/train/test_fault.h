// Fault points for the failure tests (tests/mpi/flight_stall.sh, numerics_guard.sh,
// resume_rollback.sh, test_numerics_guard.cpp). The shipped binary has no way to fire them:
// test_fault() is false until a test binary installs a hook, and only test binaries link one
// (tests/support/fault_env.cpp, which reads TESSERA_TEST_FAULT: the `tessera-faults` executable and
// the MPI gtest binaries; `tessera` itself never links it, and unit.architecture checks that).
//
//   TESSERA_TEST_FAULT=<kind>@<rank>:<step>[,<kind>@<rank>:<step>...]
//
//   desync      at the end of optimizer step <step>, rank <rank> issues one extra all_reduce(max) of
//               2 bytes on the host world group, where every rank issues its 1-byte stop vote: the
//               ranks disagree about the size of that collective (and are off by one after it)
//   stall-save  rank <rank> stops itself with SIGSTOP just before the checkpoint save of step <step>
//   stall-load  rank <rank> stops itself with SIGSTOP just before loading the checkpoint it resumes
//               from (<step>: *)
//   inf-grad    in optimizer step <step> (1-based, as logged), rank <rank> writes +inf into the first
//               element of its first non-empty gradient shard, after the reduction and before the
//               loss-scale unscale and the norm (numerics guard tests)
//   nan-loss    in optimizer step <step>, rank <rank>'s local loss sum becomes NaN before the loss
//               all-reduce (its gradients stay finite)
//   hold-host-update
//               optim.in_backward under fsdp.offload, optimizer step <step>: rank <rank>'s host
//               optimizer thread starts each unit's update only once the next unit's gradient shard
//               is final or the backward ended (host_update.h, begin(hold); tests/mpi/test_offload.cpp)
//
// THREADS: install_fault_hook runs during static initialisation (before main); test_fault is
// called by the trainer's thread.
#pragma once
#include <cstdint>

#include "util/enum_names.h"

namespace tessera::train {

// The fault points, by the names TESSERA_TEST_FAULT uses (a misspelt point does not compile; a
// misspelt name in the variable is refused by the tests' parser).
enum class Fault { Desync, StallSave, StallLoad, InfGrad, NanLoss, HoldHostUpdate };
TESSERA_ENUM_NAMES(fault_names, "desync", "stall-save", "stall-load", "inf-grad", "nan-loss", "hold-host-update")

// True when the installed hook fires `kind` for this rank at this step; false without a hook.
bool test_fault(Fault kind, int rank, int64_t step);

using FaultHook = bool (*)(Fault kind, int rank, int64_t step);
void install_fault_hook(FaultHook hook);

}  // namespace tessera::train
