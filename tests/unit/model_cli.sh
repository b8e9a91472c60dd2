#!/usr/bin/env bash
# End-to-end test of `tessera init-model` and `tessera eval`: real files, the real binary, exit
# codes, one-line errors naming the file / tensor / line, and the safetensors layout on disk.
set -u
BIN="${TESSERA_BIN:?TESSERA_BIN not set}/tessera"
if ! "$BIN" --help 2>&1 | grep -q init-model; then
  echo "SKIP: $BIN has no init-model subcommand yet"
  exit 0
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/../expect.bash"  # fail, expect_error

# 1. init-model tiny (single file) and a sharded copy with the same seed.
"$BIN" init-model --preset tiny --out "$WORK/tiny" --seed 5 >"$WORK/init.json" || fail "init-model exited $?"
grep -q '"parameters":445056' "$WORK/init.json" || fail "init-model summary: $(cat "$WORK/init.json")"
[ -f "$WORK/tiny/config.json" ] && [ -f "$WORK/tiny/model.safetensors" ] || fail "missing output files"
"$BIN" init-model --preset tiny --out "$WORK/sharded" --seed 5 --max-shard-size 300KB >/dev/null ||
  fail "sharded init-model exited $?"
[ -f "$WORK/sharded/model.safetensors.index.json" ] || fail "no index for a sharded model"
ls "$WORK/sharded" | grep -q 'model-00001-of-0000[2-9].safetensors' || fail "shard names: $(ls "$WORK/sharded")"

