#!/usr/bin/env bash
# Hostile files that a download or a colleague could hand Tessera, parsed (issue 58), through the
# real CLI: each ends in one line naming the file and what was exceeded, exit 2 (or succeeds within
# its bound), no signal, no hang, under 1 GiB (tests/hostile.bash). JSON nested 100k deep in
# tokenizer.json, tokenizer_config.json, --messages, a run folder's metrics.jsonl, run_info.json and
# flight records (util::parse_json's depth limit); YAML "billion laughs" and deep nesting in a run
# config and an Accelerate file (util/budgets.h: kYamlExpandedNodes, kYamlDepth); a tokenizer
# pattern PCRE2 gives up on; a config.json with 0 attention heads; a checkpoint manifest whose
# world_size does not fit an int. The big files are made here, not committed.
set -uo pipefail
BIN=${TESSERA_BIN:?}/tessera
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/../expect.bash"   # ok, fail, check, judge_error
source "$(dirname "${BASH_SOURCE[0]}")/../hostile.bash"  # hostile_setup, probe
hostile_setup

python3 - "$T" <<'PY'
import json, os, sys
t = sys.argv[1]
DEEP = "[" * 100000 + "]" * 100000
def write(path, text):
    os.makedirs(os.path.dirname(os.path.join(t, path)), exist_ok=True)
    with open(os.path.join(t, path), "w") as f: f.write(text)
def deep(doc, key):  # doc as JSON text, with doc[key] nested 100k deep
    return json.dumps(dict(doc, **{key: "DEEP"})).replace('"DEEP"', DEEP)
# A byte-level BPE of the 256 bytes (GPT-2 alphabet), no merges; `pattern` splits before ByteLevel.
printable = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
alphabet, n = {}, 0
for b in range(256):
    alphabet[b] = chr(b) if b in printable else chr(256 + n); n += b not in printable
def tokenizer(pattern=r"\s+|\S+"):
    return {"added_tokens": [{"id": 256, "content": "<s>", "special": True}],
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]},
            "decoder": {"type": "ByteLevel"},
            "model": {"type": "BPE", "vocab": {alphabet[b]: b for b in range(256)}, "merges": []}}
write("deep-tok/tokenizer.json", deep(tokenizer(), "pre_tokenizer"))
write("deep-cfg/tokenizer.json", json.dumps(tokenizer()))
write("deep-cfg/tokenizer_config.json", deep({"chat_template": "{{ bos_token }}"}, "bos_token"))
write("pcre/tokenizer.json", json.dumps(tokenizer("(a|aa)+$")))
write("pcre/tokenizer_config.json", '{"bos_token": "<s>", "eos_token": "<s>"}')
write("a.txt", "a" * 200 + "b\n")
write("t.jinja", "{% for m in messages %}{{ m.content }}{% endfor %}")
write("msgs.json", '{"messages": [{"role": "user", "content": "hi"}]}')
write("deep-msgs.json", deep({}, "messages"))
write("run/metrics.jsonl", '{"step": 1, "loss": 2.5}\n' + deep({"step": 2}, "loss") + "\n")
write("run/run_info.json", deep({}, "config"))
write("run/flight/rank-0.json", json.dumps({"format": "tessera-flight", "rank": 0, "world_size": 2, "groups": [],
                                           "run_id": "r1", "clock": {"realtime_ns": 5}, "context": {"step": 1},
                                           "reason": "signal SIGTERM", "host": "h"}))
write("run/flight/rank-1.json", deep({"format": "tessera-flight", "rank": 1}, "groups"))
# YAML: nine levels of nine aliases (10^9 nodes from 1 KB); nesting 100k deep (flow) and 300 (block).
laughs = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [" + ", ".join(["*" + chr(ord(c) - 1)] * 9) + "]\n" for c in "bcdefghij")
write("bomb.yaml", laughs)
write("acc-bomb.yaml", "compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\n" + laughs)
write("deep-flow.yaml", "train: " + "[" * 100000 + "\n")
write("deep-block.yaml", "".join("  " * i + "k:\n" for i in range(300)))
cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu", "vocab_size": 256,
       "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 0,
       "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 128, "rms_norm_eps": 1e-5}
