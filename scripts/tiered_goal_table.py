#!/usr/bin/env python3
"""The goal table of docs/results/tiered.md ("The goal table: one multi-tier prefix cache"):
one `hcbench replay --tiers ... --json` per row (each prints the single tier beside the tiers),
Mooncake conversation and ShareGPT zh 1K, jamba_1_5_mini and qwen3_next_80b_a3b, host = 4 x HBM,
policies sglang+, marconi (the adaptive selector) and marconi at a fixed alpha 1; prints the
markdown table and, per trace and model, the tiered marconi rows' FLOPs saved over the
tiered sglang+ rows'. 9 replays, deterministic; about 2 minutes in a Release build (the marconi rows
run the tier-aware shadows), several in a Debug build.

  python3 scripts/tiered_goal_table.py --hcbench build/release/tools/hcbench [--shared ../shared] [--jobs 2]
  python3 scripts/tiered_goal_table.py ... --table bound     # host 4 x HBM against host 8 TiB, 16 replays
"""
import argparse
import concurrent.futures
import json
import os
import subprocess
import sys

MOONCAKE = ("data/traces/mooncake/conversation_trace.jsonl", "mooncake", "Mooncake")
SHAREGPT = ("data/traces/sharegpt_zh_1k/sharegpt_zh_1K_format.jsonl", "sharegpt", "ShareGPT zh 1K")
# (trace, model, hbm, host, engines or None for auto, [(row label, policy args, goal row)])
ROWS = [
    (MOONCAKE, "jamba_1_5_mini", "64GiB", "256GiB", "3",
     [("sglang+", ["--policy", "sglang+"], True), ("marconi", ["--policy", "marconi"], True),
      ("marconi α=1", ["--policy", "marconi", "--alpha", "1"], False)]),
    (MOONCAKE, "qwen3_next_80b_a3b", "128GiB", "512GiB", "2",
     [("sglang+", ["--policy", "sglang+"], True), ("marconi", ["--policy", "marconi"], True)]),
    (SHAREGPT, "jamba_1_5_mini", "1GiB", "4GiB", None,
     [("sglang+", ["--policy", "sglang+"], True), ("marconi", ["--policy", "marconi"], True)]),
    (SHAREGPT, "qwen3_next_80b_a3b", "4GiB", "16GiB", None,
     [("sglang+", ["--policy", "sglang+"], True), ("marconi", ["--policy", "marconi"], True)]),
]


# The bound table: the goal rows' HBM with host = 4 x HBM and with an unbounded host (8 TiB) on
# Mooncake: (label, model, hbm, host 4x, engines, policies)
BOUND_ROWS = [
    ("jamba_1_5_mini, 64 GiB", "jamba_1_5_mini", "64GiB", "256GiB", "3", ["sglang+", "marconi"]),
    ("qwen3_next_80b_a3b, 128 GiB", "qwen3_next_80b_a3b", "128GiB", "512GiB", "2", ["sglang+", "marconi"]),
    ("qwen3_next_80b_a3b, 64 GiB", "qwen3_next_80b_a3b", "64GiB", "256GiB", "2", ["sglang+", "marconi"]),
    ("qwen3_next_80b_a3b, 48 GiB (2026-11-27)", "qwen3_next_80b_a3b", "48GiB", "192GiB", "2", ["sglang+"]),
    ("qwen3_next_80b_a3b, 32 GiB (2026-11-27)", "qwen3_next_80b_a3b", "32GiB", "128GiB", "2", ["sglang+"]),
]


