// One optimizer step (trainer_impl.h): the micro-batches' forward and backward, the optimizer after
// backward or in it (optim.in_backward), the numerics guard, and the step's record.
#include <ATen/Context.h>

#include <cmath>
#include <limits>

#include "runtime/comm/agree.h"
#include "runtime/device/device.h"
#include "runtime/memory/tracker.h"
#include "runtime/optim/clip.h"
#include "runtime/optim/schedule.h"
#include "runtime/profile/phase.h"
#include "runtime/train/preemption.h"
#include "runtime/train/trainer_impl.h"
#include "util/error.h"

namespace tessera::train {

at::Tensor Trainer::Impl::summed_loss(const data::Batch& b, double grad_scale) {
  set_layout(b);
  fsdp::Engine& eng = *engine;
  at::Tensor h = lm.embed(device::to_device(b.inputs, device));
  for (int64_t i = 0; i < eng.num_layers(); ++i) h = eng.run_layer(i, h);
  profile::Phase head = profile::Phase::label("head and loss");
  return lm.head_loss(h, device::to_device(b.labels, device), grad_scale, cfg.train.device_step);
}

// The step's micro-batches, and the number of target tokens they hold on all ranks (one host
// all-reduce per step): the loss is the mean over these, whatever their split between micro-batches.
Batches Trainer::Impl::next_batches() {
  profile::Phase data_part(profile::Part::Data);
  Batches b;
  at::Tensor count = at::zeros({1}, at::kLong);
  for (int64_t a = 0; a < cfg.train.grad_accum; ++a) {
    b.list.push_back(dataset->batch(sampler->micro_batch(step, static_cast<int>(a))));
    count.data_ptr<int64_t>()[0] += b.list.back().targets;
  }
  {
    profile::Phase sync(profile::Part::SyncWait);
    host.world->all_reduce(count, comm::ReduceOp::Sum)->wait();
  }
  b.targets = count.data_ptr<int64_t>()[0];
  return b;
}

// A random layer (fsdp::Options::preserve_rng: LoRA's dropout) draws from the device's default
// generator, seeded before each micro-batch from (train.seed, step, micro-batch, world rank): the
// same masks whatever ran before, so a resumed run draws what the run that never stopped drew.
void Trainer::Impl::seed_layer_rng(int64_t micro) {
  if (!engine->options().preserve_rng) return;
  uint64_t z = static_cast<uint64_t>(cfg.train.seed) * 0x9E3779B97F4A7C15ULL;
  for (int64_t v : {step, micro, static_cast<int64_t>(groups.world->rank())}) {
    z = (z ^ static_cast<uint64_t>(v)) * 0xBF58476D1CE4E5B9ULL;
    z ^= z >> 31;
  }
  at::Generator gen = at::globalContext().defaultGenerator(device);  // a handle to the device's generator
  gen.set_current_seed(z);
}

// Forward of one micro-batch: it will backpropagate its summed loss x W / N (the engine averages
// gradients over the W data-parallel ranks), so the step's gradient is exactly that of the mean
// loss over its N targets. The logits (B x T x vocab) are not kept: autograd keeps what it needs.
at::Tensor Trainer::Impl::forward(const data::Batch& b, double factor, bool last) {
  at::Tensor loss;
  {
    memory::Scope scope(memory::Category::Activations);
    profile::Phase forward(profile::Part::Forward);
    engine->begin_forward(/*sync=*/last);
    loss = summed_loss(b, factor);
  }
  memory::retag_all(memory::Category::Activations, memory::Category::SavedTensors);
  return loss;
}

// Its backward: the gradient shards accumulate in the engine (and, with optim.in_backward, the
// last micro-step's update each unit as its shard is final).
void Trainer::Impl::backward(const at::Tensor& loss, double factor) {
  {
    memory::Scope scope(memory::Category::Activations);
    profile::Phase backward(profile::Part::Backward);
    (loss * factor).backward();
  }
  profile::Phase backward(profile::Part::Backward);  // the root's gradient; the drain is reduce_wait
  engine->finish_backward();
}

// The optimizer's part: unscale, norm and clipping, the loss all-reduce, then AdamW unless the
// numerics guard skips the step on every rank (masters and moments stay, the step count too).
// Where the optimizer skips by itself (the fused kernel on a GPU, the CPU loop), the update is
// enqueued first with a device-side flag (a non-finite loss or norm) and the loss and norm are read
// back after it: no host wait before the update. Elsewhere (the tensor-op path) they are read first.
Verdict Trainer::Impl::optimizer_step(const at::Tensor& loss_sum, int64_t targets) {
  memory::Scope opt_scope(memory::Category::Optimizer);
  profile::Phase optimizer(profile::Part::Optimizer);
  const optim::ShardView view = engine->optimizer_view();
  scaler.unscale(view.grads());  // before the norm and clipping see them
  const optim::Clipped clipped = optim::clip(view, cfg.optim.clip, *adamw);
  {
    profile::Phase sync(profile::Part::SyncWait);
    groups.world->all_reduce(loss_sum, comm::ReduceOp::Sum)->wait();
  }
  const double lr = optim::lr_at(step, cfg.schedule, cfg.train.steps);
  if (!adamw->skips_itself(view.shards, loss_sum.device())) {
    Verdict v = agree_on_step(loss_sum, clipped.norm, targets);
    v.lr = lr;
    if (!v.skipped) adamw->step(view.shards, v.lr, clipped.grad_scale, at::Tensor(), clipped.device_scale);
    return v;
  }
  const int64_t before = adamw->step_count();
  // 1 where the loss or the norm is not finite: their sum is then inf or nan (both are doubles that
  // no finite pair overflows).
  const at::Tensor found_inf = at::isfinite(loss_sum + clipped.norm).logical_not().to(at::kFloat);
  adamw->step(view.shards, lr, clipped.grad_scale, found_inf, clipped.device_scale);
  Verdict v = agree_on_step(loss_sum, clipped.norm, targets);
  v.lr = lr;
  // The flag is a function of globally reduced values, so every rank's optimizer decided as the vote.
  TESSERA_CHECK(v.skipped == !(std::isfinite(v.loss) && std::isfinite(v.norm)),
                "step " + std::to_string(step + 1) + ": ranks disagree on a non-finite loss or norm after the update");
  if (v.skipped) adamw->set_step_count(before);  // the device kept the masters and moments
  return v;
}

// optim.in_backward, before the last backward: the step's loss on every rank (the step's first
// host sync); a non-finite one skips the step before any unit is updated (numerics.h), else the
// engine's hook updates each unit in the backward that follows.
Verdict Trainer::Impl::open_in_backward(const at::Tensor& loss_sum, int64_t targets) {
  {
    profile::Phase sync(profile::Part::SyncWait);
    groups.world->all_reduce(loss_sum, comm::ReduceOp::Sum)->wait();
  }
  const double loss = device::to_host(loss_sum, "step: loss").data_ptr<double>()[0];
  Verdict v;
  v.loss = loss / static_cast<double>(std::max<int64_t>(targets, 1));
  {
    profile::Phase sync(profile::Part::SyncWait);
    v.skipped = host.world->any(!std::isfinite(loss));
  }
  v.lr = optim::lr_at(step, cfg.schedule, cfg.train.steps);
  in_bwd = {!v.skipped, adamw->step_count(), v.lr, {}};
  if (host_updates) host_updates->begin(held_for_test(groups.world->rank(), step + 1));
  return v;
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
Verdict Trainer::Impl::finish_in_backward(Verdict v, const at::Tensor& loss_sum) {
  in_bwd.open = false;
  if (host_updates) {
    profile::Phase optimizer(profile::Part::Optimizer);  // the host's updates still running after backward
    host_updates->drain();  // a job's exception surfaces here, on this thread
    v.overlapped_updates = host_updates->overlapped();
  }
  double norm = 0;
  if (!v.skipped) {
    const at::Tensor local = in_bwd.square_sums.empty() ? at::zeros({1}, loss_sum.options())
                                                        : at::cat(in_bwd.square_sums).sum().reshape({1});
    const at::Tensor partials = optim::gather_partials(local, &engine->shard_group());
    profile::Phase sync(profile::Part::SyncWait);
    norm = device::to_host(partials.sum().sqrt(), "step: gradient norm").item<double>();
  }
  in_bwd.square_sums.clear();
  v.norm = v.skipped ? std::numeric_limits<double>::quiet_NaN() : norm;
  guard.record(step + 1, v.skipped, v.loss, v.norm);
  v.skipped_total = guard.total();
  if (v.skipped) return v;
  if (!std::isfinite(norm))
    throw CollectiveError(ErrorKind::Input,
                          "step " + std::to_string(step + 1) + ": non-finite gradient norm with optim.in_backward: units were "
                          "already updated, so the step cannot be skipped; the run stops here without saving" +
                              (last_checkpoint.empty() ? std::string() : "; resume from " + last_checkpoint));
  adamw->set_step_count(in_bwd.step_count + 1);
  return v;
}

// One training step, queued: the device may still be running it when this returns (record() reads
// its results; agree_on_step is its one host synchronisation).
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
  const Batches batches = next_batches();
  q.targets = batches.targets;
  q.loss_scale = scaler.scale();  // 1 unless fp16 loss scaling
  const double factor = static_cast<double>(groups.world->size()) / static_cast<double>(std::max<int64_t>(q.targets, 1)) *
                        q.loss_scale;
  const at::Tensor loss_sum = at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(device));
  Verdict opened;  // optim.in_backward: what open_in_backward agreed before the last backward
  try {
    for (size_t a = 0; a < batches.list.size(); ++a) {
      if (stop_requested_mid_step(a)) {
        q.abandoned = true;
        return q;
      }
      const bool last = a + 1 == batches.list.size();
      seed_layer_rng(static_cast<int64_t>(a));
      const at::Tensor loss = forward(batches.list[a], factor, last);
      loss_sum.add_(loss.detach().to(at::kDouble));
      if (last && cfg.optim.in_backward) {
        opened = open_in_backward(loss_sum, q.targets);
        if (opened.skipped) break;  // nothing updated
      }
      backward(loss, factor);
    }
  } catch (...) {
    in_bwd.open = false;
    if (host_updates) host_updates->abandon();  // no job outlives the step that handed it over
    throw;
  }
  q.verdict = cfg.optim.in_backward ? finish_in_backward(opened, loss_sum) : optimizer_step(loss_sum, q.targets);
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
bool Trainer::Impl::stop_requested_mid_step(size_t micro_step) {
  if (micro_step == 0) return false;  // the vote after the previous step covered this moment
  {
    profile::Phase sync(profile::Part::SyncWait);
    if (!host.world->any(preemption_requested())) return false;
  }
  engine->zero_grad();
  return true;
}

// The step's one host synchronisation (on a GPU the device's queue drains here), then the numerics
// guard's vote: every rank computed the same global values, and the vote makes the decision one all
// the same. The guard and the fp16 loss scaler learn the outcome.
Verdict Trainer::Impl::agree_on_step(const at::Tensor& loss_sum, const at::Tensor& grad_norm, int64_t targets) {
  Verdict v;
  {
    profile::Phase sync(profile::Part::SyncWait);
    const at::Tensor both = device::to_host(at::stack({loss_sum.reshape({}), grad_norm.to(at::kDouble).reshape({})}),
                                            "step: loss and gradient norm");
    v.loss = both.data_ptr<double>()[0] / static_cast<double>(std::max<int64_t>(targets, 1));
    v.norm = both.data_ptr<double>()[1];
  }
  {
    profile::Phase sync(profile::Part::SyncWait);
    v.skipped = host.world->any(!std::isfinite(v.loss) || !std::isfinite(v.norm));
  }
  guard.record(step + 1, v.skipped, v.loss, v.norm);
  scaler.update(v.skipped);
  v.skipped_total = guard.total();
  return v;
}

StepRecord Trainer::Impl::record(const QueuedStep& q) {
  Impl& im = *this;
  const int64_t T = im.dataset->seq_len(), accum = im.cfg.train.grad_accum;
  StepRecord r;
  r.step = im.step;
  r.device = device::describe(im.device);
  r.target_tokens = q.targets;
  r.loss = q.verdict.loss;  // read back by agree_on_step, the step's one host synchronisation
  r.grad_norm = q.verdict.norm;
  r.lr = q.verdict.lr;
  r.skipped = q.verdict.skipped;
  r.skipped_steps = q.verdict.skipped_total;
  r.overlapped_updates = q.verdict.overlapped_updates;
  r.loss_scale = im.scaler.enabled() ? q.loss_scale : 0.0;
  r.time = profile::end_step();
  r.step_time_s = seconds_since(q.t0);
  const double tokens = static_cast<double>(im.groups.world->size() * im.cfg.train.micro_batch * accum * T);
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

}  // namespace tessera::train
