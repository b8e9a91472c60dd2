// Test binaries only: the faults of the failure tests, made by decorating the product's seams
// (launcher/test_seams.h) instead of hook points in the training step. Linked as an object into
// `tessera-faults` and the MPI gtest binaries, never into `tessera` (unit.architecture checks).
//
//   TESSERA_TEST_FAULT=<kind>@<rank>:<step>[,<kind>@<rank>:<step>...]     (<step> * for any)
//
// The step and what the process is doing come from the activity every collective is recorded with
// (comm::flight::context_step / context_phase: "train step" N is optimizer step N as logged).
//
//   desync      Communicator: in train step <step>, rank <rank> issues one extra all_reduce(max) of
//               2 bytes before its first 1-byte max vote (a skip or stop vote) on a group: the ranks
//               disagree about the size of that collective (and are off by one after it)
//   stall-save  Communicator: rank <rank> stops itself with SIGSTOP at its first collective of the
//               checkpoint save of step <step>, before it issues it
//   stall-load  Communicator: the same at the first collective of a checkpoint load (<step>: *)
//   inf-grad    CausalLm: in train step <step>, on rank <rank>, the gradient flowing back into the
//               embeddings' output gets +inf in its first element, so one element of the embedding
//               weight's gradient is +inf (nothing else: the embeddings come first), before the
//               reduction, the unscale and the norm, at any world size (with optim.in_backward: the
//               root unit's, the last handed over)
//   nan-loss    CausalLm: in train step <step>, rank <rank>'s head_loss is NaN (loss + NaN: the
//               gradients stay finite), so its local loss sum is NaN before the loss all-reduce
//   hold-host-update
//               optim.in_backward under fsdp.offload, step <step>: rank <rank>'s host optimizer
//               thread starts each unit's update only once the next one arrived or the backward
//               ended (runtime/train/host_update.h, the one hold hook left in the runtime)
//
// THREADS: installed during static initialisation; the decorators run on the threads that issue
// collectives and build the model. TESSERA_TEST_FAULT is parsed on every check (a few per step).
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>

#include "launcher/bootstrap.h"
#include "launcher/test_seams.h"
#include "runtime/comm/flight_recorder.h"
#include "runtime/train/host_update.h"
#include "util/error.h"
#include "tests/support/forwarding_comm.h"
#include "util/enum_names.h"

namespace {

using namespace tessera;

enum class Fault { Desync, StallSave, StallLoad, InfGrad, NanLoss, HoldHostUpdate };
TESSERA_ENUM_NAMES(fault_names, "desync", "stall-save", "stall-load", "inf-grad", "nan-loss", "hold-host-update")

// Whether TESSERA_TEST_FAULT names `kind` for `rank` at `step` (any step when `any_step`).
bool env_fault(Fault kind, int rank, int64_t step, bool any_step = false) {
  const char* env = std::getenv("TESSERA_TEST_FAULT");
  if (!env || !*env) return false;
  std::stringstream ss(env);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto at = item.find('@'), colon = item.find(':', at == std::string::npos ? 0 : at);
    if (at == std::string::npos || colon == std::string::npos)
      throw TESSERA_INPUT_ERROR("TESSERA_TEST_FAULT item '" + item + "': expected kind@rank:step");
    const auto named = util::enum_named<Fault>(fault_names(), item.substr(0, at));
    if (!named) throw TESSERA_INPUT_ERROR("TESSERA_TEST_FAULT item '" + item + "': no fault " + item.substr(0, at));
    if (*named != kind) continue;
    const std::string r = item.substr(at + 1, colon - at - 1), s = item.substr(colon + 1);
    if (std::atoi(r.c_str()) != rank) continue;
    if (any_step || s == "*" || std::atoll(s.c_str()) == step) return true;
  }
  return false;
}

bool in_phase(const char* phase) {
  const char* p = comm::flight::context_phase();
  return p && std::strcmp(p, phase) == 0;
}

// Whether `kind` has not fired yet in the current (phase, step) of this thread: a fault fires once
// each time its step comes round (a second trainer in the same test process gets it again), and
// another thread's activity (the checkpoint writer's) never re-arms it.
bool first_time(Fault kind) {
  thread_local std::pair<const char*, int64_t> current{nullptr, -2};
  thread_local std::set<int> fired;
  const std::pair<const char*, int64_t> now{comm::flight::context_phase(), comm::flight::context_step()};
  if (now != current) current = now, fired.clear();
  return fired.insert(static_cast<int>(kind)).second;
}

