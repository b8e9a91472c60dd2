// Data and checkpoint inputs that a download could hand Tessera (issue 58): a record past the
// record budget (util/budgets.h), in JSON Lines and JSON arrays, plain or gzip; a data directory
// whose links leave it; FIFOs, sockets and devices as data, token files or checkpoint rank files
// (refused by name before they are opened: opening a FIFO blocks); the in-memory budget of `train`;
// the temporaries a killed `tessera tokenize` leaves. Real files in a temp directory.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "runtime/data/dataset.h"
#include "runtime/data/format.h"
#include "runtime/data/token_file.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "tests/unit/test_checkpoint_util.h"
#include "util/budgets.h"
#include "util/file_tree.h"

namespace test_hostile_files {  // the files of a gtest binary compile together (tests/CMakeLists.txt)

using namespace tessera;
using namespace tessera::data;
using namespace tessera::text;
using tessera::test::expect_input_error, tessera::test::run_capture, tessera::test::write_file;
namespace fs = std::filesystem;

namespace {

class HostileData : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return dir + "/" + name; }
  void load(const std::string& p) const {
    ByteTokenizer tok;
    ReadStats stats;
    load_documents({p}, tok, *make_chat_template("llama2"), stats);
  }
  const tessera::test::TempDir tmp{"tessera_hostile"};
  const std::string dir = tmp.str();
};

// A process id that is gone: a child that has exited and been reaped.
pid_t dead_pid() {
  const pid_t pid = fork();
  if (pid == 0) _exit(0);
  waitpid(pid, nullptr, 0);
  return pid;
}

}  // namespace

TEST_F(HostileData, RecordsPastTheBudgetAreRefusedNamingFileAndLine) {
  const std::string big(util::budget::kRecordBytes + 1, 'a');
  write_file(path("long.jsonl"), "{\"text\": \"short\"}\n\n{\"text\": \"" + big + "\"}\n");
  expect_input_error([&] { load(path("long.jsonl")); },
                     {"data file " + path("long.jsonl") + " line 3: a record longer than 16 MiB"});
  // Without a newline at all (the reader must stop at the budget, not at the end of the line).
  write_file(path("nonl.jsonl"), "{\"text\": \"" + big);
  run_capture("gzip -1 " + path("nonl.jsonl"));
  expect_input_error([&] { load(path("nonl.jsonl.gz")); }, {path("nonl.jsonl.gz") + " line 1: a record longer"});
  write_file(path("array.json"), "[\n {\"text\": \"x\"},\n {\"text\": \"" + big + "\"}\n]\n");
  run_capture("gzip -1 " + path("array.json"));
  expect_input_error([&] { load(path("array.json.gz")); }, {path("array.json.gz") + " line 3: a record longer"});
  // Plain text has no record: its long line is cut into blocks.
  write_file(path("long.txt"), big);
  EXPECT_NO_THROW(load(path("long.txt")));
}

TEST_F(HostileData, TrainRefusesMoreThanItsInMemoryBudget) {
  MemoryStoreBuilder b("f.jsonl", 258, 100);
  const std::vector<int32_t> ids(20, 7);
  const std::vector<uint8_t> t(20, 1);
  b.begin_document(false, 1);
  b.append(ids.data(), t.data(), ids.size());  // 80 bytes
  b.end_document();                            // + 16
  b.begin_document(false, 2);
  expect_input_error([&] { b.append(ids.data(), t.data(), 2); },  // 104
                     {"data file f.jsonl", "more tokens than train reads into memory", "tessera tokenize"});
}

TEST_F(HostileData, SpecialFilesAreRefusedBeforeTheyAreOpened) {
  ASSERT_EQ(mkfifo(path("fifo.jsonl").c_str(), 0600), 0);
  // Opening the FIFO would block this test for ever.
  expect_input_error([&] { list_data(path("fifo.jsonl")); },
                     {"data file " + path("fifo.jsonl") + " is a FIFO, not a regular file", "write it to a file"});
  expect_input_error([&] { list_data("/dev/null"); }, {"data file /dev/null is a character device"});
  ASSERT_EQ(mkfifo(path("t.bin").c_str(), 0600), 0);
  expect_input_error([&] { open_token_file(path("t.bin")); }, {"token file " + path("t.bin") + " is a FIFO"});
  fs::create_directories(path("d"));
  write_file(path("d/a.jsonl"), "{\"text\": \"x\"}\n");
  fs::rename(path("t.bin"), path("d/b.bin"));
  expect_input_error([&] { list_data(path("d")); }, {"data file " + path("d/b.bin") + " is a FIFO"});
  fs::remove(path("d/b.bin"));
  const int s = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path("d/sock").c_str());
  ASSERT_EQ(bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  expect_input_error([&] { list_data(path("d")); }, {"data file " + path("d/sock") + " is a socket"});
  close(s);
  EXPECT_EQ(util::special_file_kind(path("d/a.jsonl")), "");
  EXPECT_EQ(util::special_file_kind(path("d")), "");
}

