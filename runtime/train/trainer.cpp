#include "runtime/train/trainer.h"

#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <limits>

#include "runtime/checkpoint/checkpoint.h"
#include "runtime/comm/flight_recorder.h"
#include "runtime/data/dataset.h"
#include "runtime/data/sampler.h"
#include "runtime/device/device.h"
#include "runtime/error.h"
#include "runtime/optim/adamw.h"
#include "runtime/optim/clip.h"
#include "runtime/optim/schedule.h"
#include "runtime/train/test_fault.h"

namespace tessera::train {

// ---- signals ---------------------------------------------------------------------------------
namespace {
std::atomic<bool> g_preempt{false};
extern "C" void on_preempt_signal(int) { g_preempt.store(true); }

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

// Matmul throughput of this rank in the compute dtype on its device, measured once (the MFU
// denominator of the metrics; tests/gpu compares against the GPU's published peak instead).
double measure_peak_flops(at::ScalarType dtype, at::Device device) {
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
}  // namespace

void install_preemption_handlers(int preempt_signal) {
  struct sigaction sa {};
  sa.sa_handler = on_preempt_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  if (preempt_signal > 0) sigaction(preempt_signal, &sa, nullptr);
}
bool preemption_requested() { return g_preempt.load(); }

int64_t peak_rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return 0;
}

// ---- trainer ---------------------------------------------------------------------------------
// One optimizer step as queued: what is needed to turn it into a StepRecord.
struct QueuedStep {
  Clock::time_point t0;
  at::Tensor loss_sum;   // [1] double on the device: sum over the world of each rank's mean loss
  at::Tensor grad_norm;  // 0-dim double on the device
  double lr = 0;
};

struct Trainer::Impl {
  CausalLm lm;
  comm::ProcessGroups groups;  // the engine's (device) communicators
  comm::ProcessGroups host;    // MPI/self communicators over the same ranks
  at::Device device = at::kCPU;
  fsdp::Options fopts;
  TrainOptions opts;
  std::shared_ptr<const data::TokenDataset> dataset;
  nlohmann::json run_state;
  std::unique_ptr<fsdp::Engine> engine;
  std::unique_ptr<optim::AdamW> adamw;
  std::unique_ptr<data::DistributedSampler> sampler;
  optim::LrSchedule schedule;
  std::unique_ptr<checkpoint::Checkpointer> checkpointer;
  int64_t step = 0;
  double peak_flops = 0;

  nlohmann::json state_json() const {
    nlohmann::json s = run_state;
    s["step"] = step;
    s["sampler"] = sampler ? sampler->state() : nlohmann::json(nullptr);
    s["optimizer"] = {{"step_count", adamw->step_count()}};
    s["rng"] = {{"data_seed", opts.seed}};
    s["strategy"] = fsdp::to_string(fopts.strategy);
    s["world_size"] = groups.world->size();
    return s;
  }

