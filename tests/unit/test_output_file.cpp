// util/output_file.h: Tessera's outputs are never written through a link planted at their names
// (another user of a shared scratch folder may plant `metrics.jsonl -> ~/notes`), nor into a FIFO
// or device; a resumed run still appends to its regular metrics.jsonl.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "tests/support/test_support.h"
#include "util/output_file.h"

namespace {

namespace fs = std::filesystem;
using tessera::test::read_file;
using tessera::test::write_file;
using tessera::util::OutputFile;

class OutputFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    write_file(target, "precious\n");
    fs::create_symlink(target, link);
  }
  const tessera::test::TempDir tmp{"tessera-output"};
  const std::string dir = tmp.str(), target = dir + "/precious.txt", link = dir + "/planted";
};

}  // namespace

TEST_F(OutputFileTest, FreshRemovesAPlantedLinkNeverItsTarget) {
  const int fd = tessera::util::create_fresh(link.c_str());
  ASSERT_GE(fd, 0) << std::strerror(errno);
  ASSERT_TRUE(tessera::util::write_all(fd, "new\n", 4));
  ::close(fd);
  EXPECT_EQ(read_file(target), "precious\n");
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(link)));
  EXPECT_EQ(read_file(link), "new\n");
  // A stale regular file is replaced by a new one (not truncated in place: its other names keep it).
  fs::create_hard_link(link, dir + "/other-name");
  const int again = tessera::util::create_fresh(link.c_str());
  ASSERT_GE(again, 0);
  ::close(again);
  EXPECT_EQ(read_file(dir + "/other-name"), "new\n");
  EXPECT_EQ(read_file(link), "");
}

TEST_F(OutputFileTest, AppendRefusesALinkOrAFifoAndAppendsToARegularFile) {
  OutputFile f;
  std::string why;
  EXPECT_FALSE(f.open(link, OutputFile::Mode::Append, why));
  EXPECT_EQ(why, "it is a symbolic link to '" + target + "' (Tessera never writes through a link: remove it)");
  EXPECT_EQ(read_file(target), "precious\n");
  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_FALSE(f.open(fifo, OutputFile::Mode::Append, why));  // no reader: must not block either
  EXPECT_EQ(why, "it is a FIFO, not a regular file");
  const std::string metrics = dir + "/metrics.jsonl";
  write_file(metrics, "{\"step\": 1}\n");
  ASSERT_TRUE(f.open(metrics, OutputFile::Mode::Append, why)) << why;
  EXPECT_TRUE(f.write("{\"step\": 2}\n"));
  f.close();
  EXPECT_EQ(read_file(metrics), "{\"step\": 1}\n{\"step\": 2}\n");
}

TEST_F(OutputFileTest, ReplaceFileReplacesALinkNeverItsTarget) {
  std::string why;
  ASSERT_TRUE(tessera::util::replace_file(link, "report\n", why)) << why;
  EXPECT_EQ(read_file(target), "precious\n");
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(link)));
  EXPECT_EQ(read_file(link), "report\n");
  EXPECT_EQ(fs::status(link).permissions() & fs::perms::others_read, fs::perms::others_read);  // 0644, not mkstemp's 0600
  fs::create_directories(dir + "/a-dir");
  EXPECT_FALSE(tessera::util::replace_file(dir + "/a-dir", "x", why));
  EXPECT_EQ(why, "cannot write " + dir + "/a-dir: it is a directory, not a regular file");
  size_t entries = 0;  // no temporary left behind
  for (const auto& e : fs::directory_iterator(dir)) entries += e.path().filename().string().find(".tmp.") != std::string::npos;
  EXPECT_EQ(entries, 0u);
}
