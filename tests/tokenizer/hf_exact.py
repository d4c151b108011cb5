#!/usr/bin/env python3
"""Exactness test of sim/tokenizer/bpe_tokenizer.hpp against the Hugging Face `tokenizers` package.

1. Finds `tokenizers` (this interpreter, else a venv under --venv, created and filled from
   PyPI when missing). When it cannot be had, exits 77 (ctest: SKIPPED).
2. Trains small byte-level BPE tokenizers (ByteLevel pre-tokenizer, add_prefix_space=False,
   use_regex=True; and Split by the Llama 3, Qwen 2 and GPT-2 regexes then ByteLevel without
   regex, the Llama 3 one with its BOS template post-processor, the Qwen 2 one after the NFC
   normalizer) on bundled text: the
   repository's docs/*.md and tests/data/bpe_corpus.txt.
3. Generates test strings (corpus lines, random mixes of ASCII, whitespace runs, Unicode
   spaces, contractions, CJK, kana, hangul, emoji with ZWJ, combining marks, added tokens,
   random code points, random bytes = invalid UTF-8) and the package's ids for each.
   Random bytes are given to the package as bytes.decode("utf-8", "replace") and to the C++
   side raw (it replaces invalid sequences the same way).
4. Runs the C++ checker on each tokenizer, which compares every string's ids (and, for the
   Split ones, the pre-tokenizer's pieces, which the ids alone would not pin down: a
   boundary the vocabulary has no merge across gives the same ids either way); the
   tokenizer trained on the full byte alphabet must also use the fast encoder
   (sim/tokenizer/bpe_backtracking.hpp), the one without it exercises the merge fallback.
5. When the real ShareGPT trace is present (../shared/data/traces/sharegpt_zh_1k), trains the
   32k tokenizer docs/replay.md uses on it (scripts/train_bpe_tokenizer.py) and compares
   every message of the file, fast encoder required.
"""
import argparse
import os
import random
import subprocess
import sys

SKIP = 77


def have_tokenizers():
    try:
        import tokenizers  # noqa: F401
        return True
    except Exception:
        return False


def ensure_tokenizers(venv):
    if have_tokenizers():
        return None
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(py):
        try:
            subprocess.run([sys.executable, "-m", "venv", venv], check=True, timeout=300)
        except Exception as e:
            print("SKIPPED: cannot create a venv (%s)" % e)
            sys.exit(SKIP)
    ok = subprocess.run([py, "-c", "import tokenizers"], capture_output=True).returncode == 0
    if not ok:
        try:
            r = subprocess.run([py, "-m", "pip", "install", "-q", "--timeout", "20", "--retries", "1", "tokenizers"], timeout=600)
            ok = r.returncode == 0
        except Exception:
            ok = False
    if not ok:
        print("SKIPPED: the tokenizers package cannot be installed (no PyPI?)")
        sys.exit(SKIP)
    if subprocess.run([py, "-c", "import tiktoken"], capture_output=True).returncode != 0:
        try:  # optional: the reference for scripts/tiktoken_to_tokenizer_json.py (skipped without it)
            subprocess.run([py, "-m", "pip", "install", "-q", "--timeout", "20", "--retries", "1", "tiktoken"], timeout=600)
        except Exception:
            pass
    return py


def corpus_lines(source_dir):
    lines = []
    docs = os.path.join(source_dir, "docs")
    for name in sorted(os.listdir(docs)):
        if name.endswith(".md"):
            with open(os.path.join(docs, name), encoding="utf-8") as f:
                lines += f.read().split("\n")
    with open(os.path.join(source_dir, "tests", "data", "bpe_corpus.txt"), encoding="utf-8") as f:
        lines += f.read().split("\n")
    return lines


SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
ADDED = ["<tool_call>", "</tool_call>", "<im"]


# The pre-tokenizer regexes models ship with (sim/tokenizer/bpe_pretokenizer.hpp recognises exactly these).
GPT2_REGEX = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
QWEN2_REGEX = LLAMA3_REGEX.replace(r"\p{N}{1,3}", r"\p{N}")
BOS = "<|begin_of_text|>"


