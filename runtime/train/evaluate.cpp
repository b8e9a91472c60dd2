// Forward only, FSDP-sharded (trainer_impl.h): the validation loss and per-sequence losses.
#include <algorithm>

#include "runtime/memory/tracker.h"
#include "runtime/profile/phase.h"
#include "runtime/train/trainer_impl.h"
#include "util/error.h"

namespace tessera::train {

Trainer::EvalResult Trainer::evaluate() {
  Impl& im = *impl_;
  TESSERA_CHECK(im.val, "evaluate() needs a validation set");
  torch::NoGradGuard no_grad;
  EvalMode eval_mode(im.lm);
  fsdp::Engine& eng = *im.engine;
  const int64_t W = im.groups.world->size(), rank = im.groups.world->rank(), m = im.cfg.train.micro_batch;
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
  EvalMode eval_mode(im.lm);
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
