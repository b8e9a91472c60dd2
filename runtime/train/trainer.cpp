#include "runtime/train/trainer.h"

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "runtime/comm/agree.h"
#include "runtime/device/device.h"
#include "runtime/device/gemm_probe.h"
#include "runtime/memory/tracker.h"
#include "runtime/profile/kernel_trace.h"
#include "runtime/profile/phase.h"
#include "runtime/train/preemption.h"
#include "runtime/train/run_log.h"
#include "runtime/train/trainer_impl.h"
#include "util/error.h"

namespace tessera::train {

Trainer::Trainer(CausalLm lm, const comm::ProcessGroups& groups, fsdp::Options fsdp_opts, const Settings& settings,
                 std::shared_ptr<const data::TokenDataset> dataset, nlohmann::json run_state,
                 const comm::ProcessGroups& host_groups)
    : impl_(std::make_unique<Impl>()) {
  Impl& im = *impl_;
  im.lm = std::move(lm);
  im.groups = groups;
  im.host = host_groups.world ? host_groups : groups;
  im.device = fsdp_opts.device;
  TESSERA_CHECK(im.host.world->size() == groups.world->size() && im.host.world->rank() == groups.world->rank(),
                "host and device groups must span the same ranks");
  device::set_current(im.device);
  // GPUs: the step-time breakdown from CUDA events on the compute stream (profile/step_profile.h);
  // null on a CPU (host clocks).
  profile::set_device_clock(device::clock_for(im.device));
  im.fopts = fsdp_opts;
  im.cfg = settings;
  im.dataset = std::move(dataset);
  im.run_state = std::move(run_state);
  memory::install();
  im.base_rss = memory::rss_bytes();
  im.engine = std::make_unique<fsdp::Engine>(im.lm.units, im.lm.layer, groups, fsdp_opts, im.lm.decay);
  // fp16 anywhere in the gradient path gets dynamic loss scaling (numerics.h).
  const bool loss_scaling =
      settings.train.loss_scaling || fsdp_opts.param_dtype == at::kHalf || fsdp_opts.reduce_dtype == at::kHalf;
  validate(settings, loss_scaling);
  optim::AdamWOptions ao(settings.optim);
  ao.cpu_stands_for_device = settings.train.device_step;  // the fused kernel's contract, run by the CPU loop
  im.adamw = std::make_unique<optim::AdamW>(ao);
  im.guard = NumericsGuard(settings.train.max_skipped_steps);
  if (settings.optim.in_backward) {
    im.engine->on_grad_ready([&im](int unit) { im.update_in_backward(unit); });
    if (fsdp_opts.offload != fsdp::Offload::None) im.host_updates = std::make_unique<HostUpdateThread>();
  }
  im.scaler = LossScaler(loss_scaling);
  if (im.dataset) {
    // Every rank is a data-parallel rank, whatever the sharding strategy.
    im.sampler = std::make_unique<data::DistributedSampler>(im.dataset->num_sequences(), groups.world->size(),
                                                            groups.world->rank(), settings.train.micro_batch,
                                                            settings.train.grad_accum, settings.train.seed);
  }
  if (!settings.checkpoint.dir.empty()) {
    im.checkpointer = std::make_unique<checkpoint::Checkpointer>(settings.checkpoint, im.host);
    im.checkpointer->begin_lineage(0, "");  // a fresh run, unless resume() says otherwise
  }
}

// Teardown in an explicit order, the same on the normal and the exception path: what holds device
// memory or outstanding Work handles first (the checkpointer, joining an asynchronous save; the
// optimizer; the engine with its gathered buffers), then the model, and only then this trainer's
// references to the communicators. The caller's ProcessGroups outlive the trainer, so the
// communicators themselves go after the model (see ~NcclCommunicator: destroyed when drained,
// aborted otherwise). Device tensors go back to LibTorch's caching allocator, stream-recorded behind
// any NCCL work still using them: nothing here waits for the GPU.
Trainer::~Trainer() {
  Impl& im = *impl_;
  im.host_updates.reset();  // joined first: its jobs use the optimizer and the engine's shards
  im.checkpointer.reset();
  im.sampler.reset();
  im.adamw.reset();
  im.engine.reset();
  im.lm = CausalLm{};
  im.groups = {};
  im.host = {};
}

std::vector<NamedShards> Trainer::state() { return impl_->checkpoint_state(); }

fsdp::Engine& Trainer::engine() { return *impl_->engine; }
int64_t Trainer::step() const { return impl_->step; }
int64_t Trainer::process_base_rss() const { return impl_->base_rss; }

void Trainer::load_weights(fsdp::WeightSource& source) { load_weights(&source, fsdp::LoadMode::Parallel); }

void Trainer::load_weights(fsdp::WeightSource* source, fsdp::LoadMode mode) {
  profile::Phase load = profile::Phase::activity(impl_->step, "weight load");
  fsdp::load_weights(*impl_->engine, source, mode, &impl_->host);
}

int64_t Trainer::resume(const std::string& ckpt_dir) {
  Impl& im = *impl_;
  profile::Phase load = profile::Phase::activity(-1, "checkpoint load");
  nlohmann::json s = checkpoint::load(ckpt_dir, *im.engine, im.checkpoint_state());
  im.step = s.at("step").get<int64_t>();
  // This run continues from ckpt_dir: `auto` must resume it from there (or from its own later
  // saves), never from newer checkpoints of the run it rolled back (checkpoint.h, begin_lineage).
  if (im.checkpointer) im.checkpointer->begin_lineage(im.step, ckpt_dir);
  if (s.contains("best") && s["best"].is_object()) {
    im.best_step = s["best"].at("step").get<int64_t>();
    im.best_val_loss = s["best"].at("val_loss").get<double>();
  }
  if (s.contains("numerics")) {  // checkpoints from before the guard have none: nothing skipped
    im.guard.load_state(s["numerics"], ckpt_dir + "/manifest.json");
    if (im.scaler.enabled() && s["numerics"].contains("loss_scale"))
      im.scaler.load_state(s["numerics"]["loss_scale"], ckpt_dir + "/manifest.json");
  }
  im.last_checkpoint = ckpt_dir;
  im.adamw->set_step_count(s.at("optimizer").at("step_count").get<int64_t>());
  if (im.sampler && s.contains("sampler") && !s["sampler"].is_null()) {
    // The sampler's position is the step; a different world size re-slices the same global batches.
    im.sampler->set_step(im.step);
  }
  return im.step;
}

StepRecord Trainer::train_step() {
  const QueuedStep q = impl_->queue_step();
  TESSERA_CHECK(!q.abandoned, "train_step: the step was abandoned on a stop request (use run())");
  StepRecord r = impl_->record(q);
  impl_->check_skip_limit();
  return r;
}

std::string Trainer::save_checkpoint() {
  Impl& im = *impl_;
  TESSERA_CHECK(im.checkpointer, "checkpoint.dir is not set");
  profile::Phase save = profile::Phase::activity(im.step, "checkpoint save");
  auto timing = im.checkpointer->save(im.step, *im.engine, im.checkpoint_state(), im.state_json());
  im.last_checkpoint = im.checkpointer->root() + "/step-" + std::to_string(im.step);
  if (im.console.out && im.groups.world->rank() == 0) {
    char buf[160];
    snprintf(buf, sizeof(buf), "checkpoint step-%ld: loop blocked %.2fs%s", static_cast<long>(im.step),
             timing.blocked_s, im.cfg.checkpoint.async ? " (writing in the background)" : "");
    im.console.out(buf);
  }
  return im.checkpointer->root() + "/step-" + std::to_string(im.step);
}

// After a step abandoned on a stop request: the state is the last complete step's. It is saved
// unless a checkpoint of it exists or it is the state the run started from (nothing to save).
std::string Trainer::save_abandoned(int64_t start_step) {
  Impl& im = *impl_;
  const bool saved = !im.last_checkpoint.empty() &&
                     std::filesystem::path(im.last_checkpoint).filename() == "step-" + std::to_string(im.step);
  if (!im.checkpointer || saved || im.step == start_step) return im.last_checkpoint;
  return save_checkpoint();
}

// train.profile_steps: the trace starts with its first step (or the first step of a resumed run
// inside the window) and is written after its last. Returns whether step `next` ends the trace.
namespace {
bool in_window(const std::vector<int64_t>& window, int64_t step) {  // [first, last] or empty (validated)
  return !window.empty() && step >= window[0] && step <= window[1];
}
}  // namespace

void Trainer::Impl::start_trace_if_due(int64_t next) {
  if (!in_window(cfg.train.profile_steps, next) || profile::tracing()) return;
  profile::start_trace();
  profile::start_kernel_trace(device);
}

bool Trainer::Impl::write_trace_if_due(int64_t next) {
  const std::vector<int64_t>& window = cfg.train.profile_steps;
  if (!in_window(window, next) || (next != window[1] && next != cfg.train.steps)) return false;
  const std::string rank = std::to_string(groups.world->rank());
  profile::write_trace(cfg.log_dir() + "/trace-rank-" + rank + ".json", groups.world->rank());
  kernel_trace = profile::write_kernel_trace(cfg.log_dir() + "/kernels-rank-" + rank + ".json");
  return true;
}

// Validation every eval.every steps and at the end (not when stopping: time is short then). Returns
// whether it found a new best validation loss.
bool Trainer::Impl::validate_if_due(Trainer& self, StepRecord& r, bool stopping) {
  if (!val || stopping || !(step == cfg.train.steps || (cfg.eval.every > 0 && step % cfg.eval.every == 0))) return false;
  const EvalResult e = self.evaluate();
  r.evaluated = true;
  r.val_loss = e.loss;
  r.val_tokens = e.targets;
  const bool new_best = best_step < 0 || e.loss < best_val_loss;
  if (new_best) best_step = step, best_val_loss = e.loss;
  return new_best;
}

// The checkpoint policy: when stopping, every checkpoint.every steps, a new best validation loss
// (checkpoint.keep_best), and at the end.
bool Trainer::Impl::checkpoint_due(bool stopping, bool new_best) const {
  if (!checkpointer) return false;
  const bool periodic = cfg.checkpoint.every > 0 && step % cfg.checkpoint.every == 0;
  return stopping || periodic || (new_best && cfg.checkpoint.keep_best) || step == cfg.train.steps;
}

// train.sample_every: after every N-th step and the last, not when stopping (time is short then).
void Trainer::Impl::sample_if_due(StepRecord& r, bool stopping) {
  const int64_t every = cfg.sample.every;
  if (every == 0 || stopping || !(step % every == 0 || step == cfg.train.steps)) return;
  const auto t0 = std::chrono::steady_clock::now();
  const std::string what = samples(step);
  r.sample_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (console.out) {
    char took[64];
    snprintf(took, sizeof(took), "%.2f s", r.sample_s);
    console.out("samples after step " + std::to_string(step) + ": " + what + " (a pause of " + took + ")");
  }
}

RunResult Trainer::run() {
  Impl& im = *impl_;
  TESSERA_CHECK(im.cfg.sample.every == 0 || im.samples, "train.sample_every needs Trainer::set_samples");
  RunResult res;
  res.start_step = im.step;
  im.peak = device::peak_flops(im.device, im.fopts.param_dtype, at::get_num_threads(), im.cfg.train.peak_flops);
  im.gemm_flops = device::measure_gemm_flops(im.fopts.param_dtype, im.device);
  // Rank 0 opens the run's log files (a link planted at metrics.jsonl is refused there): every rank
  // learns of it, and ends with the same line.
  std::unique_ptr<RunLog> run_log;
  throw_if_any(*im.host.world, capture_error([&] { run_log = open_run_log(im, res.start_step); }));
  RunLog& log = *run_log;
  while (im.step < im.cfg.train.steps) {
    const int64_t next = im.step + 1;
    // The step's collectives, its stop vote and validation all carry "train step" (flight recorder).
    profile::Phase train_step = profile::Phase::activity(next, "train step");
    im.start_trace_if_due(next);
    const QueuedStep q = im.queue_step();
    if (q.abandoned) {  // a stop request mid-step: the last complete step's state is saved
      res.last_checkpoint = save_abandoned(res.start_step);
      res.preempted = true;
      break;
    }
    StepRecord r = im.record(q);
    const bool trace_done = im.write_trace_if_due(next);
    const bool stop = im.host.world->any(preemption_requested());  // host flag: no device sync
    const bool new_best = im.validate_if_due(*this, r, stop);
    im.sample_if_due(r, stop);
    res.records.push_back(r);
    log.step(r, trace_done);
    im.check_skip_limit();  // before any save of this step: the last checkpoint stays the last good one
    if (im.checkpoint_due(stop, new_best)) res.last_checkpoint = save_checkpoint();
    if (stop) {
      res.preempted = true;
      break;
    }
  }
  if (im.checkpointer) im.checkpointer->wait();
  log.summary(res.records);
  res.end_step = im.step;
  res.best_step = im.best_step;
  res.best_val_loss = im.best_val_loss;
  return res;
}

void Trainer::set_console(Console console) { impl_->console = std::move(console); }

void Trainer::set_samples(SampleHook hook) { impl_->samples = std::move(hook); }

void Trainer::set_validation(std::shared_ptr<const data::TokenDataset> val) { impl_->val = std::move(val); }

}  // namespace tessera::train
