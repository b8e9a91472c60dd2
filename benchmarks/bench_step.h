#pragma once
#include <string>
#include <vector>

namespace tessera::bench {

// `tessera bench step`, two modes.
//
// In process, under `mpirun -np W tessera bench step`: tokens/s of an FSDP training step at W ranks
// against one plain LibTorch process (no sharding, torch::optim::AdamW) running the same global
// batch with the same total threads, measured in the same run; prints both and the ratio.
// `--baseline none` times FSDP alone (one JSON line with --json: what the peer driver reads).
// `--modes LIST` times the memory modes of issue 36 (optim.in_backward, optim.state_dtype,
// fsdp.offload) against the default step in interleaved rounds instead (bench_step_modes.h).
//
// The peer driver, `tessera bench step --peer` as ONE plain process (no mpirun): interleaved rounds
// in which every configuration runs once, in a shuffled order -- Tessera as `mpirun -np R tessera
// bench step --baseline none` for each strategy and dtype (hybrid_shard: 2 emulated nodes of --np
// ranks over TCP loopback, plus full_shard on those ranks over shared memory as its reference), the
// PyTorch DDP peer (benchmarks/torch_peer.py, gloo) at each rank count and dtype -- all with the
// same model config, token file, global batch, threads per rank and hyper-parameters. Prints the
// medians, the ratio Tessera / DDP per configuration and the goals (or one JSON object).
int run_bench_step(const std::vector<std::string>& args);

// True for `bench step ... --peer`: the driver runs as one process without MPI (it launches mpirun).
bool bench_step_is_driver(const std::vector<std::string>& bench_args);

}  // namespace tessera::bench