write("zero-heads/config.json", json.dumps(cfg))
write("ck/manifest.json", json.dumps({"format": "tessera-checkpoint", "format_version": 2, "step": 1, "state": {},
                                      "files": [], "tensors": [], "world_size": 2 ** 40}))
PY

# JSON nested 100k deep: refused by util::parse_json, in one line naming the file.
probe 2 "tokenizer $T/deep-tok/tokenizer.json: invalid JSON: .*JSON nested deeper than 256 levels" 1024 \
  "$BIN" tokenize --input "$T/a.txt" --out "$T/o1.bin" --tokenizer "$T/deep-tok/tokenizer.json"
probe 2 "tokenizer config $T/deep-cfg/tokenizer_config.json: invalid JSON: .*nested deeper than 256" 1024 \
  "$BIN" tokenize --input "$T/a.txt" --out "$T/o2.bin" --tokenizer "$T/deep-cfg/tokenizer.json"
probe 2 "$T/deep-cfg/tokenizer_config.json is not valid JSON .*nested deeper than 256" 1024 \
  "$BIN" chat-template render --template "$T/deep-cfg" --messages "$T/msgs.json"
probe 2 "messages $T/deep-msgs.json is not valid JSON: .*nested deeper than 256" 1024 \
  "$BIN" chat-template render --template "$T/t.jinja" --messages "$T/deep-msgs.json"
# A run folder: the deep metrics line is skipped (counted as not a step record), run_info.json and
# the flight record are unreadable and said so; the report and the diagnosis are written.
probe 0 "" 1024 "$BIN" report "$T/run" --out "$T/report.html"
check "the report is written" test -s "$T/report.html"
probe 0 "" 1024 "$BIN" diagnose "$T/run"
check "diagnose names the unreadable record" grep -q "rank-1.json: unreadable (.*nested deeper than 256" "$T/out"

# YAML: alias expansion and nesting are bounded; yaml-cpp's own guard refuses 100k levels.
probe 2 "$T/bomb.yaml:.*expands to more than 10000 nodes .*(budget kYamlExpandedNodes)" 1024 \
  "$BIN" config --check "$T/bomb.yaml"
probe 2 "$T/bomb.yaml:.*(budget kYamlExpandedNodes)" 1024 "$BIN" train --config "$T/bomb.yaml"
probe 2 "$T/acc-bomb.yaml:.*(budget kYamlExpandedNodes)" 1024 \
  "$BIN" config --from-accelerate "$T/acc-bomb.yaml" --out "$T/acc.json"
check "from-accelerate wrote nothing" test ! -e "$T/acc.json"
probe 2 "$T/deep-block.yaml:.*YAML nested deeper than 256 levels (budget kYamlDepth)" 1024 \
  "$BIN" config --check "$T/deep-block.yaml"
probe 2 "$T/deep-flow.yaml:[0-9]*:[0-9]*: invalid YAML: nested deeper than yaml-cpp.s parser allows (.*kYamlDepth)" 1024 "$BIN" config --check "$T/deep-flow.yaml"

# A tokenizer pattern PCRE2 gives up on (catastrophic backtracking): the file, the key, the pattern
# and PCRE2's own words.
probe 2 "tokenizer $T/pcre/tokenizer.json: pre_tokenizer.pretokenizers\[0\].pattern.Regex failed on a text of [0-9]* bytes: match limit exceeded (PCRE2 error -47; pattern \"(a|aa)+\$\")" 1024 \
  "$BIN" tokenize --input "$T/a.txt" --out "$T/o3.bin" --tokenizer "$T/pcre/tokenizer.json"

# Counts of config.json below 1 are refused by key; a manifest's world_size must fit an int.
probe 2 "$T/zero-heads/config.json: 'num_attention_heads' must be positive, got 0" 1024 \
  "$BIN" init-model --config "$T/zero-heads/config.json" --out "$T/zm"
probe 2 "manifest $T/ck/manifest.json: \"world_size\" must be an integer in \[1, 2147483647\], got 1099511627776" 1024 \
  "$BIN" ckpt inspect "$T/ck"
echo "$pass passed, 0 failed"
