// The training loop's settings, each owned by the component that reads it, and what a run is given.
// The configuration schema (launcher/config.cpp) binds every key to one field of these structs (or
// of fsdp's, data's, model's), and the defaults are these initialisers: adding a knob is one schema
// line plus its field here (or in its owner's header) and the code that reads it.
//
//   train::LoopOptions    train.steps, micro_batch, grad_accum, seed, max_skipped_steps, device,
//                         preempt_signal, profile_steps, peak_flops
//   train::SampleOptions  train.sample_every, sample_prompts, sample_max_new_tokens, sample_temperature
//   optim::LrSchedule     train.lr, min_lr, warmup_steps, schedule   (runtime/optim/schedule.h)
//   optim::Options        train.weight_decay, beta1, beta2, eps, clip, optim.*   (runtime/optim/options.h)
//   checkpoint::Policy    checkpoint.*   (runtime/checkpoint/checkpoint.h)
//   train::EvalOptions    eval.*
//   train::LogOptions     log.*
//
// train::Settings groups them: launcher::Config is one (it derives from it), and the Trainer takes
// one. validate() is the one check of how they combine (train, plan and the trainer call it).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/checkpoint/checkpoint.h"
#include "runtime/optim/options.h"
#include "runtime/optim/schedule.h"
#include "util/enum_names.h"

namespace tessera::train {

// train.preempt_signal (SIGTERM and SIGINT always stop the run with a checkpoint).
enum class PreemptSignal { USR1, USR2 };
TESSERA_ENUM_NAMES(preempt_signal_names, "USR1", "USR2")
int signal_number(PreemptSignal s);  // SIGUSR1 / SIGUSR2

struct LoopOptions {
  int64_t steps = 20, micro_batch = 2, grad_accum = 1;
  int64_t seed = 42;               // data shuffling
  int64_t max_skipped_steps = 10;  // non-finite steps in a row that end the run (0: never)
  std::string device = "auto";     // read by the launcher (device selection), not the loop
  PreemptSignal preempt_signal = PreemptSignal::USR2;
  std::vector<int64_t> profile_steps;  // [first, last], 1-based inclusive; empty: no trace
  double peak_flops = 0;               // MFU's denominator per rank; 0: the hardware's peak
  // Not a configuration key: the step as a GPU runs it (the norm, clipping's coefficient and the
  // skip flag as tensor operations, handed to the optimizer's fused kernel -- on a CPU the one-pass
  // loop stands for it: AdamWOptions::cpu_stands_for_device) on any device. Benchmarks count that
  // step's operators with it.
  bool device_step = false;
  // Not a configuration key: dynamic loss scaling in any dtype. The trainer turns it on by itself
  // when fp16 is the compute or the reduction dtype; this asks for it in fp32 and bf16 too (where
  // it must change nothing: tests/mpi/test_numerics_guard.cpp).
  bool loss_scaling = false;
};

// Answers to a few prompts generated between steps, written to <log dir>/samples.jsonl: the trainer
// decides when (after every `every`-th step and after the last) and times the pause; the launcher's
// TrainSamples (launcher/train_samples.h) reads the prompts and generates.
struct SampleOptions {
  int64_t every = 0;            // 0: never
  std::string prompts;          // a prompt file (launcher/prompts.h): messages or prompt records
  int64_t max_new_tokens = 64;  // per prompt; generation also stops at the model's end-of-sequence ids
  double temperature = 0;       // 0: greedy; > 0: sampling, seeded by train.seed + the step
};

struct EvalOptions {
  int64_t every = 0;  // validation every N steps (0: only at the end); needs validation data
};

struct LogOptions {
  std::string dir;   // metrics.jsonl, run_info.json, traces; empty: checkpoint.dir (Settings::log_dir)
  int64_t every = 1; // progress line every N steps
  bool tensorboard = false;
};

struct Settings {
  LoopOptions train;
  SampleOptions sample;
  optim::LrSchedule schedule;
  optim::Options optim;
  checkpoint::Policy checkpoint;
  EvalOptions eval;
  LogOptions log;

  // log.dir, else checkpoint.dir (else empty: no logs).
  const std::string& log_dir() const { return log.dir.empty() ? checkpoint.dir : log.dir; }
};

// How the settings combine, one line each naming the keys (Error(Input)): the schedule
// (optim::validate(LrSchedule)), the optimizer (optim::validate with `loss_scaling`), profile_steps
// within train.steps and with a log directory, log.tensorboard with a log directory, train.sample_every
// and train.sample_prompts both set or neither, with a log directory.
void validate(const Settings& s, bool loss_scaling, const std::string& source = "");

}  // namespace tessera::train
