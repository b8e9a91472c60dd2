// `tessera bench <what>`: the benchmarks' one entry point, a command of the tessera binary.
// benchmarks/ builds on launcher/ (bootstrap, CLI, config), never the other way round: launcher's
// command table does not know this command; app/main.cpp, which links both, adds it.
#pragma once
#include "launcher/commands.h"

namespace tessera::bench {

// The `bench` command: collectives, checkpoint, step, load, memory.
launcher::CommandInfo bench_command();

}  // namespace tessera::bench