# 2. The files follow the safetensors layout (parsed here independently with Python).
python3 - "$WORK/tiny" "$WORK/sharded" <<'PY' || fail "safetensors layout check"
import json, os, struct, sys
size = {"F32": 4, "BF16": 2, "F16": 2}
def check(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    assert n % 8 == 0, "header not 8-byte aligned"
    header = json.loads(data[8:8 + n])
    assert header.pop("__metadata__") == {"format": "pt"}
    spans = sorted(tuple(v["data_offsets"]) for v in header.values())
    for v in header.values():
        count = 1
        for d in v["shape"]: count *= d
        b, e = v["data_offsets"]
        assert e - b == count * size[v["dtype"]]
    cursor = 0
    for b, e in spans:
        assert b == cursor; cursor = e
    assert 8 + n + cursor == len(data)
    return header
single = check(os.path.join(sys.argv[1], "model.safetensors"))
assert len(single) == 2 + 9 * 2 + 1, len(single)
assert single["model.layers.1.self_attn.k_proj.weight"]["shape"] == [64, 128]
cfg = json.load(open(os.path.join(sys.argv[1], "config.json")))
assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama"
index = json.load(open(os.path.join(sys.argv[2], "model.safetensors.index.json")))
names = set()
for f in set(index["weight_map"].values()):
    names |= set(check(os.path.join(sys.argv[2], f)))
assert names == set(single) == set(index["weight_map"])
PY

# 3. eval: JSON with per-sequence losses near ln(320) = 5.768 for a random model, same numbers
#    from the sharded copy, and bf16 close to fp32.
printf '256 72 101 108 108 111 257\n\n1 2 3 4 5 6 7 8 9 10\n  300   0 17 \n' >"$WORK/tokens.txt"
"$BIN" eval --model "$WORK/tiny" --tokens "$WORK/tokens.txt" >"$WORK/eval.json" || fail "eval exited $?"
"$BIN" eval --model "$WORK/sharded" --tokens "$WORK/tokens.txt" >"$WORK/eval_sharded.json" || fail "eval (sharded) exited $?"
"$BIN" eval --model "$WORK/tiny" --tokens "$WORK/tokens.txt" --dtype bf16 >"$WORK/eval_bf16.json" || fail "eval bf16 exited $?"
cat "$WORK/eval.json"
python3 - "$WORK/eval.json" "$WORK/eval_sharded.json" "$WORK/eval_bf16.json" <<'PY' || fail "eval output check"
import json, math, sys
def losses(path):  # the memory breakdown ("memory") varies from run to run; the numbers must not
    r = json.loads(open(path).read())
    assert set(r) == {"per_sequence_loss", "mean_loss", "tokens", "scored", "memory"}, r
    assert r.pop("scored") == "all tokens", r  # a token file has no targets
    assert r["memory"]["grad_shard"] == 0 and r["memory"]["optimizer"] == 0, r["memory"]  # no training state
    del r["memory"]
    return r
r = losses(sys.argv[1])
assert len(r["per_sequence_loss"]) == 3
assert r["tokens"] == 6 + 9 + 2
# Initial logits have std ~ sqrt(hidden) * 0.02 = 0.23, so a 2-token sequence can be off by ~0.3.
for loss in r["per_sequence_loss"]:
    assert abs(loss - math.log(320)) < 0.6, loss
assert abs(r["mean_loss"] - math.log(320)) < 0.15, r
weighted = (6 * r["per_sequence_loss"][0] + 9 * r["per_sequence_loss"][1] + 2 * r["per_sequence_loss"][2]) / 17
assert abs(r["mean_loss"] - weighted) < 1e-9
assert losses(sys.argv[2]) == r, "sharded checkpoint gives different numbers"
b = json.loads(open(sys.argv[3]).read())
assert abs(b["mean_loss"] - r["mean_loss"]) < 0.02, (b, r)
PY
# A different seed gives a different model.
"$BIN" init-model --preset tiny --out "$WORK/seed6" --seed 6 >/dev/null || fail "init-model seed 6"
"$BIN" eval --model "$WORK/seed6" --tokens "$WORK/tokens.txt" >"$WORK/eval6.json" || fail "eval seed 6"
cmp -s "$WORK/eval.json" "$WORK/eval6.json" && fail "seed does not change the model"

# 4. Bad tokens: the line and the id are named.
printf '1 2 3\n4 999 5\n' >"$WORK/bad_tokens.txt"
expect_error 2 "bad_tokens.txt:2: token id 999 is outside the vocabulary \[0, 320)" \
  "$BIN" eval --model "$WORK/tiny" --tokens "$WORK/bad_tokens.txt"
printf '1 2 x3\n' >"$WORK/nan_tokens.txt"
expect_error 2 "nan_tokens.txt:1: 'x3' is not an integer token id" \
  "$BIN" eval --model "$WORK/tiny" --tokens "$WORK/nan_tokens.txt"

# 5. init-model bad input: no partial output, nothing overwritten.
expect_error 2 "unknown model preset 'huge'" "$BIN" init-model --preset huge --out "$WORK/huge"
[ -e "$WORK/huge" ] && fail "failed init-model left $WORK/huge"
expect_error 2 "output directory exists and is not empty" "$BIN" init-model --preset tiny --out "$WORK/tiny"
expect_error 2 "exactly one of --preset or --config" "$BIN" init-model --out "$WORK/none"
expect_error 2 "unknown dtype 'fp8'" "$BIN" init-model --preset tiny --dtype fp8 --out "$WORK/fp8"
"$BIN" init-model --config "$WORK/tiny/config.json" --dtype bf16 --out "$WORK/from_config" >/dev/null ||
  fail "init-model --config exited $?"
grep -q '"torch_dtype": "bfloat16"' "$WORK/from_config/config.json" || fail "bf16 config dtype"
grep -q '"BF16"' "$WORK/from_config/model.safetensors" || fail "bf16 tensors"

# 6. Malformed model directories: exit 2, one line naming the file (and tensor).
cp -r "$WORK/tiny" "$WORK/truncated"
truncate -s -1000 "$WORK/truncated/model.safetensors"
expect_error 2 "truncated/model.safetensors: tensor 'lm_head.weight': data_offsets .* out of bounds" \
  "$BIN" eval --model "$WORK/truncated" --tokens "$WORK/tokens.txt"
cp -r "$WORK/tiny" "$WORK/shape"
sed -i 's/"intermediate_size": 344/"intermediate_size": 340/' "$WORK/shape/config.json"
expect_error 2 "model.layers.0.mlp.gate_proj.weight: shape \[344,128\] in .*shape/model.safetensors does not match config \[340,128\]" \
  "$BIN" eval --model "$WORK/shape" --tokens "$WORK/tokens.txt"
cp -r "$WORK/sharded" "$WORK/noshard"
rm "$WORK/noshard/model-00001-of-"*.safetensors
expect_error 2 "model.safetensors.index.json: shard file 'model-00001-of-" \
  "$BIN" eval --model "$WORK/noshard" --tokens "$WORK/tokens.txt"
mkdir "$WORK/noconfig" && cp "$WORK/tiny/model.safetensors" "$WORK/noconfig/"
expect_error 2 "noconfig/config.json: missing config.json" "$BIN" eval --model "$WORK/noconfig" --tokens "$WORK/tokens.txt"
printf '\x00\x00\x00\x00\x00\x00\x00\x80{}' >"$WORK/noconfig/model.safetensors"
cp "$WORK/tiny/config.json" "$WORK/noconfig/"
expect_error 2 "noconfig/model.safetensors: header length 9223372036854775808 exceeds" \
  "$BIN" eval --model "$WORK/noconfig" --tokens "$WORK/tokens.txt"
echo "PASS"
