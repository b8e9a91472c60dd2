// Communicator conformance: the same assertions against every backend this build and machine
// have (MPI world, MPI split communicators, the launcher's process groups, the self communicator at
// world size 1, NCCL where CUDA is compiled in and a GPU exists), at any world size (ctest runs
// np 1, 2, 4). Inputs are chosen so that typical mistakes fail: a reduce-scatter that forgets the
// padding of sizes that do not divide the world size, bf16/fp16 sums done on raw bits or rounded
// hop by hop, 64-bit integers truncated to 32 bits, operations run out of issue order.
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <thread>

#include "launcher/bootstrap.h"
#include "runtime/comm/agree.h"
#include "runtime/comm/collective_checks.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/mpi_backend.h"
#include "runtime/comm/mpi_bench_hooks.h"
#include "runtime/comm/staged.h"
#include "runtime/device/device.h"
#include "runtime/gpu/gpu.h"
#include "runtime/gpu/nccl.h"
#include "util/error.h"

namespace test_comm_conformance {  // the files of a gtest binary compile together (tests/CMakeLists.txt)

namespace tc = tessera::comm;
using tessera::comm::ReduceOp;

namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

// Every communicator under test. Built once (construction is collective over MPI_COMM_WORLD).
const std::vector<tc::CommPtr>& backends() {
  static std::vector<tc::CommPtr> all = [] {
    std::vector<tc::CommPtr> v;
    auto world = tc::make_mpi_communicator(MPI_COMM_WORLD, "world");
    v.push_back(world);
    const int r = world_rank();
    // Emulated 2-rank nodes: "pairs" = {0,1},{2,3} (intra-node), "stride" = {0,2},{1,3} (inter-node).
    v.push_back(world->split(r / 2, r, "pairs"));
    v.push_back(world->split(r % 2, r, "stride"));
    const auto& groups = tessera::launcher::current().groups;  // what the bootstrap built
    for (const auto& g : {groups.world, groups.intra, groups.inter})
      if (g) v.push_back(g);
    if (world_size() == 1) v.push_back(tc::make_self_communicator("self"));
    // The staged communicator (several ranks per GPU) over an MPI duplicate of the world: on CPU
    // tensors its staging is a copy into host buffers and back, the same code as on a GPU.
    v.push_back(tc::make_staged_communicator(world->host_duplicate("staged-world"), at::Device(at::kCPU)));
    if (tessera::gpu::built() && torch::cuda::is_available() && tessera::gpu::nccl_available()) {
      const int gpu = tessera::launcher::current().gpu >= 0 ? tessera::launcher::current().gpu : 0;
      auto nccl = tessera::gpu::make_nccl_communicator(world, "nccl-world", gpu);
      v.push_back(nccl);
      v.push_back(nccl->split(r / 2, r, "nccl-pairs"));  // over its host companion
    }
    return v;
  }();
  return all;
}

const std::vector<at::ScalarType> kAllTypes = {at::kFloat, at::kBFloat16, at::kHalf, at::kInt, at::kLong, at::kByte};

bool is_float(at::ScalarType t) { return at::isFloatingType(t); }

// Sizes: one element, fewer than the ranks, one over every ring threshold (kLarge: 1.2 MB in fp32;
// MpiAlgorithmThresholds checks which algorithm it takes per dtype), and a multiple of the ranks.
constexpr int64_t kLarge = 300007;
std::vector<int64_t> test_sizes(int size) { return {1, 7, kLarge, int64_t(size) * 1000}; }

// Element i of rank r's contribution, for i in [begin, begin+n), as exact doubles. Every value is
// exactly representable in `dt` and every sum over <= 4 ranks is exact in fp32, so the expected
// result of a reduction is "exact sum, rounded once to dt". For bf16, rank 0 contributes 256-768
// and the others 1-3: with 4 ranks 256+1+1+1 = 259 rounds to 260 once but to 256 hop by hop, and a
// sum of raw bf16 bits is nowhere near. int64 values exceed 2^32.
at::Tensor values(at::ScalarType dt, int r, int64_t begin, int64_t n) {
  auto opts = at::TensorOptions().dtype(at::kDouble);
  at::Tensor i = at::arange(begin, begin + n, opts);
  at::Tensor sign = 1.0 - 2.0 * at::remainder(at::floor(i / 3.0), 2.0);  // + + + - - - + + + ...
  switch (dt) {
    case at::kByte: return at::remainder(i + 7.0 * r, 50.0);
    case at::kInt: return at::remainder(i, 1000.0) - 500.0 + 100000.0 * r;
    case at::kLong: return sign * (double(int64_t(r + 1) << 33) + i);
    default:
      return sign * (r == 0 ? 256.0 * (1.0 + at::remainder(i, 3.0)) : 1.0 + at::remainder(i + r, 3.0));
  }
}

// The exact reduction over `size` ranks of values(dt, r, begin, n), rounded once to dt.
at::Tensor reduced(at::ScalarType dt, ReduceOp op, int size, int64_t begin, int64_t n) {
  at::Tensor acc = values(dt, 0, begin, n);
  for (int r = 1; r < size; ++r) {
    at::Tensor v = values(dt, r, begin, n);
    acc = op == ReduceOp::Max ? at::maximum(acc, v) : op == ReduceOp::Min ? at::minimum(acc, v) : acc + v;
  }
  if (op == ReduceOp::Mean) acc = acc / size;
  return acc.to(dt);
}

// Exact comparison (through double, which holds every value of every tested dtype).
void expect_same(const at::Tensor& actual, const at::Tensor& expected, const std::string& what) {
  at::Tensor a = actual.cpu().reshape({-1}).to(at::kDouble), e = expected.cpu().reshape({-1}).to(at::kDouble);
  ASSERT_EQ(a.numel(), e.numel()) << what;
  at::Tensor bad = at::ne(a, e).nonzero();
  if (bad.numel() == 0) return;
  int64_t k = bad[0][0].item<int64_t>();
  ADD_FAILURE() << what << ": " << bad.size(0) << " of " << a.numel() << " elements wrong; first at " << k
                << ": got " << a[k].item<double>() << ", expected " << e[k].item<double>();
}

// A reduction's result: exact for MPI (16-bit floats reduced in fp32, rounded once); NCCL reduces
// bf16/fp16 natively (communicator.h), rounding at each of its size - 1 steps, so its 16-bit sums
// and means are within size - 1 roundings of the exact result (half an ulp each).
void expect_reduced(const tc::Communicator& c, at::ScalarType dt, ReduceOp op, const at::Tensor& actual,
                    const at::Tensor& expected, const std::string& what) {
  const bool hop_by_hop = c.backend() == "nccl" && (dt == at::kBFloat16 || dt == at::kHalf) && c.size() > 2 &&
                          (op == ReduceOp::Sum || op == ReduceOp::Mean);
  if (!hop_by_hop) return expect_same(actual, expected, what);
  const double half_ulp = dt == at::kBFloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
  at::Tensor a = actual.cpu().reshape({-1}).to(at::kDouble), e = expected.cpu().reshape({-1}).to(at::kDouble);
  const at::Tensor bound = e.abs() * ((c.size() - 1) * half_ulp * 1.0001) + 1e-30;
  EXPECT_TRUE((a - e).abs().le(bound).all().item<bool>()) << what << ": beyond " << c.size() - 1 << " roundings";
}

std::string label(const tc::Communicator& c, const char* op, at::ScalarType dt, int64_t n, const char* mode,
                  ReduceOp rop = ReduceOp::Sum) {
  return std::string(op) + "(" + tc::detail::op_name(rop) + ") on " + c.name() + "/" + c.backend() + " size " +
         std::to_string(c.size()) + " dtype " + c10::toString(dt) + " N=" + std::to_string(n) + " " + mode;
}

at::TensorOptions opts_on(const tc::Communicator& c, at::ScalarType dt) {
  return at::TensorOptions().dtype(dt).device(c.device());
}

std::vector<ReduceOp> ops_for(at::ScalarType dt) {
  if (is_float(dt)) return {ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min};
  return {ReduceOp::Sum, ReduceOp::Max};
}

}  // namespace

