// A file that a rank has memory-mapped (a token file of the training data, a safetensors file of
// the model) and that is truncated, replaced in place or whose storage fails while the run reads it
// makes the read fault with SIGBUS. This handler turns that into one line naming the rank, the
// host, the file and the byte, and exit code 2 (bad input: the file changed under the run):
//
//   tessera: rank 1 (node2): data file /data/train.bin can no longer be read at byte 1048576 (SIGBUS:
//   it was truncated or its storage failed while mapped); restore it and resume
//
// Every other SIGBUS (and a SIGBUS raised with kill/raise) goes on to the handler installed before
// (the flight recorder's). Install it last, after comm::flight::install_signal_handlers().
#pragma once

namespace tessera::launcher {

// Installs the SIGBUS handler (idempotent); takes the rank and host for its line from the process
// identity (error.h), so call it after the bootstrap.
void install_mapped_file_fault_handler();

}  // namespace tessera::launcher
