// Helpers for unit tests that run command-line tools (spm_train, spm_encode, spm_decode) as oracles.
#pragma once
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace tessera::test {

// stdout of `cmd` (run by the shell); a non-zero exit status fails the test.
inline std::string run_capture(const std::string& cmd) {
  std::string out;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  EXPECT_EQ(pclose(pipe), 0) << cmd;
  return out;
}

}  // namespace tessera::test
