#include "runtime/comm/emulation.h"

#include "util/error.h"

namespace tessera::comm {

void validate(const Emulation& e, DeviceBackend backend, const std::string& source) {
  if (e.ranks < 0 || e.ranks == 1)
    throw TESSERA_INPUT_ERROR(source + ": comm.emulate_ranks must be 0 (off) or the number of ranks to emulate (>= 2), got " +
                              std::to_string(e.ranks));
  if (!(e.gbps > 0))
    throw TESSERA_INPUT_ERROR(source + ": comm.emulate_gbps must be above 0 (GB/s of bus bandwidth), got " + std::to_string(e.gbps));
  if (e.on() && backend == DeviceBackend::Staged)
    throw TESSERA_INPUT_ERROR(source + ": comm.emulate_ranks delays the NCCL communicator's stream; comm.device_backend=staged "
                                       "has none (use comm.device_backend=nccl)");
}

double emulated_seconds(const Emulation& e, flight::Op op, int64_t bytes) {
  if (!e.on() || bytes <= 0) return 0.0;
  const double W = static_cast<double>(e.ranks), share = (W - 1) / W, bps = e.gbps * 1e9, S = static_cast<double>(bytes);
  switch (op) {
    case flight::Op::AllGather:
    case flight::Op::ReduceScatter: return S * share / bps;
    case flight::Op::AllReduce: return 2 * S * share / bps;
    case flight::Op::Broadcast: return S / bps;
    default: return 0.0;
  }
}

}  // namespace tessera::comm
