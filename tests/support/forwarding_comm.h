// A Communicator that forwards every operation to another one: the base of the tests' decorators
// of the Communicator seam (tests/support/fault_env.cpp's faults, tests/mpi/test_load.cpp's
// fallback scatter), which override only what they change.
#pragma once
#include "runtime/comm/communicator.h"

namespace tessera::test {

class ForwardingComm : public comm::Communicator {
 public:
  explicit ForwardingComm(comm::CommPtr inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend() const override { return inner_->backend(); }
  std::string name() const override { return inner_->name(); }
  at::Device device() const override { return inner_->device(); }
  comm::WorkPtr all_gather_into(at::Tensor out, at::Tensor in) override { return inner_->all_gather_into(out, in); }
  comm::WorkPtr reduce_scatter_into(at::Tensor out, at::Tensor in, comm::ReduceOp op) override {
    return inner_->reduce_scatter_into(out, in, op);
  }
  comm::WorkPtr all_reduce(at::Tensor t, comm::ReduceOp op) override { return inner_->all_reduce(t, op); }
  comm::WorkPtr broadcast(at::Tensor t, int root) override { return inner_->broadcast(t, root); }
  comm::WorkPtr scatter_into(at::Tensor out, at::Tensor in, int root) override {
    return inner_->scatter_into(out, in, root);
  }
  comm::WorkPtr scatter_pieces(std::vector<at::Tensor> out, std::vector<std::vector<at::Tensor>> pieces, int root) override {
    return inner_->scatter_pieces(std::move(out), std::move(pieces), root);
  }
  comm::WorkPtr barrier() override { return inner_->barrier(); }
  comm::CommPtr split(int color, int key, const std::string& name) override { return inner_->split(color, key, name); }
  comm::CommPtr host_duplicate(const std::string& name) override { return inner_->host_duplicate(name); }

 protected:
  comm::CommPtr inner_;
};

}  // namespace tessera::test