  QueuedStep queue_step();
  StepRecord record(const QueuedStep& q, bool materialise);
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
  im.fopts = fsdp_opts;
  im.opts = opts;
  im.dataset = std::move(dataset);
  im.run_state = std::move(run_state);
  im.engine = std::make_unique<fsdp::Engine>(im.lm.units, im.lm.layer, groups, fsdp_opts, im.lm.decay);
  optim::AdamWOptions ao;
  ao.lr = opts.lr;
  ao.beta1 = opts.beta1;
  ao.beta2 = opts.beta2;
  ao.eps = opts.eps;
  ao.weight_decay = opts.weight_decay;
  im.adamw = std::make_unique<optim::AdamW>(ao);
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

Trainer::~Trainer() = default;

fsdp::Engine& Trainer::engine() { return *impl_->engine; }
int64_t Trainer::step() const { return impl_->step; }

void Trainer::load_weights(fsdp::WeightSource& source) { load_weights(&source, fsdp::LoadMode::Parallel); }

void Trainer::load_weights(fsdp::WeightSource* source, fsdp::LoadMode mode) {
  comm::flight::set_context(impl_->step, "weight load");
  fsdp::load_weights(*impl_->engine, source, mode, &impl_->host);
}

int64_t Trainer::resume(const std::string& ckpt_dir) {
  Impl& im = *impl_;
  comm::flight::set_context(-1, "checkpoint load");
  if (test_fault("stall-load", im.groups.world->rank(), -1)) raise(SIGSTOP);
  nlohmann::json s = checkpoint::load(ckpt_dir, *im.engine);
  im.step = s.at("step").get<int64_t>();
  // This run continues from ckpt_dir: `auto` must resume it from there (or from its own later
  // saves), never from newer checkpoints of the run it rolled back (checkpoint.h, begin_lineage).
  if (im.checkpointer) im.checkpointer->begin_lineage(im.step, ckpt_dir);
  im.adamw->set_step_count(s.at("optimizer").at("step_count").get<int64_t>());
  if (im.sampler && s.contains("sampler") && !s["sampler"].is_null()) {
    // The sampler's position is the step; a different world size re-slices the same global batches.
    im.sampler->set_step(im.step);
  }
  return im.step;
}

QueuedStep Trainer::Impl::queue_step() {
  Impl& im = *this;
  TESSERA_CHECK(im.sampler, "training needs a dataset");
  QueuedStep q;
  q.t0 = Clock::now();
  comm::flight::set_context(im.step + 1, "train step");  // the step being computed, as logged
  fsdp::Engine& eng = *im.engine;
  const int64_t T = im.opts.seq_len, accum = im.opts.grad_accum;
  // This rank's mean loss, accumulated on the device (no host sync per micro-step).
  q.loss_sum = at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(im.device));
  for (int64_t a = 0; a < accum; ++a) {
    at::Tensor batch = im.dataset->batch(im.sampler->micro_batch(im.step, static_cast<int>(a))).to(im.device);
    at::Tensor inputs = batch.narrow(1, 0, T), targets = batch.narrow(1, 1, T);
    eng.begin_forward(/*sync=*/a == accum - 1);
    at::Tensor h = im.lm.embed(inputs);
    for (int64_t i = 0; i < eng.num_layers(); ++i) h = eng.run_layer(i, h);
    at::Tensor logits = im.lm.head(h);
    at::Tensor loss = torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}).to(at::kFloat),
                                                           targets.reshape({-1}));
    (loss / static_cast<double>(accum)).backward();
    eng.finish_backward();
    q.loss_sum.add_(loss.detach().to(at::kDouble).div(static_cast<double>(accum)));
  }
  std::vector<at::Tensor> grads;
  for (auto& sh : eng.shards()) grads.push_back(sh.grad);
  if (im.device.is_cpu())  // host-side norm and clipping (the device form would only add tensor ops)
    q.grad_norm = at::scalar_tensor(im.opts.clip > 0 ? optim::clip_grad_norm(grads, im.opts.clip, &eng.shard_group())
                                                     : optim::global_grad_norm(grads, &eng.shard_group()),
                                    at::kDouble);
  else
    q.grad_norm = optim::clip_grad_norm_on_device(grads, im.opts.clip, &eng.shard_group());
  q.lr = optim::lr_at(im.step, im.schedule);
  std::vector<optim::ShardState> states;
  for (auto& sh : eng.shards()) states.push_back({sh.master, sh.grad, sh.exp_avg, sh.exp_avg_sq, sh.decay_mask});
  std::vector<optim::ShardState*> ptrs;
  for (auto& s : states) ptrs.push_back(&s);
  im.adamw->step(ptrs, q.lr);
  eng.after_step();
  eng.zero_grad();
  ++im.step;

  im.groups.world->all_reduce(q.loss_sum, comm::ReduceOp::Sum)->wait();
  return q;
}

StepRecord Trainer::Impl::record(const QueuedStep& q, bool materialise) {
  Impl& im = *this;
  const int64_t T = im.opts.seq_len, accum = im.opts.grad_accum;
  StepRecord r;
  r.step = im.step;
  r.device = device::describe(im.device);
  r.materialised = materialise || im.device.is_cpu();
  if (r.materialised) {  // on a device: the one host synchronisation of the step
    r.loss = q.loss_sum.item<double>() / im.groups.world->size();
    r.grad_norm = q.grad_norm.item<double>();
  } else {
    r.loss = r.grad_norm = std::numeric_limits<double>::quiet_NaN();
  }
  r.lr = q.lr;
  r.step_time_s = seconds_since(q.t0);
  const double tokens = static_cast<double>(im.groups.world->size() * im.opts.micro_batch * accum * T);
  r.tokens_per_s = tokens / r.step_time_s;
  if (im.peak_flops > 0 && im.lm.flops_per_token)
    r.mfu = r.tokens_per_s * im.lm.flops_per_token(T) / (im.peak_flops * im.groups.world->size());
  r.peak_rss_bytes = peak_rss_bytes();
  r.peak_gpu_mem_bytes = device::peak_memory_bytes(im.device);
  return r;
}

StepRecord Trainer::train_step() { return impl_->record(impl_->queue_step(), /*materialise=*/true); }

