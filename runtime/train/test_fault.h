// TEST-ONLY fault injection for the failure tests (tests/mpi/flight_*.sh, numerics_guard.sh,
// test_numerics_guard.cpp). Compiled in only when test_fault.cpp is built with TESSERA_TEST_HOOKS
// (CMake does so when TESSERA_BUILD_TESTS is ON);
// otherwise test_fault() is always false and the variable is ignored. Never set it in production.
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
#pragma once
#include <cstdint>

namespace tessera::train {

// True when TESSERA_TEST_FAULT names `kind` for this rank at this step (test builds only).
bool test_fault(const char* kind, int rank, int64_t step);

}  // namespace tessera::train