def bound_table(a, run_all):
    """The 'host 8 TiB (the bound)' table: per row, hit rate and P50 cut with host = 4 x HBM and
    with host = 8 TiB."""
    path, fmt, _ = MOONCAKE
    cmds = []
    for _, model, hbm, host, engines, policies in BOUND_ROWS:
        for policy in policies:
            for h in (host, "8TiB"):
                cmds.append([a.hcbench, "replay", "--trace", os.path.join(a.shared, path), "--format", fmt,
                             "--model", model, "--tiers", f"hbm={hbm},host={h}", "--prefill-engines", engines,
                             "--policy", policy, "--json"])
    results = run_all(cmds)
    print("| model, HBM | policy | host 4 × HBM: hit, P50 cut | host 8 TiB (the bound): hit, P50 cut |")
    print("|---|---|---|---|")
    k = 0
    for label, _, _, _, _, policies in BOUND_ROWS:
        for n, policy in enumerate(policies):
            cells = []
            for d in results[k:k + 2]:
                cut = signed(100 * (d["ttft_p50_ms"] / d["single_tier_ttft_p50_ms"] - 1))
                cells.append(f"{100 * d['token_hit_rate']:.2f} %, {cut} %")
            k += 2
            print(f"{'| ' + label + ' |' if n == 0 else '| |'} {policy} | {cells[0]} | {cells[1]} |")


def size_words(s):
    return s.replace("GiB", " GiB")


def replay(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"tiered_goal_table.py: {' '.join(cmd)} exited {r.returncode}: {r.stderr.strip()}")
    return json.loads(r.stdout)


def signed(v, digits=1):
    text = f"{v:+.{digits}f}"
    return text.replace("-", "−")  # the page's minus sign


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hcbench", required=True)
    p.add_argument("--shared", default="../shared", help="the shared data folder (traces under data/traces)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--table", choices=["goal", "bound"], default="goal",
                   help="goal: the goal table (default); bound: host 4 x HBM against an unbounded host (16 replays)")
    a = p.parse_args()

    def run_all(cmds):
        print(f"tiered_goal_table: {len(cmds)} replays, {a.jobs} at once", file=sys.stderr, flush=True)
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
            return list(pool.map(replay, cmds))

    if a.table == "bound":
        bound_table(a, run_all)
        return 0

    runs = []
    for (path, fmt, _), model, hbm, host, engines, policies in ROWS:
        for label, args, _ in policies:
            cmd = [a.hcbench, "replay", "--trace", os.path.join(a.shared, path), "--format", fmt, "--model", model,
                   "--tiers", f"hbm={hbm},host={host}", *(["--prefill-engines", engines] if engines else []),
                   *args, "--json"]
            runs.append(cmd)

    results = run_all(runs)

    print("| trace, model, tiers | policy | engines | token hit 1 tier → 2 tiers | TTFT P50 1 tier → 2 tiers | "
          "P50 cut | load hidden | FLOPs saved 1 tier → 2 tiers (PFLOP) |")
    print("|---|---|---|---|---|---|---|---|")
    k = 0
    for (_, _, trace_name), model, hbm, host, _, policies in ROWS:
        for n, (label, _, goal) in enumerate(policies):
            d = results[k]
            k += 1
            first = f"{trace_name}, {model}, {size_words(hbm)} + {size_words(host)}" if n == 0 else ""
            cut = signed(100 * (d["ttft_p50_ms"] / d["single_tier_ttft_p50_ms"] - 1)) + " %"
            print(f"{'| ' + first + ' |' if first else '| |'} {label} | {d['prefill_engines']} | "
                  f"{100 * d['single_tier_token_hit_rate']:.2f} % → {100 * d['token_hit_rate']:.2f} % | "
                  f"{d['single_tier_ttft_p50_ms']:.1f} → {d['ttft_p50_ms']:.1f} ms | "
                  f"{'**' + cut + '**' if goal else cut} | {100 * d['load_hidden_fraction']:.1f} % | "
                  f"{d['single_tier_flops_saved'] / 1e15:.1f} → {d['flops_saved'] / 1e15:.1f} |")
    print()
    k = 0
    for (_, _, trace_name), model, hbm, host, _, policies in ROWS:
        by = {}
        for label, _, _ in policies:
            by[label] = results[k]
            k += 1
        ratio = by["marconi"]["flops_saved"] / by["sglang+"]["flops_saved"]
        single = by["marconi"]["single_tier_flops_saved"] / by["sglang+"]["single_tier_flops_saved"]
        print(f"{trace_name}, {model}: tiered marconi / tiered sglang+ FLOPs saved {ratio:.4f}x "
              f"(over HBM alone {single:.3f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
