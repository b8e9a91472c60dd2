// The size-1 communicator and the backend-independent parts of runtime/comm, without MPI.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "runtime/comm/agree.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/emulation.h"
#include "util/error.h"

namespace test_comm_self {  // the files of a gtest binary compile together (tests/CMakeLists.txt)

namespace tc = tessera::comm;

// The emulated time of each collective: nccl-tests' bus bandwidth read backwards, written out here
// for 8 ranks at 370 GB/s and 2 at 48 (S the full buffer).
TEST(CommEmulation, NcclTestsBusBandwidthBackwards) {
  namespace fl = tessera::comm::flight;
  const tc::Emulation nvlink{8, 370}, ib{2, 48};
  const int64_t S = int64_t(1) << 30;
  EXPECT_DOUBLE_EQ(tc::emulated_seconds(nvlink, fl::Op::AllGather, S), double(S) * 7 / 8 / 370e9);
  EXPECT_DOUBLE_EQ(tc::emulated_seconds(nvlink, fl::Op::ReduceScatter, S), double(S) * 7 / 8 / 370e9);
  EXPECT_DOUBLE_EQ(tc::emulated_seconds(nvlink, fl::Op::AllReduce, S), 2 * double(S) * 7 / 8 / 370e9);
  EXPECT_DOUBLE_EQ(tc::emulated_seconds(nvlink, fl::Op::Broadcast, S), double(S) / 370e9);
  EXPECT_DOUBLE_EQ(tc::emulated_seconds(ib, fl::Op::AllGather, S), double(S) / 2 / 48e9);
  EXPECT_EQ(tc::emulated_seconds(nvlink, fl::Op::Barrier, S), 0.0);
  EXPECT_EQ(tc::emulated_seconds(tc::Emulation{}, fl::Op::AllGather, S), 0.0);  // off
  // The 1.1B model's layer (~44M parameters, bf16): ~0.21 ms to gather among 8 over NVLink.
  EXPECT_NEAR(tc::emulated_seconds(nvlink, fl::Op::AllGather, 2 * 44'000'000) * 1e3, 0.208, 0.001);
  EXPECT_NO_THROW(tc::validate(nvlink, tc::DeviceBackend::Nccl, "config"));
  EXPECT_NO_THROW(tc::validate(tc::Emulation{}, tc::DeviceBackend::Staged, "config"));
  EXPECT_THROW(tc::validate(tc::Emulation{1, 370}, tc::DeviceBackend::Nccl, "config"), tessera::Error);
  EXPECT_THROW(tc::validate(tc::Emulation{8, 0}, tc::DeviceBackend::Nccl, "config"), tessera::Error);
  EXPECT_THROW(tc::validate(tc::Emulation{0, -1}, tc::DeviceBackend::Nccl, "config"), tessera::Error);
  EXPECT_THROW(tc::validate(nvlink, tc::DeviceBackend::Staged, "config"), tessera::Error);
}

TEST(SelfComm, CollectivesAreCopiesOfOneRank) {
  auto c = tc::make_self_communicator("solo");
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->size(), 1);
  EXPECT_EQ(c->backend(), "self");
  EXPECT_EQ(c->name(), "solo");
  for (auto dt : {at::kFloat, at::kBFloat16, at::kInt}) {
    at::Tensor in = at::arange(7, at::TensorOptions().dtype(dt));
    at::Tensor out = at::full({7}, -1, in.options());
    auto w = c->reduce_scatter_into(out, in, tc::ReduceOp::Sum);
    EXPECT_TRUE(w->is_completed());
    w->wait();
    EXPECT_TRUE(at::equal(out, in));
    at::Tensor gathered = at::full({7}, -1, in.options());
    c->all_gather_into(gathered, in)->wait();
    EXPECT_TRUE(at::equal(gathered, in));
    at::Tensor t = in.clone();
    c->all_reduce(t, tc::ReduceOp::Max)->wait();
    c->broadcast(t, 0)->wait();
    EXPECT_TRUE(at::equal(t, in));
  }
  c->barrier()->wait();
}

TEST(SelfComm, HelpersAndBadInput) {
  auto c = tc::make_self_communicator();
  EXPECT_TRUE(c->any(true));
  EXPECT_FALSE(c->any(false));
  EXPECT_EQ(c->broadcast_string("hello", 0), "hello");
  EXPECT_EQ(c->agree_error(""), "");
  EXPECT_EQ(c->agree_error("bad key 'lr'"), "rank 0: bad key 'lr'");
  at::Tensor f = at::zeros({4});
  EXPECT_THROW(c->broadcast(f, 1), tessera::Error);
  EXPECT_THROW(c->all_gather_into(at::zeros({4}), at::zeros({3})), tessera::Error);
  EXPECT_THROW(c->all_reduce(at::zeros({4}, at::kInt), tc::ReduceOp::Mean), tessera::Error);
  try {
    c->reduce_scatter_into(at::zeros({5}), at::zeros({4}));
    FAIL() << "expected an error";
  } catch (const tessera::Error& e) {
    EXPECT_EQ(e.kind(), tessera::ErrorKind::Input);
    EXPECT_NE(std::string(e.what()).find("out must have ceil(4/1) = 4 elements"), std::string::npos) << e.what();
  }
}