TEST(CommConformance, AllGatherUnevenAllDtypesInAndOutOfPlace) {
  for (const auto& comm : backends()) {
    const int rank = comm->rank(), size = comm->size();
    for (at::ScalarType dt : kAllTypes) {
      for (int64_t n : test_sizes(size)) {
        const int64_t chunk = tc::detail::chunk_of(n, size);
        // Every rank's chunk, including the padding part past n that all_gather must drop.
        at::Tensor expected = at::empty({0}, at::kDouble);
        std::vector<at::Tensor> parts;
        for (int r = 0; r < size; ++r) parts.push_back(values(dt, r, r * chunk, chunk));
        expected = at::cat(parts).narrow(0, 0, n).to(dt);
        at::Tensor mine = values(dt, rank, rank * chunk, chunk).to(opts_on(*comm, dt));
        {  // out of place; out pre-filled with a sentinel
          at::Tensor out = at::full({n}, 3, opts_on(*comm, dt));
          at::Tensor in = mine.clone();
          comm->all_gather_into(out, in)->wait();
          expect_same(out, expected, label(*comm, "all_gather", dt, n, "out-of-place"));
          expect_same(in, mine, label(*comm, "all_gather", dt, n, "input untouched"));
        }
        {  // in place where this rank's chunk lies inside out (others pass a separate input)
          at::Tensor out = at::full({n}, 3, opts_on(*comm, dt));
          at::Tensor in = (rank + 1) * chunk <= n ? out.narrow(0, rank * chunk, chunk) : at::empty_like(mine);
          in.copy_(mine);
          comm->all_gather_into(out, in)->wait();
          expect_same(out, expected, label(*comm, "all_gather", dt, n, "in-place"));
        }
      }
    }
  }
}

