#!/usr/bin/python3
"""PyTorch peer of Tessera's training step: DistributedDataParallel (gloo) on a Llama written from the
same equations as model/llama.cpp, for `tessera bench step --peer` and the equivalence test.

  torch_peer.py run --config config.json | --weights HFDIR   --tokens FILE.bin --seq-len T
                    --global-batch B [--nproc W] [--threads K] [--dtype fp32|bf16]
                    [--warmup 1] [--steps 4] [--total-steps N] [AdamW / schedule options]

`run` spawns W rank processes of this script (no torchrun, no mpirun): they meet through
torch.distributed's file:// rendezvous in a private temporary folder, wrap the model in DDP over
gloo on loopback and train. Rank 0 prints one JSON line: tokens/s over the timed steps, every
step's time and world-mean loss, parameter count, torch version. Any rank failing ends all of them
with that rank's exit code; bad input is one line `torch_peer: error: ...` and exit code 2.

The model is Hugging Face's LlamaForCausalLM, written again from the equations (no transformers):
RMSNorm in fp32 then cast back, rotate-half RoPE (fp32 tables), grouped-query attention with an
explicit causal softmax in fp32 (torch 1.13 has no scaled_dot_product_attention; Tessera's
LibTorch 1.13 build runs the same explicit form), SwiGLU MLP, untied (or tied) lm_head. Parameter
names are the Hugging Face tensor names, so a Tessera `init-model` directory loads with a strict
load_state_dict. The step is Tessera's: next-token cross entropy in fp32 (mean over the rank's
micro-batch; DDP averages gradients over ranks), global-norm clipping, torch.optim.AdamW with weight
decay on everything but the norm weights, Tessera's warmup + cosine schedule (runtime/optim/
schedule.h). `--dtype bf16` runs the forward under CPU autocast to bf16 (fp32 master weights and
gradients, as PyTorch users do); Tessera's bf16 gathers bf16 parameters instead.

Data: the token file (runtime/data/token_file.h; one plain-text document) is packed as Tessera
packs it (sequence i is tokens [i*T, i*T + T + 1)); step s takes sequences s*B .. s*B + B - 1 (modulo their count), rank
r the r-th slice of B/W of them (the slot order of Tessera's sampler).
"""
import argparse
import array
import importlib.util
import json
import math
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time

from json_file import read_json  # benchmarks/json_file.py, beside this script


class InputError(Exception):
    pass


# ------------------------------------------------------------------------------------------------
# Files: config.json, safetensors, token files
# ------------------------------------------------------------------------------------------------

def load_config(path):
    c = read_json(path, InputError)
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
        if key not in c:
            raise InputError("%s: missing key '%s'" % (path, key))
    c.setdefault("num_key_value_heads", c["num_attention_heads"])
    c.setdefault("rope_theta", 10000.0)
    c.setdefault("rms_norm_eps", 1e-6)  # HF LlamaConfig's default
    c.setdefault("tie_word_embeddings", False)
    return c


SAFETENSORS_DTYPES = {"F32": ("float32", 4), "BF16": ("bfloat16", 2), "F16": ("float16", 2)}


