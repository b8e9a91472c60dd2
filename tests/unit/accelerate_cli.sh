#!/usr/bin/env bash
# `tessera config --from-accelerate` and YAML run configs through the real binary:
#  - every Accelerate fixture prints exactly its expected run config on stdout (exit 0), and on
#    stderr one report line per key and the Makefile.slurm submit line;
#  - --out writes the same bytes to a new file, refuses an existing one and leaves it as it was;
#  - bad input (YAML that is not YAML, a DeepSpeed config, contradicting keys, unknown values, a
#    repeated key) gives one line naming file and key, exit 2, and writes nothing;
#  - `tessera config --check` prints the same normalised config for a YAML run config and its
#    JSON twin, and for a translated Accelerate config.
set -uo pipefail
BIN=${TESSERA_BIN:?}/tessera
FIX=${TESSERA_SRC:?}/tests/unit/fixtures/accelerate
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
source "$TESSERA_SRC/tests/expect.bash"  # ok, fail
# refused NAME TEXT CMD...: exit 2, nothing on stdout, exactly one stderr line, holding TEXT (fixed
# text; any program's line: slurm/preflight's are "tessera preflight: ...", not expect_error's form)
refused() {
  local name=$1 want=$2; shift 2
  "$@" >"$T/out" 2>"$T/err"; local rc=$?
  if [ $rc -eq 2 ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -qF -- "$want" "$T/err" && [ ! -s "$T/out" ]; then ok "$name"
  else cat "$T/err"; fail "$name: rc=$rc want '$want'"; fi
}

n=0
for y in "$FIX"/*.yaml; do
  want=${y%.yaml}.json
  [ -f "$want" ] || continue
  n=$((n+1))
  if "$BIN" config --from-accelerate "$y" >"$T/got.json" 2>"$T/report" && cmp -s "$T/got.json" "$want"; then ok "$(basename "$y")"
  else diff "$T/got.json" "$want"; cat "$T/report"; fail "$(basename "$y"): stdout differs from $(basename "$want")"; fi
  # One report line per key (fsdp_config / parallelism_config: one per key inside), then the submit line.
  keys=$(python3 - "$y" <<'PY'
import sys, yaml
d = yaml.safe_load(open(sys.argv[1]))
n = sum(len(v or {}) if k in ("fsdp_config", "parallelism_config") else 1 for k, v in d.items())
print(n)
PY
)
  lines=$(grep -c '^  [a-z_0-9.]*: .* -> ' "$T/report")
  if [ "$lines" -eq "$keys" ] && tail -n 1 "$T/report" | grep -q '^submit: make -f Makefile.slurm submit CONFIG=run.json NODES='; then
    ok "$(basename "$y"): one report line per key, then the submit line"
  else cat "$T/report"; fail "$(basename "$y"): $lines report lines for $keys keys"; fi
done
check "$n fixtures with an expected translation (at least 7)" [ $n -ge 7 ]

# --out: a new file with the same bytes; the submit line names it; an existing file is refused and kept.
"$BIN" config --from-accelerate "$FIX/full_shard_bf16_2nodes.yaml" --out "$T/run.json" >"$T/out" 2>"$T/report"
if [ $? -eq 0 ] && [ ! -s "$T/out" ] && cmp -s "$T/run.json" "$FIX/full_shard_bf16_2nodes.json" &&
   grep -qxF "submit: make -f Makefile.slurm submit CONFIG=$T/run.json NODES=2 GPUS_PER_NODE=8" "$T/report"; then ok "--out"
else cat "$T/report"; fail "--out"; fi
echo '{"keep": "me"}' > "$T/existing.json"
refused out-exists "--out $T/existing.json already exists; remove it or choose another name" \
  "$BIN" config --from-accelerate "$FIX/cpu.yaml" --out "$T/existing.json"
check "existing --out file unchanged" [ "$(cat "$T/existing.json")" = '{"keep": "me"}' ]

# Bad input: one line, exit 2, nothing written.
printf 'distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: [FULL_SHARD\n' > "$T/notyaml.yaml"
printf 'distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n  fsdp_reshard_after_forward: NO_SHARD\n' > "$T/conflict.yaml"
printf 'distributed_type: FSDP\nfsdp_config:\n  fsdp_backward_prefetch: BACKWARD_PER\n' > "$T/value.yaml"
printf 'distributed_type: FSDP\nmixed_precision: bf16\nmixed_precision: fp16\n' > "$T/twice.yaml"
printf 'distributed_type: FSDP\nfsdp_config:\n  fsdp_ofload_params: true\n' > "$T/unknown.yaml"
refused not-yaml "$T/notyaml.yaml:4:1: invalid YAML: end of sequence flow not found" \
  "$BIN" config --from-accelerate "$T/notyaml.yaml" --out "$T/a.json"
refused deepspeed "deepspeed.yaml:6:1: distributed_type: DEEPSPEED is not an FSDP config" \
  "$BIN" config --from-accelerate "$FIX/deepspeed.yaml" --out "$T/b.json"
refused conflict "$T/conflict.yaml:4:3: fsdp_config.fsdp_reshard_after_forward: NO_SHARD contradicts fsdp_config.fsdp_sharding_strategy: FULL_SHARD (line 3)" \
  "$BIN" config --from-accelerate "$T/conflict.yaml" --out "$T/c.json"
refused bad-value "fsdp_config.fsdp_backward_prefetch: 'BACKWARD_PER' is not one of BACKWARD_PRE, BACKWARD_POST, NO_PREFETCH (did you mean 'BACKWARD_PRE'?)" \
  "$BIN" config --from-accelerate "$T/value.yaml"
refused twice "$T/twice.yaml:3:1: key 'mixed_precision' appears twice (first at line 2)" \
  "$BIN" config --from-accelerate "$T/twice.yaml"
refused unknown-key "fsdp_config.fsdp_ofload_params: unknown Accelerate key (did you mean 'fsdp_offload_params'?)" \
  "$BIN" config --from-accelerate "$T/unknown.yaml"
refused missing "$T/nope.yaml: cannot open config file" "$BIN" config --from-accelerate "$T/nope.yaml" --out "$T/d.json"
refused with-check "--from-accelerate takes no --check" "$BIN" config --from-accelerate "$FIX/cpu.yaml" --check "$T/run.json"
refused out-alone "--out goes with --from-accelerate" "$BIN" config --check "$T/run.json" --out "$T/e.json"
ls "$T"/[a-e].json 2>/dev/null && fail "a failed translation wrote a file" || ok "no failed translation wrote a file"

# YAML run config == its JSON twin, through config --check (the normalised config, every key).
cat > "$T/run.yaml" <<'Y'
model: {preset: small, load: parallel}
train:
  steps: 50
  lr: 1e-4
  device: cpu
fsdp:
  strategy: hybrid_shard
  activation_checkpointing: false
  prefetch: off
checkpoint: {dir: ckpt, every: 10, async: yes}
Y
cat > "$T/twin.json" <<'J'
{"model": {"preset": "small", "load": "parallel"}, "train": {"steps": 50, "lr": 0.0001, "device": "cpu"},
 "fsdp": {"strategy": "hybrid_shard", "activation_checkpointing": "false", "prefetch": false},
 "checkpoint": {"dir": "ckpt", "every": 10, "async": true}}
J
"$BIN" config --check "$T/run.yaml" > "$T/check_yaml" && "$BIN" config --check "$T/twin.json" > "$T/check_json" &&
  cmp -s "$T/check_yaml" "$T/check_json" && ! cmp -s "$T/check_json" <("$BIN" config --check "") && ok "config --check: YAML and JSON twins agree" ||
  { diff "$T/check_yaml" "$T/check_json"; fail "config --check: YAML and JSON twins differ"; }
"$BIN" config --check "$T/run.yaml" --set train.steps=7 | grep -q '"steps": 7' && ok "--set over a YAML config" || fail "--set over a YAML config"
printf 'train:\n  steps: 3\n lr: 1e-4\n' > "$T/broken.yml"
refused run-not-yaml "$T/broken.yml:3:2: invalid YAML: end of map not found" "$BIN" config --check "$T/broken.yml"
refused train-not-yaml "$T/broken.yml:3:2: invalid YAML: end of map not found" "$BIN" train --config "$T/broken.yml"
printf 'fsdp:\n  strategy: zero3\n' > "$T/choice.yaml"
refused run-bad-choice "$T/choice.yaml: config key 'fsdp.strategy' is 'zero3', expected one of" "$BIN" train --config "$T/choice.yaml"

# A translated Accelerate config is a valid run config; keys not translated keep their defaults.
"$BIN" config --from-accelerate "$FIX/hybrid_shard.yaml" --out "$T/acc.json" 2>/dev/null
"$BIN" config --check "$T/acc.json" > "$T/acc_check" && python3 - "$T/acc_check" <<'PY' && ok "config --check of a translated config" || fail "config --check of a translated config"
import json, sys
c = json.load(open(sys.argv[1]))
assert c["fsdp"]["strategy"] == "hybrid_shard" and c["fsdp"]["mixed_precision"] == "bf16", c["fsdp"]
assert c["model"]["load"] == "rank0" and c["train"]["steps"] == 20, c
PY

# slurm/preflight (Makefile.slurm submit, train.sbatch) reads a YAML config's checkpoint.dir too.
printf 'checkpoint:\n  dir: /proc/tessera-nope/ck\n' > "$T/pf.yaml"
refused preflight-yaml "tessera preflight: checkpoint.dir '/proc/tessera-nope/ck' is not writable" \
  "$TESSERA_SRC/slurm/preflight" --config "$T/pf.yaml" --nodes 1 --tasks-per-node 2 --gpus-per-node 0
refused preflight-not-yaml "tessera preflight: config '$T/broken.yml' is not valid YAML" \
  "$TESSERA_SRC/slurm/preflight" --config "$T/broken.yml"
"$TESSERA_SRC/slurm/preflight" --config "$T/run.yaml" --nodes 2 --tasks-per-node 2 --gpus-per-node 0 -- \
  --set checkpoint.dir="$T/ck" && [ ! -e "$T/ck" ] && ok "preflight of a good YAML config" || fail "preflight of a good YAML config"

echo "$pass passed, 0 failed"