TEST(CommConformance, ReduceScatterPadsUnevenSizes) {
  for (const auto& comm : backends()) {
    const int rank = comm->rank(), size = comm->size();
    for (at::ScalarType dt : kAllTypes) {
      for (ReduceOp op : ops_for(dt)) {
        for (int64_t n : test_sizes(size)) {
          if (n > 100000 && (op == ReduceOp::Max || op == ReduceOp::Min)) continue;  // keep the suite fast
          const int64_t chunk = tc::detail::chunk_of(n, size);
          const int64_t begin = std::min(n, rank * chunk), real = std::min(n, begin + chunk) - begin;
          // My chunk of the reduction, then zeros where it runs past the end of the input.
          at::Tensor expected = at::cat({reduced(dt, op, size, begin, real).to(at::kDouble),
                                         at::zeros({chunk - real}, at::kDouble)}).to(dt);
          at::Tensor input = values(dt, rank, 0, n).to(opts_on(*comm, dt));
          {
            at::Tensor in = input.clone();
            at::Tensor out = at::full({chunk}, 9, opts_on(*comm, dt));
            comm->reduce_scatter_into(out, in, op)->wait();
            expect_reduced(*comm, dt, op, out, expected, label(*comm, "reduce_scatter", dt, n, "out-of-place", op));
            expect_same(in, input, label(*comm, "reduce_scatter", dt, n, "input untouched", op));
          }
          {  // in place: out is a view of in's own chunk where that fits inside in
            at::Tensor in = input.clone();
            at::Tensor out = (rank + 1) * chunk <= n ? in.narrow(0, rank * chunk, chunk)
                                                     : at::full({chunk}, 9, opts_on(*comm, dt));
            comm->reduce_scatter_into(out, in, op)->wait();
            expect_reduced(*comm, dt, op, out, expected, label(*comm, "reduce_scatter", dt, n, "in-place", op));
          }
        }
      }
    }
  }
}

TEST(CommConformance, AllReduceAllDtypesAndOps) {
  for (const auto& comm : backends()) {
    for (at::ScalarType dt : kAllTypes) {
      for (ReduceOp op : ops_for(dt)) {
        for (int64_t n : test_sizes(comm->size())) {
          if (n > 100000 && (op == ReduceOp::Max || op == ReduceOp::Min)) continue;  // keep the suite fast
          at::Tensor t = values(dt, comm->rank(), 0, n).to(opts_on(*comm, dt));
          comm->all_reduce(t, op)->wait();
          expect_reduced(*comm, dt, op, t, reduced(dt, op, comm->size(), 0, n),
                         label(*comm, "all_reduce", dt, n, "in-place", op));
        }
      }
    }
  }
}