TEST(CommTimeout, DefaultIsTenMinutesAndSettable) {
  EXPECT_EQ(tc::default_timeout(), std::chrono::seconds(600));
  tc::set_default_timeout(std::chrono::seconds(5));
  EXPECT_EQ(tc::default_timeout(), std::chrono::seconds(5));
  EXPECT_THROW(tc::set_default_timeout(std::chrono::milliseconds(0)), tessera::Error);
  tc::set_default_timeout(std::chrono::seconds(600));
}

// The one mapping between error kinds and exit codes, and the wire form ranks agree with.
TEST(ErrorAgreement, KindsAndExitCodesMapOneToOne) {
  for (tessera::ErrorKind k : {tessera::ErrorKind::Input, tessera::ErrorKind::Internal, tessera::ErrorKind::Timeout})
    EXPECT_EQ(tessera::error_kind_for_exit_code(tessera::Error(k, "x").exit_code()), k);
  EXPECT_EQ(tessera::Error(tessera::ErrorKind::Input, "x").exit_code(), 2);
  EXPECT_EQ(tessera::Error(tessera::ErrorKind::Internal, "x").exit_code(), 1);
  EXPECT_EQ(tessera::Error(tessera::ErrorKind::Timeout, "x").exit_code(), 3);
  EXPECT_EQ(tessera::error_kind_for_exit_code(77), tessera::ErrorKind::Internal);
}

TEST(ErrorAgreement, EncodedErrorsKeepKindAndMessage) {
  const std::string timeout = tessera::encode_error(tessera::Error(tessera::ErrorKind::Timeout, "read of a|b timed out"));
  EXPECT_EQ(timeout, "3|read of a|b timed out");
  ASSERT_TRUE(tessera::is_encoded_error(timeout));
  const tessera::DecodedError d = tessera::decode_error(timeout);
  EXPECT_EQ(d.kind, tessera::ErrorKind::Timeout);
  EXPECT_EQ(d.message, "read of a|b timed out");
  // Anything that is not a tessera::Error is bad input (model/ format errors, LibTorch checks).
  EXPECT_EQ(tessera::decode_error(tessera::encode_error(std::runtime_error("bad header"))).kind,
            tessera::ErrorKind::Input);
  // The rank0 loader's other payloads (unit routes) and "no error" are not errors.
  for (const char* not_error : {"", "BFloat16,staged,Float", "staged", "|x", "ab|c"})
    EXPECT_FALSE(tessera::is_encoded_error(not_error)) << not_error;
  EXPECT_THROW(tessera::decode_error("staged"), tessera::Error);
}

// capture_error + agree_on_error / throw_if_any: the one agreement (here over one rank) keeps kind,
// exit code and message, and names the failing rank in the communicator.
TEST(ErrorAgreement, AgreementKeepsKindAndMessage) {
  auto c = tc::make_self_communicator();
  EXPECT_EQ(tessera::capture_error([] {}), "");
  EXPECT_FALSE(tessera::agree_on_error(*c, "").has_value());
  EXPECT_NO_THROW(tessera::throw_if_any(*c, ""));
  const std::string wire = tessera::capture_error([] { throw tessera::Error(tessera::ErrorKind::Timeout, "late"); });
  EXPECT_EQ(wire, "3|late");
  const auto agreed = tessera::agree_on_error(*c, wire);
  ASSERT_TRUE(agreed.has_value());
  EXPECT_EQ(agreed->rank, 0);
  EXPECT_EQ(agreed->kind, tessera::ErrorKind::Timeout);
  EXPECT_EQ(agreed->message, "late");
  try {
    tessera::throw_if_any(*c, tessera::capture_error([] { throw std::runtime_error("bad header in x.safetensors"); }));
    FAIL() << "no error";
  } catch (const tessera::CollectiveError& e) {
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_STREQ(e.what(), "bad header in x.safetensors");
  }
  // Only encode_error() strings are agreed on (a raw message would lose its kind).
  EXPECT_THROW(tessera::agree_on_error(*c, "raw message"), tessera::Error);
}

}  // namespace test_comm_self
