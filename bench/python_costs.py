#!/usr/bin/env python3
"""What calling hybridcache from Python costs against the same work without Python, in one run
(issue #35 item 6; docs/python.md, "Costs"). Three ratios:

1. begin + finish from Python against the same loop in C++ (the module's
   _bench_begin_finish runs it over the same prompts on a fresh cache of the same
   configuration): goal Python <= 2 x C++ + 1 us per pair.
2. hybridcache.replay against `hcbench replay --json` as a process, same trace and arguments:
   goal within 5 %. Both the caller's wall time (process start and trace loading included for
   hcbench) and the replay loop's own wall_seconds are reported.
3. Tokenizer.encode_batch against the `tokenizers` package's encode_batch (its Rust threads,
   add_special_tokens=False) on every message of the ShareGPT trace, with the 32k tokenizer
   docs/replay.md trains on it: goal >= 3x. Ids are checked equal first.

Each timing is the best of --repeat runs. Run it with a Release module, e.g.

    python3 bench/python_costs.py --hcbench build/release/tools/hcbench

with `hybridcache` importable (pip install ., or PYTHONPATH at a build's python/ folder) and
`tokenizers` installed (the venv scripts/install-deps.sh makes has it).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

import hybridcache

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def best(fn, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def tiny_model():
    s = hybridcache.ModelSpec()
    s.name, s.layers, s.recurrent = "tiny", "RARA", "gated_deltanet"
    s.d_model, s.attention_heads, s.kv_heads, s.head_dim = 64, 2, 1, 32
    s.gdn_key_heads = s.gdn_value_heads = 2
    s.gdn_key_dim = s.gdn_value_dim = 32
    s.kv_dtype_bytes = s.state_dtype_bytes = s.activation_dtype_bytes = 4
    s.scan_chunk = 16
    return hybridcache.CostModel(s)


def lifecycle(repeat):
    model = tiny_model()
    rng = np.random.default_rng(1)
    system = rng.integers(0, 256, 64).astype(np.int32)
    # 64 conversations' prompts over a shared system prompt: a hit on the system prompt each time.
    prompts = [np.concatenate([system, rng.integers(0, 256, 48).astype(np.int32)]) for _ in range(64)]
    rounds = 20

    def fresh():
        return hybridcache.PrefixCache(model, capacity_bytes=64 << 20, granularity_bytes=32 << 10)

    # Round r finishes each prompt as prompt + [r] (the C++ loop builds the same sequences).
    sequences = [[np.append(p, np.int32(r)) for p in prompts] for r in range(rounds)]

    def py_loop():
        c = fresh()
        for r in range(rounds):
            for p, s in zip(prompts, sequences[r]):
                t = c.begin(p, output_tokens=1)
                c.finish(t, s, [len(s)])

    py = best(py_loop, repeat)
    cpp = min(hybridcache._hybridcache._bench_begin_finish(fresh(), prompts, rounds) for _ in range(repeat))
    n = rounds * len(prompts)
    py_us, cpp_us = 1e6 * py / n, 1e6 * cpp / n
    print(f"begin+finish: Python {py_us:.2f} us, C++ {cpp_us:.2f} us per pair ({n} pairs, 112-token prompts): "
          f"{py_us / cpp_us:.2f}x; goal <= 2x + 1 us = {2 * cpp_us + 1:.2f} us: {'met' if py_us <= 2 * cpp_us + 1 else 'NOT met'}")


def replay(hcbench, repeat):
    with tempfile.TemporaryDirectory() as d:
        trace = os.path.join(d, "chat.jsonl")
        subprocess.run([hcbench, "gen", "--profile", "chat", "--seed", "1", "--out", trace], check=True)
        kw = dict(format="marconi", model="jamba_1_5_mini", capacity="2e9", policy="marconi")
        argv = [hcbench] + hybridcache.command_line("replay", trace=trace, **kw) + ["--json"]
        loop = {}

        def py_call():
            loop["py"] = hybridcache.replay(trace, **kw)["wall_seconds"]

        def cli_call():
            loop["cli"] = json.loads(subprocess.run(argv, check=True, capture_output=True, text=True).stdout)["wall_seconds"]

        cli_call(), py_call()  # warm the page cache and the tokenizer-free trace reader
        py, cli = [], []
        py_loops, cli_loops = [], []
        for _ in range(repeat):  # alternate, so a busy machine slows both alike
            py.append(best(py_call, 1)), py_loops.append(loop["py"])
            cli.append(best(cli_call, 1)), cli_loops.append(loop["cli"])
        p, c = min(py), min(cli)
        print(f"replay (synth-v1 chat, 100 sessions, jamba_1_5_mini 2e9 marconi): Python {p:.3f} s, hcbench {c:.3f} s "
              f"as a process: {p / c:.3f}x; the replay loop alone {min(py_loops):.3f} s vs {min(cli_loops):.3f} s: "
              f"{min(py_loops) / min(cli_loops):.3f}x; goal within 5 %: {'met' if p <= 1.05 * c else 'NOT met'}")


def tokenizer(repeat):
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        print("encode_batch: skipped (no tokenizers package)")
        return
    sharegpt = os.path.join(ROOT, "..", "shared", "data", "traces", "sharegpt_zh_1k", "sharegpt_zh_1K_format.jsonl")
    if not os.path.exists(sharegpt):
        print(f"encode_batch: skipped (no {sharegpt})")
        return
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import train_bpe_tokenizer
    messages = train_bpe_tokenizer.texts(sharegpt)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "tokenizer.json")
        ref = train_bpe_tokenizer.train(messages, 32000)
        ref.save(path)
        tok = hybridcache.Tokenizer.from_file(path)
        got = tok.encode_batch(messages)
        want = ref.encode_batch(messages, add_special_tokens=False)
        assert all(a.tolist() == b.ids for a, b in zip(got, want)), "ids differ"
        ours = best(lambda: tok.encode_batch(messages), repeat)
        theirs = best(lambda: ref.encode_batch(messages, add_special_tokens=False), repeat)
        one = best(lambda: tok.encode_batch(messages, threads=1), repeat)
        mb = sum(len(m.encode()) for m in messages) / 1e6
        print(f"encode_batch ({len(messages)} ShareGPT messages, {mb:.1f} MB, 32k vocab, {os.cpu_count()} cores): "
              f"hybridcache {ours * 1e3:.1f} ms ({one * 1e3:.1f} ms on one thread), tokenizers {theirs * 1e3:.1f} ms: "
              f"{theirs / ours:.2f}x; goal >= 3x: {'met' if theirs / ours >= 3 else 'NOT met'}; ids identical")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hcbench", default=os.path.join(ROOT, "build", "release", "tools", "hcbench"))
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    print(f"hybridcache {hybridcache.build_version} from {os.path.dirname(hybridcache.__file__)}")
    lifecycle(a.repeat)
    replay(a.hcbench, a.repeat)
    tokenizer(a.repeat)


if __name__ == "__main__":
    main()
