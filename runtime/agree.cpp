#include "runtime/agree.h"

#include <cctype>

namespace tessera {

ErrorKind kind_of_exit_code(int code) {
  for (ErrorKind k : {ErrorKind::Input, ErrorKind::Timeout, ErrorKind::Internal})
    if (Error(k, "").exit_code() == code) return k;
  return ErrorKind::Internal;
}

std::string encode_error(const std::exception& e) {
  const auto* te = dynamic_cast<const Error*>(&e);
  const int code = te ? te->exit_code() : Error(ErrorKind::Input, "").exit_code();
  return std::to_string(code) + "|" + e.what();
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
  return {kind_of_exit_code(std::stoi(wire.substr(0, bar))), wire.substr(bar + 1)};
}

}  // namespace tessera
