// model/ has no dependency on runtime/, so it has its own exception type for bad model input
// (malformed safetensors, config.json, shapes). launcher/ maps it to exit code 2 like
// tessera::Error(Input). The message always names the file and, where relevant, the tensor or key.
#pragma once
#include <stdexcept>
#include <string>

namespace tessera::model {

class ModelError : public std::runtime_error {
 public:
  explicit ModelError(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace tessera::model
