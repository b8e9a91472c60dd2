#include "runtime/train/trainer.h"

#include <torch/torch.h>

#include <atomic>
#include <cmath>
#include <chrono>
#include <filesystem>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <limits>
#include <sstream>
#include <unistd.h>

#include "runtime/checkpoint/checkpoint.h"
#include "runtime/comm/agree.h"
#include "runtime/data/dataset.h"
#include "runtime/data/sampler.h"
#include "runtime/device/device.h"
#include "runtime/device/peak_flops.h"
#include "runtime/error.h"
#include "runtime/memory/tracker.h"
#include "runtime/optim/adamw.h"
#include "runtime/optim/clip.h"
#include "runtime/optim/schedule.h"
#include "runtime/optim/shard_view.h"
#include "runtime/profile/kernel_trace.h"
#include "runtime/profile/phase.h"
#include "runtime/train/host_update.h"
#include "runtime/train/numerics.h"
#include "runtime/train/tensorboard.h"
#include "runtime/train/test_fault.h"
#include "util/output_file.h"

namespace tessera::train {

// ---- signals ---------------------------------------------------------------------------------
namespace {
std::atomic<bool> g_preempt{false};
std::atomic<int> g_preempt_signal{0};  // the first signal that asked to stop
extern "C" void on_preempt_signal(int sig) {
  const bool again = g_preempt.exchange(true);
  if (!again) g_preempt_signal.store(sig);
  if (sig != SIGINT) return;
  if (again) {  // a second Ctrl-C: quit at once
    signal(SIGINT, SIG_DFL);
    raise(SIGINT);
    return;
  }
  static const char msg[] =
      "\ntessera: interrupt: stopping at the next micro-batch boundary with a checkpoint (Ctrl-C again to quit at once)\n";
  ssize_t n = write(STDERR_FILENO, msg, sizeof(msg) - 1);
  (void)n;
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string format_duration(double s) {
  char buf[64];
  int64_t t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) snprintf(buf, sizeof(buf), "%ldh%02ldm", t / 3600, (t % 3600) / 60);
  else if (t >= 60) snprintf(buf, sizeof(buf), "%ldm%02lds", t / 60, t % 60);
  else snprintf(buf, sizeof(buf), "%lds", t);
  return buf;
}

// Matmul throughput of this rank in the compute dtype on its device, measured once: the
// denominator of metrics' "mfu_of_measured_gemm", a diagnostic. MFU itself divides by the
// hardware's peak (runtime/device/peak_flops.h).
double measure_gemm_flops(at::ScalarType dtype, at::Device device) {
  const int64_t n = device.is_cpu() ? 512 : 4096;
  auto a = torch::randn({n, n}).to(device, dtype), b = torch::randn({n, n}).to(device, dtype);
  torch::NoGradGuard ng;
  auto c = torch::matmul(a, b);  // warm up
  device::synchronize(device);
  int iters = 0;
  auto t0 = Clock::now();
  while (seconds_since(t0) < 0.15) {
    c = torch::matmul(a, b);
    ++iters;
  }
  device::synchronize(device);  // a device queues the matmuls; count them once they have run
  return 2.0 * n * n * n * iters / seconds_since(t0);
}

// The line rank 0 prints once at the start of run(): which peak MFU divides by.
std::string describe_peak(const device::Peak& p) {
  if (p.flops <= 0)
    return "MFU: not reported (" + p.source + "); set train.peak_flops (--peak-flops) to one rank's peak FLOP/s";
  char buf[64];
  if (p.flops >= 1e12) snprintf(buf, sizeof(buf), "%.4g TFLOP/s", p.flops / 1e12);
  else snprintf(buf, sizeof(buf), "%.4g GFLOP/s", p.flops / 1e9);
  return std::string("MFU: model FLOPs per token over a peak of ") + buf + " per rank (" + p.source + ")";
}

// What log.tensorboard writes for a step: metrics.jsonl's numbers of these keys, as they are there.
std::vector<std::pair<std::string, double>> tensorboard_scalars(const nlohmann::json& rec) {
  std::vector<std::pair<std::string, double>> out;
  for (const char* k : {"loss", "val_loss", "lr", "grad_norm", "tokens_per_s", "mfu", "peak_rss_bytes",
                        "peak_gpu_mem_bytes"})
    if (rec.contains(k) && rec[k].is_number() && !(std::string(k) == "peak_gpu_mem_bytes" && rec[k] == 0))
      out.emplace_back(k, rec[k].get<double>());
  return out;
}
}  // namespace

void install_preemption_handlers(int preempt_signal) {
  struct sigaction sa {};
  sa.sa_handler = on_preempt_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);  // Ctrl-C, also on a single process without mpirun
  if (preempt_signal > 0) sigaction(preempt_signal, &sa, nullptr);
}
bool preemption_requested() { return g_preempt.load(); }
int preemption_signal() { return g_preempt_signal.load(); }

