// libFuzzer harness: the run configuration (launcher/config.cpp): JSON text, then `--set` overrides.
//
// Input: part 0 is the JSON text of a run config; every further part (fuzz_common.h's kSplit
// line between them) is one `--set key=value` override. When parsing succeeds, every key's field is
// read back through the schema, and the configuration written as JSON reads back to the same
// configuration (what run_info.json and checkpoints record is what ran).
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
        for (const auto& k : config_schema()) (void)k.value(c);
        const nlohmann::json written = c.json();
        (void)written.dump();
        if (Config::from_json(written, "written").json() != written) __builtin_trap();
      },
      {"fuzz.json", "--set"});
  return 0;
}
