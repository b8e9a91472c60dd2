// libFuzzer harness: sharded checkpoints -- manifest.json and the rank files it describes
// (runtime/checkpoint/reader.cpp: Reader, verify(), reads of tensor ranges).
//
// Input: part 0 is manifest.json; parts 1..8 (fuzz_common.h's kSplit line between them) are the
// files rank-00000.bin, rank-00001.bin, ... When the manifest parses, verify() checks coverage and
// checksums, each file is streamed once with the requests of every tensor's first elements (as
// load() does), and the first <= 1024 and the last element of every tensor are read.
#include <algorithm>
#include <cstdio>
#include <vector>

#include "runtime/checkpoint/checkpoint.h"
#include "tests/fuzz/fuzz_common.h"

using namespace tessera;
using namespace tessera::checkpoint;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fuzz::Scratch s;
  static std::vector<float> buf(1024);
  s.clear();
  const std::vector<std::string> parts = fuzz::split_parts(data, size, 9);
  s.write("manifest.json", parts[0]);
  for (size_t i = 1; i < parts.size(); ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "rank-%05zu.bin", i - 1);
    s.write(name, parts[i]);
  }
  fuzz::expect_input_error(
      [&] {
        Reader r(s.dir());
        (void)r.step();
        (void)r.state();
        // As load() does: every tensor's requests grouped by file, each file streamed once.
        std::vector<std::vector<ReadRequest>> per_file(r.files().size());
        size_t used = 0;
        for (const auto& t : r.tensors()) {
          const int64_t n = std::min<int64_t>(t.numel, 64);
          if (used + n > buf.size()) break;
          uint64_t bytes = 0;
          for (const auto& q : r.requests(t, 0, n, buf.data() + used)) {
            bytes += q.bytes;
            per_file.at(q.file).push_back(q);
          }
          used += n;
          if (bytes != static_cast<uint64_t>(n) * 4) fuzz::finding("requests for " + t.name + " cover the wrong bytes");
          r.read(t, 0, std::min<int64_t>(t.numel, 1024), buf.data());
          if (t.numel > 0) r.read(t, t.numel - 1, 1, buf.data());
        }
        for (size_t f = 0; f < per_file.size(); ++f) r.stream_file(static_cast<int>(f), per_file[f]);
        verify(s.dir());
      },
      {s.dir()});
  return 0;
}