// ---- trainer ---------------------------------------------------------------------------------
// One optimizer step as queued: what is needed to turn it into a StepRecord.
struct QueuedStep {
  Clock::time_point t0;
  at::Tensor loss_sum;   // [1] double on the device: cross entropy summed over the step's targets, all ranks
  int64_t targets = 0;   // target tokens of the step, all ranks and micro-steps
  at::Tensor grad_norm;  // 0-dim double on the device
  double loss = 0, norm = 0;  // on the host after the step's one synchronisation (skip_step): loss per target
  double lr = 0;
  bool skipped = false;       // the numerics guard skipped the optimizer (numerics.h)
  int64_t skipped_total = 0;  // skipped steps of the run so far
  float loss_scale = 1;       // the loss scale the step ran with
  int64_t overlapped_updates = 0;  // optim.in_backward under offload (HostUpdateThread::overlapped)
  bool abandoned = false;  // stopped at a micro-batch boundary (preemption): nothing of it was applied
};

struct Trainer::Impl {
  CausalLm lm;
  comm::ProcessGroups groups;  // the engine's (device) communicators
  comm::ProcessGroups host;    // MPI/self communicators over the same ranks
  at::Device device = at::kCPU;
  fsdp::Options fopts;
  TrainOptions opts;
  std::shared_ptr<const data::TokenDataset> dataset, val;
  nlohmann::json run_state;
  std::unique_ptr<fsdp::Engine> engine;
  std::unique_ptr<optim::AdamW> adamw;
  std::unique_ptr<data::DistributedSampler> sampler;
  optim::LrSchedule schedule;
  std::unique_ptr<checkpoint::Checkpointer> checkpointer;
  int64_t step = 0;
  device::Peak peak;       // MFU's denominator per rank (flops 0: unknown)
  double gemm_flops = 0;    // a matmul's measured throughput (mfu_of_measured_gemm)
  int64_t base_rss = 0;           // resident set before the engine allocated anything
  int64_t lifetime_peak_rss = 0;  // peak resident set of the phases before the current step
  int64_t best_step = -1;  // lowest validation loss so far (-1: none)
  double best_val_loss = 0;
  LossScaler scaler;         // fp16 dynamic loss scaling (disabled: scale 1)
  NumericsGuard guard;       // skips steps with a non-finite loss or gradient norm
  std::string last_checkpoint;  // saved or resumed from (for the guard's stop message)

  nlohmann::json state_json() const {
    nlohmann::json s = run_state;
    s["step"] = step;
    s["sampler"] = sampler ? sampler->state() : nlohmann::json(nullptr);
    s["optimizer"] = {{"step_count", adamw->step_count()}};
    s["rng"] = {{"data_seed", opts.seed}};
    s["strategy"] = fsdp::to_string(fopts.strategy);
    s["world_size"] = groups.world->size();
    // checkpoint.keep_best: the checkpoint named here survives pruning (checkpoint.cpp prune()).
    if (opts.keep_best && best_step >= 0) s["best"] = {{"step", best_step}, {"val_loss", best_val_loss}};
    s["numerics"] = guard.state();
    if (scaler.enabled()) s["numerics"]["loss_scale"] = scaler.state();
    return s;
  }

  // Tells the model how this batch's tokens are laid out (packed documents or plain rows).
  void set_layout(const data::Batch& b) {
    if (!b.packed) {
      if (lm.set_layout) lm.set_layout({});
      return;
    }
    TESSERA_CHECK(lm.set_layout, "this model cannot take packed batches (CausalLm::set_layout is empty)");
    lm.set_layout({device::to_device(b.position_ids, device), device::to_device(b.document_ids, device)});
  }
  // Forward of one batch: cross entropy summed over its targets (a 0-dim fp32 tensor on the device).
  // grad_scale: the loss scale backward will carry (fp16), a hint for the fused head.
  at::Tensor summed_loss(const data::Batch& b, double grad_scale = 1.0);

  // The step, in the order it runs (queue_step): the batches, forward and backward of each, the
  // optimizer.
  QueuedStep queue_step();
  std::vector<data::Batch> next_batches(QueuedStep& q);
  bool abandon_if_preempted(size_t micro_step, QueuedStep& q);
  at::Tensor forward(const data::Batch& b, double scale, bool last, QueuedStep& q);
  void backward(const at::Tensor& loss, double scale, QueuedStep& q);
  void optimizer_step(QueuedStep& q);
  // optim.in_backward (TrainOptions::optimizer_in_backward): the step's loss agreed before the last
  // backward, each unit's update from the engine's on_grad_ready hook, the norm checked after.
  bool loss_finite_before_update(QueuedStep& q);
  void update_in_backward(int unit);
  void update_unit(int unit, const std::vector<optim::ParamShard>& shards);
  void finish_in_backward(QueuedStep& q);
  // fsdp.offload with optim.in_backward: the thread that runs update_unit while backward goes on
  // (host_update.h); null otherwise (the hook updates on the thread that runs backward).
  std::unique_ptr<HostUpdateThread> host_updates;
  struct InBackward {
    bool open = false;            // the hook updates units (the last micro-step's backward)
    int64_t step_count = 0;       // AdamW's step count before this step (each unit takes step + 1)
    double lr = 0;
    std::vector<at::Tensor> square_sums;  // per updated unit: its gradient shard's sum of squares
    QueuedStep* q = nullptr;
  } in_bwd;
  void inject_test_faults(const optim::ShardView& view, QueuedStep& q) const;
  void inject_inf_grad(const optim::ShardView& view) const;