std::string Trainer::save_checkpoint() {
  Impl& im = *impl_;
  TESSERA_CHECK(im.checkpointer, "checkpoint.dir is not set");
  comm::flight::set_context(im.step, "checkpoint save");
  if (test_fault("stall-save", im.groups.world->rank(), im.step)) raise(SIGSTOP);
  auto timing = im.checkpointer->save(im.step, *im.engine, im.state_json());
  if (!im.opts.quiet && im.groups.world->rank() == 0) {
    char buf[160];
    snprintf(buf, sizeof(buf), "checkpoint step-%ld: loop blocked %.2fs%s", static_cast<long>(im.step),
             timing.blocked_s, im.opts.checkpoint_async ? " (writing in the background)" : "");
    std::cout << buf << std::endl;
  }
  return im.checkpointer->root() + "/step-" + std::to_string(im.step);
}

RunResult Trainer::run() {
  Impl& im = *impl_;
  const bool rank0 = im.groups.world->rank() == 0;
  RunResult res;
  res.start_step = im.step;
  im.peak_flops = measure_peak_flops(im.fopts.param_dtype, im.device);
  std::ofstream metrics;
  if (rank0 && !im.opts.log_dir.empty()) {
    std::string path = im.opts.log_dir + "/metrics.jsonl";
    metrics.open(path, std::ios::app);
    if (!metrics) throw TESSERA_INPUT_ERROR(path + ": cannot open metrics file for writing");
  }
  auto t_start = Clock::now();
  while (im.step < im.opts.steps) {
    // Only a logged record is read back from the device (CPU records always are).
    const int64_t next = im.step + 1;
    const bool progress_due = rank0 && !im.opts.quiet && (next % im.opts.log_every == 0 || next == im.opts.steps);
    const bool read_back = metrics.is_open() || progress_due || next == res.start_step + 1 || next == im.opts.steps;
    StepRecord r = impl_->record(impl_->queue_step(), read_back);
    res.records.push_back(r);
    if (rank0) {
      if (metrics.is_open()) {
        metrics << nlohmann::json{{"step", r.step},
                                  {"loss", r.loss},
                                  {"grad_norm", r.grad_norm},
                                  {"lr", r.lr},
                                  {"step_time_s", r.step_time_s},
                                  {"tokens_per_s", r.tokens_per_s},
                                  {"mfu", r.mfu},
                                  {"peak_rss_bytes", r.peak_rss_bytes},
                                  {"device", r.device},
                                  {"peak_gpu_mem_bytes", r.peak_gpu_mem_bytes}}
                       .dump()
                << "\n";
        metrics.flush();
      }
      if (!im.opts.quiet && (r.step % im.opts.log_every == 0 || r.step == im.opts.steps)) {
        double done = static_cast<double>(r.step - res.start_step);
        double eta = seconds_since(t_start) / done * static_cast<double>(im.opts.steps - r.step);
        char line[256];
        // mem: host peak RSS on CPU, the caching allocator's peak on a GPU.
        const int64_t mem = im.device.is_cpu() ? r.peak_rss_bytes : r.peak_gpu_mem_bytes;
        snprintf(line, sizeof(line),
                 "step %ld/%ld | loss %.4f | gnorm %.3f | lr %.2e | %.0f tok/s | MFU %.1f%% | mem %.0f MiB | ETA %s",
                 static_cast<long>(r.step), static_cast<long>(im.opts.steps), r.loss, r.grad_norm, r.lr,
                 r.tokens_per_s, 100.0 * r.mfu, mem / 1048576.0, format_duration(eta).c_str());
        std::cout << line << std::endl;
      }
    }
    if (test_fault("desync", im.host.world->rank(), im.step))  // test builds only: one rank's extra collective
      im.host.world->all_reduce(at::zeros({2}, at::kByte), comm::ReduceOp::Max)->wait();
    const bool stop = im.host.world->any(preemption_requested());  // host flag: no device sync
    const bool periodic = im.opts.checkpoint_every > 0 && im.step % im.opts.checkpoint_every == 0;
    if (im.checkpointer && (stop || periodic || im.step == im.opts.steps)) res.last_checkpoint = save_checkpoint();
    if (stop) {
      res.preempted = true;
      break;
    }
  }
  if (im.checkpointer) im.checkpointer->wait();
  res.end_step = im.step;
  return res;
}

std::vector<double> Trainer::sequence_losses(const at::Tensor& tokens) {
  Impl& im = *impl_;
  torch::NoGradGuard no_grad;
  fsdp::Engine& eng = *im.engine;
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
