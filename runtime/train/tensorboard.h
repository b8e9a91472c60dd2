// A TensorBoard event file of scalars (log.tensorboard), written without TensorFlow or protobuf:
// <dir>/events.out.tfevents.<unix time>.<host>, a TFRecord file of Event protos:
//   record = u64 length | u32 masked_crc32c(length bytes) | data | u32 masked_crc32c(data)
//   (little-endian; CRC-32C (Castagnoli), masked as ((crc >> 15) | (crc << 17)) + 0xa282ead8)
//   Event { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }  Value { string tag = 1; float simple_value = 2; }
// The first event carries file_version "brain.Event:2"; then one event per add_scalars call.
// Every write is flushed (a crashed run keeps what it logged). Rank 0 only; not thread-safe.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "util/output_file.h"

namespace tessera::train {

class TensorBoardWriter {
 public:
  // Creates the event file in `dir` (Error(Input) naming the path when it cannot).
  explicit TensorBoardWriter(const std::string& dir);
  const std::string& path() const { return path_; }
  // One event at `step` with the given (tag, value) scalars (simple_value is a float).
  void add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars);

 private:
  void write_record(const std::string& data);
  std::string path_;
  util::OutputFile out_;  // appended to, never through a link (util/output_file.h)
};

}  // namespace tessera::train
