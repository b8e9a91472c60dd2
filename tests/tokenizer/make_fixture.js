// The independent reference for Tessera's tokenizer.json reader (text/bpe/tokenizer.cpp),
// run by tests/unit/bpe_tiktoken.sh. Uses npm's js-tiktoken (installed by scripts/deps.sh into
// tests/tokenizer/node_modules) and its cl100k_base ranks, the base of Llama 3's vocabulary.
//
//   node make_fixture.js make DIR SRC   writes into DIR:
//     tokenizer.json         an HF byte-level BPE built from the ranks the way transformers'
//                            TikTokenConverter does (vocab = ranks spelled with GPT-2's
//                            byte-to-unicode map; merges = every split of every token into two
//                            tokens, ordered by the rank of the result), Llama 3's pre-tokenizer,
//                            ignore_merges, and Llama 3.1's 256 special tokens at ids 128000..128255
//     tokenizer_config.json  bos <|begin_of_text|>, eos <|end_of_text|>
//     corpus.jsonl           documents of varied text (SRC's sources, Debian's license texts and
//                            generated Unicode: CJK, emoji, scripts, combining marks, whitespace
//                            runs, digits, contractions, special tokens)
//     expected.bin           js-tiktoken's ids as a Tessera token file: per document BOS + ids + EOS
//   node make_fixture.js compare DIR GOT.bin   exits 1 naming the first differing document and
//                                             token (with both decodings) if GOT != expected
"use strict";
const fs = require("fs");
const path = require("path");
const { Tiktoken } = require("js-tiktoken/lite");
const cl100k = require("js-tiktoken/ranks/cl100k_base");

const LLAMA3_PATTERN =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const VOCAB = 128256;

function llama3Specials() {
  const names = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>", "<|start_header_id|>", "<|end_header_id|>",
    "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"];
  for (let i = 3; names.length < 256; ++i) names.push(`<|reserved_special_token_${i}|>`);
  const specials = {};
  names.forEach((n, i) => (specials[n] = 128000 + i));
  return specials;
}

function bytesToUnicode() {
  const bs = [];
  for (let b = 0x21; b <= 0x7e; ++b) bs.push(b);
  for (let b = 0xa1; b <= 0xac; ++b) bs.push(b);
  for (let b = 0xae; b <= 0xff; ++b) bs.push(b);
  const map = new Array(256);
  bs.forEach((b) => (map[b] = String.fromCodePoint(b)));
  let n = 0;
  for (let b = 0; b < 256; ++b) if (map[b] === undefined) map[b] = String.fromCodePoint(256 + n++);
  return map;
}

