// Training examples and how JSONL records become them: record formats, chat templates, targets.
//
// EXAMPLE. Token ids and, per token, whether it is a TARGET: the loss is computed on predicting the
// target tokens from their prefixes (data.train_on = completion); data.train_on = all makes every
// token after the first a target.
//
// RECORD FORMATS, auto-detected per JSONL line (the first of these fields present decides):
//   {"messages": [{"role": "system"|"user"|"assistant"|"tool"|"ipython", "content": ...}, ...], "tools": [...]}
//        Hugging Face chat format, rendered with the chat template; the assistant turns (their
//        content, their tool calls and the end-of-turn) are the targets. "conversation" (lmsys-chat)
//        is the same field under another name (records.h).
//   {"prompt": "...", "completion": "..."}
//        BOS + encode(prompt + completion) + EOS; the completion's tokens and EOS are the targets.
//        (prompt + completion is encoded as one string, as TRL does: the prompt's tokens are the
//        leading tokens that encode(prompt) shares with it.)
//   {"text": "..."}
//        BOS + encode(text) + EOS, every token a target; a plain-text document (one longer than a
//        training sequence is cut into pieces instead of being truncated). Empty text is skipped.
// Other fields are ignored. Preference data (chosen/rejected) is refused by format detection
// (format.h), naming the file once.
//
// CONVERSATIONS must be: an optional first "system" message, then "user" first; a "user" is
// followed by an "assistant"; an "assistant" by a "user" or by tool results ("tool", or Llama 3.1's
// "ipython"); tool results by more tool results, an "assistant" or a "user". A trailing user message
// is rendered but has no target; at least one assistant message is required. Content is a string;
// an assistant message with "tool_calls" (a list of objects, OpenAI's {"type": "function",
// "function": {"name", "arguments": "<JSON text>"}} or Hugging Face's with "arguments" an object)
// may have content null or none; a tool result's content may also be a JSON object or list.
// Anything else (an unknown role, two user messages in a row, a system message later on, no
// assistant message) is a BadExample.
//
// TOOLS. The messages are given to the template unchanged (every field: tool_calls, name,
// tool_call_id, ...) and the record's "tools" list as the `tools` variable, as transformers'
// apply_chat_template(messages, tools=record["tools"]) does. "tools" must be a list of JSON objects
// (or null): anything else is a FatalRecord (the reader stops naming file, line and key), since a
// data set that carries tools in another shape would lose them on every record. Only data.chat_template
// auto (the model's own Jinja template) renders tools, tool calls and tool roles; a built-in
// template makes such a record a BadExample ("tool use").
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
//   auto    (the default) the model's own Jinja `chat_template` (read_model_chat_template below),
//           rendered as transformers' apply_chat_template does (text/jinja/template.h), with messages,
//           bos_token / eos_token (tokenizer_config.json's), add_generation_prompt false, tools (the
//           record's, else none) and documents none. When the model has none: llama2, as before (choose_chat_template says
//           which was taken). make_chat_template(Auto) alone, without a model, is that fallback.
//
// THE MODEL'S TEMPLATE, tokenised: the rendered text is cut at the special tokens it contains (the
// added tokens, bos/eos/unk/pad and additional_special_tokens of tokenizer_config.json that the
// tokenizer knows as special ids, leftmost and longest first): each becomes its id (a SentencePiece
// model would encode "<s>" as text), the text between them is encoded piece by piece, as Hugging
// Face's tokenizers do, without BOS/EOS added (apply_chat_template's add_special_tokens=False).
//
// ITS TARGETS, whatever the template: the assistant turns (content, tool calls) and their end-of-turn.
//   - A template with {% generation %} ... {% endgeneration %} blocks (Hugging Face's
//     return_assistant_tokens_mask markers): the text rendered inside them.
//   - Otherwise by rendering prefixes, without the template's cooperation. W is the whole
//     conversation's render (what is trained on); for each assistant message i:
//     START: P = render(messages[:i], add_generation_prompt=true); the turn starts where P and W stop
//       agreeing (at the end of P when P is a prefix of W, as for every template seen so far; else
//       render(messages[:i]) must be a prefix of W that ends before that point).
//     END: F = render(messages[:i+1]). When F is a prefix of the render that goes on after it (W, or
//       for the last message W followed by a user message), the turn ends where F ends: the content
//       and what the template closes the turn with (<|eot_id|>, " </s>", "<|im_end|>\n", ...).
//       Otherwise the template renders a last message differently (Qwen3 writes <think></think> only
//       in the last turn) or appends text to every render (Meta's first Llama 3 8B Instruct template
//       ends every render with the assistant header, whatever add_generation_prompt says). Then the
//       render N of messages[:i+1] followed by the next message with its content replaced (after the
//       last message: a user message) agrees with W through the turn, the next turn's header, and
//       no further. The turn's closing is the first special token after its start (one marked
//       special in tokenizer_config.json: <|eot_id|>, <|im_end|>, <end_of_turn>, </s>) followed, after
//       optional whitespace, by another special token or by the end of that agreement; the turn ends
//       after it and that whitespace (which rendering alone cannot tell: the closing and the next
//       header follow each other in every render).
//     A turn that cannot be located so (a start before messages[:i] end, no such closing, an empty
//     turn) makes the record a BadExample ("template mask") naming the message.
//   A token is a target when its text starts inside a target span; a span boundary inside a run of
//   text is placed as encode_with_prefix places the prompt/completion one.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "text/names.h"
#include "text/tokenizer.h"

