#include "runtime/comm/staged.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <mutex>
#include <utility>

#include "runtime/comm/collective_checks.h"
#include "util/error.h"

namespace tessera::comm {

namespace {

// A host buffer for the result that goes into `t` (pinned when t is on a GPU).
at::Tensor host_like(const at::Tensor& t) {
  return at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(t.is_cuda()));
}
// `t` copied into a fresh host buffer; undefined stays undefined.
at::Tensor to_host(const at::Tensor& t) { return t.defined() ? host_like(t).copy_(t) : t; }

using CopyBack = std::vector<std::pair<at::Tensor, at::Tensor>>;  // (device output, its host result)

class StagedWork final : public Work {
 public:
  StagedWork(WorkPtr inner, CopyBack back, std::vector<at::Tensor> keep)
      : inner_(std::move(inner)), back_(std::move(back)), keep_(std::move(keep)) {
    for (const auto& b : back_) outputs_.push_back(b.first);
  }
  // The device outputs it writes when waited for (kept after: for the issue-time hazard check).
  const std::vector<at::Tensor>& outputs() const { return outputs_; }
  void wait(std::chrono::milliseconds timeout) override {
    inner_->wait(timeout);
    std::lock_guard<std::mutex> lock(m_);
    at::NoGradGuard no_grad;
    for (auto& [dst, src] : back_) dst.copy_(src);
    back_.clear();
    keep_.clear();
  }
  bool is_completed() override {
    std::lock_guard<std::mutex> lock(m_);
    return back_.empty() && inner_->is_completed();  // complete once its results are in place
  }

 private:
  WorkPtr inner_;
  std::mutex m_;
  CopyBack back_;
  std::vector<at::Tensor> outputs_;
  std::vector<at::Tensor> keep_;  // the host inputs, alive until the host operation is done
};

class StagedCommunicator final : public Communicator {
 public:
  StagedCommunicator(CommPtr host, at::Device device) : host_(std::move(host)), device_(device) {
    TESSERA_CHECK(host_ && host_->device().is_cpu(), "a staged communicator needs a host communicator");
  }
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  std::string backend() const override { return "staged"; }
  std::string name() const override { return host_->name(); }
  at::Device device() const override { return device_; }

  // Each operation checks its arguments as the host communicator would (before staging makes them
  // contiguous copies), and first completes every earlier operation whose results it reads or
  // writes (an operation may consume the one before it without a wait in between).
  WorkPtr all_gather_into(at::Tensor out, at::Tensor in) override {
    detail::check_all_gather(out, in, size(), where("all_gather"));
    after_pending({out, in});
    at::Tensor h_out = host_like(out), h_in = to_host(in);
    return staged(host_->all_gather_into(h_out, h_in), {{out, h_out}}, {h_in});
  }
  WorkPtr reduce_scatter_into(at::Tensor out, at::Tensor in, ReduceOp op) override {
    detail::check_reduce_scatter(out, in, op, size(), where("reduce_scatter"));
    after_pending({out, in});
    at::Tensor h_out = host_like(out), h_in = to_host(in);
    return staged(host_->reduce_scatter_into(h_out, h_in, op), {{out, h_out}}, {h_in});
  }
  WorkPtr all_reduce(at::Tensor t, ReduceOp op) override {
    detail::check_reducible(t, op, where("all_reduce"));
    after_pending({t});
    at::Tensor h = to_host(t);
    return staged(host_->all_reduce(h, op), {{t, h}}, {});
  }
  WorkPtr broadcast(at::Tensor t, int root) override {
    detail::check_contiguous(t, "broadcast", where("broadcast"));
    after_pending({t});
    at::Tensor h = to_host(t);
    return staged(host_->broadcast(h, root), {{t, h}}, {});
  }
  WorkPtr scatter_into(at::Tensor out, at::Tensor in, int root) override {
    detail::check_contiguous(out, "scatter output", where("scatter"));
    if (in.defined()) detail::check_contiguous(in, "scatter input", where("scatter"));
    after_pending({out, in});
    at::Tensor h_out = host_like(out), h_in = to_host(in);
    return staged(host_->scatter_into(h_out, h_in, root), {{out, h_out}}, {h_in});
  }
  WorkPtr scatter_pieces(std::vector<at::Tensor> out, std::vector<std::vector<at::Tensor>> pieces, int root) override {
    detail::check_scatter_pieces(out, pieces, rank(), size(), root, where("scatter_pieces"));
    after_pending(out);
    CopyBack back;
    std::vector<at::Tensor> h_out, keep;
    for (const at::Tensor& o : out) {
      h_out.push_back(host_like(o));
      back.emplace_back(o, h_out.back());
    }
    for (auto& rank_pieces : pieces)
      for (at::Tensor& p : rank_pieces)
        if (!p.is_cpu()) keep.push_back(p = to_host(p));  // host pieces (a mapped file) are read as they are
    return staged(host_->scatter_pieces(std::move(h_out), std::move(pieces), root), std::move(back), std::move(keep));
  }
  WorkPtr barrier() override {
    after_pending({});
    return host_->barrier();
  }
  CommPtr split(int color, int key, const std::string& name) override {
    CommPtr h = host_->split(color, key, name);
    return h ? make_staged_communicator(std::move(h), device_) : nullptr;
  }
  CommPtr host_duplicate(const std::string& name) override { return host_->host_duplicate(name); }

 private:
  std::string where(const std::string& op) const {
    return op + " on " + detail::describe(name(), rank(), size(), process_host());
  }
  WorkPtr staged(WorkPtr inner, CopyBack back, std::vector<at::Tensor> keep) {
    auto w = std::make_shared<StagedWork>(std::move(inner), std::move(back), std::move(keep));
    pending_.push_back(w);
    return w;
  }
  // Waits (in issue order) for the pending operations up to the last one whose outputs overlap
  // `tensors` (all of them for an empty list: a barrier), and forgets the completed ones.
  void after_pending(const std::vector<at::Tensor>& tensors) {
    size_t last = 0;  // one past the last pending operation to complete now
    for (size_t i = 0; i < pending_.size(); ++i) {
      bool hit = tensors.empty();
      for (const at::Tensor& o : pending_[i]->outputs())
        for (const at::Tensor& t : tensors) hit = hit || (t.defined() && detail::overlaps(o, t));
      if (hit) last = i + 1;
    }
    for (size_t i = 0; i < last; ++i) pending_[i]->wait(default_timeout());
    pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(last));
    while (!pending_.empty() && pending_.front()->is_completed()) pending_.erase(pending_.begin());
  }
  CommPtr host_;
  at::Device device_;
  std::vector<std::shared_ptr<StagedWork>> pending_;  // issued, maybe not yet copied back (issue order)
};

}  // namespace

CommPtr make_staged_communicator(CommPtr host, at::Device device) {
  return std::make_shared<StagedCommunicator>(std::move(host), device);
}

}  // namespace tessera::comm
