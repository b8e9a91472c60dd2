// The harnesses' precompiled header (tests/fuzz/CMakeLists.txt): the heavy, stable includes of
// Tessera's LibTorch sources, compiled once with the sanitizer and coverage flags.
#pragma once
#include <torch/torch.h>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>
#include <memory>
