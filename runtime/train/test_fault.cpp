// See test_fault.h: the fault points' switch. The parser of TESSERA_TEST_FAULT lives with the tests
// (tests/support/fault_env.cpp).
#include "runtime/train/test_fault.h"

namespace tessera::train {

namespace {
FaultHook g_hook = nullptr;
}  // namespace

void install_fault_hook(FaultHook hook) { g_hook = hook; }

bool test_fault(Fault kind, int rank, int64_t step) { return g_hook && g_hook(kind, rank, step); }

}  // namespace tessera::train
