// take_global_options (launcher/commands.h): an MPI command's --ranks-per-node / --threads, taken
// anywhere among its arguments in either form, the rest passed on in order; bad values refused in
// one line naming the option. (The real binary's refusal: tests/unit/cli_errors.sh.)
#include <gtest/gtest.h>

#include "launcher/commands.h"
#include "util/error.h"

namespace test_global_options {  // the files of a gtest binary compile together (tests/CMakeLists.txt)

using tessera::launcher::global_options;
using tessera::launcher::take_global_options;
using Args = std::vector<std::string>;

std::string error_of(const Args& args) {
  try {
    take_global_options(args);
  } catch (const tessera::Error& e) {
    EXPECT_EQ(e.kind(), tessera::ErrorKind::Input);
    return e.what();
  }
  return "";
}

TEST(GlobalOptions, TakenAnywhereTheRestInOrder) {
  global_options() = {};
  const Args rest = take_global_options({"--config", "run.json", "--threads", "3", "--set", "train.lr=-1e-4",
                                         "--ranks-per-node=2", "-h", "data.txt", "--tokens", "t.bin"});
  EXPECT_EQ(rest, (Args{"--config", "run.json", "--set", "train.lr=-1e-4", "-h", "data.txt", "--tokens", "t.bin"}));
  EXPECT_EQ(global_options().threads, 3);
  EXPECT_EQ(global_options().ranks_per_node, 2);
}

TEST(GlobalOptions, ExactNamesOnlyAndNothingTakenWhenAbsent) {
  global_options() = {};
  const Args args{"--thread", "4", "--ranks", "2", "--t=1", "--steps=5"};
  EXPECT_EQ(take_global_options(args), args);  // no prefix guessing: these belong to the command
  EXPECT_EQ(global_options().threads, 0);
  EXPECT_EQ(global_options().ranks_per_node, 0);
}

TEST(GlobalOptions, BadValuesNameTheOption) {
  EXPECT_EQ(error_of({"--ranks-per-node", "zero"}), "--ranks-per-node 'zero' must be a positive integer");
  EXPECT_EQ(error_of({"--threads=0"}), "--threads '0' must be a positive integer");
  EXPECT_EQ(error_of({"--threads", "2x"}), "--threads '2x' must be a positive integer");
  EXPECT_NE(error_of({"--train", "--threads"}).find("threads"), std::string::npos);  // no value
}

}  // namespace test_global_options