TEST(CommConformance, BroadcastFromFirstAndLastRank) {
  for (const auto& comm : backends()) {
    for (at::ScalarType dt : kAllTypes) {
      for (int root : {0, comm->size() - 1}) {
        for (int64_t n : {int64_t(1), int64_t(100003)}) {
          at::Tensor t = values(dt, comm->rank(), 0, n).to(opts_on(*comm, dt));
          comm->broadcast(t, root)->wait();
          expect_same(t, values(dt, root, 0, n).to(dt),
                      label(*comm, "broadcast", dt, n, ("root " + std::to_string(root)).c_str()));
        }
      }
    }
  }
}

// Reduce-scatter of `input` (this rank's n values) out of place and in place (into its own chunk of
// the input where the chunk fits), each against the exact reduction; the input stays untouched.
void check_reduce_scatter(tc::Communicator& comm, at::ScalarType dt, int64_t n, const at::Tensor& input, ReduceOp op,
                          const char* what) {
  const int rank = comm.rank(), size = comm.size();
  const int64_t chunk = tc::detail::chunk_of(n, size);
  const int64_t begin = std::min(n, rank * chunk), real = std::min(n, begin + chunk) - begin;
  auto o = input.options();
  at::Tensor expected =
      at::cat({reduced(dt, op, size, begin, real).to(at::kDouble), at::zeros({chunk - real}, at::kDouble)}).to(dt);
  at::Tensor in = input.clone(), out = at::full({chunk}, 9, o);
  comm.reduce_scatter_into(out, in, op)->wait();
  expect_same(out, expected, label(comm, what, dt, n, "out-of-place", op));
  expect_same(in, input, label(comm, what, dt, n, "input untouched", op));
  in = input.clone();
  out = (rank + 1) * chunk <= n ? in.narrow(0, rank * chunk, chunk) : at::full({chunk}, 9, o);
  comm.reduce_scatter_into(out, in, op)->wait();
  expect_same(out, expected, label(comm, what, dt, n, "in-place", op));
}

// 16-bit reduce-scatters on the MPI backend run in fp32 through a bounded accumulator, in segments
// (runtime/comm/mpi_backend.cpp): with the bound made tiny, the segments are many and do not divide
// the blocks, and the results are the same exact ones, in and out of place.
TEST(CommConformance, WidenedReduceScatterInSegments) {
  setenv("TESSERA_WIDENED_REDUCTION_BYTES", "40000", 1);  // same on every rank
  for (const auto& comm : backends()) {
    if (comm->backend() != "mpi") continue;
    for (at::ScalarType dt : {at::kBFloat16, at::kHalf}) {
      const int64_t n = 300007;
      const at::Tensor input = values(dt, comm->rank(), 0, n).to(opts_on(*comm, dt));
      for (ReduceOp op : ops_for(dt)) check_reduce_scatter(*comm, dt, n, input, op, "segmented reduce_scatter");
    }
  }
  unsetenv("TESSERA_WIDENED_REDUCTION_BYTES");
}

// Sizes above the thresholds where the MPI backend leaves MPI's own collectives for its ring and
// chain algorithms (runtime/comm/mpi_ring.h; reduce-scatter 256 KiB, all-reduce and broadcast
// 1 MiB), uneven so that the last blocks are short or empty: the same exact results as the small
// sizes above, every op, in and out of place.
TEST(CommConformance, LargeUnevenMessagesEveryOp) {
  for (const auto& comm : backends()) {
    const int rank = comm->rank(), size = comm->size();
    for (at::ScalarType dt : {at::kFloat, at::kBFloat16, at::kLong}) {
      auto o = opts_on(*comm, dt);
      {  // reduce-scatter and all-reduce: 300007 elements (1.2 MB in fp32, where 16-bit floats are reduced)
        const int64_t n = 300007;
        at::Tensor input = values(dt, rank, 0, n).to(o);
        for (ReduceOp op : ops_for(dt)) {
          check_reduce_scatter(*comm, dt, n, input, op, "reduce_scatter");
          at::Tensor t = input.clone();
          comm->all_reduce(t, op)->wait();
          expect_same(t, reduced(dt, op, size, 0, n), label(*comm, "all_reduce", dt, n, "in-place", op));
        }
      }
      {  // broadcast: 600011 elements (>= 1.2 MB in every dtype here), from the last rank
        const int64_t n = 600011;
        at::Tensor t = values(dt, rank, 0, n).to(o);
        comm->broadcast(t, size - 1)->wait();
        expect_same(t, values(dt, size - 1, 0, n).to(dt), label(*comm, "broadcast", dt, n, "root last"));
      }
    }
  }
}

