#!/usr/bin/env python3
"""tiktoken's two encode calls on the ShareGPT messages, timed as bench_tokenizer times ours.

  python bench/tiktoken_calls.py --ranks llama3/tokenizer.model [--repeat 5] [--ids-out ids.json]

tiktoken is not in this project's pinned venv: run it from a venv with tiktoken (0.14.0 was
measured) and Meta's Llama 3 `tokenizer.model` (a tiktoken ranks file; Llama 3's regex and 256
special tokens are built in here). For each repetition, every one of the trace's messages is
encoded by
  - `encode_ordinary(text)`: the fastest call (no special-token scan);
  - `encode(text, allowed_special="all")`: what a reader that allows special tokens calls;
  - `encode("", allowed_special="all")`: that call's own overhead (the same number of calls);
and the medians are printed in milliseconds. `--ids-out` writes `encode_ordinary`'s ids (one
list per message) for an equality check against another encoder. docs/replay.md quotes a run.
"""
import argparse
import base64
import json
import os
import statistics
import time

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
                   "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>", "<|start_header_id|>", "<|end_header_id|>",
                   "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
LLAMA3_SPECIALS += [f"<|reserved_special_token_{i}|>" for i in range(3, 3 + 256 - len(LLAMA3_SPECIALS))]


def messages(path):
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                out += [c["value"] for c in json.loads(line).get("conversations", []) if "value" in c]
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", required=True, help="a tiktoken ranks file (Meta's Llama 3 tokenizer.model)")
    ap.add_argument("--trace", default=os.path.join(here, "..", "..", "shared", "data", "traces", "sharegpt_zh_1k",
                                                    "sharegpt_zh_1K_format.jsonl"))
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--ids-out")
    a = ap.parse_args()
    try:
        import tiktoken
    except ModuleNotFoundError:
        raise SystemExit("tiktoken is not installed: run this from a venv with `pip install tiktoken==0.14.0`")
    ranks = {}
    with open(a.ranks) as f:
        for number, line in enumerate(f, 1):
            parts = line.split()
            if len(parts) != 2:
                raise SystemExit(f"{a.ranks}:{number}: not 'BASE64 RANK'")
            ranks[base64.b64decode(parts[0])] = int(parts[1])
    enc = tiktoken.Encoding("llama3", pat_str=LLAMA3_SPLIT, mergeable_ranks=ranks,
                            special_tokens={s: len(ranks) + i for i, s in enumerate(LLAMA3_SPECIALS)})
    msgs = messages(a.trace)
    calls = {"encode_ordinary": enc.encode_ordinary,
             "encode(allowed_special='all')": lambda m: enc.encode(m, allowed_special="all"),
             "encode('', allowed_special='all') x messages": lambda m: enc.encode("", allowed_special="all")}
    times = {name: [] for name in calls}
    ids = None
    for _ in range(a.repeat):
        for name, call in calls.items():
            t0 = time.perf_counter()
            out = [call(m) for m in msgs]
            times[name].append(time.perf_counter() - t0)
            if name == "encode_ordinary":
                ids = out
    print(f"{len(msgs)} messages, {sum(len(m.encode()) for m in msgs)} bytes, {sum(map(len, ids))} ids; tiktoken {tiktoken.__version__}")
    for name, t in times.items():
        print(f"{name}: median {1000 * statistics.median(t):.1f} ms ({', '.join(f'{1000 * x:.0f}' for x in t)})")
    if a.ids_out:
        with open(a.ids_out, "w") as f:
            json.dump(ids, f)


if __name__ == "__main__":
    main()
