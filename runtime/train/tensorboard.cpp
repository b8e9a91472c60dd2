#include "runtime/train/tensorboard.h"

#include <unistd.h>

#include <chrono>
#include <cerrno>
#include <cstring>

#include "runtime/checkpoint/crc32c.h"
#include "util/error.h"

namespace tessera::train {
namespace {

// Protobuf wire format: key = field << 3 | wire type (0 varint, 1 fixed64, 2 length-delimited, 5 fixed32).
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}
template <typename T>
void put_fixed(std::string& out, T v) {  // little-endian hosts (x86-64, aarch64)
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}
void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_varint(out, static_cast<uint64_t>(field) << 3 | 2);
  put_varint(out, bytes.size());
  out += bytes;
}
// Event's wall_time (1, double) and step (2, int64).
std::string event_head(int64_t step) {
  std::string e;
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  put_varint(e, 1 << 3 | 1);
  put_fixed(e, now);
  put_varint(e, 2 << 3 | 0);
  put_varint(e, static_cast<uint64_t>(step));
  return e;
}

// TFRecord's mask of the CRC-32C (the checkpoints' checkpoint::crc32c, Castagnoli).
uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t crc = checkpoint::crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

}  // namespace

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  const auto secs = std::chrono::duration_cast<std::chrono::seconds>(
      std::chrono::system_clock::now().time_since_epoch()).count();
  path_ = dir + "/events.out.tfevents." + std::to_string(secs) + "." + host;
  std::string why;
  if (!out_.open(path_, util::OutputFile::Mode::Append, why))
    throw TESSERA_INPUT_ERROR("cannot open the TensorBoard event file " + path_ + " for writing (log.dir): " + why);
  std::string e = event_head(0);
  put_bytes(e, 3, "brain.Event:2");
  write_record(e);
}

void TensorBoardWriter::add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    put_bytes(v, 1, tag);
    put_varint(v, 2 << 3 | 5);
    put_fixed(v, static_cast<float>(value));
    put_bytes(summary, 1, v);
  }
  std::string e = event_head(step);
  put_bytes(e, 5, summary);
  write_record(e);
}

void TensorBoardWriter::write_record(const std::string& data) {
  std::string rec;
  put_fixed(rec, static_cast<uint64_t>(data.size()));
  put_fixed(rec, masked_crc32c(rec.data(), 8));
  rec += data;
  put_fixed(rec, masked_crc32c(data.data(), data.size()));
  if (!out_.write(rec)) throw TESSERA_INPUT_ERROR(path_ + ": cannot write the TensorBoard event file: " + std::strerror(errno));
}

}  // namespace tessera::train
