#include "runtime/comm/agree.h"

#include <cctype>

#include "runtime/comm/communicator.h"

namespace tessera {

std::string encode_error(ErrorKind kind, const std::string& message) {
  return std::to_string(exit_code_for(kind)) + "|" + message;
}

std::string encode_error(const std::exception& e) {
  const auto* te = dynamic_cast<const Error*>(&e);
  return encode_error(te ? te->kind() : ErrorKind::Input, e.what());
}

std::string capture_error(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return encode_error(e);
  }
  return "";
}

bool is_encoded_error(const std::string& wire) {
  const auto bar = wire.find('|');
  if (bar == std::string::npos || bar == 0 || bar > 3) return false;
  for (size_t i = 0; i < bar; ++i)
    if (!std::isdigit(static_cast<unsigned char>(wire[i]))) return false;
  return true;
}

DecodedError decode_error(const std::string& wire) {
  TESSERA_CHECK(is_encoded_error(wire), "not an encoded error: '" + wire.substr(0, 80) + "'");
  const auto bar = wire.find('|');
  return {error_kind_for_exit_code(std::stoi(wire.substr(0, bar))), wire.substr(bar + 1)};
}

std::optional<AgreedError> agree_on_error(comm::Communicator& comm, const std::string& wire) {
  TESSERA_CHECK(wire.empty() || is_encoded_error(wire), "agree_on_error takes encode_error() strings");
  const comm::Communicator::LowestError lowest = comm.lowest_error(wire);
  if (lowest.rank < 0) return std::nullopt;
  const DecodedError d = decode_error(lowest.error);
  return AgreedError{lowest.rank, d.kind, d.message};
}

void throw_if_any(comm::Communicator& comm, const std::string& wire) {
  if (auto agreed = agree_on_error(comm, wire)) throw CollectiveError(agreed->kind, agreed->message);
}

}  // namespace tessera