// Where the MPI backend switches to its own algorithms (mpi_backend.cpp), as `bench collectives`
// reports it: reduce-scatter from 256 KiB, all-reduce from 1 MiB (16-bit floats counted in fp32,
// the size they are reduced in), broadcast from 1 MiB on more than one rank, all-gather never.
TEST(CommConformance, MpiAlgorithmThresholds) {
  EXPECT_EQ(tc::mpi_algorithm("reduce_scatter", 65535, at::kFloat, 4), "mpi");
  EXPECT_EQ(tc::mpi_algorithm("reduce_scatter", 65536, at::kFloat, 4), "ring");
  EXPECT_EQ(tc::mpi_algorithm("reduce_scatter", 65536, at::kBFloat16, 2), "ring");
  EXPECT_EQ(tc::mpi_algorithm("reduce_scatter", 65536, at::kByte, 2), "mpi");
  EXPECT_EQ(tc::mpi_algorithm("all_reduce", 262143, at::kFloat, 4), "mpi");
  EXPECT_EQ(tc::mpi_algorithm("all_reduce", 262144, at::kHalf, 4), "ring");
  EXPECT_EQ(tc::mpi_algorithm("all_reduce", 131072, at::kLong, 2), "ring");
  EXPECT_EQ(tc::mpi_algorithm("broadcast", 1 << 20, at::kByte, 2), "chain");
  EXPECT_EQ(tc::mpi_algorithm("broadcast", 1 << 20, at::kByte, 1), "mpi");
  EXPECT_EQ(tc::mpi_algorithm("broadcast", 262144, at::kBFloat16, 4), "mpi");  // broadcasts move 16-bit as is
  EXPECT_EQ(tc::mpi_algorithm("all_gather", int64_t(1) << 30, at::kFloat, 4), "mpi");
  EXPECT_THROW(tc::mpi_algorithm("gather", 1, at::kFloat, 2), tessera::Error);
  // test_sizes' large size takes the ring for every dtype (all-reduce: all but uint8, at 300 KB).
  for (at::ScalarType dt : kAllTypes) {
    EXPECT_EQ(tc::mpi_algorithm("reduce_scatter", kLarge, dt, 2), "ring") << dt;
    EXPECT_EQ(tc::mpi_algorithm("all_reduce", kLarge, dt, 2), dt == at::kByte ? "mpi" : "ring") << dt;
  }
}

// Large fp32 reductions of the MPI backend are deterministic and identical on every rank: block b
// is summed in ring order ((v[b+1] + v[b+2]) + ...) + v[b] on rank b alone and then copied
// (mpi_ring.h). Inputs are not exactly summable, so another order shows up in the last bits.
TEST(CommConformance, MpiLargeReductionsFollowTheRingOrder) {
  for (const auto& comm : backends()) {
    if (comm->backend() != "mpi") continue;
    const int rank = comm->rank(), size = comm->size();
    const int64_t n = 70001 * size + 3, chunk = tc::detail::chunk_of(n, size);  // >= 256 KiB per rank
    auto v = [&](int r) {
      at::Tensor i = at::arange(n, at::kDouble);
      return (at::sin(i * (0.37 + 0.11 * r)) * (1000.0 / (r + 1))).to(at::kFloat);
    };
    std::vector<at::Tensor> all;
    for (int r = 0; r < size; ++r) all.push_back(v(r));
    at::Tensor expected = at::empty({n}, at::kFloat);
    for (int b = 0; b < size; ++b) {
      const int64_t begin = std::min(n, b * chunk), len = std::min(n, begin + chunk) - begin;
      at::Tensor acc = all[(b + 1) % size].narrow(0, begin, len).clone();
      for (int k = 2; k <= size; ++k) acc.add_(all[(b + k) % size].narrow(0, begin, len));  // fp32, one add at a time
      expected.narrow(0, begin, len).copy_(acc);
    }
    at::Tensor out = at::empty({chunk}, at::kFloat);
    comm->reduce_scatter_into(out, all[rank], ReduceOp::Sum)->wait();
    const int64_t begin = std::min(n, rank * chunk), len = std::min(n, begin + chunk) - begin;
    EXPECT_TRUE(at::equal(out.narrow(0, 0, len), expected.narrow(0, begin, len))) << comm->name() << " reduce_scatter";
    at::Tensor t = all[rank].clone();
    comm->all_reduce(t, ReduceOp::Sum)->wait();
    EXPECT_TRUE(at::equal(t, expected)) << comm->name() << " all_reduce";
  }
}

