#!/usr/bin/env python3
"""The other `hcbench replay --tiers` tables of docs/results/tiered.md, one `--json` replay per cell:

  --table hiding      layer-wise hiding for llama2_7b (Mooncake, 1.5 TiB + 6 TiB, sglang+) at
                      10, 50 and 200 GB/s: 3 replays
  --table mechanisms  each CaR mechanism alone against the tiered sglang+ baseline with every
                      mechanism off, at 1, 5, 10 and 50 GB/s: Mooncake jamba, ShareGPT jamba,
                      Mooncake llama2_7b; 72 replays
  --table decay       the tiered selector's decay: tiered marconi with --selector-decay 0.995 (the
                      old default), with the default (0.9995 over tiers) and a fixed GDSF, each as
                      FLOPs saved over tiered sglang+, on the four goal rows and four held-out rows;
                      32 replays (16 run the tier-aware shadows: the longest)

Prints each table as the page shows it (markdown) and a line or two the page quotes in its
text. The replays are deterministic; the wall time is not (the mechanisms table takes about
3 minutes in a Release build, the decay table about 10, one replay at a time on this 2-core VM).

  python3 scripts/tiered_tables.py --hcbench build/release/tools/hcbench --shared ../shared --table mechanisms

While the replays run, `[k/N] replays, ETA mm:ss` goes to stderr (a line per ~10 %; rewritten in
place on a terminal); stdout is the tables only. --cache DIR keeps each replay's JSON in DIR,
keyed by its command, and reuses it (for editing the tables' layout; delete DIR after changing
hcbench). Standard library only.
"""
import argparse
import concurrent.futures
import hashlib
import json
import os
import subprocess
import sys
import time

from replay_progress import Progress

MOONCAKE = ("data/traces/mooncake/conversation_trace.jsonl", "mooncake")
SHAREGPT = ("data/traces/sharegpt_zh_1k/sharegpt_zh_1K_format.jsonl", "sharegpt")
LINKS = ["1", "5", "10", "50"]

# The mechanisms tables: (title, trace, model, tiers, engines or None for auto)
MECH_TABLES = [
    ("Mooncake jamba", MOONCAKE, "jamba_1_5_mini", "hbm=64GiB,host=256GiB", "3"),
    ("ShareGPT jamba", SHAREGPT, "jamba_1_5_mini", "hbm=1GiB,host=4GiB", None),
    ("Mooncake llama2_7b", MOONCAKE, "llama2_7b", "hbm=1536GiB,host=6144GiB", None),
]
BASELINE = {"--layerwise": "off", "--scheduler": "fcfs", "--prefetch": "none", "--sparsify": "off",
            "--demotion": "lru"}
MECHANISMS = [
    ("baseline (all off)", None),
    ("layer-wise loading", ("--layerwise", "on")),
    ("CaR queue", ("--scheduler", "car")),
    ("deadline prefetch", ("--prefetch", "deadline")),
    ("sparsification", ("--sparsify", "profile")),
    ("FLOP-aware demotion", ("--demotion", "flop")),
]

# The decay table: (label, trace, model, tiers, engines or None for auto)
DECAY_ROWS = [
    ("Mooncake jamba, 64 GiB + 256 GiB", MOONCAKE, "jamba_1_5_mini", "hbm=64GiB,host=256GiB", "3"),
    ("Mooncake qwen3, 128 GiB + 512 GiB", MOONCAKE, "qwen3_next_80b_a3b", "hbm=128GiB,host=512GiB", "2"),
    ("ShareGPT jamba, 1 GiB + 4 GiB", SHAREGPT, "jamba_1_5_mini", "hbm=1GiB,host=4GiB", None),
    ("ShareGPT qwen3, 4 GiB + 16 GiB", SHAREGPT, "qwen3_next_80b_a3b", "hbm=4GiB,host=16GiB", None),
    ("Mooncake jamba, 48 GiB + 192 GiB (held out)", MOONCAKE, "jamba_1_5_mini", "hbm=48GiB,host=192GiB", None),
    ("Mooncake qwen3, 64 GiB + 256 GiB (held out)", MOONCAKE, "qwen3_next_80b_a3b", "hbm=64GiB,host=256GiB", None),
    ("ShareGPT jamba, 2 GiB + 8 GiB (held out)", SHAREGPT, "jamba_1_5_mini", "hbm=2GiB,host=8GiB", None),
    ("ShareGPT qwen3, 2 GiB + 8 GiB (held out)", SHAREGPT, "qwen3_next_80b_a3b", "hbm=2GiB,host=8GiB", None),
]
DECAY_POLICIES = [["--policy", "sglang+"], ["--policy", "marconi", "--selector-decay", "0.995"],
                  ["--policy", "marconi"], ["--policy", "gdsf"]]

HIDING_LINKS = [("10", "10 GB/s"), ("50", "50 GB/s (default)"), ("200", "200 GB/s")]


def replay_cmd(a, trace, model, tiers, engines, extra):
    path, fmt = trace
    return [a.hcbench, "replay", "--trace", os.path.join(a.shared, path), "--format", fmt, "--model", model,
            "--tiers", tiers, *(["--prefill-engines", engines] if engines else []), *extra, "--json"]


