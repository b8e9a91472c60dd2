#include "runtime/train/run_log.h"

#include <cmath>
#include <cstdio>
#include <sstream>

#include "runtime/train/tensorboard.h"
#include "runtime/train/trainer_impl.h"
#include "util/error.h"
#include "util/output_file.h"

namespace tessera::train {

namespace {

std::string format_duration(double s) {
  char buf[64];
  int64_t t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) snprintf(buf, sizeof(buf), "%ldh%02ldm", t / 3600, (t % 3600) / 60);
  else if (t >= 60) snprintf(buf, sizeof(buf), "%ldm%02lds", t / 60, t % 60);
  else snprintf(buf, sizeof(buf), "%lds", t);
  return buf;
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
// Rank 0's account of the run: metrics.jsonl (and TensorBoard's event file), the progress line every
// log.every steps, the skipped-step warning, and at the end where a step's time went. It decides
// its own "when"; other ranks keep nothing.
class RankZeroLog : public RunLog {
 public:
  RankZeroLog(const Trainer::Impl& im, int64_t start_step) : im_(im), start_step_(start_step), t_start_(Clock::now()) {
    rank0_ = im.groups.world->rank() == 0;
    if (rank0_ && im.console.out) im.console.out(describe_peak(im.peak));
    if (!rank0_ || im.cfg.log_dir().empty()) return;
    const std::string path = im.cfg.log_dir() + "/metrics.jsonl";
    std::string why;  // appended to (a resumed run), never through a link (util/output_file.h)
    if (!metrics_.open(path, util::OutputFile::Mode::Append, why))
      throw TESSERA_INPUT_ERROR("cannot open the metrics file " + path + " for appending: " + why);
    if (im.cfg.log.tensorboard) tensorboard_ = std::make_unique<TensorBoardWriter>(im.cfg.log_dir());
  }

  void step(const StepRecord& r, bool trace_done) override {
    if (!rank0_) return;
    if (metrics_.is_open()) {
      const nlohmann::json rec = record_json(r);
      metrics_.write(rec.dump() + "\n");  // one write per record: a crashed run keeps what it logged
      if (tensorboard_) tensorboard_->add_scalars(r.step, tensorboard_scalars(rec));
    }
    const Console& c = im_.console;
    if (!c.out) return;
    if (r.step % im_.cfg.log.every == 0 || r.step == im_.cfg.train.steps || r.evaluated) c.out(progress_line(r));
    if (trace_done)
      c.out("trace of steps " + std::to_string(std::max(im_.cfg.train.profile_steps.at(0), start_step_ + 1)) + "-" +
            std::to_string(r.step) + ": " + im_.cfg.log_dir() + "/trace-rank-*.json (chrome://tracing, ui.perfetto.dev)");
    if (trace_done && im_.kernel_trace.written)  // else one warning saying why it was not written
      c.out("kernel trace of rank 0: " + im_.kernel_trace.note);
    else if (trace_done && c.warn)
      c.warn(im_.kernel_trace.note);
    if (r.skipped) {
      std::ostringstream w;
      w << "step " << r.step << ": " << im_.guard.last_reason()
        << "; optimizer step skipped on every rank (" << im_.guard.consecutive() << " in a row, " << r.skipped_steps
        << " in total; train.max_skipped_steps " << im_.cfg.train.max_skipped_steps << ")";
      if (c.warn) c.warn(w.str());
    }
  }

  // Where the time went: the median step (the first step of the run, with its warm-up, left out).
  void summary(const std::vector<StepRecord>& records) const override {
    if (!rank0_ || !im_.console.out || records.empty()) return;
    std::vector<profile::Breakdown> times;
    for (size_t i = records.size() > 1 ? 1 : 0; i < records.size(); ++i) times.push_back(records[i].time);
    const profile::Breakdown m = profile::median(times);
    char head[96];
    snprintf(head, sizeof(head), "time per step (median of %zu, %.3f s): ", times.size(), m.step_s);
    im_.console.out(head + m.summary());
    double paused = 0;
    int64_t pauses = 0;
    for (const StepRecord& r : records) paused += r.sample_s, pauses += r.sample_s > 0;
    if (pauses == 0) return;
    char line[160];
    snprintf(line, sizeof(line), "samples (train.sample_every): %lld pause(s), %.2f s in all, outside the step times above",
             static_cast<long long>(pauses), paused);
    im_.console.out(line);
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
    if (r.sample_s > 0) rec["sample_s"] = r.sample_s;  // train.sample_every's pause after the step
    if (r.evaluated) {
      rec["val_loss"] = r.val_loss;
      rec["val_ppl"] = std::exp(r.val_loss);
      rec["val_tokens"] = r.val_tokens;
    }
    return rec;
  }

  std::string progress_line(const StepRecord& r) const {
    const double done = static_cast<double>(r.step - start_step_);
    const double eta = seconds_since(t_start_) / done * static_cast<double>(im_.cfg.train.steps - r.step);
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
             static_cast<long>(r.step), static_cast<long>(im_.cfg.train.steps), r.loss, val, r.grad_norm, num, r.lr,
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

std::unique_ptr<RunLog> open_run_log(const Trainer::Impl& im, int64_t start_step) {
  return std::make_unique<RankZeroLog>(im, start_step);
}

}  // namespace tessera::train