function makeTokenizerJson(enc, specials) {
  const byteChar = bytesToUnicode();
  const spell = (bytes) => Array.from(bytes, (b) => byteChar[b]).join("");
  const vocab = {};
  const merges = [];
  for (const [rank, bytes] of enc.textMap) {
    vocab[spell(bytes)] = rank;
    const local = [];
    for (let i = 1; i < bytes.length; ++i) {
      const l = enc.rankMap.get(Array.from(bytes.slice(0, i)).join(","));
      const r = enc.rankMap.get(Array.from(bytes.slice(i)).join(","));
      if (l !== undefined && r !== undefined) local.push([l, r, rank, bytes.slice(0, i), bytes.slice(i)]);
    }
    local.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
    merges.push(...local);
  }
  merges.sort((a, b) => a[2] - b[2]);  // stable: within one result, by (left rank, right rank)
  return {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: Object.entries(specials).map(([content, id]) => ({
      id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true })),
    normalizer: null,
    pre_tokenizer: { type: "Sequence", pretokenizers: [
      { type: "Split", pattern: { Regex: LLAMA3_PATTERN }, behavior: "Isolated", invert: false },
      { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: false }] },
    post_processor: { type: "TemplateProcessing",
      single: [{ SpecialToken: { id: "<|begin_of_text|>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
      pair: [], special_tokens: {} },
    decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
      fuse_unk: false, byte_fallback: false, ignore_merges: true, vocab,
      merges: merges.map((m) => `${spell(m[3])} ${spell(m[4])}`) },
  };
}

// ---- corpus ------------------------------------------------------------------------------------
function rng(seed) {  // mulberry32
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function generatedDocs(count, rand) {
  const pick = (a) => a[Math.floor(rand() * a.length)];
  const int = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1));
  const range = (lo, hi) => String.fromCodePoint(int(lo, hi));
  const word = (lo, hi, n) => Array.from({ length: n }, () => range(lo, hi)).join("");
  const scripts = [
    [0x61, 0x7a], [0x41, 0x5a], [0xe0, 0xff], [0x100, 0x17e], [0x3b1, 0x3c9], [0x391, 0x3a9], [0x430, 0x44f],
    [0x410, 0x42f], [0x5d0, 0x5ea], [0x627, 0x64a], [0x905, 0x939], [0xe01, 0xe2e], [0x4e00, 0x9fa5],
    [0x3041, 0x3096], [0x30a1, 0x30fa], [0xac00, 0xd7a3], [0x10d0, 0x10f0], [0x531, 0x556]];
  const english = ("the of and to in is that for it as was with be by on not he I this are or his from at which but " +
    "have an they you were her she there would their we him been has when who will more no if out so said what up its " +
    "about into than them can only other new some could time these two may then do first any my now such like our over " +
    "man me even most made after also did many before must through back years where much your way well down should " +
    "because each just those people Mr how too little state good very make world still own see men work long get here").split(" ");
  const contractions = ["don't", "I'm", "you're", "we've", "they'll", "she'd", "it's", "DON'T", "I'LL", "We'Re",
    "YOU'VE", "He'D", "it'S", "can't", "rock'n'roll", "'s", "'tis", "o'clock", "y'all", "'LL"];
  const emoji = ["😀", "🎉", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇫🇷", "🇯🇵", "❤️", "🚀", "🤖", "🦀", "🧪", "☕", "✨", "👩🏾‍💻"];
  const spaces = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", " \n", "\n ", " \t\n ", "\u00a0", "\u3000",
    "\u2003", "\u2009", "    ", "\n\n\n", "\r\n\r\n", "\t \t", " \u00a0 "];
  const punct = ["!", "?", ".", ",", ";", ":", "...", "—", "–", "«", "»", "“", "”", "‘", "’", "(", ")", "[", "]", "{", "}",
    "<", ">", "/", "\\", "|", "@", "#", "$", "%", "^", "&", "*", "+", "=", "~", "`", "\"", "'", "''", "!!!", "?!", "。",
    "、", "，", "！", "？", "←", "→", "∑", "∞", "≤", "±", "§", "¶", "©", "®", "™", "€", "£", "¥", "_", "__", "-", "--"];
  const specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
    "<|python_tag|>", "<|reserved_special_token_17|>", "<|reserved_special_token_247|>", "<|eom_id|>",
    "<|begin_of", "<|eot_id", "<|unknown|>", "<|>", "|>", "<|"];
  const combining = () => pick(["e\u0301", "a\u0308", "n\u0303", "o\u0302\u0323", "\u0915\u094d\u0937", "Z\u0335\u0351",
    "\u0301", "i\u0307"]);
  const number = () => pick([
    () => String(int(0, 9)), () => String(int(0, 999)), () => String(int(0, 1e9)), () => word(0x30, 0x39, int(4, 40)),
    () => `${int(0, 99)}.${int(0, 999)}`, () => `${int(1, 9)},${int(100, 999)},${int(100, 999)}`,
    () => `0x${int(0, 1e8).toString(16)}`, () => `${int(1, 9)}e-${int(1, 30)}`, () => word(0x660, 0x669, int(1, 6)),
    () => word(0x966, 0x96f, int(1, 6)), () => word(0xff10, 0xff19, int(1, 5)), () => "²³¼½", () => "ⅫⅣ"])();
  const token = () => pick([
    () => pick(english), () => pick(english), () => pick(english), () => pick(english)[0].toUpperCase() + pick(english).slice(1),
    () => pick(english).toUpperCase(), () => pick(contractions), () => number(), () => pick(punct), () => pick(emoji),
    () => { const [lo, hi] = pick(scripts); return word(lo, hi, int(1, 8)); },
    () => { const [lo, hi] = pick(scripts); return word(lo, hi, int(1, 3)) + pick(punct) + word(lo, hi, int(1, 3)); },
    () => combining(), () => pick(specials), () => pick(english) + pick(punct) + pick(english),
    () => pick(["http://example.com/a?b=c&d=1", "foo_bar.baz()", "x+=1;", "#include <vector>", "a->b", "i++", "==",
      "!==", "/*", "*/", "//", "${x}", "λx.x", "<div class=\"a\">", "</div>", "\\n", "C:\\Windows", "~/.bashrc"])]);
  const docs = [];
  for (let d = 0; d < count; ++d) {
    const parts = [];
    const n = int(1, 400);
    if (rand() < 0.2) parts.push(pick(spaces));
    for (let i = 0; i < n; ++i) {
      parts.push(token());
      const r = rand();
      parts.push(r < 0.6 ? " " : r < 0.75 ? "" : r < 0.97 ? pick(spaces) : pick(spaces).repeat(int(2, 50)));
    }
    docs.push(parts.join(""));
  }
  return docs;
}

function sourceDocs(src) {
  const files = [];
  const walk = (dir) => {
    for (const e of fs.readdirSync(dir, { withFileTypes: true }).sort((a, b) => (a.name < b.name ? -1 : 1))) {
      const p = path.join(dir, e.name);
      if (e.isDirectory()) walk(p);
      else if (/\.(cpp|h|sh|md|txt|js|py|cmake)$/.test(e.name)) files.push(p);
    }
  };
  for (const sub of ["runtime", "model", "launcher", "benchmarks", "scripts", "slurm"])
    if (fs.existsSync(path.join(src, sub))) walk(path.join(src, sub));
  if (fs.existsSync(path.join(src, "README.md"))) files.push(path.join(src, "README.md"));
  const licenses = "/usr/share/common-licenses";
  if (fs.existsSync(licenses))
    for (const f of fs.readdirSync(licenses).sort()) {
      const p = path.join(licenses, f);
      if (fs.statSync(p).isFile()) files.push(p);
    }
  return files.map((f) => fs.readFileSync(f, "utf8"));
}

