// libFuzzer harness: YAML configuration files (launcher/yaml_config.cpp), the YAML text converted
// to the JSON the run config and the Accelerate translation read, aliases followed.
//
// Input: the YAML text. It is converted twice, as a run config (plain scalars typed by the schema's
// "string" for keys ending in "name", to take that branch) and as an Accelerate file (positions
// recorded); what converts must dump (the value is finite and acyclic). The budgets on nesting and
// on nodes after alias expansion (util/budgets.h) keep a 1 KB "billion laughs" from growing for ever.
#include "launcher/yaml_config.h"
#include "tests/fuzz/fuzz_common.h"

using namespace tessera;
using namespace tessera::launcher;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const bool newline = text.find('\n') != std::string::npos || text.find('\r') != std::string::npos;
  auto typer = [](const std::string& key) {
    return key.size() >= 4 && key.compare(key.size() - 4, 4, "name") == 0 ? std::string("string") : std::string();
  };
  fuzz::expect_input_error([&] { (void)parse_yaml_text(text, "fuzz.yaml", typer).dump(); }, {"fuzz.yaml"}, newline);
  YamlPositions positions;
  fuzz::expect_input_error([&] { (void)parse_yaml_text(text, "acc.yaml", {}, &positions).dump(); }, {"acc.yaml"}, newline);
  return 0;
}