  // Everything a checkpoint saves and restores: the engine's masters and the optimizer's state.
  std::vector<NamedShards> checkpoint_state() {
    std::vector<NamedShards> kinds = {engine->named_state()};
    for (auto& k : adamw->state(engine->optimizer_view().shards)) kinds.push_back(std::move(k));
    return kinds;
  }
  StepRecord record(const QueuedStep& q);
  // The numerics guard's agreed decision for the queued step (host sync on a device; numerics.h).
  bool skip_step(QueuedStep& q);
  // train.max_skipped_steps reached: the same CollectiveError on every rank.
  bool trace_around(int64_t next, bool before);
  profile::KernelTrace kernel_trace;  // the kernels of train.profile_steps (profile/kernel_trace.h)
  bool validate_if_due(Trainer& self, StepRecord& r, bool stopping);
  bool checkpoint_due(bool stopping, bool new_best) const;
  void check_skip_limit() const {
    if (guard.exhausted()) throw CollectiveError(ErrorKind::Input, guard.stop_message(last_checkpoint));
  }
};

Trainer::Trainer(CausalLm lm, const comm::ProcessGroups& groups, fsdp::Options fsdp_opts, TrainOptions opts,
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
  profile::set_device_clock(profile::device_clock_for(im.device));
  im.fopts = fsdp_opts;
  im.opts = opts;
  im.dataset = std::move(dataset);
  im.run_state = std::move(run_state);
  memory::install();
  im.base_rss = memory::rss_bytes();
  im.engine = std::make_unique<fsdp::Engine>(im.lm.units, im.lm.layer, groups, fsdp_opts, im.lm.decay);
  optim::AdamWOptions ao;
  ao.lr = opts.lr;
  ao.beta1 = opts.beta1;
  ao.beta2 = opts.beta2;
  ao.eps = opts.eps;
  ao.weight_decay = opts.weight_decay;
  ao.state_dtype = opts.optimizer_state_dtype;
  ao.fused_cpu = !opts.device_step;
  im.adamw = std::make_unique<optim::AdamW>(ao);
  TESSERA_CHECK_INPUT(opts.max_skipped_steps >= 0, "train.max_skipped_steps must be >= 0 (got " +
                                                        std::to_string(opts.max_skipped_steps) + ")");
  im.guard = NumericsGuard(opts.max_skipped_steps);
  if (opts.optimizer_in_backward) {
    TESSERA_CHECK_INPUT(opts.clip <= 0 && !opts.loss_scaling,
                        "optim.in_backward needs train.clip = 0 and no fp16 loss scaling (fsdp.mixed_precision / fsdp.reduce_dtype fp16)");
    im.engine->on_grad_ready([&im](int unit) { im.update_in_backward(unit); });
    if (fsdp_opts.offload != fsdp::Offload::None) im.host_updates = std::make_unique<HostUpdateThread>();
  }
  im.scaler = LossScaler(opts.loss_scaling);
  im.schedule = {opts.lr, opts.min_lr, opts.warmup_steps, opts.steps, opts.schedule};
  optim::validate(im.schedule);
  if (im.dataset) {
    // Every rank is a data-parallel rank, whatever the sharding strategy.
    im.sampler = std::make_unique<data::DistributedSampler>(im.dataset->num_sequences(), groups.world->size(),
                                                            groups.world->rank(), opts.micro_batch,
                                                            opts.grad_accum, opts.seed);
  }
  if (!opts.checkpoint_dir.empty()) {
    checkpoint::SaveOptions so;
    so.keep = opts.checkpoint_keep;
    so.async = opts.checkpoint_async;
    im.checkpointer = std::make_unique<checkpoint::Checkpointer>(opts.checkpoint_dir, so, im.host);
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
  if (test_fault("stall-load", im.groups.world->rank(), -1)) raise(SIGSTOP);
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

at::Tensor Trainer::Impl::summed_loss(const data::Batch& b, double grad_scale) {
  set_layout(b);
  fsdp::Engine& eng = *engine;
  at::Tensor h = lm.embed(device::to_device(b.inputs, device));
  for (int64_t i = 0; i < eng.num_layers(); ++i) h = eng.run_layer(i, h);
  profile::Phase head = profile::Phase::label("head and loss");
  return lm.head_loss(h, device::to_device(b.labels, device), grad_scale, opts.device_step);
}

// The step's micro-batches, and the number of target tokens they hold on all ranks (one host
// all-reduce per step): the loss is the mean over these, whatever their split between micro-batches.
std::vector<data::Batch> Trainer::Impl::next_batches(QueuedStep& q) {
  profile::Phase data_part(profile::Part::Data);
  std::vector<data::Batch> batches;
  at::Tensor count = at::zeros({1}, at::kLong);
  for (int64_t a = 0; a < opts.grad_accum; ++a) {
    batches.push_back(dataset->batch(sampler->micro_batch(step, static_cast<int>(a))));
    count.data_ptr<int64_t>()[0] += batches.back().targets;
  }
  {
    profile::Phase sync(profile::Part::SyncWait);
    host.world->all_reduce(count, comm::ReduceOp::Sum)->wait();
  }
  q.targets = count.data_ptr<int64_t>()[0];
  return batches;
}

// Forward of one micro-batch: it will backpropagate its summed loss x W / N (the engine averages
// gradients over the W data-parallel ranks), so the step's gradient is exactly that of the mean
// loss over its N targets. The logits (B x T x vocab) are not kept: autograd keeps what it needs.
at::Tensor Trainer::Impl::forward(const data::Batch& b, double scale, bool last, QueuedStep& q) {
  at::Tensor loss;
  {
    memory::Scope scope(memory::Category::Activations);
    profile::Phase forward(profile::Part::Forward);
    engine->begin_forward(/*sync=*/last);
    loss = summed_loss(b, scale * q.loss_scale);
  }
  memory::retag_all(memory::Category::Activations, memory::Category::SavedTensors);
  q.loss_sum.add_(loss.detach().to(at::kDouble));
  return loss;
}

// Its backward: the gradient shards accumulate in the engine (and, with optim.in_backward, the
// last micro-step's update each unit as its shard is final).
void Trainer::Impl::backward(const at::Tensor& loss, double scale, QueuedStep& q) {
  {
    memory::Scope scope(memory::Category::Activations);
    profile::Phase backward(profile::Part::Backward);
    (loss * (scale * q.loss_scale)).backward();
  }
  profile::Phase backward(profile::Part::Backward);  // the root's gradient; the drain is reduce_wait
  engine->finish_backward();
}

// Test binaries only (test_fault.h): one rank's reduced gradient shard, or its local loss, made
// non-finite for the numerics guard's tests. Never fires in `tessera`.
void Trainer::Impl::inject_test_faults(const optim::ShardView& view, QueuedStep& q) const {
  inject_inf_grad(view);
  if (test_fault("nan-loss", groups.world->rank(), step + 1)) q.loss_sum.fill_(std::numeric_limits<double>::quiet_NaN());
}

void Trainer::Impl::inject_inf_grad(const optim::ShardView& view) const {
  if (!test_fault("inf-grad", groups.world->rank(), step + 1)) return;
  for (const optim::ParamShard& s : view.shards)
    if (s.grad.defined() && s.grad.numel() > 0) {
      s.grad.narrow(0, 0, 1).fill_(std::numeric_limits<double>::infinity());
      return;
    }
}

// The optimizer's part: unscale, norm and clipping, the loss all-reduce, then AdamW unless the
// numerics guard skips the step on every rank (masters and moments stay, the step count too).
void Trainer::Impl::optimizer_step(QueuedStep& q) {
  memory::Scope opt_scope(memory::Category::Optimizer);
  profile::Phase optimizer(profile::Part::Optimizer);
  const optim::ShardView view = engine->optimizer_view();
  inject_test_faults(view, q);
  scaler.unscale(view.grads());  // before the norm and clipping see them
  const optim::Clipped clipped = optim::clip(view, opts.clip, adamw->options().fused_cpu);
  q.grad_norm = clipped.norm;
  q.lr = optim::lr_at(step, schedule);
  {
    profile::Phase sync(profile::Part::SyncWait);
    groups.world->all_reduce(q.loss_sum, comm::ReduceOp::Sum)->wait();
  }
  if (!skip_step(q)) adamw->step(view.shards, q.lr, clipped.grad_scale);
}

// optim.in_backward, before the last backward: the step's loss on every rank (the step's first
// host sync); a non-finite one skips the step before any unit is updated (numerics.h), else the
// engine's hook updates each unit in the backward that follows.
bool Trainer::Impl::loss_finite_before_update(QueuedStep& q) {
  if (test_fault("nan-loss", groups.world->rank(), step + 1)) q.loss_sum.fill_(std::numeric_limits<double>::quiet_NaN());
  {
    profile::Phase sync(profile::Part::SyncWait);
    groups.world->all_reduce(q.loss_sum, comm::ReduceOp::Sum)->wait();
  }
  const double loss = device::to_host(q.loss_sum, "step: loss").data_ptr<double>()[0];
  q.loss = loss / static_cast<double>(std::max<int64_t>(q.targets, 1));
  {
    profile::Phase sync(profile::Part::SyncWait);
    q.skipped = host.world->any(!std::isfinite(loss));
  }
  q.lr = optim::lr_at(step, schedule);
  in_bwd = {!q.skipped, adamw->step_count(), q.lr, {}, &q};
  if (host_updates) host_updates->begin(test_fault("hold-host-update", groups.world->rank(), step + 1));
  return !q.skipped;
}

// The engine's on_grad_ready hook: AdamW on this unit's shard alone, with the step count every unit
// of this step shares, then its gradient shard released. Under offload the update is handed to the
// host optimizer thread, which holds the shard until it is done; the hook's optimizer time is then
// the wait for the previous unit's update (host_update.h: one in flight).
void Trainer::Impl::update_in_backward(int unit) {
  if (!in_bwd.open) return;  // micro-steps before the last never call it; a skipped step neither
  profile::Phase optimizer(profile::Part::Optimizer);
  optim::ShardView view = engine->optimizer_view();
  for (size_t i = 0; i < view.shards.size(); ++i)
    if (static_cast<int>(i) != unit) view.shards[i].grad = at::Tensor();  // this unit alone
  if (unit == 1) inject_inf_grad(view);  // test binaries: after the later layers were updated
  if (host_updates)
    host_updates->submit([this, unit, shards = std::move(view.shards)] { update_unit(unit, shards); });
  else
    update_unit(unit, view.shards);
  engine->release_grad(unit);
}

// One unit's update and its gradient's sum of squares, on the thread that runs it (the host
// optimizer thread under offload: it touches only this unit's master, gradient and moments, and
// AdamW, which no other thread uses until finish_in_backward has drained it).
void Trainer::Impl::update_unit(int unit, const std::vector<optim::ParamShard>& shards) {
  const optim::ParamShard& s = shards[static_cast<size_t>(unit)];
  memory::Scope opt_scope(memory::Category::Optimizer, s.host ? memory::Where::Host : memory::Where::Device);
  in_bwd.square_sums.push_back(
      at::linalg_vector_norm(s.grad, 2, c10::nullopt, false, at::kDouble).square().reshape({1}));
  adamw->set_step_count(in_bwd.step_count);
  adamw->step(shards, in_bwd.lr, 1.0f);
}

// After the last backward: the step's gradient norm from the updated units' sums (the step's second
// host sync). A non-finite one cannot be skipped any more (units were updated): the run stops here,
// before anything of this step is saved, and the last checkpoint stays its last good state.
void Trainer::Impl::finish_in_backward(QueuedStep& q) {
  in_bwd.open = false;
  if (host_updates) {
    profile::Phase optimizer(profile::Part::Optimizer);  // the host's updates still running after backward
    host_updates->drain();  // a job's exception surfaces here, on this thread
    q.overlapped_updates = host_updates->overlapped();
  }
  double norm = 0;
  if (!q.skipped) {
    const at::Tensor local = in_bwd.square_sums.empty() ? at::zeros({1}, q.loss_sum.options())
                                                        : at::cat(in_bwd.square_sums).sum().reshape({1});
    const at::Tensor partials = optim::gather_partials(local, &engine->shard_group());
    q.grad_norm = partials.sum().sqrt();
    profile::Phase sync(profile::Part::SyncWait);
    norm = device::to_host(q.grad_norm, "step: gradient norm").item<double>();
  }
  in_bwd.square_sums.clear();
  q.norm = q.skipped ? std::numeric_limits<double>::quiet_NaN() : norm;
  guard.record(step + 1, q.skipped, q.loss, q.norm);
  q.skipped_total = guard.total();
  if (q.skipped) return;
  if (!std::isfinite(norm))
    throw CollectiveError(ErrorKind::Input,
                          "step " + std::to_string(step + 1) + ": non-finite gradient norm with optim.in_backward: units were "
                          "already updated, so the step cannot be skipped; the run stops here without saving" +
                              (last_checkpoint.empty() ? std::string() : "; resume from " + last_checkpoint));
  adamw->set_step_count(in_bwd.step_count + 1);
}

// One training step, queued: the device may still be running it when this returns (record() reads
// its results; skip_step is its one host synchronisation).
QueuedStep Trainer::Impl::queue_step() {
  TESSERA_CHECK(sampler, "training needs a dataset");
  // This step's peaks: the tracker's composition and the kernel's high-water mark start afresh.
  lifetime_peak_rss = std::max(lifetime_peak_rss, memory::peak_rss_bytes());
  memory::reset_peak_rss();
  memory::reset_peak();
  QueuedStep q;
  q.t0 = Clock::now();
  profile::begin_step(step + 1);
  profile::Phase train_step = profile::Phase::activity(step + 1, "train step");  // the step as logged
  std::vector<data::Batch> batches = next_batches(q);
  const double scale = static_cast<double>(groups.world->size()) / static_cast<double>(std::max<int64_t>(q.targets, 1));
  q.loss_sum = at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(device));
  q.loss_scale = scaler.scale();  // 1 unless fp16 loss scaling
  try {
    for (size_t a = 0; a < batches.size(); ++a) {
      if (abandon_if_preempted(a, q)) return q;
      const bool last = a + 1 == batches.size();
      const at::Tensor loss = forward(batches[a], scale, last, q);
      if (last && opts.optimizer_in_backward && !loss_finite_before_update(q)) break;  // skipped: nothing updated
      backward(loss, scale, q);
    }
  } catch (...) {
    in_bwd.open = false;
    if (host_updates) host_updates->abandon();  // no job outlives the step that handed it over
    throw;
  }
  if (opts.optimizer_in_backward) finish_in_backward(q);
  else optimizer_step(q);
  engine->after_step();
  engine->zero_grad();
  ++step;
  return q;
}

// Before micro-step a > 0 of a step, every rank votes on a stop request (SIGTERM, SIGINT, the
// preemption signal; one host all-reduce). On a stop the step is abandoned: its gradients are
// dropped and nothing was updated (masters, moments and the step count are the last complete
// step's; the sampler is a function of the step), so the run can save that state at once instead
// of finishing a long step inside the launcher's grace period (mpirun: odls_base_sigkill_timeout).
bool Trainer::Impl::abandon_if_preempted(size_t micro_step, QueuedStep& q) {
  if (micro_step == 0) return false;  // the vote after the previous step covered this moment
  {
    profile::Phase sync(profile::Part::SyncWait);
    if (!host.world->any(preemption_requested())) return false;
  }
  engine->zero_grad();
  q.abandoned = true;
  return true;
}

bool Trainer::Impl::skip_step(QueuedStep& q) {
  Impl& im = *this;
  double loss = 0, norm = 0;
  {
    profile::Phase sync(profile::Part::SyncWait);  // on a GPU: the device's queue drains here
    const at::Tensor both = device::to_host(
        at::stack({q.loss_sum.reshape({}), q.grad_norm.to(at::kDouble).reshape({})}), "step: loss and gradient norm");
    loss = both.data_ptr<double>()[0];
    norm = both.data_ptr<double>()[1];
  }
  loss /= static_cast<double>(std::max<int64_t>(q.targets, 1));
  q.loss = loss;
  q.norm = norm;
  // Every rank computed the same global values; the vote makes the decision one all the same.
  {
    profile::Phase sync(profile::Part::SyncWait);
    q.skipped = im.host.world->any(!std::isfinite(loss) || !std::isfinite(norm));
  }
  im.guard.record(im.step + 1, q.skipped, loss, norm);
  im.scaler.update(q.skipped);
  q.skipped_total = im.guard.total();
  return q.skipped;
}

StepRecord Trainer::Impl::record(const QueuedStep& q) {
  Impl& im = *this;
  const int64_t T = im.opts.seq_len, accum = im.opts.grad_accum;
  StepRecord r;
  r.step = im.step;
  r.device = device::describe(im.device);
  r.target_tokens = q.targets;
  r.loss = q.loss;  // read back by skip_step, the step's one host synchronisation
  r.grad_norm = q.norm;
  r.lr = q.lr;
  r.skipped = q.skipped;
  r.skipped_steps = q.skipped_total;
  r.overlapped_updates = q.overlapped_updates;
  r.loss_scale = im.scaler.enabled() ? q.loss_scale : 0.0;
  r.time = profile::end_step();
  r.step_time_s = seconds_since(q.t0);
  const double tokens = static_cast<double>(im.groups.world->size() * im.opts.micro_batch * accum * T);
  r.tokens_per_s = tokens / r.step_time_s;
  if (im.lm.flops_per_token) {  // model FLOP/s of all ranks over the peak of all ranks
    const double model_flops = r.tokens_per_s * im.lm.flops_per_token(T);
    const double W = static_cast<double>(im.groups.world->size());
    if (im.peak.flops > 0) r.mfu = model_flops / (im.peak.flops * W);
    if (im.gemm_flops > 0) r.mfu_of_measured_gemm = model_flops / (im.gemm_flops * W);
  }
  r.memory.tracked = memory::peak();
  r.memory.process_base = im.base_rss;
  r.memory.peak_rss = memory::peak_rss_bytes();
  im.lifetime_peak_rss = std::max(im.lifetime_peak_rss, r.memory.peak_rss);
  r.peak_rss_bytes = im.lifetime_peak_rss;
  r.peak_gpu_mem_bytes = device::peak_memory_bytes(im.device);
  return r;
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
  if (test_fault("stall-save", im.groups.world->rank(), im.step)) raise(SIGSTOP);
  auto timing = im.checkpointer->save(im.step, *im.engine, im.checkpoint_state(), im.state_json());
  im.last_checkpoint = im.checkpointer->root() + "/step-" + std::to_string(im.step);
  if (!im.opts.quiet && im.groups.world->rank() == 0) {
    char buf[160];
    snprintf(buf, sizeof(buf), "checkpoint step-%ld: loop blocked %.2fs%s", static_cast<long>(im.step),
             timing.blocked_s, im.opts.checkpoint_async ? " (writing in the background)" : "");
    std::cout << buf << std::endl;
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

namespace {

// Rank 0's account of the run: metrics.jsonl (and TensorBoard's event file), the progress line every
// log.every steps, the skipped-step warning, and at the end where a step's time went. It decides
// its own "when"; other ranks keep nothing.
class RunLog {
 public:
  RunLog(const Trainer::Impl& im, int64_t start_step) : im_(im), start_step_(start_step), t_start_(Clock::now()) {
    rank0_ = im.groups.world->rank() == 0;
    if (!rank0_ || im.opts.log_dir.empty()) return;
    const std::string path = im.opts.log_dir + "/metrics.jsonl";
    std::string why;  // appended to (a resumed run), never through a link (util/output_file.h)
    if (!metrics_.open(path, util::OutputFile::Mode::Append, why))
      throw TESSERA_INPUT_ERROR("cannot open the metrics file " + path + " for appending: " + why);
    if (im.opts.tensorboard) tensorboard_ = std::make_unique<TensorBoardWriter>(im.opts.log_dir);
  }

  void step(const StepRecord& r, bool trace_done) {
    if (!rank0_) return;
    if (metrics_.is_open()) {
      const nlohmann::json rec = record_json(r);
      metrics_.write(rec.dump() + "\n");  // one write per record: a crashed run keeps what it logged
      if (tensorboard_) tensorboard_->add_scalars(r.step, tensorboard_scalars(rec));
    }
    if (im_.opts.quiet) return;
    if (r.step % im_.opts.log_every == 0 || r.step == im_.opts.steps || r.evaluated) std::cout << progress_line(r) << std::endl;
    if (trace_done)
      std::cout << "trace of steps " << std::max(im_.opts.profile_first, start_step_ + 1) << "-" << r.step << ": "
                << im_.opts.log_dir << "/trace-rank-*.json (chrome://tracing, ui.perfetto.dev)" << std::endl;
    if (trace_done && im_.kernel_trace.written)  // else one warning saying why it was not written
      std::cout << "kernel trace of rank 0: " << im_.kernel_trace.note << std::endl;
    else if (trace_done)
      std::cerr << ("tessera: warning: " + im_.kernel_trace.note + "\n") << std::flush;
    if (r.skipped) {
      // One write of the whole line: Open MPI 5's output forwarding can cut a line written in
      // pieces and deliver a piece on the wrong stream (stderr's "tessera: warning: step " was
      // seen in front of a progress line on stdout).
      std::ostringstream w;
      w << "tessera: warning: step " << r.step << ": " << im_.guard.last_reason()
        << "; optimizer step skipped on every rank (" << im_.guard.consecutive() << " in a row, " << r.skipped_steps
        << " in total; train.max_skipped_steps " << im_.opts.max_skipped_steps << ")\n";
      std::cerr << w.str() << std::flush;
    }
  }

  // Where the time went: the median step (the first step of the run, with its warm-up, left out).
  void summary(const std::vector<StepRecord>& records) const {
    if (!rank0_ || im_.opts.quiet || records.empty()) return;
    std::vector<profile::Breakdown> times;
    for (size_t i = records.size() > 1 ? 1 : 0; i < records.size(); ++i) times.push_back(records[i].time);
    const profile::Breakdown m = profile::median(times);
    char head[96];
    snprintf(head, sizeof(head), "time per step (median of %zu, %.3f s): ", times.size(), m.step_s);
    std::cout << head << m.summary() << std::endl;
  }

 private:
  nlohmann::json record_json(const StepRecord& r) const {
    nlohmann::json rec = {{"step", r.step},
                          {"loss", r.loss},
                          {"target_tokens", r.target_tokens},
                          {"grad_norm", r.grad_norm},
                          {"lr", r.lr},
                          {"step_time_s", r.step_time_s},
                          {"tokens_per_s", r.tokens_per_s},
                          {"mfu", im_.peak.flops > 0 ? nlohmann::json(r.mfu) : nlohmann::json(nullptr)},
                          {"mfu_peak", {{"flops", im_.peak.flops}, {"source", im_.peak.source}}},
                          {"mfu_of_measured_gemm", r.mfu_of_measured_gemm},
                          {"time", r.time.to_json()},
                          {"peak_rss_bytes", r.peak_rss_bytes},
                          {"memory", r.memory.to_json()},
                          {"device", r.device},
                          {"peak_gpu_mem_bytes", r.peak_gpu_mem_bytes},
                          {"skipped", r.skipped},
                          {"skipped_steps", r.skipped_steps}};
    if (im_.scaler.enabled()) rec["loss_scale"] = r.loss_scale;
    if (im_.host_updates) rec["overlapped_updates"] = r.overlapped_updates;  // in_backward under offload
    if (r.evaluated) {
      rec["val_loss"] = r.val_loss;
      rec["val_ppl"] = std::exp(r.val_loss);
      rec["val_tokens"] = r.val_tokens;
    }
    return rec;
  }

  std::string progress_line(const StepRecord& r) const {
    const double done = static_cast<double>(r.step - start_step_);
    const double eta = seconds_since(t_start_) / done * static_cast<double>(im_.opts.steps - r.step);
    char val[64] = "";
    if (r.evaluated) snprintf(val, sizeof(val), " | val %.4f (ppl %.2f)", r.val_loss, std::exp(r.val_loss));
    // Numerics: the fp16 loss scale, and this step skipped / the run's skipped steps so far.
    char num[96] = "";
    int n = 0;
    if (im_.scaler.enabled()) n = snprintf(num, sizeof(num), " | scale %g", r.loss_scale);
    if (r.skipped)
      snprintf(num + n, sizeof(num) - n, " | step skipped (%ld in total)", static_cast<long>(r.skipped_steps));
    else if (r.skipped_steps > 0)
      snprintf(num + n, sizeof(num) - n, " | skipped %ld", static_cast<long>(r.skipped_steps));
    // mem: host peak RSS on CPU, the caching allocator's peak on a GPU.
    const int64_t mem = im_.device.is_cpu() ? r.peak_rss_bytes : r.peak_gpu_mem_bytes;
    char mfu[32] = "n/a";  // no peak known (the line at the start says why)
    if (im_.peak.flops > 0) snprintf(mfu, sizeof(mfu), "%.1f%%", 100.0 * r.mfu);
    char line[420];
    snprintf(line, sizeof(line),
             "step %ld/%ld | loss %.4f%s | gnorm %.3f%s | lr %.2e | %.0f tok/s | MFU %s | mem %.0f MiB | ETA %s",
             static_cast<long>(r.step), static_cast<long>(im_.opts.steps), r.loss, val, r.grad_norm, num, r.lr,
             r.tokens_per_s, mfu, mem / 1048576.0, format_duration(eta).c_str());
    return line;
  }

  const Trainer::Impl& im_;
  int64_t start_step_;
  Clock::time_point t_start_;
  bool rank0_ = false;
  util::OutputFile metrics_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
};

}  // namespace

// train.profile_steps: the trace starts with its first step (or the first step of a resumed run
// inside the window) and is written after its last. Returns whether step `next` ends the trace.
bool Trainer::Impl::trace_around(int64_t next, bool before) {
  const bool traced = opts.profile_last > 0 && next >= opts.profile_first && next <= opts.profile_last;
  if (before) {
    if (traced && !profile::tracing()) {
      profile::start_trace();
      profile::start_kernel_trace(device);
    }
    return false;
  }
  const bool done = traced && (next == opts.profile_last || next == opts.steps);
  const std::string rank = std::to_string(groups.world->rank());
  if (done) {
    profile::write_trace(opts.log_dir + "/trace-rank-" + rank + ".json", groups.world->rank());
    kernel_trace = profile::write_kernel_trace(opts.log_dir + "/kernels-rank-" + rank + ".json");
  }
  return done;
}

// Validation every eval.every steps and at the end (not when stopping: time is short then). Returns
// whether it found a new best validation loss.
bool Trainer::Impl::validate_if_due(Trainer& self, StepRecord& r, bool stopping) {
  if (!val || stopping || !(step == opts.steps || (opts.eval_every > 0 && step % opts.eval_every == 0))) return false;
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
  const bool periodic = opts.checkpoint_every > 0 && step % opts.checkpoint_every == 0;
  return stopping || periodic || (new_best && opts.keep_best) || step == opts.steps;
}

RunResult Trainer::run() {
  Impl& im = *impl_;
  RunResult res;
  res.start_step = im.step;
  im.peak = device::peak_flops(im.device, im.fopts.param_dtype, at::get_num_threads(), im.opts.peak_flops);
  im.gemm_flops = measure_gemm_flops(im.fopts.param_dtype, im.device);
  if (im.groups.world->rank() == 0 && !im.opts.quiet) std::cout << describe_peak(im.peak) << std::endl;
  // Rank 0 opens the run's log files (a link planted at metrics.jsonl is refused there): every rank
  // learns of it, and ends with the same line.
  std::unique_ptr<RunLog> run_log;
  throw_if_any(*im.host.world, capture_error([&] { run_log = std::make_unique<RunLog>(im, res.start_step); }));
  RunLog& log = *run_log;
  while (im.step < im.opts.steps) {
    const int64_t next = im.step + 1;
    // The step's collectives, its stop vote and validation all carry "train step" (flight recorder).
    profile::Phase train_step = profile::Phase::activity(next, "train step");
    im.trace_around(next, /*before=*/true);
    const QueuedStep q = im.queue_step();
    if (q.abandoned) {  // a stop request mid-step: the last complete step's state is saved
      res.last_checkpoint = save_abandoned(res.start_step);
      res.preempted = true;
      break;
    }
    StepRecord r = im.record(q);
    const bool trace_done = im.trace_around(next, /*before=*/false);
    if (test_fault("desync", im.host.world->rank(), im.step))  // test builds only: one rank's extra collective
      im.host.world->all_reduce(at::zeros({2}, at::kByte), comm::ReduceOp::Max)->wait();
    const bool stop = im.host.world->any(preemption_requested());  // host flag: no device sync
    const bool new_best = im.validate_if_due(*this, r, stop);
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

void Trainer::set_validation(std::shared_ptr<const data::TokenDataset> val) { impl_->val = std::move(val); }

Trainer::EvalResult Trainer::evaluate() {
  Impl& im = *impl_;
  TESSERA_CHECK(im.val, "evaluate() needs a validation set");
  torch::NoGradGuard no_grad;
  fsdp::Engine& eng = *im.engine;
  const int64_t W = im.groups.world->size(), rank = im.groups.world->rank(), m = im.opts.micro_batch;
  const int64_t rows = im.val->num_sequences();
  const int64_t passes = ((rows + W - 1) / W + m - 1) / m;  // the same on every rank
  at::Tensor sums = at::zeros({2}, at::TensorOptions().dtype(at::kDouble).device(im.device));  // loss, targets
  for (int64_t p = 0; p < passes; ++p) {
    std::vector<int64_t> idx;
    for (int64_t i = 0; i < m; ++i)
      if (const int64_t j = (p * m + i) * W + rank; j < rows) idx.push_back(j);
    const bool filler = idx.empty();  // this rank has no rows left but must join the forward
    if (filler) idx.push_back(0);
    data::Batch b = im.val->batch(idx);
    if (filler) {
      b.labels.fill_(data::Batch::kIgnore);
      b.targets = 0;
    }
    eng.begin_forward(true);
    at::Tensor loss = im.summed_loss(b);
    eng.reshard_all();
    sums[0] += loss.to(at::kDouble);
    sums[1] += static_cast<double>(b.targets);
  }
  im.groups.world->all_reduce(sums, comm::ReduceOp::Sum)->wait();
  at::Tensor host = sums.cpu();
  const double targets = host.data_ptr<double>()[1];
  return {host.data_ptr<double>()[0] / std::max(targets, 1.0), static_cast<int64_t>(targets)};
}

std::vector<double> Trainer::sequence_losses(const at::Tensor& tokens) {
  Impl& im = *impl_;
  torch::NoGradGuard no_grad;
  memory::Scope scope(memory::Category::Activations);
  profile::Phase forward = profile::Phase::label("forward (no grad)");
  fsdp::Engine& eng = *im.engine;
  if (im.lm.set_layout) im.lm.set_layout({});  // plain rows
  eng.begin_forward(true);
  at::Tensor h = im.lm.embed(tokens.to(im.device));
  for (int64_t i = 0; i < eng.num_layers(); ++i) h = eng.run_layer(i, h);
  at::Tensor logits = im.lm.head(h).to(at::kFloat).cpu();
  eng.reshard_all();
  const int64_t B = tokens.size(0), T = tokens.size(1);
  std::vector<double> out;
  for (int64_t b = 0; b < B; ++b) {
    at::Tensor lb = logits[b].narrow(0, 0, T - 1), tb = tokens[b].narrow(0, 1, T - 1);
    out.push_back(torch::nn::functional::cross_entropy(lb, tb).item<double>());
  }
  return out;
}

}  // namespace tessera::train
