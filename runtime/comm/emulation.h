// Communication-time emulation (comm.emulate_ranks, comm.emulate_gbps): a world-size-1 run on one
// GPU whose collectives take the time that `ranks` ranks would take over a link of `gbps` GB/s of
// bus bandwidth, so that one GPU measures for real whether prefetch hides the all-gathers and how
// much of the reduce-scatter is exposed. The NCCL communicator (runtime/gpu/nccl_cuda.cpp) puts a
// delay kernel of emulated_seconds on its stream before each collective; the delay holds
// kEmulatedChannels thread blocks, the SMs NCCL's channels would take. Only the time is emulated:
// buffers and shards stay those of world size 1.
//
// The time is nccl-tests' bus bandwidth read backwards (NOTES.md, "Collectives"): with S the full
// buffer (all-gather's output, reduce-scatter's input, all-reduce's and broadcast's tensor) and
// W = ranks, all-gather and reduce-scatter move S (W - 1) / W per rank, all-reduce 2 S (W - 1) / W,
// broadcast S; a barrier nothing.
#pragma once
#include <cstdint>
#include <string>

#include "runtime/comm/flight_recorder.h"
#include "runtime/comm/names.h"

namespace tessera::comm {

struct Emulation {
  int64_t ranks = 0;   // 0: off; else the world size whose communication time the run takes (>= 2)
  double gbps = 370;   // bus bandwidth, GB/s (1e9 bytes): H100/H200 NVLink's ring ~370, NDR InfiniBand ~48 per NIC
  bool on() const { return ranks > 0; }
};

// Thread blocks the delay kernel holds while it waits (NCCL's channels on NVLink: 8 to 16).
constexpr int kEmulatedChannels = 8;

// The emulated settings checked once (config check): ranks 0 or at least 2, a bandwidth above 0,
// and the NCCL backend (the staged one has no stream to delay). Error(Input) naming the key.
void validate(const Emulation& e, DeviceBackend backend, const std::string& source);

// Seconds an operation of `bytes` (its full buffer) takes among e.ranks ranks at e.gbps.
double emulated_seconds(const Emulation& e, flight::Op op, int64_t bytes);

}  // namespace tessera::comm