TEST_F(HostileData, LinksLeavingTheDataDirectoryAreRefusedNamingLinkAndTarget) {
  fs::create_directories(path("outside/sub"));
  fs::create_directories(path("data/in"));
  write_file(path("outside/secret.jsonl"), "{\"text\": \"secret\"}\n");
  write_file(path("outside/sub/more.jsonl"), "{\"text\": \"more\"}\n");
  write_file(path("data/in/a.jsonl"), "{\"text\": \"a\"}\n");
  // Links inside stay fine, and a loop (a link to an enclosing directory inside) does not hang.
  fs::create_symlink("in/a.jsonl", path("data/b.jsonl"));
  fs::create_directory_symlink("..", path("data/in/up"));
  EXPECT_EQ(list_data(path("data")).files.size(), 2u);
  const std::string outside = fs::canonical(path("outside")).string();
  fs::create_symlink(path("outside/secret.jsonl"), path("data/in/s.jsonl"));
  expect_input_error([&] { list_data(path("data")); },
                     {"data directory " + path("data") + " holds a link " + path("data/in/s.jsonl") + " to " + outside +
                          "/secret.jsonl, outside it",
                      "copy the file in, or give it itself as data.path"});
  fs::remove(path("data/in/s.jsonl"));
  fs::create_directory_symlink("../../outside/sub", path("data/in/o"));
  expect_input_error([&] { list_data(path("data")); }, {path("data/in/o") + " to " + outside + "/sub, outside it"});
  fs::remove(path("data/in/o"));
  fs::create_directory_symlink("../..", path("data/in/parent"));  // a loop through the parent: outside
  expect_input_error([&] { list_data(path("data")); }, {path("data/in/parent") + " to " + fs::canonical(dir).string()});
  fs::remove(path("data/in/parent"));
  // The data path itself may be a link (to a directory or a file): that is what was given.
  fs::create_directory_symlink(path("data"), path("via-link"));
  EXPECT_EQ(list_data(path("via-link")).files.size(), 2u);
  const util::TreeListing t = [&] {
    std::error_code ec;
    return util::list_tree(path("data"), ec);
  }();
  EXPECT_TRUE(t.outside_links.empty());
}

TEST_F(HostileData, TokenizeRemovesTheTemporariesOfAKilledRun) {
  const std::string out = path("out.bin"), gone = std::to_string(dead_pid()), alive = std::to_string(getpid());
  for (const std::string& name : {out + ".tmp." + gone, out + ".table.tmp." + gone, out + ".tmp." + alive,
                                  out + ".tmp.x" + gone, path("other.bin.tmp." + gone)})
    write_file(name, "partial");
  fs::create_directory(out + ".tmp.1");  // not a regular file: kept
  const std::vector<std::string> removed = TokenFileWriter::remove_stale_temporaries(out);
  EXPECT_EQ(std::set<std::string>(removed.begin(), removed.end()),
            (std::set<std::string>{out + ".tmp." + gone, out + ".table.tmp." + gone}));
  EXPECT_FALSE(fs::exists(out + ".tmp." + gone));
  EXPECT_TRUE(fs::exists(out + ".tmp." + alive)) << "a running writer's temporary is kept";
  EXPECT_TRUE(fs::exists(out + ".tmp.x" + gone));
  EXPECT_TRUE(fs::exists(path("other.bin.tmp." + gone)));
}

namespace {
using HostileCheckpoint = ckpt_test::CheckpointDirTest;
}  // namespace

TEST_F(HostileCheckpoint, ARankFileThatIsNotARegularFileIsRefusedByName) {
  const std::string ck = save_steps({1});
  const std::string file = ck + "/rank-00000.bin";
  fs::remove(file);
  ASSERT_EQ(mkfifo(file.c_str(), 0600), 0);
  auto e = ckpt_test::make_engine(ckpt_test::self_groups());
  const std::string msg = tessera::test::error_of([&] { checkpoint::load(ck, *e, e->kinds); });
  EXPECT_NE(msg.find("checkpoint file " + file + " is a FIFO, not a regular file"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("18446744073709551615"), std::string::npos) << msg;
}

}  // namespace test_hostile_files
