// `tessera init-model`: write a freshly initialised Hugging Face model directory (`tessera eval` is
// in commands.h, beside train: they share cmd_train.cpp's FSDP setup).
#pragma once
#include <string>
#include <vector>

namespace tessera::launcher {

// tessera init-model --preset NAME|--config config.json --out DIR [--dtype fp32|bf16|fp16]
//                    [--seed N] [--max-shard-size 2GB]
// Streams one tensor at a time (peak memory ~ the largest tensor), so it works for 70B.
int run_init_model(const std::vector<std::string>& args);

}  // namespace tessera::launcher
