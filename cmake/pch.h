// Precompiled header: the heavy, stable includes every LibTorch translation unit uses.
#pragma once
#include <torch/torch.h>
#include <nlohmann/json.hpp>
#include <mpi.h>
#include <string>
#include <vector>
#include <memory>
#include <functional>