function writeTokenFile(file, ids) {
  const buf = Buffer.alloc(20 + 4 * ids.length);
  buf.write("TSRTOK1\0", 0, "latin1");
  buf.writeUInt32LE(VOCAB, 8);
  buf.writeBigUInt64LE(BigInt(ids.length), 12);
  ids.forEach((id, i) => buf.writeInt32LE(id, 20 + 4 * i));
  fs.writeFileSync(file, buf);
}

// The ids of a token file (runtime/data/token_file.h): version 2, what `tessera tokenize` writes
// (u64 count at 16, u32 words from 32 with the id in bits 0-30), or version 1, expected.bin's.
function readTokenFile(file) {
  const buf = fs.readFileSync(file);
  const magic = buf.toString("latin1", 0, 8);
  if (magic === "TSRTOK2\0") {
    const n = Number(buf.readBigUInt64LE(16));
    return Array.from({ length: n }, (_, i) => buf.readUInt32LE(32 + 4 * i) & 0x7fffffff);
  }
  if (magic !== "TSRTOK1\0") throw new Error(`${file}: not a token file`);
  const n = Number(buf.readBigUInt64LE(12));
  return Array.from({ length: n }, (_, i) => buf.readInt32LE(20 + 4 * i));
}

function make(dir, src) {
  const specials = llama3Specials();
  // Llama 3's specials only: cl100k's own (<|endoftext|> ...) are not in Llama 3's tokenizer, so
  // text that spells them (this repository's sources mention Qwen's) is ordinary text.
  const enc = new Tiktoken({ ...cl100k, special_tokens: {} }, specials);
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, "tokenizer.json"), JSON.stringify(makeTokenizerJson(enc, specials)));
  fs.writeFileSync(path.join(dir, "tokenizer_config.json"),
    JSON.stringify({ bos_token: "<|begin_of_text|>", eos_token: { content: "<|end_of_text|>" } }));
  // js-tiktoken's own regex spells the case-insensitive contractions out; check it is Llama 3's.
  const expanded = LLAMA3_PATTERN.replace("(?i:'s|'t|'re|'ve|'m|'ll|'d)",
    "('s|'S|'t|'T|'re|'rE|'Re|'RE|'ve|'vE|'Ve|'VE|'m|'M|'ll|'lL|'Ll|'LL|'d|'D)");
  if (cl100k.pat_str !== expanded) throw new Error(`js-tiktoken's cl100k pattern changed: ${cl100k.pat_str}`);
  const docs = [...sourceDocs(src), ...generatedDocs(300, rng(1234))];
  const ids = [];
  let bytes = 0;
  for (const text of docs) {
    ids.push(specials["<|begin_of_text|>"], ...enc.encode(text, "all"), specials["<|end_of_text|>"]);
    bytes += Buffer.byteLength(text, "utf8");
  }
  fs.writeFileSync(path.join(dir, "corpus.jsonl"), docs.map((text) => JSON.stringify({ text })).join("\n") + "\n");
  writeTokenFile(path.join(dir, "expected.bin"), ids);
  console.log(`fixture: ${docs.length} documents, ${bytes} bytes of text, ${ids.length} tokens (js-tiktoken)`);
}

function compare(dir, got) {
  const want = readTokenFile(path.join(dir, "expected.bin"));
  const have = readTokenFile(got);
  const enc = new Tiktoken(cl100k, llama3Specials());
  const n = Math.min(want.length, have.length);
  let i = 0;
  while (i < n && want[i] === have[i]) ++i;
  if (i === n && want.length === have.length) {
    console.log(`identical: ${want.length} tokens`);
    return 0;
  }
  let doc = 0;
  for (let k = 0; k < i; ++k) if (want[k] === 128001) ++doc;
  const show = (a) => JSON.stringify(a.slice(Math.max(0, i - 5), i + 5).map((t) => [t, enc.decode([t])]));
  console.log(`FIRST DIFFERENCE at token ${i} (document ${doc}; ${want.length} expected, ${have.length} got)`);
  console.log(`  js-tiktoken: ${show(want)}`);
  console.log(`  tessera:     ${show(have)}`);
  return 1;
}

module.exports = { rng, readTokenFile };  // also used by hf_reference.js

if (require.main === module) {
  const [mode, dir, arg] = process.argv.slice(2);
  if (mode === "make") make(dir, arg);
  else if (mode === "compare") process.exit(compare(dir, arg));
  else {
    console.error("usage: node make_fixture.js make DIR SRC | compare DIR GOT.bin");
    process.exit(2);
  }
}
