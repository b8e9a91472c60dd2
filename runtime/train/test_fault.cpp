// See test_fault.h. Parsed on every call (only at a few points per step, and only in test builds).
#include "runtime/train/test_fault.h"

#include <cstdlib>
#include <sstream>
#include <string>

#include "runtime/error.h"

namespace tessera::train {

bool test_fault(const char* kind, int rank, int64_t step) {
#ifdef TESSERA_TEST_HOOKS
  const char* env = std::getenv("TESSERA_TEST_FAULT");
  if (!env || !*env) return false;
  std::stringstream ss(env);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto at = item.find('@'), colon = item.find(':', at == std::string::npos ? 0 : at);
    if (at == std::string::npos || colon == std::string::npos)
      throw TESSERA_INPUT_ERROR("TESSERA_TEST_FAULT item '" + item + "': expected kind@rank:step");
    if (item.substr(0, at) != kind) continue;
    const std::string r = item.substr(at + 1, colon - at - 1), s = item.substr(colon + 1);
    if (std::atoi(r.c_str()) != rank) continue;
    if (s == "*" || std::atoll(s.c_str()) == step) return true;
  }
  return false;
#else
  (void)kind, (void)rank, (void)step;
  return false;
#endif
}

}  // namespace tessera::train
