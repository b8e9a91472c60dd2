#include "runtime/data/token_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "util/budgets.h"
#include "util/error.h"
#include "util/file_tree.h"
#include "util/output_file.h"

namespace tessera::data {

namespace fs = std::filesystem;

// ---- DocStore ------------------------------------------------------------------------------------

DocStore::DocStore(std::string source, int64_t vocab, const unsigned char* tokens, int64_t num_tokens,
                   const unsigned char* table, int64_t num_documents, std::vector<int64_t> lines,
                   std::shared_ptr<void> owner, bool all_targets)
    : source_(std::move(source)),
      vocab_(vocab),
      tokens_(tokens),
      num_tokens_(num_tokens),
      table_(table),
      num_documents_(num_documents),
      lines_(std::move(lines)),
      owner_(std::move(owner)),
      all_targets_(all_targets) {}

DocStore::Doc DocStore::doc(int64_t d) const {
  const uint64_t a = load_le<uint64_t>(table_ + 8 * d), b = load_le<uint64_t>(table_ + 8 * (d + 1));
  const int64_t begin = static_cast<int64_t>(a & ~kTextBit), end = static_cast<int64_t>(b & ~kTextBit);
  return {begin, end - begin, (a & kTextBit) != 0};
}

std::string DocStore::where(int64_t d) const {
  if (d < static_cast<int64_t>(lines_.size()) && lines_[d] > 0) return source_ + ":" + std::to_string(lines_[d]);
  return source_ + ": document " + std::to_string(d + 1);
}

// ---- MemoryStoreBuilder --------------------------------------------------------------------------

MemoryStoreBuilder::MemoryStoreBuilder(std::string source, int64_t vocab, size_t max_bytes)
    : source_(std::move(source)), vocab_(vocab), max_bytes_(max_bytes) {}

void MemoryStoreBuilder::check_budget() const {
  if (bytes() <= max_bytes_) return;
  throw TESSERA_INPUT_ERROR("data file " + source_ + ": its data path holds more tokens than train reads into memory (" +
                            std::to_string(util::budget::kInMemoryDataBytes >> 20) +
                            " MiB on every rank): tokenize it once (tessera tokenize --input PATH --out FILE.bin) and "
                            "train on the token file, which is memory-mapped");
}

void MemoryStoreBuilder::begin_document(bool text, int64_t line) {
  TESSERA_CHECK(!open_, "begin_document inside a document");
  open_ = true;
  text_ = text;
  line_ = line;
  doc_begin_ = static_cast<int64_t>(words_.size());
}

void MemoryStoreBuilder::append(const int32_t* ids, const uint8_t* target, size_t n) {
  TESSERA_CHECK(open_, "append outside a document");
  const size_t at = words_.size();
  words_.resize(at + n);
  for (size_t i = 0; i < n; ++i) {
    TESSERA_CHECK(ids[i] >= 0, "negative token id from the tokenizer");
    max_id_ = std::max(max_id_, ids[i]);
    store_le<uint32_t>(&words_[at + i], static_cast<uint32_t>(ids[i]) | (target[i] ? kTargetBit : 0));
  }
  check_budget();
}

void MemoryStoreBuilder::end_document() {
  TESSERA_CHECK(open_, "end_document outside a document");
  open_ = false;
  if (static_cast<int64_t>(words_.size()) == doc_begin_) return;
  uint64_t entry = 0;
  store_le<uint64_t>(&entry, static_cast<uint64_t>(doc_begin_) | (text_ ? kTextBit : 0));
  table_.push_back(entry);
  lines_.push_back(line_);
  check_budget();
}

std::shared_ptr<DocStore> MemoryStoreBuilder::finish() {
  TESSERA_CHECK(!open_, "finish inside a document");
  struct Owner {
    std::vector<uint32_t> words;
    std::vector<uint64_t> table;
  };
  auto owner = std::make_shared<Owner>();
  owner->words = std::move(words_);
  owner->table = std::move(table_);
  const int64_t docs = static_cast<int64_t>(owner->table.size());
  uint64_t last = 0;
  store_le<uint64_t>(&last, owner->words.size());
  owner->table.push_back(last);
  const auto* tokens = reinterpret_cast<const unsigned char*>(owner->words.data());
  const auto* table = reinterpret_cast<const unsigned char*>(owner->table.data());
  const int64_t n = static_cast<int64_t>(owner->words.size());
  return std::make_shared<DocStore>(source_, vocab_, tokens, n, table, docs, std::move(lines_), owner);
}

// ---- reading token files -------------------------------------------------------------------------

namespace {

struct Mapping {
  void* addr = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (addr) ::munmap(addr, size);
  }
};

}  // namespace

