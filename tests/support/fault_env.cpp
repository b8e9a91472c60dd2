// Test binaries only: installs the fault hook of runtime/train/test_fault.h, which fires the faults
// TESSERA_TEST_FAULT names (kind@rank:step, comma-separated; step * for any). Linked as an object
// into `tessera-faults` and the MPI gtest binaries, never into `tessera`. Parsed on every call (a
// few points per step).
#include <cstdlib>
#include <sstream>
#include <string>

#include "runtime/error.h"
#include "runtime/train/test_fault.h"

namespace {

using tessera::train::Fault;

bool env_fault(Fault kind, int rank, int64_t step) {
  const char* env = std::getenv("TESSERA_TEST_FAULT");
  if (!env || !*env) return false;
  std::stringstream ss(env);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto at = item.find('@'), colon = item.find(':', at == std::string::npos ? 0 : at);
    if (at == std::string::npos || colon == std::string::npos)
      throw TESSERA_INPUT_ERROR("TESSERA_TEST_FAULT item '" + item + "': expected kind@rank:step");
    const auto named = tessera::util::enum_named<Fault>(tessera::train::fault_names(), item.substr(0, at));
    if (!named)
      throw TESSERA_INPUT_ERROR("TESSERA_TEST_FAULT item '" + item + "': no fault point " + item.substr(0, at));
    if (*named != kind) continue;
    const std::string r = item.substr(at + 1, colon - at - 1), s = item.substr(colon + 1);
    if (std::atoi(r.c_str()) != rank) continue;
    if (s == "*" || std::atoll(s.c_str()) == step) return true;
  }
  return false;
}

const bool installed = (tessera::train::install_fault_hook(&env_fault), true);

}  // namespace