// Several operations in flight at once, waited for in reverse: they must still have run in issue
// order (the second all_reduce sees the first one's result) and all complete.
TEST(CommConformance, AsyncOperationsCompleteInIssueOrder) {
  for (const auto& comm : backends()) {
    const int rank = comm->rank(), size = comm->size();
    const int64_t n = 100003, chunk = tc::detail::chunk_of(n, size);
    auto o = opts_on(*comm, at::kFloat);
    at::Tensor t = values(at::kFloat, rank, 0, n).to(o);
    at::Tensor gathered = at::zeros({n}, o), shard = at::zeros({chunk}, o);
    at::Tensor b = at::full({5}, double(rank), o);
    std::vector<tc::WorkPtr> works;
    works.push_back(comm->all_reduce(t, ReduceOp::Sum));   // t = sum
    works.push_back(comm->all_reduce(t, ReduceOp::Mean));  // identical everywhere: t stays the sum
    works.push_back(comm->reduce_scatter_into(shard, t, ReduceOp::Max));  // t equal everywhere: my chunk of it
    works.push_back(comm->all_gather_into(gathered, shard));              // back to the full sum
    works.push_back(comm->broadcast(b, size - 1));
    works.push_back(comm->barrier());
    for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();
    // NCCL's wait() orders the caller's stream, not the host: synchronise before the host asks.
    tessera::device::synchronize(comm->device());
    for (auto& w : works) EXPECT_TRUE(w->is_completed());
    at::Tensor sum = reduced(at::kFloat, ReduceOp::Sum, size, 0, n);
    expect_same(t, sum, comm->name() + ": all_reduce sum then mean in issue order");
    expect_same(gathered, sum, comm->name() + ": reduce_scatter then all_gather of the sum");
    expect_same(b, at::full({5}, double(size - 1)), comm->name() + ": broadcast from last rank");
  }
}

// A wait on an operation the other ranks have not issued yet times out with a one-line message
// naming the operation, communicator, rank and host; the operation completes once they issue it.
TEST(CommConformance, WaitTimesOutWhileOtherRanksHaveNotIssued) {
  for (const auto& comm : backends()) {
    // NCCL waits do not block the host (its watchdog aborts the communicator instead; see runtime/gpu/nccl.h).
    if (comm->size() < 2 || comm->backend() == "nccl") continue;
    const int rank = comm->rank();
    at::Tensor in = at::full({3}, double(rank), opts_on(*comm, at::kFloat));
    at::Tensor out = at::zeros({3 * comm->size()}, opts_on(*comm, at::kFloat));
    tc::WorkPtr late;
    if (rank == 0) {
      late = comm->all_gather_into(out, in);
      EXPECT_FALSE(late->is_completed());
      try {
        late->wait(std::chrono::milliseconds(50));
        ADD_FAILURE() << comm->name() << ": wait returned although rank 1 has not issued the all_gather";
      } catch (const tessera::Error& e) {
        EXPECT_EQ(e.kind(), tessera::ErrorKind::Timeout);
        std::string msg = e.what();
        std::string want = "all_gather on comm '" + comm->name() + "' (rank 0 of " + std::to_string(comm->size());
        EXPECT_NE(msg.find(want), std::string::npos) << msg;
        EXPECT_NE(msg.find("did not complete within 0.05s"), std::string::npos) << msg;
        EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      }
    }
    MPI_Barrier(MPI_COMM_WORLD);  // rank 0 has timed out: now the others issue the all_gather
    if (rank != 0) late = comm->all_gather_into(out, in);
    late->wait();
    at::Tensor expected = at::arange(comm->size(), at::kFloat).repeat_interleave(3);
    expect_same(out, expected, comm->name() + ": all_gather after a timed-out wait");
  }
}