bool is_token_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return false;
  char magic[8];
  const bool ok = std::fread(magic, 1, 8, f) == 8 &&
                  (std::memcmp(magic, kTokenFileMagic, 8) == 0 || std::memcmp(magic, kTokenFileMagicV1, 8) == 0);
  std::fclose(f);
  return ok;
}

std::shared_ptr<DocStore> open_token_file(const std::string& path) {
  const std::string special = util::not_regular_file(path, "token file");
  if (!special.empty()) throw TESSERA_INPUT_ERROR(special + ": give the .bin file tessera tokenize wrote");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw TESSERA_INPUT_ERROR("cannot open token file " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw TESSERA_INPUT_ERROR("cannot stat token file " + path + ": " + std::strerror(errno));
  }
  auto map = std::make_shared<Mapping>();
  map->size = static_cast<size_t>(st.st_size);
  if (map->size > 0) {
    map->addr = ::mmap(nullptr, map->size, PROT_READ, MAP_SHARED, fd, 0);
    if (map->addr == MAP_FAILED) {
      map->addr = nullptr;
      ::close(fd);
      throw TESSERA_INPUT_ERROR("cannot map token file " + path + ": " + std::strerror(errno));
    }
    ::madvise(map->addr, map->size, MADV_RANDOM);
  }
  ::close(fd);
  const auto* p = static_cast<const unsigned char*>(map->addr);
  const uint64_t size = map->size;
  const bool v2 = size >= kTokenFileHeaderBytes && std::memcmp(p, kTokenFileMagic, 8) == 0;
  const bool v1 = size >= 20 && std::memcmp(p, kTokenFileMagicV1, 8) == 0;
  if (!v1 && !v2) throw TESSERA_INPUT_ERROR("token file " + path + " is not a Tessera token file (magic \"TSRTOK2\" missing)");
  const uint32_t vocab = load_le<uint32_t>(p + 8);
  if (v1) {
    const uint64_t count = load_le<uint64_t>(p + 12);
    if (count > (uint64_t(1) << 60) || size != 20 + 4 * count)
      throw TESSERA_INPUT_ERROR("token file " + path + " has " + std::to_string(size) + " bytes, but its header (" +
                                std::to_string(count) + " tokens) says " + std::to_string(20 + 4 * count));
    // One plain-text document: a table of two entries, kept beside the mapping.
    struct Owner {
      std::shared_ptr<Mapping> map;
      uint64_t table[2];
    };
    auto owner = std::make_shared<Owner>();
    owner->map = map;
    store_le<uint64_t>(&owner->table[0], kTextBit);
    store_le<uint64_t>(&owner->table[1], count);
    return std::make_shared<DocStore>(path, vocab, p + 20, static_cast<int64_t>(count),
                                      reinterpret_cast<const unsigned char*>(owner->table), count > 0 ? 1 : 0,
                                      std::vector<int64_t>{}, owner, /*all_targets=*/true);
  }
  const uint64_t n = load_le<uint64_t>(p + 16), d = load_le<uint64_t>(p + 24);
  const uint64_t limit = uint64_t(1) << 60;
  const uint64_t table_at = kTokenFileHeaderBytes + 4 * n + (n % 2 ? 4 : 0);
  const uint64_t expected = n < limit && d < limit ? table_at + 8 * (d + 1) : 0;
  if (size != expected)
    throw TESSERA_INPUT_ERROR("token file " + path + " has " + std::to_string(size) + " bytes, but its header (" +
                              std::to_string(n) + " tokens, " + std::to_string(d) + " documents) says " +
                              std::to_string(expected));
  const unsigned char* table = p + table_at;
  uint64_t prev = 0;
  for (uint64_t i = 0; i <= d; ++i) {
    const uint64_t start = load_le<uint64_t>(table + 8 * i) & ~kTextBit;
    const bool ok = i == 0 ? start == 0 : start > prev && start <= n;
    if (!ok || (i == d && start != n))
      throw TESSERA_INPUT_ERROR("token file " + path + ": document table entry " + std::to_string(i) + " (" +
                                std::to_string(start) + ") is out of order or out of range (" + std::to_string(n) +
                                " tokens)");
    prev = start;
  }
  return std::make_shared<DocStore>(path, vocab, p + kTokenFileHeaderBytes, static_cast<int64_t>(n), table,
                                    static_cast<int64_t>(d), std::vector<int64_t>{}, map);
}