def pre_tokenizer(split):
    """GPT-2's ByteLevel split (split None), or a Split by `split` then ByteLevel without regex
    (how Llama 3 and Qwen 2 tokenizer.json files spell theirs)."""
    from tokenizers import Regex, pre_tokenizers
    if split is None:
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def train(lines, vocab_size, full_alphabet, path, split=None, bos=False, nfc=False):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE())
    if nfc:  # Qwen 2's normalizer
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizer(split)
    specials = SPECIALS + ([BOS] if bos else [])
    kw = dict(vocab_size=vocab_size, special_tokens=specials, show_progress=False)
    if full_alphabet:
        kw["initial_alphabet"] = pre_tokenizers.ByteLevel.alphabet()
    tok.train_from_iterator(lines, trainers.BpeTrainer(**kw))
    tok.add_tokens(ADDED)
    if bos:  # Llama 3's post-processor: BOS before every sequence, in a Sequence with ByteLevel
        template = processors.TemplateProcessing(single=BOS + " $A", special_tokens=[(BOS, tok.token_to_id(BOS))])
        tok.post_processor = processors.Sequence([processors.ByteLevel(trim_offsets=False), template])
    tok.save(path)
    if nfc:  # the model fields of Qwen's files: "" prefixes and an unk token (no-ops with every byte in the vocab)
        import json
        from tokenizers import Tokenizer as T
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        doc["model"].update({"continuing_subword_prefix": "", "end_of_word_suffix": "", "unk_token": SPECIALS[2]})
        with open(path, "w", encoding="utf-8") as f:
            json.dump(doc, f, ensure_ascii=False)
        tok = T.from_file(path)
    return tok


def convert_like_tiktoken(src, dst):
    """Rewrites a tokenizer.json's merges as Hugging Face converts a tiktoken vocabulary
    (Llama 3, Qwen): for each token in id order, every split into two vocabulary tokens,
    ordered by the parts' ids (scripts/tiktoken_to_tokenizer_json.py's split_merges); ignore_merges on.
    Returns the package's tokenizer of it."""
    import json
    from tokenizers import Tokenizer
    import tiktoken_to_tokenizer_json as conv
    with open(src, encoding="utf-8") as f:
        doc = json.load(f)
    doc["model"]["merges"] = [[l, r] for l, r in conv.split_merges(doc["model"]["vocab"])]
    doc["model"]["ignore_merges"] = True
    with open(dst, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False)
    return Tokenizer.from_file(dst)