TEST(CommConformance, SynchronousHelpers) {
  for (const auto& comm : backends()) {
    const int rank = comm->rank(), size = comm->size();
    EXPECT_TRUE(comm->any(rank == size - 1)) << comm->name();
    EXPECT_FALSE(comm->any(false)) << comm->name();
    std::string s = comm->broadcast_string(rank == size - 1 ? "from the last rank " + std::to_string(rank) : "",
                                           size - 1);
    EXPECT_EQ(s, "from the last rank " + std::to_string(size - 1)) << comm->name();
    EXPECT_EQ(comm->broadcast_string("", 0), "") << comm->name();
    EXPECT_EQ(comm->agree_error(""), "") << comm->name();
    // Ranks >= 1 fail (rank 0 alone at size 1): the lowest failing rank's message reaches everyone.
    int lowest = size > 1 ? 1 : 0;
    std::string err = rank >= lowest ? "bad key 'x' on rank " + std::to_string(rank) : "";
    EXPECT_EQ(comm->agree_error(err), "rank " + std::to_string(lowest) + ": bad key 'x' on rank " +
                                          std::to_string(lowest))
        << comm->name();
    // The typed agreement (runtime/comm/agree.h): the lowest failing rank's kind and message everywhere.
    const auto agreed = tessera::agree_on_error(
        *comm, rank >= lowest ? tessera::encode_error(rank == lowest ? tessera::ErrorKind::Timeout
                                                                      : tessera::ErrorKind::Input,
                                                      "late on rank " + std::to_string(rank))
                              : "");
    ASSERT_TRUE(agreed.has_value()) << comm->name();
    EXPECT_EQ(agreed->rank, lowest) << comm->name();
    EXPECT_EQ(agreed->kind, tessera::ErrorKind::Timeout) << comm->name();
    EXPECT_EQ(agreed->message, "late on rank " + std::to_string(lowest)) << comm->name();
    EXPECT_FALSE(tessera::agree_on_error(*comm, "").has_value()) << comm->name();
  }
}

// Bad arguments are refused on the calling thread, before anything is issued, with Error(Input).
TEST(CommConformance, BadArgumentsAreInputErrors) {
  for (const auto& comm : backends()) {
    auto o = opts_on(*comm, at::kFloat);
    const int size = comm->size();
    auto expect_input_error = [&](const std::function<void()>& fn, const std::string& needle) {
      try {
        fn();
        ADD_FAILURE() << comm->name() << ": no error, expected one mentioning '" << needle << "'";
      } catch (const tessera::Error& e) {
        EXPECT_EQ(e.kind(), tessera::ErrorKind::Input) << e.what();
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find(comm->name()), std::string::npos) << e.what();
      }
    };
    // out of 10 elements needs ceil(10/size) per rank.
    expect_input_error([&] { comm->all_gather_into(at::zeros({10}, o), at::zeros({tc::detail::chunk_of(10, size) + 1}, o)); },
                       "elements");
    expect_input_error([&] { comm->reduce_scatter_into(at::zeros({tc::detail::chunk_of(10, size) + 1}, o), at::zeros({10}, o)); },
                       "elements");
    expect_input_error([&] { comm->all_reduce(at::zeros({4, 4}, o).t()); }, "contiguous");
    expect_input_error([&] { comm->all_reduce(at::zeros({4}, opts_on(*comm, at::kInt)), ReduceOp::Mean); }, "mean");
    expect_input_error([&] { comm->all_gather_into(at::zeros({size}, o), at::zeros({1}, opts_on(*comm, at::kHalf))); },
                       "Half");
    expect_input_error([&] { comm->broadcast(at::zeros({1}, o), size); }, "root");
    if (comm->backend() == "mpi")
      expect_input_error([&] { comm->all_reduce(at::zeros({3}, at::kBool)); }, "not supported");
  }
}

