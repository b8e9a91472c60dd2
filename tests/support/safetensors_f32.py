"""fp32 safetensors files read and written by hand for the Python references of the shell tests
(tests/unit/qwen_reference.sh, tests/unit/generate_reference.sh): a u64 little-endian header length
N, N bytes of JSON {name: {dtype, shape, data_offsets: [begin, end]}} padded with spaces to 8
bytes, then the data. Not a test itself."""
import json, struct
import torch


def read_safetensors(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", (name, info["dtype"])
        b, e = info["data_offsets"]
        out[name] = torch.frombuffer(bytearray(data[8 + n + b:8 + n + e]), dtype=torch.float32).reshape(info["shape"])
    return out


def write_safetensors(path, tensors):
    header, blobs, at = {}, [], 0
    for name, t in tensors.items():
        raw = t.to(torch.float32).contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
