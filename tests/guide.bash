# Sourced by tests/mpi/guide.sh and tests/slurm/guide.sh (not a test itself: ctest registers only
# tests/<label>/*.sh): runs the shell blocks of docs/GUIDE.md in order, in one bash, so the guide
# cannot rot.
#
# A block runs when its fence is ```sh guide [TAG...]``` (shown to readers) or ```sh guide-test [TAG...]```
# (test glue inside an HTML comment, hidden when the page is rendered) and it has no tag, or the tag
# of this run's way of launching (`local`: mpirun; `slurm`: Makefile.slurm on a Slurm cluster).
#   guide_model DIR          a small Hugging Face Llama directory like a real one: bf16 weights in
#                            several safetensors files with an index, a SentencePiece tokenizer.model
#   guide_run MODE           runs the blocks for MODE from the repository root (the guide's commands
#                            are written for it); the first failing command ends the run with
#                            "FAIL: docs/GUIDE.md:LINE: ..." and a non-zero exit

# guide_script FILE MODE: the bash script of FILE's blocks for MODE, on stdout.
guide_script() {
  awk -v mode="$2" -v file="$1" '
    function wanted(tags,   n, t, i) {
      n = split(tags, t, " ")
      if (n == 0) return 1
      for (i = 1; i <= n; i++) {
        if (t[i] != mode) return 0
      }
      return 1
    }
    !inside && /^```sh guide(-test)?( |$)/ {
      tags = $0; sub(/^```sh guide(-test)? */, "", tags)
      inside = 1; keep = wanted(tags); blocks += keep
      if (keep) print "GUIDE_LINE=" NR
      next
    }
    inside && /^```/ { inside = 0; next }
    inside && keep { print }
    END { if (blocks == 0) { print "echo \"no blocks in " file "\" >&2; exit 1" } }
  ' "$1"
}

guide_model() {
  local dir=$1 bin=$TESSERA_SRC/build/bin/tessera
  mkdir -p "$dir.tmp"
  "$bin" init-model --preset tiny --out "$dir.tmp/tiny" >/dev/null
  # The tiny preset's byte vocabulary, replaced by a 512-token one with Llama 2's BOS 1 / EOS 2.
  python3 -c "
import json, sys; c = json.load(open(sys.argv[1])); c.update(vocab_size=512, bos_token_id=1, eos_token_id=2)
json.dump(c, open(sys.argv[2], 'w'))" "$dir.tmp/tiny/config.json" "$dir.tmp/config.json"
  "$bin" init-model --config "$dir.tmp/config.json" --out "$dir" --dtype bf16 --seed 1 --max-shard-size 400KB >/dev/null
  cp "$TESSERA_SRC/tests/unit/fixtures/llama2-chat-test.model" "$dir/tokenizer.model"
  rm -rf "$dir.tmp"
}

guide_run() {
  local mode=$1 script
  script=$(mktemp /tmp/tessera-guide.XXXXXX.sh)
  {
    echo 'set -Eeuo pipefail'
    echo "trap 'echo \"FAIL: docs/GUIDE.md:\$GUIDE_LINE (block starting there): exit \$? from: \$BASH_COMMAND\" >&2' ERR"
    guide_script "$TESSERA_SRC/docs/GUIDE.md" "$mode"
  } > "$script"
  # The guide's commands expect the repository root and the binary in build/bin.
  [[ $(realpath "$TESSERA_SRC/build/bin/tessera") -ef $(realpath "${TESSERA_GUIDE_BIN:?}") ]] ||
    { echo "FAIL: the guide runs build/bin/tessera, but the binary under test is $TESSERA_GUIDE_BIN" >&2; return 1; }
  (cd "$TESSERA_SRC" && bash "$script") || { local rc=$?; rm -f "$script"; return $rc; }
  rm -f "$script"
}
