// The optimizer's settings, owned here: the configuration schema (launcher/config.cpp) binds the
// keys train.weight_decay, train.beta1, train.beta2, train.eps, train.clip, optim.state_dtype and
// optim.in_backward to these fields, and their defaults are these initialisers. AdamW (adamw.h)
// takes them as they are; clipping (clip.h) reads `clip`. validate() is the one check of how they
// combine, called by the configuration check, `tessera plan` and the trainer.
#pragma once
#include <string>

#include "runtime/optim/names.h"

namespace tessera::optim {

struct Options {
  double weight_decay = 0.1;  // AdamW decoupled weight decay (decay ranges only)
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double clip = 1.0;  // global gradient-norm threshold (0: off)
  StateDtype state_dtype = StateDtype::F32;  // the two moments (names.h)
  bool in_backward = false;  // each unit's update in backward, its gradient shard freed at once
};

// Throws Error(Input), one line naming the keys, for settings that cannot work together:
// in_backward with clipping, or with fp16 loss scaling (`loss_scaling`: the trainer's, from the
// FSDP dtypes). `source` prefixes the message (a config file, or empty).
void validate(const Options& o, bool loss_scaling, const std::string& source = "");

}  // namespace tessera::optim
