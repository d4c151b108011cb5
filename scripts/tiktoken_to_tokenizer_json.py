#!/usr/bin/env python3
"""Writes a Hugging Face tokenizer.json (what `hcbench --tokenizer` reads) from a tiktoken BPE
ranks file, the form in which some models ship their vocabulary (Meta's Llama 3
`tokenizer.model`, Qwen's `qwen.tiktoken`): one "BASE64-TOKEN RANK" per line.

  python3 scripts/tiktoken_to_tokenizer_json.py --split llama3 --specials llama3 \
      --bos '<|begin_of_text|>' llama3/tokenizer.model llama3_tokenizer.json

The result is built the way Hugging Face converts such a vocabulary (and as the tokenizer.json
files those models publish hold it):
- vocab: each token's bytes spelled byte-level (GPT-2's byte-to-character table), id = rank;
- merges: for each token in rank order, every split of its bytes into two vocabulary tokens,
  ordered by the left part's rank, then the right's; `ignore_merges` on (a piece that is a
  token is that token);
- pre-tokenizer: a Split by the model's regex (--split: llama3, qwen2; or --regex), then
  ByteLevel without its own regex; --nfc adds the NFC normalizer (Qwen 2);
- added tokens: --specials (llama3: Llama 3's 256, ids after the vocabulary; or a file of
  "TOKEN ID" lines), special and not normalized; --bos makes the post-processor put that
  token first (TemplateProcessing), as Llama 3's does.
Bad input (a line that is not "BASE64 RANK", a repeated token or rank, ranks with gaps)
stops with the line number. Standard library only.
"""
import argparse
import base64
import json
import sys

SPLITS = {
    "llama3": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}


def llama3_specials(first_id):
    named = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
             "<|finetune_right_pad_id|>", "<|step_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>",
             "<|eot_id|>", "<|python_tag|>", "<|image|>"]
    names = named + [f"<|reserved_special_token_{2 + i}|>" for i in range(256 - len(named))]
    return [(name, first_id + i) for i, name in enumerate(names)]


def byte_level_table():
    """GPT-2's byte -> character map: printable Latin-1 bytes stand for themselves, the
    others for code points from 256 up, in byte order."""
    kept = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in kept:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def split_merges(ranks):
    """The merges of a vocabulary {token: rank} (tokens bytes or str): for each token in rank
    order, every split into two vocabulary tokens, ordered by the left part's rank, then the
    right's. Returns (left, right) pairs."""
    merges = []
    for token in sorted(ranks, key=ranks.get):
        splits = [(ranks[token[:i]], ranks[token[i:]], token[:i], token[i:]) for i in range(1, len(token))
                  if token[:i] in ranks and token[i:] in ranks]
        merges += [(l, r) for _, _, l, r in sorted(splits)]
    return merges


def fail(path, line, message):
    sys.exit(f"{path}:{line}: {message}")


def read_ranks(path):
    ranks = {}
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            line = raw.strip()
            if not line:
                continue
            parts = line.split()
            if len(parts) != 2:
                fail(path, number, "expected 'BASE64-TOKEN RANK'")
            try:
                token = base64.b64decode(parts[0], validate=True)
                rank = int(parts[1])
            except ValueError as e:
                fail(path, number, f"bad token or rank ({e})")
            if not token or rank < 0:
                fail(path, number, "empty token or negative rank")
            if token in ranks:
                fail(path, number, "repeated token")
            ranks[token] = rank
    if not ranks:
        sys.exit(f"{path}: no tokens")
    if sorted(ranks.values()) != list(range(len(ranks))):
        sys.exit(f"{path}: ranks must be 0 .. {len(ranks) - 1}, each once")
    for b in range(256):
        if bytes([b]) not in ranks:
            sys.exit(f"{path}: byte {b} has no token (a byte-level vocabulary needs all 256)")
    return ranks


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ranks")
    ap.add_argument("out")
    ap.add_argument("--split", choices=sorted(SPLITS), help="the model's pre-tokenizer regex")
    ap.add_argument("--regex", help="another pre-tokenizer regex (hcbench reads only Llama 3's, Qwen 2's, GPT-2's)")
    ap.add_argument("--nfc", action="store_true", help="NFC normalizer (Qwen 2)")
    ap.add_argument("--specials", help="llama3, or a file of 'TOKEN ID' lines")
    ap.add_argument("--bos", help="an added token the post-processor puts first")
    a = ap.parse_args()
    if (a.split is None) == (a.regex is None):
        sys.exit("give exactly one of --split and --regex")
    ranks = read_ranks(a.ranks)
    table = byte_level_table()
    spell = {token: "".join(table[b] for b in token) for token in ranks}
    by_rank = sorted(ranks, key=ranks.get)
    merges = [[spell[l], spell[r]] for l, r in split_merges(ranks)]
    specials = []
    if a.specials == "llama3":
        specials = llama3_specials(len(ranks))
    elif a.specials:
        with open(a.specials, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                name, _, id_text = line.rstrip("\n").rpartition(" ")
                if not name or not id_text.isdigit():
                    fail(a.specials, number, "expected 'TOKEN ID'")
                specials.append((name, int(id_text)))
    ids = {i for _, i in specials}
    if len(ids) != len(specials) or any(i < len(ranks) for i in ids):
        sys.exit("special tokens need distinct ids after the vocabulary")
    added = [{"id": i, "content": name, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for name, i in specials]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
    if a.bos:
        bos = [i for name, i in specials if name == a.bos]
        if not bos:
            sys.exit(f"--bos {a.bos}: not among the special tokens")
        post = {"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": a.bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": a.bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                         {"SpecialToken": {"id": a.bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {a.bos: {"id": a.bos, "ids": bos, "tokens": [a.bos]}}}
    else:
        post = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}
    doc = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"} if a.nfc else None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": SPLITS[a.split] if a.split else a.regex}, "behavior": "Isolated",
             "invert": False},
            byte_level]},
        "post_processor": post,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": {spell[t]: ranks[t] for t in by_rank}, "merges": merges},
    }
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False)
    print(f"{a.out}: {len(ranks)} tokens, {len(merges)} merges, {len(added)} added tokens")


if __name__ == "__main__":
    main()
