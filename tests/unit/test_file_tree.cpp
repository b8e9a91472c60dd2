// util/file_tree.h: removing and walking directory trees on POSIX calls (std::filesystem's tree
// functions bind to a LibTorch wheel's own copies; see the header). Real files in a temp directory.
#include "util/file_tree.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "tests/support/test_support.h"

namespace test_file_tree {  // the files of a gtest binary compile together (tests/CMakeLists.txt)

namespace fs = std::filesystem;
using tessera::util::files_below;
using tessera::util::remove_tree;

namespace {

void touch(const std::string& path) { std::ofstream(path) << path; }

// <root>/a/b/deep, <root>/a/one, <root>/two, <root>/.hidden/inside, <root>/a/.dot, and a link
// <root>/link -> <outside> (a directory with one file).
void make_tree(const std::string& root, const std::string& outside) {
  fs::create_directories(root + "/a/b");
  fs::create_directories(root + "/.hidden");
  touch(root + "/a/b/deep");
  touch(root + "/a/one");
  touch(root + "/two");
  touch(root + "/.hidden/inside");
  touch(root + "/a/.dot");
  fs::create_directories(outside);
  touch(outside + "/kept");
  fs::create_directory_symlink(outside, root + "/link");
}

}  // namespace

TEST(FileTree, RemoveTreeRemovesEverythingBelowAndNotThroughLinks) {
  tessera::test::TempDir t("tessera-file-tree");
  const std::string root = t.str() + "/root", outside = t.str() + "/outside";
  make_tree(root, outside);
  std::error_code ec;
  // 4 directories (root, a, a/b, .hidden), 5 files, 1 link.
  EXPECT_EQ(remove_tree(root, ec), 10u);
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_FALSE(fs::exists(fs::symlink_status(root)));
  EXPECT_TRUE(fs::exists(outside + "/kept")) << "the link's target was followed";
  EXPECT_EQ(remove_tree(root, ec), 0u) << "a missing path is no error";
  EXPECT_FALSE(ec);
  touch(t.str() + "/file");
  EXPECT_EQ(remove_tree(t.str() + "/file"), 1u);
  EXPECT_FALSE(fs::exists(t.str() + "/file"));
}

TEST(FileTree, RemoveTreeReportsAnErrorAndThrowsNamingThePath) {
  tessera::test::TempDir t("tessera-file-tree");
  const std::string file = t.str() + "/plain";
  touch(file);
  std::error_code ec;
  // A path through a regular file: lstat fails with ENOTDIR.
  EXPECT_EQ(remove_tree(file + "/below", ec), static_cast<std::uintmax_t>(-1));
  EXPECT_EQ(ec, std::errc::not_a_directory);
  try {
    remove_tree(file + "/below");
    FAIL() << "no exception";
  } catch (const fs::filesystem_error& e) {
    EXPECT_NE(std::string(e.what()).find(file + "/below"), std::string::npos) << e.what();
  }
}

TEST(FileTree, FilesBelowFollowsDirectoryLinksSkipsHiddenAndSorts) {
  tessera::test::TempDir t("tessera-file-tree");
  const std::string root = t.str() + "/root", outside = t.str() + "/outside";
  make_tree(root, outside);
  fs::create_directory_symlink(root + "/a", root + "/a/b/loop");  // a cycle: walked once
  std::error_code ec;
  const std::vector<std::string> want{root + "/a/b/deep", root + "/a/one", root + "/link/kept", root + "/two"};
  EXPECT_EQ(files_below(root, ec), want);
  EXPECT_FALSE(ec) << ec.message();
  const std::vector<std::string> all{root + "/.hidden/inside", root + "/a/.dot", root + "/a/b/deep",
                                     root + "/a/one", root + "/link/kept", root + "/two"};
  EXPECT_EQ(files_below(root, ec, /*skip_hidden=*/false), all);
  EXPECT_TRUE(files_below(root + "/two", ec).empty());
  EXPECT_EQ(ec, std::errc::not_a_directory);
  files_below(root + "/missing", ec);
  EXPECT_EQ(ec, std::errc::no_such_file_or_directory);
}

}  // namespace test_file_tree
