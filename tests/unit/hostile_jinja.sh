#!/usr/bin/env bash
# A hostile chat template in a downloaded model directory (tokenizer_config.json's chat_template),
# rendered by `tessera chat-template render`: deep nesting (parsed or recursive at render time),
# loops that would spin, and strings that would grow to gigabytes each end in one line and exit 2,
# naming the file and what was exceeded (util/budgets.h: kJinjaDepth, kJinjaSteps, kJinjaStringBytes,
# kJinjaMadeBytes), within 60 s and 1 GiB. The same through `train` on every rank: tests/mpi/hostile_template.sh.
set -u
BIN=${TESSERA_BIN:?}/tessera
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
WORK=$T
source "$(dirname "${BASH_SOURCE[0]}")/../expect.bash"
source "$(dirname "${BASH_SOURCE[0]}")/../hostile.bash"
hostile_setup
echo '{"messages": [{"role": "user", "content": "hi"}]}' >"$T/conv.json"
mkdir -p "$T/m"
CFG=$T/m/tokenizer_config.json

# rep S N: S repeated N times.
rep() { python3 -c 'import sys; sys.stdout.write(sys.argv[1] * int(sys.argv[2]))' "$1" "$2"; }
# hostile WANT TEMPLATE: the model directory's template is TEMPLATE; rendering it ends in WANT, exit 2.
hostile() {
  python3 -c 'import json, sys; json.dump({"bos_token": "<s>", "eos_token": "</s>", "chat_template": sys.argv[1]}, open(sys.argv[2], "w"))' \
    "$2" "$CFG"
  probe 2 "$1" 1024 "$BIN" chat-template render --template "$T/m" --messages "$T/conv.json"
}

DEEP="chat template $CFG line 1: nests deeper than 256 levels"
N=100000
hostile "$DEEP" '{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}'
hostile "$DEEP" "{{ $(rep '(' $N)1$(rep ')' $N) }}"
hostile "$DEEP" "{{ $(rep '[' $N)$(rep ']' $N) }}"
hostile "$DEEP" "{{ $(rep '-(' $N)1$(rep ')' $N) }}"
hostile "$DEEP" "{{ messages$(rep '.a' $N) }}"
hostile "$DEEP" "{{ $(rep 'not ' $N)1 }}"
hostile "$DEEP" "$(rep '{% if true %}' 20000)x$(rep '{% endif %}' 20000)"
hostile "$DEEP" '{% set ns = namespace(a=1) %}{% set ns.a = ns %}{{ ns }}'
hostile "chat template $CFG line 1: exceeded 1000000 loop iterations and macro calls in one render" \
  '{% for i in range(99999) %}{% for j in range(99999) %}{{ i }}{% endfor %}{% endfor %}'
BIG="chat template $CFG line 1: made a string of more than 16 MiB"
hostile "$BIG" "{{ 'x' * 4000000000 }}"
hostile "$BIG" "{% set s = 'ab' %}{% for i in range(64) %}{% set s = s ~ s %}{% endfor %}{{ s }}"
hostile "$BIG" "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s }}"
hostile "$BIG" "{{ range(99999)|join('x' * 100000) }}"
hostile "$BIG" "{% set s = 'x' * 9000000 %}{{ [s, s, s]|string }}"
hostile "chat template $CFG line 1: rendered more than 16 MiB" "{% for i in range(99999) %}{{ 'x' * 1000000 }}{% endfor %}"
hostile "chat template $CFG line 1: made more than 256 MiB of strings and list items in one render" \
  "{% set s = 'x' * 10000000 %}{% set ns = namespace(l=[]) %}{% for i in range(1000) %}{% set ns.l = ns.l + [s] %}{% endfor %}"
hostile "chat template $CFG raised: range too big" "{{ range(1000000000000)|length }}"
echo "$pass passed, 0 failed"