POOL = (
    list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
    + list(".,;:!?-_()[]{}<>/\\|\"'`~@#$%^&*+=")
    + [" ", " ", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\x0b", "\x0c", "\x1c", "\x1f", "\x85",
       "\u00a0", "\u1680", "\u2000", "\u2009", "\u200b", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000", "\ufeff"]
    + ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", " 's", "n't", "''", "'x"]
    + ["the", " the", "token", " cache", "prefix", "über", "naïve", "café", "Ærø", "straße", "Ωμέγα", "Привет", "שלום", "مرحبا", "नमस्ते", "ภาษาไทย"]
    + list("中文字符缓存前缀模型的是了在一") + ["你好", "世界", "。", "，", "！", "？", "「", "」", "、"]
    + list("ひらがなカタカナ") + ["한국어", "가나다"]
    + ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🇯🇵", "❤️", "✨", "🤖", "𝔘𝔫𝔦", "𐍈", "Ⅻ", "½", "²", "٣", "०१२", "e\u0301", "a\u0308\u0323", "\u200d", "\ufffd"]
    + ["123", "4567", "3.14", "1,000", "0x1F", "v2.0", "12345678", "٣٤٥٦٧"]
    # Llama 3 / Qwen 2 alternatives: case-insensitive contractions (U+017F folds to s), a lead
    # character before letters, CR/LF runs, punctuation with trailing newlines
    + ["'RE", "'Ve", "'lL", "'D", "'\u017f", "'\ufb05", "'\u212a", "\r", "\r\n\r\n", " \r\n", "\n x", "$word", "\tword",
       "\u3000word", "!!!\n\n", " !!!\r\n", "a\r\nb", "#!", " ?"]
    # NFC (Qwen 2's normalizer): jamo, singletons, excluded composites, marks to reorder, marks
    # newer than the package's Unicode data
    + ["\u1100\u1161\u11a8", "\uac00\u11a8", "\uf900", "\u212b", "\u0344", "\u0958", "\u0b47\u0b3e", "\u1e9b\u0323",
       "A\u030a\u0301", "\u0301", "\u0323\u0301\u0308", "\u00e9", "\u1dfa", "\u07fd", "\u0345", "\u05b7\u05b0"]
    + SPECIALS + ADDED + ["<|im_start|>user\n", "<tool", "_call>"]
)


def nfc_cases():
    """Every code point with a canonical decomposition or combining class (Python's data), alone,
    after a letter, and before and after marks of other classes; Hangul jamo sequences."""
    import unicodedata
    out = []
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        c = chr(cp)
        d = unicodedata.decomposition(c)
        if unicodedata.combining(c) or (d and not d.startswith("<")):
            out += [c, "a" + c, c + "\u0323\u0301", "e\u0301" + c + "\u0316", "\u1100" + c]
    for l in range(0x1100, 0x1113, 3):
        for v in range(0x1161, 0x1176, 4):
            out += [chr(l) + chr(v), chr(l) + chr(v) + "\u11a8", chr(l) + chr(v) + "\u0301\u11af", "\uac00" + chr(0x11a8 + (v % 27))]
    return [s.encode("utf-8") for s in out]


def random_strings(rng, n):
    out = []
    for _ in range(n):
        k = rng.randint(1, 24)
        out.append("".join(rng.choice(POOL) for _ in range(k)))
    return out


def random_code_points(rng, n):
    out = []
    for _ in range(n):
        cps = []
        for _ in range(rng.randint(1, 12)):
            r = rng.random()
            if r < 0.3:
                cp = rng.randint(0x20, 0x7E)
            elif r < 0.7:
                cp = rng.randint(0x80, 0xFFFF)
            else:
                cp = rng.randint(0x10000, 0x10FFFF)
            if 0xD800 <= cp <= 0xDFFF:
                cp = 0x20
            cps.append(chr(cp))
        out.append("".join(cps))
    return out


def random_bytes(rng, n):
    out = []
    tails = [b"\xe4\xb8", b"\xf0\x9f\x98", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf5\x80", b"\xe0\x80\x80", b"\xf4\x90\x80\x80", b"\x80", b"\xff"]
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 10)):
            r = rng.random()
            if r < 0.3:
                parts.append(bytes(rng.randint(0, 255) for _ in range(rng.randint(1, 4))))
            elif r < 0.6:
                parts.append(rng.choice(tails))
            else:
                parts.append(rng.choice(POOL).encode("utf-8"))
        out.append(b"".join(parts))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--work-dir", required=True)
    ap.add_argument("--checker", required=True)
    ap.add_argument("--venv", required=True)
    ap.add_argument("--in-venv", action="store_true")
    a = ap.parse_args()
    if not a.in_venv:
        py = ensure_tokenizers(a.venv)
        if py is not None:
            os.execv(py, [py] + sys.argv + ["--in-venv"])
    if not have_tokenizers():
        print("SKIPPED: tokenizers not importable")
        return SKIP
    os.makedirs(a.work_dir, exist_ok=True)
    sys.path.insert(0, os.path.join(a.source_dir, "scripts"))  # train_bpe_tokenizer, tiktoken_to_tokenizer_json
    lines = corpus_lines(a.source_dir)
    rng = random.Random(19)
    texts = [l for l in lines if l.strip()]
    rng.shuffle(texts)
    cases = [t.encode("utf-8") for t in texts[:1500]]
    cases += [s.encode("utf-8") for s in random_strings(rng, 3000)]
    cases += [s.encode("utf-8") for s in random_code_points(rng, 1000)]
    cases += random_bytes(rng, 1500)
    cases += [b"", b" ", b"  ", b"\n", b"a", b"'s", b"'", b" '", "\u3000\u3000x".encode(), b"a   b", b"a  !", b"x\n\ny", b"   "]
    status = 0
    for name, vocab, full in (("full", 4000, True), ("small", 600, False)):
        path = os.path.join(a.work_dir, "tokenizer_%s.json" % name)
        tok = train(lines, vocab, full, path)
        status = check(a, name, tok, path, cases, ["--fast"] if full else []) or status
    # The Split pre-tokenizers of Llama 3 (with its BOS post-processor) and Qwen 2, and
    # GPT-2's regex spelled as a Split.
    for name, split, bos, nfc in (("llama3", LLAMA3_REGEX, True, False), ("qwen2", QWEN2_REGEX, False, True),
                                  ("gpt2_split", GPT2_REGEX, False, False)):
        path = os.path.join(a.work_dir, "tokenizer_%s.json" % name)
        tok = train(lines, 4000, True, path, split=split, bos=bos, nfc=nfc)
        status = check(a, name, tok, path, cases, ["--fast"]) or status
        status = check(a, name + "_pieces", tok, path, cases, ["--split"]) or status
        if nfc:  # the normalizer alone, also on every character its data knows, alone and among marks
            status = check(a, name + "_nfc", tok, path, cases + nfc_cases(), ["--nfc"]) or status
        if bos:
            status = check(a, name + "_bos", tok, path, cases, ["--fast", "--special-tokens"]) or status
    # Llama 3's tokenizer.json holds a tiktoken vocabulary converted to merges: every split of
    # a token into two tokens, splits into tokens made later included (so merges apply out of
    # rank order), and ignore_merges. The same conversion of the Llama 3 tokenizer above.
    path = os.path.join(a.work_dir, "tokenizer_llama3_converted.json")
    tok = convert_like_tiktoken(os.path.join(a.work_dir, "tokenizer_llama3.json"), path)
    status = check(a, "llama3_converted", tok, path, cases, ["--fast", "--out-of-order"]) or status
    # A tiktoken ranks file of the same vocabulary, through scripts/tiktoken_to_tokenizer_json.py
    # (what a user does with Meta's tokenizer.model); its ids against the package's and, when
    # the tiktoken package is there, against tiktoken's own.
    status = check_tiktoken_script(a, os.path.join(a.work_dir, "tokenizer_llama3.json"), cases) or status
    sharegpt = os.path.join(a.source_dir, "..", "shared", "data", "traces", "sharegpt_zh_1k", "sharegpt_zh_1K_format.jsonl")
    if os.path.exists(sharegpt):
        import train_bpe_tokenizer
        messages = train_bpe_tokenizer.texts(sharegpt)
        tok = train_bpe_tokenizer.train(messages, 32000)
        path = os.path.join(a.work_dir, "tokenizer_sharegpt32k.json")
        tok.save(path)
        status = check(a, "sharegpt32k", tok, path, [m.encode("utf-8") for m in messages], ["--fast"]) or status
    else:
        print("(no %s: the ShareGPT check is not run)" % sharegpt)
    return status


