// The smaller precompiled header (cmake/pch_tiers.cmake): for sources that include LibTorch's ATen
// or c10 headers, or nlohmann-json, but not <torch/torch.h>.
#pragma once
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <mpi.h>
#include <string>
#include <vector>
#include <memory>
#include <functional>