TEST(CommConformance, SplitWithUndefinedColorGivesNoCommunicator) {
  const auto& world = backends().front();
  int rank = world->rank();
  tc::CommPtr c = world->split(rank == 0 ? -1 : 1, rank, "all-but-0");
  if (rank == 0) {
    EXPECT_EQ(c, nullptr);
  } else {
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(c->size(), world->size() - 1);
    EXPECT_EQ(c->rank(), rank - 1);
    EXPECT_EQ(c->name(), "all-but-0");
  }
  // A size-1 communicator splits into itself or nothing.
  auto self = tc::make_self_communicator();
  ASSERT_NE(self->split(0, 0, "x"), nullptr);
  EXPECT_EQ(self->split(0, 0, "x")->name(), "x");
  EXPECT_EQ(self->split(-1, 0, "x"), nullptr);
}

// host_duplicate: the same ranks in the same order, host tensors, independent of the original
// (what the async checkpoint writer uses, whatever the backend).
TEST(CommConformance, HostDuplicateHasTheSameRanksOnTheHost) {
  for (const auto& comm : backends()) {
    auto dup = comm->host_duplicate(comm->name() + "-host");
    ASSERT_NE(dup, nullptr) << comm->name();
    EXPECT_EQ(dup->rank(), comm->rank()) << comm->name();
    EXPECT_EQ(dup->size(), comm->size()) << comm->name();
    EXPECT_TRUE(dup->device().is_cpu()) << comm->name();
    at::Tensor t = at::full({3}, static_cast<float>(comm->rank() + 1));
    dup->all_reduce(t)->wait();
    const int n = comm->size();
    // The ranks summed are comm's own: 1 + ... + n.
    EXPECT_EQ(t[0].item<float>(), static_cast<float>(n * (n + 1) / 2)) << comm->name();
  }
}

// mpi_run_ordered (the raw-MPI baseline of `bench collectives` runs through it): fn runs on the
// communicator's own thread, after every operation issued before it, on an MPI communicator of the
// same group; fn's exceptions reach the caller; non-MPI communicators are refused.
TEST(CommConformance, RunOrderedRunsOnTheCommunicationThreadInIssueOrder) {
  const auto& boot = tessera::launcher::current().groups;
  for (const auto& comm : backends()) {
    // mpi_run_ordered takes the MPI backend's own class: not the bootstrap's groups, which the test
    // binaries wrap in the failure tests' decorators (tests/support/fault_env.cpp).
    if (comm->backend() != "mpi" || comm == boot.world || comm == boot.intra || comm == boot.inter) continue;
    SCOPED_TRACE(comm->name());
    at::Tensor t = at::full({1 << 16}, comm->rank() + 1, at::kLong);
    auto pending = comm->all_reduce(t);  // not waited for: run_ordered must come after it
    std::thread::id ran_on;
    int64_t seen = -1;
    int size = -1, rank = -1;
    tc::mpi_run_ordered(*comm, [&](MPI_Comm c) {
      ran_on = std::this_thread::get_id();
      seen = t[(1 << 16) - 1].item<int64_t>();
      MPI_Comm_size(c, &size);
      MPI_Comm_rank(c, &rank);
    });
    pending->wait();
    const int64_t n = comm->size();
    EXPECT_EQ(seen, n * (n + 1) / 2);
    EXPECT_NE(ran_on, std::this_thread::get_id());
    EXPECT_EQ(size, comm->size());
    EXPECT_EQ(rank, comm->rank());
    EXPECT_THROW(tc::mpi_run_ordered(*comm, [](MPI_Comm) { throw std::runtime_error("boom"); }), std::exception);
    comm->barrier()->wait();  // the communicator still works after fn threw
  }
  EXPECT_THROW(tc::mpi_run_ordered(*tc::make_self_communicator(), [](MPI_Comm) {}), tessera::Error);
}

}  // namespace test_comm_conformance
