// tokenizer.json's Split pre-tokenizer, as Hugging Face `tokenizers` defines it (pre_tokenizers/
// split.rs, NormalizedString::split), for BpeTokenizer (bpe_tokenizer.h):
//  - pattern {"String": s} (s literally) or {"Regex": r} (run by PCRE2 in UTF + UCP mode: \p{L},
//    \s and \w are Unicode classes; invalid UTF-8 never matches);
//  - the text becomes its matches and the stretches between them (find_matches), with invert
//    swapping which is which; an empty match is stepped over;
//  - behavior (what happens to the matches): Removed (dropped), Isolated (a piece each),
//    MergedWithPrevious (a match joins the stretch before it), MergedWithNext (the stretch after it),
//    Contiguous (consecutive matches become one piece); empty pieces are dropped.
// For example, "How are you doing?" with the Regex \w+|[^\w\s]+ and invert true (the spaces are
// the matches): Removed "How" "are" "you" "doing" "?"; MergedWithPrevious "How " "are " "you "
// "doing" "?"; MergedWithNext "How" " are" " you" " doing" "?"; Contiguous "How" " " "are" " "
// "you" " " "doing?" (tokenizers' own test of Split).
// Errors are tessera::Error(Input) naming the file and the field.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace tessera::text::bpe {

class Regex;

class Split {
 public:
  enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };
  // A step of tokenizer.json's "pre_tokenizer" of type Split; `field` names it in errors.
  static std::unique_ptr<Split> load(const nlohmann::json& j, const std::string& field, const std::string& path);
  // A PCRE2 pattern; `where` names it in errors ("tokenizer <path>: <field>.pattern.Regex").
  Split(const std::string& regex, Behavior behavior, bool invert, const std::string& where);
  ~Split();
  Split(const Split&) = delete;
  Split& operator=(const Split&) = delete;

  // Appends the pieces of s[begin, end) as (begin, end) byte offsets into s. Thread-safe.
  void split(const std::string& s, size_t begin, size_t end, std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  std::unique_ptr<Regex> regex_;
  Behavior behavior_;
  bool invert_;
};

}  // namespace tessera::text::bpe
