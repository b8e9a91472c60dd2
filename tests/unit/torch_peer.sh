#!/usr/bin/env bash
# The PyTorch peer of `bench step --peer` (benchmarks/torch_peer.py) computes the same model and the
# same training step as Tessera: it loads the weights `tessera init-model` wrote (safetensors parsed
# by hand) and the same token file, and
#  - its step-0 loss equals `tessera eval`'s mean loss on those sequences (fp32, |diff| <= 1e-5);
#  - its losses over 4 AdamW steps (warmup + cosine schedule, clipping, weight decay off the norms)
#    equal those of a single-process `tessera train` (fp32, |diff| <= 1e-5 each; the two agree to
#    ~1e-6 here), at 1 rank and as 2 DDP ranks over gloo;
#  - in bf16 (peer: CPU autocast; Tessera: bf16 parameters and compute) within 1e-2 of each other.
# And bad input is one line `torch_peer: error: ...` with exit code 2.
set -u
BIN="${TESSERA_BIN:?TESSERA_BIN not set}/tessera"
SRC="${TESSERA_SRC:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
PY=/usr/bin/python3
PEER=("$PY" "$SRC/benchmarks/torch_peer.py" run)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/../expect.bash"  # fail, expect_error
"$PY" -c "import torch" 2>/dev/null || fail "$PY has no torch (scripts/deps.sh installs python3-torch)"

# A tiny model (GQA: 4 heads, 2 KV heads) and 4 sequences of 32 tokens (+1) as a token file (one
# plain-text document, what bench step --peer writes) and as text for `tessera eval`.
"$BIN" init-model --preset tiny --out "$WORK/model" --seed 3 >/dev/null || fail "init-model exited $?"
"$PY" - "$WORK" <<'PY' || fail "writing tokens"
import random, struct, sys
w = sys.argv[1]
random.seed(5)
T, B = 32, 4
ids = [random.randrange(258) for _ in range(B * T + 1)]
def token_file(path, docs):  # TSRTOK2 (runtime/data/token_file.h): plain-text documents, every token a target
    words = [i | 1 << 31 for d in docs for i in d]
    table, at = [], 0
    for d in docs:
        table.append(at | 1 << 63)
        at += len(d)
    with open(path, "wb") as f:
        f.write(b"TSRTOK2\0" + struct.pack("<IIQQ", 258, 0, len(words), len(docs)))
        f.write(struct.pack("<%dI" % len(words), *words) + b"\0" * (4 * (len(words) % 2)))
        f.write(struct.pack("<%dQ" % (len(docs) + 1), *(table + [at])))
token_file(w + "/tokens.bin", [ids])
token_file(w + "/two_docs.bin", [ids[:40], ids[40:]])  # not the one stream the peer reads
with open(w + "/tokens.txt", "w") as f:  # the same 4 sequences for `tessera eval`
    for i in range(B):
        f.write(" ".join(map(str, ids[i * T:i * T + T + 1])) + "\n")
PY

# Same hyper-parameters on both sides: a large LR and a short warmup so the optimizer moves the loss.
HP_T=(--set train.lr=0.003 --set train.min_lr=0.0003 --set train.warmup_steps=2 --set train.steps=4
      --set train.weight_decay=0.1 --set train.beta1=0.9 --set train.beta2=0.95 --set train.clip=1.0)
HP_P=(--lr 0.003 --min-lr 0.0003 --warmup-steps 2 --total-steps 4 --weight-decay 0.1 --beta1 0.9 --beta2 0.95
      --clip 1.0 --warmup 0 --steps 4)
"$BIN" eval --model "$WORK/model" --tokens "$WORK/tokens.txt" >"$WORK/eval.json" || fail "eval exited $?"
for dt in fp32 bf16; do
  "$BIN" train --set model.path="$WORK/model" --set data.path="$WORK/tokens.bin" --set data.seq_len=32 \
    --set train.micro_batch=4 --set fsdp.mixed_precision=$dt --set log.dir="$WORK/log_$dt" "${HP_T[@]}" \
    >"$WORK/train_$dt.out" 2>&1 || fail "tessera train ($dt) exited $?: $(tail -2 "$WORK/train_$dt.out")"
done
for run in "1 fp32" "2 fp32" "1 bf16"; do
  set -- $run
  "${PEER[@]}" --weights "$WORK/model" --tokens "$WORK/tokens.bin" --seq-len 32 --global-batch 4 --nproc $1 \
    --dtype $2 "${HP_P[@]}" >"$WORK/peer_$1_$2.json" 2>"$WORK/peer.err" ||
    fail "peer --nproc $1 --dtype $2 exited $?: $(cat "$WORK/peer.err")"
done

"$PY" - "$WORK" <<'PY' || fail "peer and Tessera disagree"
import json, sys
w = sys.argv[1]
ev = json.load(open(w + "/eval.json"))["mean_loss"]
tess = {dt: [json.loads(l)["loss"] for l in open("%s/log_%s/metrics.jsonl" % (w, dt))] for dt in ("fp32", "bf16")}
peer = {k: json.load(open("%s/peer_%s.json" % (w, k))) for k in ("1_fp32", "2_fp32", "1_bf16")}
def close(name, a, b, tol):
    print("%-34s peer %s" % (name, " ".join("%.7f" % x for x in a)))
    print("%-34s ref  %s" % ("", " ".join("%.7f" % x for x in b)))
    assert len(a) == len(b), (name, a, b)
    for x, y in zip(a, b):
        assert abs(x - y) <= tol, "%s: %.8f vs %.8f (tolerance %g)" % (name, x, y, tol)
for k in ("1_fp32", "2_fp32"):
    assert peer[k]["world_size"] == int(k[0]) and peer[k]["parameters"] == 445056, peer[k]
    close("step 0 vs tessera eval, W=" + k[0], peer[k]["losses"][:1], [ev], 1e-5)
    close("4 steps vs tessera train fp32, W=" + k[0], peer[k]["losses"], tess["fp32"], 1e-5)
close("4 steps vs tessera train bf16", peer["1_bf16"]["losses"], tess["bf16"], 1e-2)
assert tess["fp32"][-1] < tess["fp32"][0] - 0.05, ("the optimizer did not move the loss", tess["fp32"])
PY
echo "ok: peer losses equal Tessera's"

# Bad input: one line, exit code 2, before any rank starts.
cp -r "$WORK/model" "$WORK/model3"
"$PY" - "$WORK/model3/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["num_hidden_layers"] = 3; json.dump(c, open(sys.argv[1], "w"))
PY
expect_error 2 "missing \['model.layers.2" "${PEER[@]}" --weights "$WORK/model3" --tokens "$WORK/tokens.bin" \
  --seq-len 32 --global-batch 4 --nproc 2
expect_error 2 "nope.bin: no such file" "${PEER[@]}" --weights "$WORK/model" --tokens "$WORK/nope.bin" --seq-len 32 \
  --global-batch 4
expect_error 2 "fewer than one sequence" "${PEER[@]}" --weights "$WORK/model" --tokens "$WORK/tokens.bin" \
  --seq-len 200 --global-batch 2
expect_error 2 "expected one plain-text document" "${PEER[@]}" --weights "$WORK/model" --tokens "$WORK/two_docs.bin" \
  --seq-len 32 --global-batch 4
expect_error 2 "multiple of --nproc" "${PEER[@]}" --weights "$WORK/model" --tokens "$WORK/tokens.bin" --seq-len 32 \
  --global-batch 3 --nproc 2
echo "ok: bad input"