def read_safetensors(path):
    """name -> fp32 tensor, parsed by hand: u64 little-endian header length N, N bytes of JSON
    {name: {dtype, shape, data_offsets: [begin, end]}} (offsets after the header), then the data."""
    import torch
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise InputError("%s: too short for a safetensors file" % path)
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        raise InputError("%s: header length %d exceeds the file size %d" % (path, n, len(blob)))
    try:
        header = json.loads(blob[8:8 + n])
    except ValueError as e:
        raise InputError("%s: bad header JSON: %s" % (path, e))
    data = memoryview(blob)[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in SAFETENSORS_DTYPES:
            raise InputError("%s: tensor %s has unsupported dtype %s" % (path, name, info["dtype"]))
        dtype_name, size = SAFETENSORS_DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        count = math.prod(info["shape"])
        if end - begin != count * size or end > len(data):
            raise InputError("%s: tensor %s: data_offsets %s do not fit shape %s" % (path, name, info["data_offsets"], info["shape"]))
        t = torch.frombuffer(bytearray(data[begin:end]), dtype=getattr(torch, dtype_name)) if count else torch.empty(0)
        out[name] = t.reshape(info["shape"]).float()
    return out


def read_model_dir(path):
    """config.json and every tensor of a Hugging Face directory (one safetensors file or an index)."""
    config = load_config(os.path.join(path, "config.json"))
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors = {}
    for name in files:
        tensors.update(read_safetensors(os.path.join(path, name)))
    return config, tensors


def read_binary_token_file(path, vocab_size, seq_len):
    """The ids of a token file (runtime/data/token_file.h) as an array('i'), checked against the
    model's vocabulary and for at least one sequence of seq_len + 1 tokens. Version 2 (TSRTOK2:
    magic, u32 vocab, u32 0, u64 N, u64 D, N u32 words with the id in bits 0-30, padding to 8 bytes,
    D + 1 u64 table entries) must hold one plain-text document, the stream `bench step --peer`
    writes; version 1 (TSRTOK1: magic, u32 vocab, u64 N, N int32 ids) is one stream already."""
    with open(path, "rb") as f:
        blob = f.read()
    ids = array.array("i")
    if blob[:8] == b"TSRTOK2\0" and len(blob) >= 32:
        _vocab, _reserved, count, docs = struct.unpack("<IIQQ", blob[8:32])
        words = 32 + 4 * count
        size = words + 4 * (count % 2) + 8 * (docs + 1)
        if len(blob) != size:
            raise InputError("%s: %d bytes, expected %d for %d tokens and %d documents" % (path, len(blob), size, count, docs))
        table = struct.unpack("<%dQ" % (docs + 1), blob[size - 8 * (docs + 1):])
        if docs != 1 or table[0] != 1 << 63 or table[1] != count:
            raise InputError("%s: expected one plain-text document (the stream bench step --peer writes), got %d documents" % (path, docs))
        ids.frombytes(blob[32:words])
        if sys.byteorder != "little":
            ids.byteswap()
        ids = array.array("i", (w & 0x7FFFFFFF for w in ids))
    elif blob[:8] == b"TSRTOK1\0" and len(blob) >= 20:
        _vocab, count = struct.unpack("<IQ", blob[8:20])
        if len(blob) != 20 + 4 * count:
            raise InputError("%s: %d bytes, expected %d for %d tokens" % (path, len(blob), 20 + 4 * count, count))
        ids.frombytes(blob[20:])
        if sys.byteorder != "little":
            ids.byteswap()
    else:
        raise InputError("%s: not a token file (magic TSRTOK2 or TSRTOK1)" % path)
    if count < seq_len + 1:
        raise InputError("%s: %d tokens, fewer than one sequence of %d + 1" % (path, count, seq_len))
    if min(ids) < 0 or max(ids) >= vocab_size:
        raise InputError("%s: token ids outside the model's vocabulary [0, %d)" % (path, vocab_size))
    return ids


# ------------------------------------------------------------------------------------------------
# The model (Hugging Face LlamaForCausalLM semantics; names = HF tensor names)
# ------------------------------------------------------------------------------------------------

def build_llama(c):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    H, nh, nkv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    D, I, eps = H // nh, c["intermediate_size"], c["rms_norm_eps"]

    def linear(i, o):
        return nn.Linear(i, o, bias=False)

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(H))

        def forward(self, x):
            h = x.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
            return self.weight * h.to(x.dtype)

    def rope(x, cos, sin):  # rotate-half: first half / second half of each head
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    def repeat_kv(x):  # [B, nkv, T, D] -> [B, nh, T, D]; query head h uses KV head h // (nh / nkv)
        B, _, T, _ = x.shape
        return x[:, :, None].expand(B, nkv, nh // nkv, T, D).reshape(B, nh, T, D) if nkv != nh else x

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj, self.k_proj = linear(H, nh * D), linear(H, nkv * D)
            self.v_proj, self.o_proj = linear(H, nkv * D), linear(nh * D, H)

        def forward(self, x, cos, sin, mask):
            B, T, _ = x.shape
            q = self.q_proj(x).view(B, T, nh, D).transpose(1, 2)
            k = self.k_proj(x).view(B, T, nkv, D).transpose(1, 2)
            v = self.v_proj(x).view(B, T, nkv, D).transpose(1, 2)
            cos, sin = cos.to(q.dtype), sin.to(q.dtype)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            scores = torch.matmul(q, repeat_kv(k).transpose(-2, -1)) * (1.0 / math.sqrt(D))
            probs = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1, dtype=torch.float32).to(q.dtype)
            out = torch.matmul(probs, repeat_kv(v))
            return self.o_proj(out.transpose(1, 2).reshape(B, T, nh * D))

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj, self.up_proj, self.down_proj = linear(H, I), linear(H, I), linear(I, H)

        def forward(self, x):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    class DecoderLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn, self.mlp = Attention(), Mlp()
            self.input_layernorm, self.post_attention_layernorm = RMSNorm(), RMSNorm()

        def forward(self, h, cos, sin, mask):
            x = h + self.self_attn(self.input_layernorm(h), cos, sin, mask)
            return x + self.mlp(self.post_attention_layernorm(x))

    class LlamaModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(c["vocab_size"], H)
            self.layers = nn.ModuleList(DecoderLayer() for _ in range(c["num_hidden_layers"]))
            self.norm = RMSNorm()

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = LlamaModel()
            self.lm_head = None if c["tie_word_embeddings"] else linear(H, c["vocab_size"])

        def forward(self, tokens):
            T = tokens.shape[1]
            inv_freq = 1.0 / torch.pow(c["rope_theta"], torch.arange(0, D, 2, dtype=torch.float32) / D)
            freqs = torch.outer(torch.arange(T, dtype=torch.float32), inv_freq)
            emb = torch.cat((freqs, freqs), dim=-1)
            cos, sin = emb.cos(), emb.sin()
            mask = torch.ones(T, T, dtype=torch.bool).triu(1)
            h = self.model.embed_tokens(tokens)
            for layer in self.model.layers:
                h = layer(h, cos, sin, mask)
            h = self.model.norm(h)
            return self.lm_head(h) if self.lm_head is not None else F.linear(h, self.model.embed_tokens.weight)

    return Llama()


