// libFuzzer harness: the run configuration (launcher/config.cpp): JSON text, then `--set` overrides.
//
// Input: part 0 is the JSON text of a run config; every further part (fuzz_common.h's kSplit
// line between them) is one `--set key=value` override. When parsing succeeds, every schema key is
// read back with its typed getter (the types the schema promises must hold).
#include "launcher/config.h"
#include "tests/fuzz/fuzz_common.h"

using namespace tessera;
using namespace tessera::launcher;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string> parts = fuzz::split_parts(data, size, 64);
  const std::vector<std::string> sets(parts.begin() + 1, parts.end());
  fuzz::expect_input_error(
      [&] {
        const nlohmann::json j = parse_json_text(parts[0], "fuzz.json");
        const Config c = Config::from_json(j, "fuzz.json", sets);
        for (const auto& k : config_schema()) {
          if (k.type == "int") (void)c.get_int(k.key);
          else if (k.type == "float") (void)c.get_float(k.key);
          else if (k.type == "bool") (void)c.get_bool(k.key);
          else if (k.type == "int list") (void)c.get_int_list(k.key);
          else (void)c.get_string(k.key);
        }
        (void)c.json().dump();
      },
      {"fuzz.json", "--set"});
  return 0;
}
