// Shared gtest main for tests/mpi/*: initialises MPI (same thread level as the launcher), runs
// every test on every rank, and makes all ranks agree on the result: the process exits non-zero
// on every rank if any rank failed. Only rank 0 prints the normal gtest report; other ranks print
// failures only.
#include <gtest/gtest.h>
#include <mpi.h>

#include "launcher/bootstrap.h"
#include "runtime/memory/tracker.h"

namespace {
class QuietListener : public ::testing::EmptyTestEventListener {
 public:
  explicit QuietListener(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
              r.line_number(), r.summary());
  }

 private:
  int rank_;
};
}  // namespace

int main(int argc, char** argv) {
  tessera::memory::configure_process_allocators();  // as the tessera binary does
  ::testing::InitGoogleTest(&argc, argv);
  tessera::launcher::Bootstrap boot = tessera::launcher::bootstrap(argc, argv, {});
  int rank = boot.world_rank;
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new QuietListener(rank));
  }
  int local_fail = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_fail = 0;
  MPI_Allreduce(&local_fail, &any_fail, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && any_fail && !local_fail) fprintf(stderr, "some other rank failed\n");
  tessera::launcher::finalize();
  return any_fail;
}
