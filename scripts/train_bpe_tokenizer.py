#!/usr/bin/env python3
"""Trains a byte-level BPE tokenizer.json (the kind sim/tokenizer/bpe_tokenizer.hpp reads) with the
Hugging Face `tokenizers` package on the text of traces, for replays with a real BPE when a
model's own tokenizer.json cannot be downloaded.

  python3 scripts/train_bpe_tokenizer.py --vocab-size 32000 --out tok.json \
      ../shared/data/traces/sharegpt_zh_1k/sharegpt_zh_1K_format.jsonl

Text is taken from every JSON string value named "value", "content" or "text" in each
line (ShareGPT and OpenAI-style JSONL) or, for a file holding one JSON document (a
tau-bench results array, a .traj), from the whole document. Pre-tokenizer: ByteLevel
(add_prefix_space=False, use_regex=True), or with --split llama3|qwen2 a Split by that
model's regex then ByteLevel without regex (as their tokenizer.json files hold them; --nfc
adds Qwen's NFC normalizer); special tokens <|im_start|>, <|im_end|>, <|endoftext|> (so the
ChatML template's markers are single tokens).
"""
import argparse
import json
import sys


def strings(v, out):
    if isinstance(v, dict):
        for k, x in v.items():
            if k in ("value", "content", "text") and isinstance(x, str):
                out.append(x)
            else:
                strings(x, out)
    elif isinstance(v, list):
        for x in v:
            strings(x, out)


def texts(path):
    out = []
    with open(path, encoding="utf-8", errors="replace") as f:
        data = f.read()
    try:
        strings(json.loads(data), out)
    except json.JSONDecodeError:
        for line in data.splitlines():
            if line.strip():
                strings(json.loads(line), out)
    return out


SPLITS = {
    "llama3": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
    "qwen2": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
}


def train(corpus, vocab_size, split="gpt2", nfc=False):
    """A byte-level BPE Tokenizer trained on the strings `corpus` (also used by
    tests/tokenizer/hf_exact.py, so the test checks the tokenizers docs/replay.md uses)."""
    try:
        from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers
    except ModuleNotFoundError:
        sys.exit("train_bpe_tokenizer.py needs the Hugging Face `tokenizers` package: pip install tokenizers==0.23.3 "
                 "(the version the tests are measured with), or run it with the venv scripts/llama.sh makes "
                 "(~/.cache/hybridcache/venv/*/bin/python)")
    tok = Tokenizer(models.BPE())
    if nfc:
        tok.normalizer = normalizers.NFC()
    if split == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(SPLITS[split]), behavior="isolated", invert=False),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|im_start|>", "<|im_end|>", "<|endoftext|>"], show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    return tok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--vocab-size", type=int, default=32000)
    ap.add_argument("--out", required=True)
    ap.add_argument("--split", choices=["gpt2", "llama3", "qwen2"], default="gpt2")
    ap.add_argument("--nfc", action="store_true")
    a = ap.parse_args()
    corpus = []
    for p in a.files:
        corpus += texts(p)
    tok = train(corpus, a.vocab_size, a.split, a.nfc)
    tok.save(a.out)
    print("%s: vocab %d from %d strings" % (a.out, tok.get_vocab_size(), len(corpus)), file=sys.stderr)


if __name__ == "__main__":
    main()
