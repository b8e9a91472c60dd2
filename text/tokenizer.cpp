#include "text/tokenizer.h"

#include <sentencepiece_processor.h>

#include <dlfcn.h>

#include <filesystem>

#include "text/bpe/tokenizer.h"
#include "util/error.h"

namespace tessera::text {

std::vector<int32_t> ByteTokenizer::encode(const std::string& text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>&) const {
  TESSERA_CHECK(false, "tokenizer " + name() + " cannot decode");
  return "";
}

std::string ByteTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  for (int32_t id : ids) {
    TESSERA_CHECK_INPUT(id >= 0 && id < kVocab, "token id " + std::to_string(id) + " is outside the byte vocabulary [0, 258)");
    if (id < 256) text.push_back(static_cast<char>(id));
  }
  return text;
}

namespace {

// ---- libsentencepiece, loaded in isolation ------------------------------------------------------
// Debian's libsentencepiece.so.0 carries its own copy of protobuf-lite 3.14 and exports its
// symbols. Linked normally it sits in the global symbol scope next to LibTorch's libprotobuf 3.21:
// whichever comes first wins, and either order crashes (protobuf's static initialisers run
// sentencepiece's copy, or sentencepiece aborts on the protobuf version check). So Tessera never
// links it: it is dlopen()ed on first use with RTLD_LOCAL | RTLD_DEEPBIND, which keeps its
// symbols out of the global scope and binds its own references to its own copies.
//
// Our code must therefore not reference any libsentencepiece symbol at link time. The constructor
// and destructor come from dlsym (Itanium C1/D1 symbols); every other call is virtual, made through
// pointers to virtual member functions (a vtable offset, no symbol). Methods returning util::Status
// are called through a member-pointer type returning StatusShim, a layout-compatible stand-in
// whose destructor runs the library's ~Status via dlsym.
namespace spm = sentencepiece;

struct SpmLibrary {
  void* handle = nullptr;
  void (*construct)(void* self) = nullptr;        // SentencePieceProcessor::SentencePieceProcessor()
  void (*destruct)(void* self) = nullptr;         // SentencePieceProcessor::~SentencePieceProcessor()
  void (*status_destruct)(void* self) = nullptr;  // util::Status::~Status()
  const char* (*status_message)(const void* self) = nullptr;  // util::Status::error_message()
};

const SpmLibrary& spm_library() {
  static const SpmLibrary lib = [] {
    SpmLibrary l;
    l.handle = ::dlopen("libsentencepiece.so.0", RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    TESSERA_CHECK(l.handle != nullptr, std::string("cannot load libsentencepiece.so.0: ") + ::dlerror());
    const auto sym = [&](const char* name) {
      void* p = ::dlsym(l.handle, name);
      TESSERA_CHECK(p != nullptr, std::string("libsentencepiece.so.0 lacks ") + name);
      return p;
    };
    l.construct = reinterpret_cast<void (*)(void*)>(sym("_ZN13sentencepiece22SentencePieceProcessorC1Ev"));
    l.destruct = reinterpret_cast<void (*)(void*)>(sym("_ZN13sentencepiece22SentencePieceProcessorD1Ev"));
    l.status_destruct = reinterpret_cast<void (*)(void*)>(sym("_ZN13sentencepiece4util6StatusD1Ev"));
    l.status_message = reinterpret_cast<const char* (*)(const void*)>(sym("_ZNK13sentencepiece4util6Status13error_messageEv"));
    return l;
  }();
  return lib;
}

// Same layout as spm::util::Status (one owning pointer, null when ok).
struct StatusShim {
  void* rep = nullptr;
  StatusShim() = default;
  StatusShim(const StatusShim&) = delete;
  ~StatusShim() {
    if (rep) spm_library().status_destruct(this);
  }
  bool ok() const { return rep == nullptr; }
  std::string message() const { return ok() ? "ok" : spm_library().status_message(this); }
};
static_assert(sizeof(StatusShim) == sizeof(spm::util::Status), "util::Status layout changed");

// Pointers to the virtual methods we call, retyped to return StatusShim.
using LoadFn = StatusShim (spm::SentencePieceProcessor::*)(std::string_view);
using LoadProtoFn = StatusShim (spm::SentencePieceProcessor::*)(std::string_view);
const LoadProtoFn kLoadProto = reinterpret_cast<LoadProtoFn>(
    static_cast<spm::util::Status (spm::SentencePieceProcessor::*)(absl::string_view)>(
        &spm::SentencePieceProcessor::LoadFromSerializedProto));
using EncodeFn = StatusShim (spm::SentencePieceProcessor::*)(std::string_view, std::vector<int>*) const;
const LoadFn kLoad = reinterpret_cast<LoadFn>(
    static_cast<spm::util::Status (spm::SentencePieceProcessor::*)(absl::string_view)>(&spm::SentencePieceProcessor::Load));
const EncodeFn kEncode = reinterpret_cast<EncodeFn>(
    static_cast<spm::util::Status (spm::SentencePieceProcessor::*)(absl::string_view, std::vector<int>*) const>(
        &spm::SentencePieceProcessor::Encode));
using DecodeFn = StatusShim (spm::SentencePieceProcessor::*)(const std::vector<int>&, std::string*) const;
const DecodeFn kDecode = reinterpret_cast<DecodeFn>(
    static_cast<spm::util::Status (spm::SentencePieceProcessor::*)(const std::vector<int>&, std::string*) const>(
        &spm::SentencePieceProcessor::Decode));
using IntFn = int (spm::SentencePieceProcessor::*)() const;
const IntFn kBosId = &spm::SentencePieceProcessor::bos_id;
const IntFn kEosId = &spm::SentencePieceProcessor::eos_id;
const IntFn kPieceSize = &spm::SentencePieceProcessor::GetPieceSize;
using PieceToIdFn = int (spm::SentencePieceProcessor::*)(std::string_view) const;
const PieceToIdFn kPieceToId = reinterpret_cast<PieceToIdFn>(
    static_cast<int (spm::SentencePieceProcessor::*)(absl::string_view) const>(&spm::SentencePieceProcessor::PieceToId));
using IdToPieceFn = const std::string& (spm::SentencePieceProcessor::*)(int) const;
const IdToPieceFn kIdToPiece = &spm::SentencePieceProcessor::IdToPiece;
using IdPredicate = bool (spm::SentencePieceProcessor::*)(int) const;
const IdPredicate kIsControl = &spm::SentencePieceProcessor::IsControl;
const IdPredicate kIsUnknown = &spm::SentencePieceProcessor::IsUnknown;

class SentencePieceTokenizer final : public Tokenizer {
 public:
  // From the file `path`, or (bytes != nullptr) from its contents.
  SentencePieceTokenizer(const std::string& path, const std::string* bytes) : path_(path) {
    std::error_code ec;
    if (!bytes && !std::filesystem::is_regular_file(path, ec))
      throw TESSERA_INPUT_ERROR("tokenizer file " + path + " does not exist or is not a regular file");
    spm_library().construct(storage_);
    {
      const StatusShim status = bytes ? (sp()->*kLoadProto)(*bytes) : (sp()->*kLoad)(path);
      if (!status.ok())
        throw TESSERA_INPUT_ERROR("tokenizer file " + path + " is not a SentencePiece model (" + status.message() + ")");
    }
    bos_ = (sp()->*kBosId)();
    eos_ = (sp()->*kEosId)();
    vocab_ = (sp()->*kPieceSize)();
    if (vocab_ <= 0)
      throw TESSERA_INPUT_ERROR("tokenizer file " + path + " is a SentencePiece model with an empty vocabulary");
  }
  ~SentencePieceTokenizer() override { spm_library().destruct(storage_); }

  std::vector<int32_t> encode(const std::string& text) const override {
    std::vector<int> ids;
    const StatusShim status = (sp()->*kEncode)(text, &ids);
    TESSERA_CHECK(status.ok(), "SentencePiece encode failed with " + path_ + ": " + status.message());
    return std::vector<int32_t>(ids.begin(), ids.end());
  }
  int32_t bos_id() const override { return bos_; }
  int32_t eos_id() const override { return eos_; }
  int64_t vocab_size() const override { return vocab_; }
  std::string name() const override { return "sentencepiece:" + path_; }
  std::string decode(const std::vector<int32_t>& ids) const override {
    for (int32_t id : ids)
      TESSERA_CHECK_INPUT(id >= 0 && id < vocab_, "token id " + std::to_string(id) + " is outside the vocabulary of " + path_);
    std::string text;
    const StatusShim status = (sp()->*kDecode)(std::vector<int>(ids.begin(), ids.end()), &text);
    TESSERA_CHECK(status.ok(), "SentencePiece decode failed with " + path_ + ": " + status.message());
    return text;
  }
  // Control pieces (<s>, </s>) and the unknown piece (<unk>) are the model's special tokens.
  std::optional<int32_t> special_id(const std::string& text) const override {
    const int id = (sp()->*kPieceToId)(text);
    if (id < 0 || id >= vocab_ || (sp()->*kIdToPiece)(id) != text) return std::nullopt;
    if (!(sp()->*kIsControl)(id) && !(sp()->*kIsUnknown)(id)) return std::nullopt;
    return id;
  }

 private:
  spm::SentencePieceProcessor* sp() const {
    return reinterpret_cast<spm::SentencePieceProcessor*>(const_cast<unsigned char*>(storage_));
  }
  std::string path_;
  int32_t bos_ = -1, eos_ = -1;
  int64_t vocab_ = 0;
  alignas(spm::SentencePieceProcessor) unsigned char storage_[sizeof(spm::SentencePieceProcessor)];
};

}  // namespace

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& path_or_empty) {
  if (path_or_empty.empty() || path_or_empty == "bytes") return std::make_unique<ByteTokenizer>();
  {  // Hugging Face tokenizer.json (BPE: byte-level or SentencePiece-converted)
    namespace fs = std::filesystem;
    const fs::path p(path_or_empty);
    std::error_code ec;
    if (p.extension() == ".json") return std::make_unique<bpe::BpeTokenizer>(path_or_empty);
    if (fs::is_directory(p, ec) && fs::exists(p / "tokenizer.json", ec) && !fs::exists(p / "tokenizer.model", ec))
      return std::make_unique<bpe::BpeTokenizer>((p / "tokenizer.json").string());
  }
  return std::make_unique<SentencePieceTokenizer>(path_or_empty, nullptr);
}

std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const std::string& model_bytes, const std::string& path) {
  return std::make_unique<SentencePieceTokenizer>(path, &model_bytes);
}

}  // namespace tessera::text