// ---- writing token files -------------------------------------------------------------------------

// A new file at a temporary name, read-write (util::create_fresh: whatever is at the name, a
// crash's leftover or a planted link, is unlinked, never written through).
static std::FILE* fresh_file(const std::string& path) {
  const int fd = util::create_fresh(path.c_str());
  std::FILE* f = fd < 0 ? nullptr : ::fdopen(fd, "w+b");
  if (!f) {
    const std::string why = util::output_error(path, errno);
    if (fd >= 0) ::close(fd);
    throw TESSERA_INPUT_ERROR("cannot create " + path + ": " + why);
  }
  return f;
}

TokenFileWriter::TokenFileWriter(const std::string& path, uint32_t vocab)
    : path_(path),
      tmp_(path + ".tmp." + std::to_string(::getpid())),
      table_tmp_(path + ".table.tmp." + std::to_string(::getpid())),
      vocab_(vocab) {
  TESSERA_CHECK(vocab > 0 && vocab <= (1u << 31), "token file vocab out of range");
  out_ = fresh_file(tmp_);
  std::setvbuf(out_, nullptr, _IOFBF, size_t(1) << 20);
  const unsigned char zeros[kTokenFileHeaderBytes] = {};
  put(zeros, sizeof(zeros));  // the header is written by finish(), once the counts are known
}

TokenFileWriter::~TokenFileWriter() {
  if (out_) std::fclose(out_);
  if (table_out_) std::fclose(table_out_);
  if (!finished_) std::remove(tmp_.c_str());
  std::remove(table_tmp_.c_str());
}

void TokenFileWriter::put(const void* p, size_t n) {
  if (n && std::fwrite(p, 1, n, out_) != n)
    throw TESSERA_INPUT_ERROR("cannot write token file " + tmp_ + " (disk full?): " + std::strerror(errno));
}

void TokenFileWriter::begin_document(bool text, int64_t) {
  TESSERA_CHECK(!open_, "begin_document inside a document");
  open_ = true;
  text_ = text;
  doc_begin_ = num_tokens_;
}

void TokenFileWriter::append(const int32_t* ids, const uint8_t* target, size_t n) {
  TESSERA_CHECK(open_, "append outside a document");
  unsigned char buf[4096];
  for (size_t i = 0; i < n;) {
    const size_t m = std::min(n - i, sizeof(buf) / 4);
    for (size_t k = 0; k < m; ++k) {
      const int32_t id = ids[i + k];
      if (id < 0 || static_cast<uint32_t>(id) >= vocab_)
        throw TESSERA_INPUT_ERROR("token file " + path_ + ": token " + std::to_string(num_tokens_ + k) + " has id " +
                                  std::to_string(id) + ", outside the vocab of " + std::to_string(vocab_));
      store_le<uint32_t>(buf + 4 * k, static_cast<uint32_t>(id) | (target[i + k] ? kTargetBit : 0));
    }
    put(buf, 4 * m);
    num_tokens_ += static_cast<int64_t>(m);
    i += m;
  }
}