// The Communicator decorator: forwards everything, firing the communicator faults above first.
class FaultComm : public test::ForwardingComm {
 public:
  using ForwardingComm::ForwardingComm;
  comm::WorkPtr all_gather_into(at::Tensor out, at::Tensor in) override {
    before();
    return inner_->all_gather_into(out, in);
  }
  comm::WorkPtr reduce_scatter_into(at::Tensor out, at::Tensor in, comm::ReduceOp op) override {
    before();
    return inner_->reduce_scatter_into(out, in, op);
  }
  comm::WorkPtr all_reduce(at::Tensor t, comm::ReduceOp op) override {
    before();
    const int64_t step = comm::flight::context_step();
    if (op == comm::ReduceOp::Max && t.numel() == 1 && t.scalar_type() == at::kByte && in_phase("train step") &&
        env_fault(Fault::Desync, world_rank(), step) && first_time(Fault::Desync))
      inner_->all_reduce(at::zeros({2}, at::kByte), comm::ReduceOp::Max)->wait();
    return inner_->all_reduce(t, op);
  }
  comm::WorkPtr broadcast(at::Tensor t, int root) override {
    before();
    return inner_->broadcast(t, root);
  }
  comm::WorkPtr scatter_into(at::Tensor out, at::Tensor in, int root) override {
    before();
    return inner_->scatter_into(out, in, root);
  }
  comm::WorkPtr scatter_pieces(std::vector<at::Tensor> out, std::vector<std::vector<at::Tensor>> pieces, int root) override {
    before();
    return inner_->scatter_pieces(std::move(out), std::move(pieces), root);
  }
  comm::WorkPtr barrier() override {
    before();
    return inner_->barrier();
  }
  comm::CommPtr split(int color, int key, const std::string& name) override {
    comm::CommPtr c = inner_->split(color, key, name);
    return c ? std::make_shared<FaultComm>(c) : c;
  }
  comm::CommPtr host_duplicate(const std::string& name) override {
    return std::make_shared<FaultComm>(inner_->host_duplicate(name));
  }

 private:
  static int world_rank() { return launcher::current().world_rank; }
  // stall-save / stall-load: this rank stops before it issues the save's (load's) first collective.
  void before() {
    const int64_t step = comm::flight::context_step();
    const bool save = in_phase("checkpoint save") && env_fault(Fault::StallSave, world_rank(), step);
    const bool load = in_phase("checkpoint load") && env_fault(Fault::StallLoad, world_rank(), step, true);
    if ((save && first_time(Fault::StallSave)) || (load && first_time(Fault::StallLoad))) raise(SIGSTOP);
  }
};

// inf-grad's autograd function: the identity forward; backward writes +inf into the first element of
// the gradient it passes on.
struct InfGradient : public torch::autograd::Function<InfGradient> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& x) { return x.clone(); }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*, torch::autograd::variable_list g) {
    at::Tensor out = g[0].clone();
    out.reshape({-1}).narrow(0, 0, 1).fill_(std::numeric_limits<double>::infinity());
    return {out};
  }
};

bool fires(Fault kind) {
  return in_phase("train step") && env_fault(kind, launcher::current().world_rank, comm::flight::context_step());
}

// The CausalLm decorator: nan-loss on the loss, inf-grad on the gradient of the embeddings.
train::CausalLm fault_lm(train::CausalLm lm) {
  auto head_loss = lm.head_loss;
  lm.head_loss = [head_loss](const at::Tensor& h, const at::Tensor& labels, double grad_scale, bool device_rows) {
    at::Tensor loss = head_loss(h, labels, grad_scale, device_rows);
    if (fires(Fault::NanLoss)) loss = loss + std::numeric_limits<double>::quiet_NaN();  // a constant: finite gradients
    return loss;
  };
  auto embed = lm.embed;
  lm.embed = [embed](const at::Tensor& tokens) {
    at::Tensor h = embed(tokens);
    return at::GradMode::is_enabled() && fires(Fault::InfGrad) ? InfGradient::apply(h) : h;
  };
  return lm;
}

bool hold(int rank, int64_t step) { return env_fault(Fault::HoldHostUpdate, rank, step); }

const bool installed = [] {
  launcher::install_test_seams({[](comm::CommPtr c) -> comm::CommPtr { return std::make_shared<FaultComm>(std::move(c)); },
                                fault_lm});
  train::set_hold_hook(&hold);
  return true;
}();

}  // namespace
