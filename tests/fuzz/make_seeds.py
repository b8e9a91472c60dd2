#!/usr/bin/env python3
"""Writes the starting seeds of every harness into OUT/<harness>/ (tests/fuzz/README.md).

python3 tests/fuzz/make_seeds.py OUT TESSERA_BIN

Valid inputs come from Tessera's own writers where one exists (`tessera init-model` for model
directories, `tessera tokenize` for token files); checkpoints are assembled here following
runtime/checkpoint/FORMAT.md and checked with `tessera ckpt verify`. A few hand-written invalid
inputs per harness start the fuzzer near the error paths. The fuzzer grows and the minimiser
shrinks the corpus from these; what is committed under tests/fuzz/corpus/ is that result."""
import json, os, shutil, struct, subprocess, sys, tempfile

SPLIT = b"\n--8<--\n"  # fuzz_common.h kSplit
out, tessera = sys.argv[1], sys.argv[2]
tmp = tempfile.mkdtemp()


def put(harness, name, data):
    d = os.path.join(out, harness)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def read(path):
    with open(path, "rb") as f:
        return f.read()


# ---- safetensors / model directories ------------------------------------------------------------
def safetensors(tensors, meta=None):
    """tensors: [(name, dtype, shape, bytes)] -> file bytes (the layout of model/safetensors.cpp)."""
    h, data = {}, b""
    if meta is not None:
        h["__metadata__"] = meta
    for name, dt, shape, raw in tensors:
        h[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    js = json.dumps(h, separators=(",", ":")).encode()
    js += b" " * ((8 - len(js) % 8) % 8)
    return struct.pack("<Q", len(js)) + js + data


put("fuzz_safetensors", "two_tensors", safetensors(
    [("a", "F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4)), ("b", "BF16", [3], b"\x80\x3f\x00\x40\x40\x40")],
    {"format": "pt"}))
put("fuzz_safetensors", "f16_and_empty", safetensors(
    [("h", "F16", [1, 2], b"\x00\x3c\x00\xc0"), ("z", "F32", [0, 3], b"")]))
put("fuzz_safetensors", "unsupported_dtype", safetensors([("i", "I64", [1], b"\x01" + b"\x00" * 7)]))
cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu", "vocab_size": 4,
       "hidden_size": 2, "intermediate_size": 2, "num_hidden_layers": 1, "num_attention_heads": 1,
       "num_key_value_heads": 1, "max_position_embeddings": 4, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
       "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2}
with open(os.path.join(tmp, "cfg.json"), "w") as f:
    json.dump(cfg, f)
model = os.path.join(tmp, "model")
subprocess.run([tessera, "init-model", "--config", os.path.join(tmp, "cfg.json"), "--out", model, "--dtype", "bf16"],
               check=True, stdout=subprocess.DEVNULL)
st, cj = read(os.path.join(model, "model.safetensors")), read(os.path.join(model, "config.json"))
put("fuzz_safetensors", "model_dir", st + SPLIT + cj)
names = [k for k in json.loads(st[8:8 + struct.unpack("<Q", st[:8])[0]]) if k != "__metadata__"]
index = json.dumps({"metadata": {"total_size": len(st)}, "weight_map": {n: "shard.safetensors" for n in names}}, indent=2)
put("fuzz_safetensors", "sharded_dir", st + SPLIT + cj + SPLIT + index.encode())
put("fuzz_safetensors", "index_missing_shard", st + SPLIT + cj + SPLIT + b'{"weight_map": {"x": "other.safetensors"}}')

# ---- run config + --set --------------------------------------------------------------------------
put("fuzz_config", "empty_object", "{}")
put("fuzz_config", "sections", json.dumps({
    "model": {"preset": "small", "seed": 7, "load": "parallel"},
    "data": {"seq_len": 64, "path": "corpus.jsonl"},
    "train": {"steps": 10, "lr": 1e-4, "schedule": "constant", "device": "cpu"},
    "fsdp": {"strategy": "hybrid_shard", "mixed_precision": "bf16", "prefetch": False},
    "checkpoint": {"dir": "ckpt", "every": 5, "async": True},
    "log": {"every": 2}, "comm": {"timeout_s": 30}}, indent=1))
put("fuzz_config", "sets", b"{\"train\": {\"steps\": 3}}" + SPLIT + b"train.lr=1e-4" + SPLIT +
    b"fsdp.strategy=no_shard" + SPLIT + b"fsdp.prefetch=false" + SPLIT + b"model.path=/m")
put("fuzz_config", "bad_type", '{"train": {"steps": "ten"}}')
put("fuzz_config", "unknown_key", '{"trian": {"steps": 1}}')
put("fuzz_config", "bad_json", '{"train": {"steps": 1,}}\n')

# ---- token files and JSONL -----------------------------------------------------------------------
with open(os.path.join(tmp, "doc.txt"), "w") as f:
    f.write("Hello, token file.\n")
subprocess.run([tessera, "tokenize", "--input", os.path.join(tmp, "doc.txt"), "--out", os.path.join(tmp, "doc.bin")],
               check=True, stdout=subprocess.DEVNULL)
tok = read(os.path.join(tmp, "doc.bin"))
put("fuzz_token_file", "tokenized", tok)
put("fuzz_token_file", "three_tokens", tok[:12] + struct.pack("<Q", 3) + tok[20:32])
put("fuzz_token_file", "bad_magic", b"TSRTOK2\0" + tok[8:])
put("fuzz_token_file", "jsonl", '{"text": "one document"}\n\n{"text": "two", "id": 2}\n')
put("fuzz_token_file", "jsonl_bad", '{"text": 5}\n')

# ---- checkpoints -----------------------------------------------------------------------------------
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from crc32c import crc32c  # noqa: E402  (tests/crc32c.py)


def checkpoint(tensors, nfiles):
    """tensors: [(name, kind, shape)] split evenly over nfiles rank files -> (manifest, [file bytes])."""
    files = [b""] * nfiles
    entries = []
    for name, kind, shape in tensors:
        n = 1
        for d in shape:
            n *= d
        slices, begin = [], 0
        for r in range(nfiles):
            k = n // nfiles + (1 if r < n % nfiles else 0)
            if k == 0:
                continue
            slices.append({"file": "rank-%05d.bin" % r, "offset": len(files[r]), "begin": begin, "numel": k})
            files[r] += struct.pack("<%df" % k, *[float(begin + j) for j in range(k)])
            begin += k
        entries.append({"name": name, "kind": kind, "unit": "root", "dtype": "F32", "shape": shape, "slices": slices})
    manifest = {"format": "tessera-checkpoint", "format_version": 1, "step": 3, "world_size": nfiles,
                "strategy": "full_shard", "shard_group_size": nfiles, "replicate_group_size": 1, "align": 1,
                "files": [{"name": "rank-%05d.bin" % r, "bytes": len(files[r]), "crc32c": crc32c(files[r])}
                          for r in range(nfiles)],
                "units": [{"name": "root", "params": sorted({t[0] for t in tensors})}],
                "tensors": entries, "state": {"step": 3, "sampler": {"epoch": 0}}}
    return json.dumps(manifest, indent=1).encode(), files


def put_ckpt(name, manifest, files, verify):
    put("fuzz_checkpoint", name, SPLIT.join([manifest] + files))
    if verify:  # the real reader accepts it
        d = os.path.join(tmp, "ckpt-" + name)
        os.makedirs(d)
        with open(os.path.join(d, "manifest.json"), "wb") as f:
            f.write(manifest)
        for r, data in enumerate(files):
            with open(os.path.join(d, "rank-%05d.bin" % r), "wb") as f:
                f.write(data)
        subprocess.run([tessera, "ckpt", "verify", d], check=True, stdout=subprocess.DEVNULL)


ts = [(n, k, s) for n, s in (("w", [2, 3]), ("b", [3])) for k in ("param", "exp_avg", "exp_avg_sq")]
m, f = checkpoint(ts, 2)
put_ckpt("two_ranks", m, f, True)
m, f = checkpoint([("w", "param", [5])], 1)
put_ckpt("one_rank", m, f, True)
put_ckpt("bad_crc", m, [f[0][:-1] + b"\x01"], False)

# ---- SLURM hostlists and environments --------------------------------------------------------------
for i, h in enumerate(["gpu[001-004,010],login2", "r[1-2]-n[01-03]", "x[0-1]y[0-1]z[0-1]", "2(x3),1",
                       "n[1-2]-ib", "a[3-1]"]):
    put("fuzz_hostlist", "list%d" % i, h)
put("fuzz_hostlist", "env_step", "\n".join([
    "SLURM_JOB_ID=12", "SLURM_STEP_ID=0", "SLURM_PROCID=3", "SLURM_LOCALID=1", "SLURM_NODEID=1",
    "SLURM_STEP_NUM_TASKS=4", "SLURM_STEP_NUM_NODES=2", "SLURM_JOB_NODELIST=n[1-4]", "SLURM_STEP_NODELIST=n[1-2]",
    "SLURM_STEP_TASKS_PER_NODE=2(x2)", "SLURM_GPUS_ON_NODE=2", "SLURM_RESTART_COUNT=1"]))
put("fuzz_hostlist", "env_mismatch", "SLURM_JOBID=5\nSLURM_NTASKS=3\nSLURM_NNODES=2\nSLURM_NODELIST=a,b\n"
    "SLURM_TASKS_PER_NODE=2,2")
shutil.rmtree(tmp)