def run_all(a, cmds):
    """The JSON of every command, in order."""
    print(f"tiered_tables: {len(cmds)} replays, {a.jobs} at once", file=sys.stderr, flush=True)
    progress = Progress(len(cmds), a.jobs)

    def one(cmd):
        key = hashlib.sha256("\0".join(cmd[1:]).encode()).hexdigest()[:20] if a.cache else None
        cached = os.path.join(a.cache, key + ".json") if key else None
        if cached and os.path.exists(cached):
            with open(cached) as f:
                return json.load(f), 0.0
        start = time.monotonic()
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}: {r.stderr.strip()[-2000:]}")
        if cached:
            with open(cached, "w") as f:
                f.write(r.stdout)
        return json.loads(r.stdout), time.monotonic() - start

    results = [None] * len(cmds)
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
            futures = {pool.submit(one, c): k for k, c in enumerate(cmds)}
            for f in concurrent.futures.as_completed(futures):
                try:
                    results[futures[f]], seconds = f.result()
                except RuntimeError as e:
                    for g in futures:
                        g.cancel()
                    sys.exit(f"tiered_tables.py: {e}")
                progress.step(seconds)
    finally:
        progress.end()
    return results


def ms(v):
    """A time as the page shows it: 1 decimal below 1,000 ms, whole ms with thousands commas above."""
    return f"{v:.1f}" if v < 1000 else f"{v:,.0f}"


def hiding_table(a):
    cmds = [replay_cmd(a, MOONCAKE, "llama2_7b", "hbm=1536GiB,host=6144GiB", None,
                       ["--policy", "sglang+", "--link-gbps", g]) for g, _ in HIDING_LINKS]
    results = run_all(a, cmds)
    print("| link | load hidden | hits split | token hit rate | TTFT P50 (P95) | bytes loaded |")
    print("|---|---|---|---|---|---|")
    for (_, label), d in zip(HIDING_LINKS, results):
        print(f"| {label} | {100 * d['load_hidden_fraction']:.1f} % | {d['split_load_recompute']:,} | "
              f"{100 * d['token_hit_rate']:.2f} % | {ms(d['ttft_p50_ms'])} ({ms(d['ttft_p95_ms'])}) ms | "
              f"{d['bytes_loaded'] / 1e12:.1f} TB |")
    print()
    engines = sorted({d["prefill_engines"] for d in results})
    single = sorted({round(d["single_tier_ttft_p50_ms"], 1) for d in results})
    saturated = [label for (_, label), d in zip(HIDING_LINKS, results) if d["saturated"] or d["single_tier_saturated"]]
    print(f"llama2_7b: {'/'.join(map(str, engines))} prefill engine{'' if engines == [1] else 's'} "
          f"({'auto' if all(d['prefill_engines_auto'] for d in results) else 'given'}), single tier "
          f"TTFT P50 {'/'.join(f'{v:,.1f}' for v in single)} ms, saturated: {', '.join(saturated) or 'none'}")


def mechanisms_table(a):
    cmds = []
    for _, trace, model, tiers, engines in MECH_TABLES:
        for _, switch in MECHANISMS:
            for g in LINKS:
                flags = dict(BASELINE)
                if switch:
                    flags[switch[0]] = switch[1]
                extra = ["--policy", "sglang+", "--link-gbps", g] + [x for kv in flags.items() for x in kv]
                cmds.append(replay_cmd(a, trace, model, tiers, engines, extra))
    results = run_all(a, cmds)
    k = 0
    for title, _, _, _, _ in MECH_TABLES:
        rows = []
        for _ in MECHANISMS:
            rows.append(results[k:k + len(LINKS)])
            k += len(LINKS)
        print(f"{title} (P50 TTFT in ms, token hit rate; `*` saturated)")
        print()
        print("| mechanism alone | " + " | ".join(f"{g} GB/s" for g in LINKS) + " |")
        print("|---|" + "---|" * len(LINKS))
        for (label, switch), cells in zip(MECHANISMS, rows):
            out = []
            for n, d in enumerate(cells):
                text = ms(d["ttft_p50_ms"]) + ("*" if d["saturated"] else "")
                if switch:
                    base = rows[0][n]["ttft_p50_ms"]
                    text += f" ({100 * (d['ttft_p50_ms'] / base - 1):+.0f} %)"
                out.append(f"{text}, {100 * d['token_hit_rate']:.1f} %")
            print(f"| {label} | " + " | ".join(out) + " |")
        single = [d["single_tier_ttft_p50_ms"] for cells in rows for d in cells]
        engines = sorted({d["prefill_engines"] for cells in rows for d in cells})
        print()
        print(f"{title}: single tier P50 {ms(min(single))}-{ms(max(single))} ms, "
              f"{'/'.join(map(str, engines))} prefill engine{'' if engines == [1] else 's'}")
        print()


def decay_table(a):
    cmds = [replay_cmd(a, trace, model, tiers, engines, policy)
            for _, trace, model, tiers, engines in DECAY_ROWS for policy in DECAY_POLICIES]
    results = run_all(a, cmds)
    print("| trace, model, tiers | decay 0.995 (old default) | decay 0.9995 (new default) | GDSF fixed |")
    print("|---|---|---|---|")
    for n, (label, _, _, _, _) in enumerate(DECAY_ROWS):
        sglang, old, new, gdsf = results[4 * n:4 * n + 4]
        base = sglang["flops_saved"]
        print(f"| {label} | {old['flops_saved'] / base:.4f} ({old['selector_switches']}) | "
              f"**{new['flops_saved'] / base:.4f}** ({new['selector_switches']}) | {gdsf['flops_saved'] / base:.4f} |")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hcbench", required=True)
    p.add_argument("--shared", default="../shared", help="the shared data folder (traces under data/traces)")
    p.add_argument("--jobs", type=int, default=1, help="replays at once (default 1)")
    p.add_argument("--table", choices=["hiding", "mechanisms", "decay"], required=True)
    p.add_argument("--cache", help="keep and reuse each replay's JSON here (keyed by its command)")
    a = p.parse_args()
    if a.cache:
        os.makedirs(a.cache, exist_ok=True)
    {"hiding": hiding_table, "mechanisms": mechanisms_table, "decay": decay_table}[a.table](a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