def check_tiktoken_script(a, trained_path, cases):
    import base64
    import json
    from tokenizers import Tokenizer
    with open(trained_path, encoding="utf-8") as f:
        vocab = json.load(f)["model"]["vocab"]
    # The byte-level spelling back to bytes (GPT-2's table, as the script builds it).
    import tiktoken_to_tokenizer_json as conv
    unspell = {c: b for b, c in conv.byte_level_table().items()}
    specials = SPECIALS + [BOS]
    ranks = {}
    for token, _ in sorted(vocab.items(), key=lambda kv: kv[1]):
        if token not in specials:
            ranks[bytes(unspell[c] for c in token)] = len(ranks)
    ranks_path = os.path.join(a.work_dir, "llama3.tiktoken")
    with open(ranks_path, "w") as f:
        for token, rank in ranks.items():
            f.write("%s %d\n" % (base64.b64encode(token).decode(), rank))
    specials_path = os.path.join(a.work_dir, "llama3_specials.txt")
    with open(specials_path, "w", encoding="utf-8") as f:
        for i, name in enumerate(specials):
            f.write("%s %d\n" % (name, len(ranks) + i))
    path = os.path.join(a.work_dir, "tokenizer_tiktoken_script.json")
    subprocess.run([sys.executable, os.path.join(a.source_dir, "scripts", "tiktoken_to_tokenizer_json.py"), "--split", "llama3",
                    "--specials", specials_path, "--bos", BOS, ranks_path, path], check=True)
    # Bad ranks files stop it with the line (and write nothing).
    for bad_name, lines, said in (("not_pair", ["IQ== 0", "xyz"], ":2: expected"), ("repeated", ["IQ== 0", "IQ== 1"], ":2: repeated token"),
                                  ("gap", ["IQ== 0", "Ig== 2"], "ranks must be 0 .. 1")):
        bad_path = os.path.join(a.work_dir, "bad_%s.tiktoken" % bad_name)
        with open(bad_path, "w") as f:
            f.write("\n".join(lines) + "\n")
        out_path = os.path.join(a.work_dir, "bad_%s.json" % bad_name)
        if os.path.exists(out_path):
            os.remove(out_path)
        r = subprocess.run([sys.executable, os.path.join(a.source_dir, "scripts", "tiktoken_to_tokenizer_json.py"), "--split", "llama3",
                            bad_path, out_path], capture_output=True, text=True)
        if r.returncode == 0 or said not in r.stderr or os.path.exists(out_path):
            print("tiktoken_to_tokenizer_json.py accepted a bad ranks file (%s): rc %d, %r" % (bad_name, r.returncode, r.stderr))
            return 1
    tok = Tokenizer.from_file(path)
    status = check(a, "tiktoken_script", tok, path, cases, ["--fast", "--out-of-order"])
    status = check(a, "tiktoken_script_bos", tok, path, cases, ["--fast", "--special-tokens"]) or status
    try:
        import tiktoken
    except ImportError:
        print("(tiktoken not importable: the script's ids are not compared with tiktoken's)")
        return status
    enc = tiktoken.Encoding(name="hf_exact_llama3", pat_str=LLAMA3_REGEX, mergeable_ranks=ranks,
                            special_tokens={name: len(ranks) + i for i, name in enumerate(specials)})
    bad = 0
    for raw in cases:
        text = raw.decode("utf-8", "replace")
        if enc.encode(text, allowed_special="all") != tok.encode(text, add_special_tokens=False).ids:
            bad += 1
            if bad <= 3:
                print("tiktoken differs from the script's tokenizer.json on %r" % text)
    print("tiktoken %s against the script's tokenizer.json (package): %d mismatches in %d strings" % (tiktoken.__version__, bad, len(cases)))
    return status or (1 if bad else 0)


def check(a, name, tok, path, cases, flags):
    import tokenizers
    cases_path = os.path.join(a.work_dir, "cases_%s.txt" % name)
    with open(cases_path, "w") as f:
        for raw in cases:
            text = raw.decode("utf-8", "replace")
            if "--split" in flags:  # the pre-tokenizer's pieces, as byte lengths (one character per byte after ByteLevel)
                ids = [len(piece) for piece, _ in tok.pre_tokenizer.pre_tokenize_str(text)]
            elif "--nfc" in flags:  # the normalizer's output, as code points
                ids = [ord(c) for c in tok.normalizer.normalize_str(text)]
            else:
                ids = tok.encode(text, add_special_tokens="--special-tokens" in flags).ids
            f.write(raw.hex() + "\t" + " ".join(map(str, ids)) + "\n")
    print("tokenizers %s, tokenizer '%s': vocab %d, %d strings" % (tokenizers.__version__, name, tok.get_vocab_size(), len(cases)))
    sys.stdout.flush()
    return subprocess.run([a.checker, path, cases_path] + flags).returncode


if __name__ == "__main__":
    sys.exit(main())
