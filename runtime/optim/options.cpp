#include "runtime/optim/options.h"

#include <sstream>

#include "util/error.h"

namespace tessera::optim {

void validate(const Options& o, bool loss_scaling, const std::string& source) {
  if (!o.in_backward) return;
  const std::string at = source.empty() ? "" : source + ": ";
  std::ostringstream clip;
  clip << o.clip;
  TESSERA_CHECK_INPUT(o.clip == 0, at + "optim.in_backward cannot clip (train.clip = " + clip.str() +
                                       "): each unit is updated before the global gradient norm exists; set train.clip = 0");
  TESSERA_CHECK_INPUT(!loss_scaling, at + "optim.in_backward does not combine with fp16 (fsdp.mixed_precision / "
                                          "fsdp.reduce_dtype): loss scaling must skip overflowing steps, and units are "
                                          "updated before the overflow is known; use bf16");
}

}  // namespace tessera::optim