def is_norm_weight(name):  # model/llama.h: no weight decay, initialised to 1
    return name.endswith("layernorm.weight") or name == "model.norm.weight"


def lr_at(step, a):  # runtime/optim/schedule.h, 0-based optimizer steps
    if step < a.warmup_steps:
        return a.lr * (step + 1) / a.warmup_steps
    if a.schedule == "constant":
        return a.lr
    span = a.total_steps - a.warmup_steps
    progress = 1.0 if span <= 0 else min(1.0, max(0.0, (step - a.warmup_steps) / span))
    if a.schedule == "linear":
        return a.min_lr + (a.lr - a.min_lr) * (1 - progress)
    return a.min_lr + 0.5 * (a.lr - a.min_lr) * (1 + math.cos(math.pi * progress))


# ------------------------------------------------------------------------------------------------
# One rank
# ------------------------------------------------------------------------------------------------

def prepare(a):
    """Config, tokens and the initialised model, with every input check (one InputError each)."""
    import torch
    if a.weights:
        config, tensors = read_model_dir(a.weights)
    else:
        config, tensors = load_config(a.config), None
    tokens = torch.frombuffer(read_binary_token_file(a.tokens, config["vocab_size"], a.seq_len), dtype=torch.int32).long()
    torch.manual_seed(a.seed)
    model = build_llama(config)
    if tensors is not None:
        expected = set(model.state_dict())
        missing, extra = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
        if missing or extra:
            raise InputError("%s: tensors do not match config.json: missing %s, unexpected %s"
                             % (a.weights, missing[:3], extra[:3]))
        for name, p in model.named_parameters():
            if tuple(tensors[name].shape) != tuple(p.shape):
                raise InputError("%s: tensor %s has shape %s, config.json needs %s"
                                 % (a.weights, name, list(tensors[name].shape), list(p.shape)))
        model.load_state_dict(tensors, strict=True)
    else:
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.fill_(1.0) if is_norm_weight(name) else p.normal_(0.0, 0.02)
    return config, tokens, model


def run_rank(a):
    import datetime
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", init_method="file://" + a.init_file, rank=a.rank, world_size=a.nproc,
                            timeout=datetime.timedelta(seconds=a.timeout))
    config, tokens, model = prepare(a)
    T, B, W = a.seq_len, a.global_batch, a.nproc
    num_seq, micro = (tokens.numel() - 1) // T, B // W
    decay = [p for n, p in model.named_parameters() if not is_norm_weight(n)]
    no_decay = [p for n, p in model.named_parameters() if is_norm_weight(n)]
    ddp = DDP(model)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps)

    def batch(step):
        first = step * B + a.rank * micro
        rows = [tokens[((first + j) % num_seq) * T:((first + j) % num_seq) * T + T + 1] for j in range(micro)]
        return torch.stack(rows)

    def train_step(step):
        seqs = batch(step)
        inputs, targets = seqs[:, :-1], seqs[:, 1:]
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
            logits = ddp(inputs)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
        loss.backward()
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(ddp.parameters(), a.clip)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, a)
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)  # world mean, as Tessera logs it
        return float(mean) / W

    losses, times = [], []
    for s in range(a.warmup):
        losses.append(train_step(s))
    dist.barrier()
    t0 = time.perf_counter()
    for s in range(a.warmup, a.warmup + a.steps):
        ts = time.perf_counter()
        losses.append(train_step(s))
        times.append(time.perf_counter() - ts)
    dist.barrier()
    elapsed = time.perf_counter() - t0
    if a.rank == 0:
        print(json.dumps({
            "peer": "pytorch-ddp-gloo", "torch": torch.__version__, "world_size": W, "threads_per_rank": a.threads,
            "dtype": a.dtype, "seq_len": T, "global_batch": B, "parameters": sum(p.numel() for p in model.parameters()),
            "warmup_steps": a.warmup, "timed_steps": a.steps,
            "tokens_per_s": B * T * a.steps / elapsed if a.steps else 0.0,
            "step_time_s": times, "losses": losses}), flush=True)
    # Every collective is done (the barrier above). Leave without the interpreter's teardown: there,
    # destroying DDP's Reducer joins gloo's worker threads while holding the GIL, and a worker that
    # releases a tensor with a Python object waits for the GIL -- torch 1.13 hung there now and then.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# ------------------------------------------------------------------------------------------------
