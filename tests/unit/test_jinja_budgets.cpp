// The budgets of the Jinja renderer (util/budgets.h): a hostile chat template's nesting (parsed and
// at render time), steps and strings end in one input error naming the template and its line, never
// in a stack overflow, a spin or std::bad_alloc. Real templates stay far inside them
// (test_chat_template.cpp renders them, unit.chat_template_hf compares them byte for byte with Jinja2).
#include <gtest/gtest.h>

#include <string>

#include "text/jinja/template.h"
#include "util/budgets.h"
#include "util/error.h"

namespace {

using namespace tessera::text::jinja;
const std::string kOrigin = "/models/m/tokenizer_config.json";

std::string render(const std::string& src) {
  const Template t(src, kOrigin);
  return t.render({{"messages", Value::make_list({Value::str("hi")})}}).text;
}

// The input error that parsing and rendering `src` throws ("" and a failure when none).
std::string input_error(const std::string& src) {
  try {
    render(src);
  } catch (const tessera::Error& e) {
    EXPECT_EQ(e.kind(), tessera::ErrorKind::Input) << e.what();
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    return what;
  }
  ADD_FAILURE() << "no error for " << src.substr(0, 200);
  return "";
}

std::string repeat(const std::string& s, int n) {
  std::string out;
  for (int k = 0; k < n; ++k) out += s;
  return out;
}

const std::string kTooDeep = "chat template " + kOrigin + " line 1: nests deeper than 256 levels";

TEST(JinjaBudgets, DeepExpressionsAreRefusedWhenParsed) {
  const int n = 100000;
  for (const std::string& expr :
       {repeat("(", n) + "1" + repeat(")", n), repeat("[", n) + repeat("]", n), repeat("-(", n) + "1" + repeat(")", n),
        repeat("- ", n) + "1", "a" + repeat(".b", n), repeat("not ", n) + "1", "1" + repeat(" + 1", n),
        "'a'" + repeat("|upper", n), "f" + repeat("()", n), "1" + repeat(" if 1 else 2", n / 4),
        repeat("{'a': ", n) + "1" + repeat("}", n), "x" + repeat("[0]", n), repeat("1 or ", n) + "1"})
    EXPECT_NE(input_error("{{ " + expr + " }}").find(kTooDeep), std::string::npos) << expr.substr(0, 40);
}

TEST(JinjaBudgets, DeepBlocksAreRefusedWhenParsed) {
  const std::string ifs = repeat("{% if true %}", 20000) + "x" + repeat("{% endif %}", 20000);
  EXPECT_NE(input_error(ifs).find("nests deeper than 256 levels"), std::string::npos);
  const std::string fors = repeat("{% for x in [1] %}", 20000) + "x" + repeat("{% endfor %}", 20000);
  EXPECT_NE(input_error(fors).find("nests deeper than 256 levels"), std::string::npos);
}

TEST(JinjaBudgets, NestingWithinTheBudgetRenders) {
  EXPECT_EQ(render("{{ " + repeat("(", 200) + "7" + repeat(")", 200) + " }}"), "7");
  EXPECT_EQ(render(repeat("{% if true %}", 100) + "x" + repeat("{% endif %}", 100)), "x");
  EXPECT_EQ(render("{{ " + repeat("- ", 100) + "1 }}"), "1");
}

TEST(JinjaBudgets, MacroRecursionIsBoundedAtRenderTime) {
  EXPECT_NE(input_error("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}").find("nests deeper than 256 levels"),
            std::string::npos);
  // Recursion with a base case, as deep as a real template could want, renders.
  EXPECT_EQ(render("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(9) }}"), "987654321");
}

TEST(JinjaBudgets, LoopIterationsAndMacroCallsAreCounted) {
  const std::string want = "exceeded 1000000 loop iterations and macro calls in one render";
  EXPECT_NE(input_error("{% set r = range(2000) %}{% for i in r %}{% for j in r %}{% endfor %}{% endfor %}").find(want),
            std::string::npos);
  EXPECT_NE(input_error("{% macro g() %}{% endmacro %}{% set r = range(1000) %}{% for i in r %}{% for j in r %}{{ g() }}"
                        "{% endfor %}{% endfor %}")
                .find(want),
            std::string::npos);
}

TEST(JinjaBudgets, StringsAndTheOutputAreBounded) {
  const std::string big = "made a string of more than 16 MiB";
  for (const std::string& src : {std::string("{{ 'x' * 4000000000 }}"), std::string("{{ '' * 4000000000 }}x"),
                                 std::string("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}"
                                             "{% endfor %}{{ ns.s|length }}"),
                                 std::string("{% set s = 'x' %}{% for i in range(40) %}{% set s = s ~ s %}{% endfor %}"),
                                 std::string("{{ range(100000)|join('x' * 1000) }}"),
                                 std::string("{% set s = 'x' * 10000000 %}{{ [s, s]|string|length }}"),
                                 std::string("{% set s = 'x' * 10000000 %}{{ [s, s]|tojson|length }}"),
                                 std::string("{{ ('x' * 10000000).replace('x', 'yy')|length }}")}) {
    const std::string err = src.find("'' *") != std::string::npos ? "" : input_error(src);
    if (src.find("'' *") != std::string::npos) EXPECT_EQ(render(src), "x");  // the empty string repeated: no spin
    else EXPECT_NE(err.find(big), std::string::npos) << src << ": " << err;
  }
  EXPECT_NE(input_error("{% for i in range(20) %}{{ 'x' * 1000000 }}{% endfor %}").find("rendered more than 16 MiB"),
            std::string::npos);
  EXPECT_NE(input_error("{% set s = 'x' * 10000000 %}{% set ns = namespace(l=[]) %}{% for i in range(100) %}"
                        "{% set ns.l = ns.l + [s] %}{% endfor %}")
                .find("made more than 256 MiB of strings and list items in one render"),
            std::string::npos);
}

TEST(JinjaBudgets, DeepAndCyclicValuesArePrintedWithinTheBudget) {
  // A namespace holding itself, printed or compared: refused, not a stack overflow (nor a leak).
  EXPECT_NE(input_error("{% set ns = namespace(a=1) %}{% set ns.a = ns %}{{ ns }}").find("nests deeper than 256 levels"),
            std::string::npos);
  EXPECT_NE(input_error("{% set ns = namespace(a=1) %}{% set ns.a = [ns] %}{{ ns|tojson }}").find("nests deeper"),
            std::string::npos);
  // A list 100,000 deep, built by a loop: measured and freed without deep recursion, refused when printed.
  const std::string deep = "{% set ns = namespace(x=none) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}";
  EXPECT_EQ(render(deep + "{{ ns.x|length }}"), "1");
  EXPECT_NE(input_error(deep + "{{ ns.x }}").find("nests deeper than 256 levels"), std::string::npos);
}

}  // namespace

namespace {
// Literals that std::stoll / std::stoul refuse (found by fuzz_jinja: the exception escaped as an
// internal error, exit 1): an input error naming the template and line.
TEST(JinjaBudgets, LiteralsOutOfRangeAreInputErrors) {
  EXPECT_NE(input_error("{{ 99999999999999999999999 }}").find("number literal out of range"), std::string::npos);
  EXPECT_NE(input_error("{{ '\\xzz' }}").find("bad \\x, \\u or \\U escape"), std::string::npos);
  EXPECT_EQ(render("{{ 9223372036854775807 }}"), "9223372036854775807");
}
}  // namespace