namespace tessera::text {

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

// A record that makes its whole file unusable (a "tools" entry that is not an object): the reader
// stops with an Error(Input) naming the file, the line and what() (which names the key).
class FatalRecord : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Message {
  std::string role;
  std::string content;         // the content when it is a string, else "" (what built-ins render)
  nlohmann::ordered_json raw;  // the message as written, every field: what the model's template is given
  bool tool_calls = false;     // has a non-empty "tool_calls"
};

struct Conversation {
  std::vector<Message> messages;
  nlohmann::ordered_json tools;  // the record's "tools" list; null when it has none
  // Tools, tool calls or tool results: only the model's own template renders them.
  bool uses_tools() const;
};

// Throws BadExample unless the conversation has the shape described above.
void check_conversation(const Conversation& conversation);
// The same roles, for a prompt to answer: no assistant message needed, and the last message is a
// user message or tool results.
void check_prompt(const Conversation& conversation);

class ChatTemplate {
 public:
  virtual ~ChatTemplate() = default;
  virtual std::string name() const = 0;
  // Throws Error(Input) when `tok` lacks what the template needs (BOS/EOS, special tokens).
  virtual void check(const Tokenizer& tok) const = 0;
  // Renders a conversation that passed check_conversation.
  virtual Example render(const Conversation& conversation, const Tokenizer& tok) const = 0;
  // Whether it renders tools, tool calls and tool results (the model's own template does).
  virtual bool renders_tools() const { return false; }
  // A conversation that passed check_prompt (it ends with a user message or tool results) followed by
  // the generation prompt: the ids a model continues to answer it, the same text training renders
  // before an assistant turn (llama2: the trailing "[INST] ... [/INST]"; llama3: the assistant header
  // and "\n\n"; none: BOS and the contents; the model's template: add_generation_prompt true).
  virtual std::vector<int32_t> render_prompt(const Conversation& conversation, const Tokenizer& tok) const = 0;
};

std::unique_ptr<ChatTemplate> make_chat_template(ChatTemplateKind kind);

// A model's own chat template: tokenizer_config.json's "chat_template" (a string, or a list of
// {name, template} of which "default" is taken), else a chat_template.jinja beside it; its bos/eos
// tokens and the special-token strings named above.
struct ModelChatTemplate {
  std::string source, origin;  // the Jinja text and where it came from (messages)
  std::optional<std::string> bos_token, eos_token;
  std::vector<std::string> special_tokens;  // every added token, special or not (each is cut out of the render)
  std::vector<std::string> control_tokens;  // those marked special: what may close a turn (ITS TARGETS)
};
// nullopt when the file does not exist or names no template; Error(Input) when it does not parse.
std::optional<ModelChatTemplate> read_model_chat_template(const std::string& tokenizer_config_json);
// Renders `model`'s template (throws Error(Input) when it does not parse or uses an unsupported
// construct, naming the construct, file and line).
std::unique_ptr<ChatTemplate> make_model_chat_template(const ModelChatTemplate& model);

// data.chat_template resolved for a model whose tokenizer has `tokenizer_config_json` beside it
// ("" for none): the template and a line saying which it is and why ("the model's own (<path>)",
// "llama2 (auto: <path> has no chat_template)", "llama3 (data.chat_template)").
struct ChatTemplateChoice {
  std::unique_ptr<ChatTemplate> chat;
  std::string description;
};
ChatTemplateChoice choose_chat_template(ChatTemplateKind kind, const std::string& tokenizer_config_json);
// The tokenizer_config.json beside a tokenizer (a tokenizer.model / tokenizer.json file, or a
// directory holding one); "" for "", "bytes".
std::string tokenizer_config_beside(const std::string& tokenizer_path);
// A name of chat_template_names() (names.h); throws Error(Input) naming data.chat_template for any other.
std::unique_ptr<ChatTemplate> make_chat_template(const std::string& name);

// One parsed JSONL record (parsed as ordered_json: a template's `tools | tojson` writes the keys in
// the record's order, as Python does) as an example (see RECORD FORMATS). Throws BadExample for a record that
// is not an object, has none of the fields, has fields of the wrong type, an ill-formed
// conversation, or no target token. An empty "text" gives an example without tokens.
// Throws FatalRecord for a "tools" field that is not a list of objects.
Example render_record(const nlohmann::ordered_json& record, const Tokenizer& tok, const ChatTemplate& chat);

// A prompt record for generation (`tessera generate --prompts`) as the ids the model continues:
// {"messages": [...]} (check_prompt; tools as render_record takes them) through
// ChatTemplate::render_prompt, or {"prompt": "..."} as BOS + encode(prompt), what training renders
// before a completion. Throws BadExample for anything else.
std::vector<int32_t> render_prompt_record(const nlohmann::ordered_json& record, const Tokenizer& tok,
                                          const ChatTemplate& chat);

// encode(full) and how many of its leading ids belong to `prefix` (a prefix of `full`): the length
// of encode(prefix) when that is a prefix of encode(full), else their longest common prefix.
std::pair<std::vector<int32_t>, size_t> encode_with_prefix(const Tokenizer& tok, const std::string& prefix,
                                                          const std::string& full);

}  // namespace tessera::text
