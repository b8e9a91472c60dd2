// Training examples and how JSONL records become them: record formats, chat templates, targets.
//
// EXAMPLE. Token ids and, per token, whether it is a TARGET: the loss is computed on predicting the
// target tokens from their prefixes (data.train_on = completion); data.train_on = all makes every
// token after the first a target.
//
// RECORD FORMATS, auto-detected per JSONL line (the first of these fields present decides):
//   {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}
//        Hugging Face chat format, rendered with the chat template; the assistant turns (their
//        content and the end-of-turn token) are the targets.
//   {"prompt": "...", "completion": "..."}
//        BOS + encode(prompt + completion) + EOS; the completion's tokens and EOS are the targets.
//        (prompt + completion is encoded as one string, as TRL does: the prompt's tokens are the
//        leading tokens that encode(prompt) shares with it.)
//   {"text": "..."}
//        BOS + encode(text) + EOS, every token a target; a plain-text document (one longer than a
//        training sequence is cut into pieces instead of being truncated). Empty text is skipped.
// Other fields are ignored.
//
// CONVERSATIONS must be: an optional first "system" message, then "user" and "assistant" messages
// alternating, starting with "user" (a trailing user message is rendered but has no target). Every
// content is a string. Anything else (an unknown role, two user messages in a row, a system message
// later on, no assistant message at all) is a BadExample.
//
// TEMPLATES (data.chat_template):
//   llama2  Meta's reference (llama/generation.py chat_completion) and Hugging Face's Llama 2
//           template: per user/assistant pair BOS + encode("[INST] {user} [/INST] {assistant} ") + EOS,
//           with the system message folded into the first user message as
//           "<<SYS>>\n{system}\n<</SYS>>\n\n{user}"; contents are stripped of leading and trailing
//           whitespace (Python's str.strip() on ASCII whitespace). BOS and EOS are the tokenizer's
//           ids, never text. Targets: the tokens after "[/INST]" and EOS.
//   llama3  <|begin_of_text|>, then per message <|start_header_id|>{role}<|end_header_id|> +
//           encode("\n\n{content}") + <|eot_id|> (content stripped); the special tokens come from
//           the tokenizer (Tokenizer::special_id). Targets: an assistant message's content and its
//           <|eot_id|>.
//   none    BOS, each message's content as encoded, EOS; targets: the assistant contents and the
//           final EOS when the last message is the assistant's.
#pragma once
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/data/names.h"
#include "runtime/data/tokenizer.h"

namespace tessera::data {

struct Example {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> target;  // 1: the token is a target (same length as tokens)
  bool text = false;            // plain text: cut into pieces when longer than a sequence

  void append(int32_t id, bool is_target);
  void append(const std::vector<int32_t>& ids, bool is_target);
  int64_t num_targets() const;
};

// A record that cannot become a training example; what() is the reason (no file or line: the
// reader adds them), kind() a short class of it for the counts ("unknown role", "invalid JSON", ...).
class BadExample : public std::runtime_error {
 public:
  BadExample(std::string kind, const std::string& reason) : std::runtime_error(reason), kind_(std::move(kind)) {}
  const std::string& kind() const { return kind_; }

 private:
  std::string kind_;
};

struct Message {
  std::string role, content;
};

// Throws BadExample unless the conversation has the shape described above.
void check_conversation(const std::vector<Message>& messages);

class ChatTemplate {
 public:
  virtual ~ChatTemplate() = default;
  virtual std::string name() const = 0;
  // Throws Error(Input) when `tok` lacks what the template needs (BOS/EOS, special tokens).
  virtual void check(const Tokenizer& tok) const = 0;
  // Renders a conversation that passed check_conversation.
  virtual Example render(const std::vector<Message>& messages, const Tokenizer& tok) const = 0;
};

std::unique_ptr<ChatTemplate> make_chat_template(ChatTemplateKind kind);
// A name of chat_template_names() (names.h); throws Error(Input) naming data.chat_template for any other.
std::unique_ptr<ChatTemplate> make_chat_template(const std::string& name);

// One parsed JSONL record as an example (see RECORD FORMATS). Throws BadExample for a record that
// is not an object, has none of the fields, has fields of the wrong type, an ill-formed
// conversation, or no target token. An empty "text" gives an example without tokens.
Example render_record(const nlohmann::json& record, const Tokenizer& tok, const ChatTemplate& chat);

// encode(full) and how many of its leading ids belong to `prefix` (a prefix of `full`): the length
// of encode(prefix) when that is a prefix of encode(full), else their longest common prefix.
std::pair<std::vector<int32_t>, size_t> encode_with_prefix(const Tokenizer& tok, const std::string& prefix,
                                                          const std::string& full);

}  // namespace tessera::data
