#!/usr/bin/env python3
"""Writes train.jsonl and val.jsonl: small arithmetic-tutor conversations in the Hugging Face chat
format ({"messages": [{"role": ..., "content": ...}]}), written for Tessera's README example (no
third-party text). Deterministic: python3 make_data.py reproduces the committed files."""
import json
import random

SYSTEMS = [
    "You are a concise arithmetic tutor. Answer with the equation.",
    "You answer arithmetic questions in one short sentence.",
]
OPS = [
    ("plus", "+", lambda a, b: a + b),
    ("minus", "-", lambda a, b: a - b),
    ("times", "x", lambda a, b: a * b),
]
ASK = ["What is {a} {w} {b}?", "Compute {a} {w} {b}.", "How much is {a} {w} {b}?", "{a} {w} {b} = ?"]


def turn(rng, a=None):
    w, sym, f = rng.choice(OPS)
    a = rng.randint(2, 60) if a is None else a
    b = rng.randint(2, 12) if sym == "x" else rng.randint(2, 60)
    q = rng.choice(ASK).format(a=a, w=w, b=b)
    return q, f"{a} {sym} {b} = {f(a, b)}.", f(a, b)


def conversation(rng):
    messages = []
    if rng.random() < 0.4:
        messages.append({"role": "system", "content": rng.choice(SYSTEMS)})
    q, ans, value = turn(rng)
    messages += [{"role": "user", "content": q}, {"role": "assistant", "content": ans}]
    if rng.random() < 0.3:  # a follow-up on the previous result
        w, sym, f = rng.choice(OPS[:2])
        b = rng.randint(2, 30)
        messages += [{"role": "user", "content": f"And {w} {b}?"},
                     {"role": "assistant", "content": f"{value} {sym} {b} = {f(value, b)}."}]
    return {"messages": messages}


def main():
    rng = random.Random(2026)
    for name, n in (("train.jsonl", 600), ("val.jsonl", 60)):
        with open(name, "w") as out:
            for _ in range(n):
                out.write(json.dumps(conversation(rng)) + "\n")


if __name__ == "__main__":
    main()
