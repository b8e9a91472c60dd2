#include "launcher/test_seams.h"

namespace tessera::launcher {

namespace {
TestSeams& installed() {
  static TestSeams s;
  return s;
}
}  // namespace

void install_test_seams(TestSeams seams) { installed() = std::move(seams); }

comm::ProcessGroups with_test_seams(comm::ProcessGroups groups) {
  const auto& wrap = installed().comm;
  if (!wrap) return groups;
  for (comm::CommPtr* c : {&groups.world, &groups.intra, &groups.inter})
    if (*c) *c = wrap(*c);
  return groups;
}

train::CausalLm with_test_seams(train::CausalLm lm) {
  const auto& wrap = installed().causal_lm;
  return wrap ? wrap(std::move(lm)) : lm;
}

}  // namespace tessera::launcher
