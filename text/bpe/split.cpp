#include "text/bpe/split.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>

#include "text/bpe/sentencepiece.h"  // fail
#include "util/error.h"

namespace tessera::text::bpe {

using json = nlohmann::json;

namespace {

// Per thread: a JIT stack of up to 8 MiB (the default 32 KiB overflows on long runs of one class).
struct JitContext {
  pcre2_match_context* ctx = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 << 10, 8 << 20, nullptr);
  JitContext() { pcre2_jit_stack_assign(ctx, nullptr, stack); }
  ~JitContext() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(ctx);
  }
};

// PCRE2's own words for an error code ("match limit exceeded").
std::string pcre2_message(int code) {
  PCRE2_UCHAR msg[256];
  if (pcre2_get_error_message(code, msg, sizeof msg) < 0) return "PCRE2 error " + std::to_string(code);
  return reinterpret_cast<const char*>(msg);
}

struct Piece {
  size_t begin, end;
  bool match;
};

// `text` as a PCRE2 literal: \Q...\E, an \E inside it written apart.
std::string quote(const std::string& text) {
  std::string out = "\\Q";
  for (size_t i = 0; i < text.size(); ++i) {
    if (text.compare(i, 2, "\\E") == 0) out += "\\E\\\\E\\Q", ++i;
    else out += text[i];
  }
  return out + "\\E";
}

}  // namespace

// A compiled PCRE2 pattern (UTF, Unicode properties for \s \w \d, invalid UTF-8 treated as
// unmatchable), JIT-compiled where PCRE2 can. Matching is thread-safe (match data per call).
// Errors name `where` (the file and key the pattern comes from) and the pattern (its start).
class Regex {
 public:
  Regex(const std::string& pattern, const std::string& where) : where_(where) {
    constexpr size_t kShown = 80;  // bytes of the pattern in an error line
    const json shown = pattern.size() > kShown ? pattern.substr(0, kShown) + "..." : pattern;
    pattern_ = "pattern " + shown.dump(-1, ' ', false, json::error_handler_t::replace);
    int err = 0;
    PCRE2_SIZE off = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, nullptr);
    if (!code_)
      throw TESSERA_INPUT_ERROR(where_ + " does not compile at offset " + std::to_string(off) + ": " + pcre2_message(err) +
                                " (" + pattern_ + ")");
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // optional: pcre2_match falls back to the interpreter
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // [begin, end) of `s` as its matches and the stretches between them, in order (find_matches);
  // an empty match is stepped over (one character).
  void find(const std::string& s, size_t begin, size_t end, std::vector<Piece>& out) const {
    thread_local JitContext jit;
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    size_t pos = begin, last = begin;
    while (pos < end) {
      const int rc = pcre2_match(code_, subject, end, pos, 0, md, jit.ctx);
      if (rc < 0) {
        if (rc != PCRE2_ERROR_NOMATCH) {
          pcre2_match_data_free(md);
          throw TESSERA_INPUT_ERROR(where_ + " failed on a text of " + std::to_string(end - begin) + " bytes: " +
                                    pcre2_message(rc) + " (PCRE2 error " + std::to_string(rc) + "; " + pattern_ + ")");
        }
        break;
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      if (ov[1] == ov[0]) {  // empty match: step over one character
        pos = ov[0] + 1;
        while (pos < end && (static_cast<unsigned char>(s[pos]) & 0xC0) == 0x80) ++pos;
        continue;
      }
      if (ov[0] > last) out.push_back({last, ov[0], false});
      out.push_back({ov[0], ov[1], true});
      pos = last = ov[1];
    }
    if (last < end) out.push_back({last, end, false});
    pcre2_match_data_free(md);
  }

 private:
  pcre2_code* code_ = nullptr;
  std::string where_, pattern_;  // the file and key; the pattern, truncated, as JSON
};

std::unique_ptr<Split> Split::load(const json& j, const std::string& field, const std::string& path) {
  static const std::pair<const char*, Behavior> kBehaviors[] = {
      {"Removed", Behavior::Removed},
      {"Isolated", Behavior::Isolated},
      {"MergedWithPrevious", Behavior::MergedWithPrevious},
      {"MergedWithNext", Behavior::MergedWithNext},
      {"Contiguous", Behavior::Contiguous}};
  const json b = j.value("behavior", json());
  const auto* found = std::find_if(std::begin(kBehaviors), std::end(kBehaviors), [&](const auto& k) { return b == k.first; });
  if (found == std::end(kBehaviors))
    fail(path, field + ".behavior",
         b.dump() + " is not supported (Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous)");
  const json invert = j.value("invert", json(false));
  if (!invert.is_boolean()) fail(path, field + ".invert", invert.dump() + " is not true or false");
  const json pat = j.value("pattern", json());
  const std::string where = "tokenizer " + path + ": " + field + ".pattern.";
  if (pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string())
    return std::make_unique<Split>(pat["Regex"].get<std::string>(), found->second, invert.get<bool>(), where + "Regex");
  if (pat.is_object() && pat.contains("String") && pat["String"].is_string() && !pat["String"].get<std::string>().empty())
    // A literal: quoted for PCRE2 (\Q...\E; an \E inside ends the quote, so it is escaped apart).
    return std::make_unique<Split>(quote(pat["String"].get<std::string>()), found->second, invert.get<bool>(), where + "String");
  fail(path, field + ".pattern", "is neither {\"Regex\": pattern} nor {\"String\": non-empty text}");
}

Split::Split(const std::string& regex, Behavior behavior, bool invert, const std::string& where)
    : regex_(std::make_unique<Regex>(regex, where)), behavior_(behavior), invert_(invert) {}

Split::~Split() = default;

// NormalizedString::split: the matches (or, inverted, the stretches between them) handled per
// behavior, as its fold over them does; empty pieces never come out.
void Split::split(const std::string& s, size_t begin, size_t end, std::vector<std::pair<size_t, size_t>>& out) const {
  std::vector<Piece> found, pieces;
  regex_->find(s, begin, end, found);
  const bool next = behavior_ == Behavior::MergedWithNext;  // folds from the end
  if (next) std::reverse(found.begin(), found.end());
  bool previous = false;  // the piece before (after, for MergedWithNext) was a match
  for (Piece p : found) {
    p.match = p.match != invert_;
    bool join = false;  // joins the last piece kept
    if (behavior_ == Behavior::Contiguous) join = p.match == previous;
    else if (behavior_ == Behavior::MergedWithPrevious || next) join = p.match && !previous;
    previous = p.match;
    if (behavior_ == Behavior::Removed && p.match) continue;
    if (!join || pieces.empty()) pieces.push_back(p);
    else if (next) pieces.back().begin = p.begin;
    else pieces.back().end = p.end;
  }
  if (next) std::reverse(pieces.begin(), pieces.end());
  for (const Piece& p : pieces)
    if (p.end > p.begin) out.emplace_back(p.begin, p.end);
}

}  // namespace tessera::text::bpe
