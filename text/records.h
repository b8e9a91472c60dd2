// Instruction-data record formats that are conversations in another shape: Alpaca, ShareGPT and lmsys
// records become the `messages` form (chat_template.h) and are rendered and masked exactly as that
// record would be (render_record calls to_messages_record first).
//
// ALPACA   {"instruction": I, "input": X, "output": O, "system": S}; "input" and "system" optional.
//          -> [{"system", S} when S is non-empty,
//              {"user", I} when X is missing or empty, else {"user", I + "\n\n" + X},
//              {"assistant", O}]
//          (Alpaca's own prompt puts the input after the instruction, separated by a blank line.)
//          A record is Alpaca when it has "instruction". "history" (LLaMA-Factory's earlier turns)
//          is refused unless empty.
// SHAREGPT {"conversations": [{"from": F, "value": V}, ...], "system": S}; "system" optional.
//          F human|user -> "user", gpt|assistant -> "assistant", system -> "system"; a non-empty
//          top-level S becomes a first system message. Turns may also be written {"role", "content"}.
// LMSYS   {"conversation": [{"role", "content"}, ...], ...} (lmsys-chat-1m): the messages form under
//          another name, taken as "messages" when it is a list.
// A record with "messages" is left as it is (the messages form wins), as is every other record.
// Bad records throw BadExample naming what is wrong ("ShareGPT turn 2: from 'bot' is not
// human/gpt/system"); the conversation's shape (alternation) is checked by render_record as usual.
#pragma once
#include <nlohmann/json.hpp>

#include <optional>

namespace tessera::text {

// {"messages": [...]} for an Alpaca, ShareGPT or lmsys record; nullopt for any other value.
std::optional<nlohmann::ordered_json> to_messages_record(const nlohmann::ordered_json& record);

// True for an object with a field of some record format: messages, conversations, conversation,
// instruction, prompt, completion, text, and preference data's chosen / rejected (format.cpp tells a one-line JSONL file from a metadata .json with it).
bool has_record_field(const nlohmann::json& value);

}  // namespace tessera::text
