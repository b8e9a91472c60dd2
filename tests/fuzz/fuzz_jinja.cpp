// libFuzzer harness: the Jinja chat-template renderer (text/jinja/*.cpp), as a downloaded
// model directory's tokenizer_config.json hands it a template. The input is the template's source;
// it is parsed, then rendered with a fixed two-turn conversation, add_generation_prompt false and true.
// Bounds (util/budgets.h): nesting, steps and string bytes end in an input error naming the template
// ("chat template <origin> line N: ..."); an exception the template raises (raise_exception, a Python
// TypeError: jinja::TemplateError) is the template's own and fine. Anything else is a finding.
#include <string>

#include "text/jinja/template.h"
#include "tests/fuzz/fuzz_common.h"

using namespace tessera;
using namespace tessera::text::jinja;

namespace {

Value message(const char* role, const char* content) {
  Value m = Value::make_dict();
  m.dict->set("role", Value::str(role));
  m.dict->set("content", Value::str(content));
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string source(reinterpret_cast<const char*>(data), size);
  fuzz::expect_input_error(
      [&] {
        const Template t(source, "fuzz/tokenizer_config.json");
        for (const bool prompt : {false, true}) {
          const Context ctx = {{"messages", Value::make_list({message("system", "Be brief."), message("user", "Hi {{ x }}"),
                                                              message("assistant", "Hello\n'quoted' \"too\" é")})},
                               {"bos_token", Value::str("<s>")},
                               {"eos_token", Value::str("</s>")},
                               {"add_generation_prompt", Value::boolean(prompt)},
                               {"tools", Value::none()}};
          try {
            (void)t.render(ctx);
          } catch (const TemplateError&) {
          }
        }
      },
      {"chat template fuzz/tokenizer_config.json"});
  return 0;
}
