// Where test binaries decorate the product's seams. Faults for the failure tests (a desync, a rank
// that stops itself at a save or a load, a non-finite loss or gradient) come from test decorators of
// the Communicator and of the CausalLm, never from hook points inside the training step:
// tests/support/fault_env.cpp, linked only into `tessera-faults` and the MPI test binaries, installs
// them from its static initialiser. In `tessera` nothing is installed and both functions return
// their argument unchanged.
//
// Applied by the launcher where the seams are made: with_test_seams(groups) by the bootstrap to the
// process groups it returns (world, intra, inter: everything made from them, such as the
// checkpointer's host duplicate, comes from the decorated communicator), with_test_seams(lm) by
// make_causal_lm to every model it builds.
//
// THREADS: install_test_seams runs during static initialisation, before main(); the others on the
// thread that bootstraps or builds the model.
#pragma once
#include <functional>

#include "runtime/comm/communicator.h"
#include "runtime/train/trainer.h"

namespace tessera::launcher {

struct TestSeams {
  std::function<comm::CommPtr(comm::CommPtr)> comm;          // each communicator of the bootstrap's groups
  std::function<train::CausalLm(train::CausalLm)> causal_lm;  // each model make_causal_lm builds
};
void install_test_seams(TestSeams seams);

comm::ProcessGroups with_test_seams(comm::ProcessGroups groups);
train::CausalLm with_test_seams(train::CausalLm lm);

}  // namespace tessera::launcher