void TokenFileWriter::end_document() {
  TESSERA_CHECK(open_, "end_document outside a document");
  open_ = false;
  if (num_tokens_ == doc_begin_) return;
  table_.push_back(static_cast<uint64_t>(doc_begin_) | (text_ ? kTextBit : 0));
  ++num_documents_;
  if (table_.size() >= (size_t(1) << 20)) spill_table();
}

void TokenFileWriter::spill_table() {
  if (!table_out_) {
    table_out_ = fresh_file(table_tmp_);
  }
  std::vector<unsigned char> buf(8 * table_.size());
  for (size_t i = 0; i < table_.size(); ++i) store_le<uint64_t>(buf.data() + 8 * i, table_[i]);
  if (std::fwrite(buf.data(), 1, buf.size(), table_out_) != buf.size())
    throw TESSERA_INPUT_ERROR("cannot write " + table_tmp_ + " (disk full?)");
  table_.clear();
}

std::vector<std::string> TokenFileWriter::remove_stale_temporaries(const std::string& path) {
  const fs::path out(path);
  const fs::path dir = out.parent_path().empty() ? fs::path(".") : out.parent_path();
  const std::string base = out.filename().string();
  std::vector<std::string> removed;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::string pid;
    for (const std::string& prefix : {base + ".tmp.", base + ".table.tmp."})
      if (name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0) pid = name.substr(prefix.size());
    std::error_code st;
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos || pid.size() > 9 ||
        !fs::is_regular_file(fs::symlink_status(it->path(), st)))
      continue;
    if (::kill(static_cast<pid_t>(std::stol(pid)), 0) == 0 || errno != ESRCH) continue;  // its writer runs
    if (fs::remove(it->path(), st)) removed.push_back(it->path().string());
  }
  return removed;
}

void TokenFileWriter::finish() {
  TESSERA_CHECK(!open_ && !finished_, "finish inside a document or twice");
  if (num_tokens_ % 2) {
    const unsigned char pad[4] = {};
    put(pad, 4);
  }
  if (table_out_) {  // the spilled part of the table, in order
    std::fflush(table_out_);
    std::rewind(table_out_);
    std::vector<unsigned char> buf(size_t(1) << 20);
    size_t got;
    while ((got = std::fread(buf.data(), 1, buf.size(), table_out_)) > 0) put(buf.data(), got);
  }
  table_.push_back(static_cast<uint64_t>(num_tokens_));
  std::vector<unsigned char> buf(8 * table_.size());
  for (size_t i = 0; i < table_.size(); ++i) store_le<uint64_t>(buf.data() + 8 * i, table_[i]);
  put(buf.data(), buf.size());
  unsigned char header[kTokenFileHeaderBytes] = {};
  std::memcpy(header, kTokenFileMagic, 8);
  store_le<uint32_t>(header + 8, vocab_);
  store_le<uint64_t>(header + 16, static_cast<uint64_t>(num_tokens_));
  store_le<uint64_t>(header + 24, static_cast<uint64_t>(num_documents_));
  if (std::fflush(out_) != 0 || std::fseek(out_, 0, SEEK_SET) != 0)
    throw TESSERA_INPUT_ERROR("cannot write token file " + tmp_ + " (disk full?)");
  put(header, sizeof(header));
  const int rc = std::fclose(out_);
  out_ = nullptr;
  if (rc != 0) throw TESSERA_INPUT_ERROR("cannot write token file " + tmp_ + " (disk full?)");
  std::error_code ec;
  fs::rename(tmp_, path_, ec);
  if (ec) throw TESSERA_INPUT_ERROR("cannot move " + tmp_ + " to token file " + path_ + ": " + ec.message());
  finished_ = true;
}

}  // namespace tessera::data