# The launcher: W ranks of this script, file:// rendezvous, all-or-nothing exit
# ------------------------------------------------------------------------------------------------

def launch(a, argv):
    if a.nproc < 1:
        raise InputError("--nproc must be >= 1, got %d" % a.nproc)
    if a.global_batch < 1 or a.global_batch % a.nproc:
        raise InputError("--global-batch %d must be a positive multiple of --nproc %d" % (a.global_batch, a.nproc))
    if a.seq_len < 1 or a.steps < 0 or a.warmup < 0 or a.threads < 1:
        raise InputError("--seq-len and --threads must be >= 1, --steps and --warmup >= 0")
    if a.dtype not in ("fp32", "bf16"):
        raise InputError("--dtype must be fp32 or bf16, got '%s'" % a.dtype)
    if bool(a.config) == bool(a.weights):
        raise InputError("give exactly one of --config (random initialisation) or --weights (a Hugging Face directory)")
    for path in (a.config or os.path.join(a.weights, "config.json"), a.tokens):
        if not os.path.isfile(path):
            raise InputError("%s: no such file" % path)
    if a.weights:
        prepare(a)  # every check once here, so bad input is one line before any rank starts
    else:
        read_binary_token_file(a.tokens, load_config(a.config)["vocab_size"], a.seq_len)
    def stop(signum, _frame):  # SIGTERM (a driver's timeout) / Ctrl-C: end the ranks too (finally below)
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    env = dict(os.environ)
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env["OMP_NUM_THREADS"] = str(a.threads)
    with tempfile.TemporaryDirectory(prefix="torch_peer.") as tmp:
        init = os.path.join(tmp, "rendezvous")
        procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__)] + argv +
                                  ["--rank", str(r), "--init-file", init], env=env,
                                  stdout=None if r == 0 else subprocess.DEVNULL, start_new_session=True)
                 for r in range(a.nproc)]
        code = 0
        try:
            pending = list(procs)
            while pending:
                for p in list(pending):
                    rc = p.poll()
                    if rc is None:
                        continue
                    pending.remove(p)
                    if rc != 0 and code == 0:
                        code = rc if rc > 0 else 1
                        for q in pending:  # one rank failed: the others would wait in a collective
                            os.killpg(q.pid, signal.SIGKILL)
                time.sleep(0.05)
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
    return code


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("run", help="train W DDP ranks and print one JSON line")
    p.add_argument("--config", help="Hugging Face config.json (random initialisation, seed --seed)")
    p.add_argument("--weights", help="Hugging Face model directory (config.json + safetensors)")
    p.add_argument("--tokens", required=True, help="token file (TSRTOK2 with one plain-text document, or TSRTOK1)")
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--global-batch", type=int, required=True, help="sequences per step, all ranks together")
    p.add_argument("--nproc", type=int, default=1, help="ranks (processes) to spawn")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--dtype", default="fp32", help="fp32, or bf16 (CPU autocast)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    p.add_argument("--steps", type=int, default=4, help="timed steps")
    p.add_argument("--total-steps", type=int, help="steps of the LR schedule (default warmup + steps)")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--min-lr", type=float, default=3e-5)
    p.add_argument("--warmup-steps", type=int, default=5, help="LR warmup steps")
    p.add_argument("--schedule", default="cosine", choices=["cosine", "linear", "constant"])
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0, help="initialisation seed without --weights")
    p.add_argument("--timeout", type=float, default=600, help="seconds a collective may wait")
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--init-file", help=argparse.SUPPRESS)
    argv = sys.argv[1:]
    a = ap.parse_args(argv)
    if a.total_steps is None:
        a.total_steps = a.warmup + a.steps
    try:
        if importlib.util.find_spec("torch") is None:
            raise InputError("PyTorch is not installed for %s (Debian: apt-get install python3-torch)" % sys.executable)
        return run_rank(a) if a.rank is not None else launch(a, argv)
    except InputError as e:
        who = "" if a.rank is None else " (rank %d)" % a.rank
        print("torch_peer: error%s: %s" % (who, e), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
