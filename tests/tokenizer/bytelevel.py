# A small byte-level BPE tokenizer.json for shell tests (imported by their python3 snippets with
# sys.path including this folder): ids 0-255 are the bytes in GPT-2's alphabet, then one id per
# merge, then the special tokens from id 300.
def alphabet():
    printable = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, n = {}, 0
    for b in range(256):
        if b in printable: out[b] = chr(b)
        else: out[b] = chr(256 + n); n += 1
    return out


def spell(s, a=alphabet()):
    return "".join(a[b] for b in s.encode())


def tokenizer(merges, specials, pre_tokenizer, ignore_merges=True):
    """merges: [(left, right)] as text, ids 256, 257, ...; specials: names, ids 300, 301, ..."""
    a = alphabet()
    vocab = {a[b]: b for b in range(256)}
    for i, (l, r) in enumerate(merges): vocab[spell(l + r)] = 256 + i
    return {
        "version": "1.0",
        "added_tokens": [{"id": 300 + i, "content": s, "special": True, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False} for i, s in enumerate(specials)],
        "normalizer": None,
        "pre_tokenizer": pre_tokenizer,
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "dropout": None, "ignore_merges": ignore_merges, "vocab": vocab,
                  "merges": [spell(l) + " " + spell(r) for l, r in merges]},
    }
