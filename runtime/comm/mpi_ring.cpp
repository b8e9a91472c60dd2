#include "runtime/comm/mpi_ring.h"

#include <cstring>
#include <string>
#include <vector>

#include "util/error.h"

namespace tessera::comm::ring {
namespace {

// Calls of one communicator never interleave, so one tag suffices: MPI matches messages with the
// same source, tag and communicator in the order they were sent.
constexpr int kTag = 0x7e55;

int rank_of(MPI_Comm comm) {
  int r = 0;
  check_mpi(MPI_Comm_rank(comm, &r), "MPI_Comm_rank");
  return r;
}

int mod(int a, int n) { return ((a % n) + n) % n; }

int as_int(int64_t count) { return static_cast<int>(count); }  // callers keep counts <= INT_MAX

}  // namespace

void check_mpi(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw Error(ErrorKind::Internal, std::string(call) + " failed: " + std::string(msg, len), __FILE__, __LINE__);
}

void reduce_scatter(char* in, bool clobber_in, char* out, char* scratch, const Blocks& b, int elem_size,
                    MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
  const int n = b.parts, r = rank_of(comm), next = mod(r + 1, n), prev = mod(r - 1, n);
  auto block = [&](int i) { return in + b.offset(i) * elem_size; };
  // Block k starts at rank k+1 and travels k+1 -> k+2 -> ... -> k, each rank adding its own part:
  // at step s rank r sends block r-1-s and receives block r-2-s.
  if (clobber_in) {
    for (int s = 0; s < n - 1; ++s) {
      const int bs = mod(r - 1 - s, n), br = mod(r - 2 - s, n);
      check_mpi(MPI_Sendrecv(block(bs), as_int(b.count(bs)), type, next, kTag, scratch, as_int(b.count(br)), type,
                             prev, kTag, comm, MPI_STATUS_IGNORE),
                "MPI_Sendrecv");
      check_mpi(MPI_Reduce_local(scratch, block(br), as_int(b.count(br)), type, op), "MPI_Reduce_local");
    }
    if (out != block(r)) std::memcpy(out, block(r), b.count(r) * elem_size);
    return;
  }
  // `in` stays untouched: receive into `scratch` and `out` alternately (the last step lands in out).
  const char* send = block(mod(r - 1, n));
  for (int s = 0; s < n - 1; ++s) {
    const int bs = mod(r - 1 - s, n), br = mod(r - 2 - s, n);
    char* acc = (n - 2 - s) % 2 == 0 ? out : scratch;
    check_mpi(MPI_Sendrecv(send, as_int(b.count(bs)), type, next, kTag, acc, as_int(b.count(br)), type, prev, kTag,
                           comm, MPI_STATUS_IGNORE),
              "MPI_Sendrecv");
    check_mpi(MPI_Reduce_local(block(br), acc, as_int(b.count(br)), type, op), "MPI_Reduce_local");
    send = acc;
  }
  if (n == 1) std::memcpy(out, in, b.count(0) * elem_size);
}

void all_gather(char* buf, const Blocks& b, int elem_size, MPI_Datatype type, MPI_Comm comm) {
  const int n = b.parts, r = rank_of(comm), next = mod(r + 1, n), prev = mod(r - 1, n);
  auto block = [&](int i) { return buf + b.offset(i) * elem_size; };
  for (int s = 0; s < n - 1; ++s) {  // step s: pass on block r-s, receive block r-1-s
    const int bs = mod(r - s, n), br = mod(r - 1 - s, n);
    check_mpi(MPI_Sendrecv(block(bs), as_int(b.count(bs)), type, next, kTag, block(br), as_int(b.count(br)), type,
                           prev, kTag, comm, MPI_STATUS_IGNORE),
              "MPI_Sendrecv");
  }
}

void all_reduce(char* buf, int64_t n, char* scratch, int elem_size, MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
  int size = 1;
  check_mpi(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  const Blocks b(n, size);
  const int r = rank_of(comm);
  reduce_scatter(buf, true, buf + b.offset(r) * elem_size, scratch, b, elem_size, type, op, comm);
  all_gather(buf, b, elem_size, type, comm);
}

void broadcast(char* buf, int64_t n, int root, int64_t segment, int elem_size, MPI_Datatype type, MPI_Comm comm) {
  int size = 1;
  check_mpi(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  const int r = rank_of(comm), pos = mod(r - root, size);
  const int prev = mod(r - 1, size), next = mod(r + 1, size);
  std::vector<MPI_Request> sends;
  for (int64_t off = 0; off < n; off += segment) {
    const int len = as_int(std::min(segment, n - off));
    char* p = buf + off * elem_size;
    if (pos > 0) check_mpi(MPI_Recv(p, len, type, prev, kTag, comm, MPI_STATUS_IGNORE), "MPI_Recv");
    if (pos < size - 1) {
      sends.emplace_back();
      check_mpi(MPI_Isend(p, len, type, next, kTag, comm, &sends.back()), "MPI_Isend");
    }
  }
  check_mpi(MPI_Waitall(static_cast<int>(sends.size()), sends.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
}

}  // namespace tessera::comm::ring
