#!/usr/bin/env python3
"""Side-by-side replay: the Marconi reference simulator vs `hcbench replay`, same traces and
capacities. Prints a Markdown table of token hit rates and replay-loop times (medians of
--repeat runs each) and the speed-up ratio. For humans reproducing docs/replay.md; never
run in CI.

    PYTHONPATH=/tmp/marconi-ref/stubs /usr/bin/python3 scripts/reference/compare_reference.py \
        --marconi-dir /tmp/marconi-ref/marconi --hcbench build/release/tools/hcbench \
        --trace /tmp/marconi-ref/traces/chat_s1_100.jsonl --capacities 5e9 --repeat 3

Reference policies: sglang+ = RadixCache V1, vllm+ = vLLM+ tree (32-token blocks),
marconi = RadixCache V3 (fixed alpha, --alpha). Ours: the same names with --alpha fixed.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def run_reference(args, trace, policy, capacity):
    cmd = [sys.executable, os.path.join(HERE, "time_marconi_loop.py"), "--marconi-dir", args.marconi_dir,
           "--trace", trace, "--policy", policy, "--capacity", capacity, "--alpha", str(args.alpha),
           "--repeat", str(args.repeat)]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def run_ours(args, trace, policy, capacity):
    runs = []
    per_request = os.path.join(tempfile.gettempdir(), "hcbench_per_request.csv")
    for i in range(args.repeat_ours):
        cmd = [args.hcbench, "replay", "--trace", trace, "--format", "marconi", "--model", "marconi_7b",
               "--capacity", capacity, "--policy", policy, "--alpha", str(args.alpha), "--json"]
        if policy == "marconi" and args.ours_quirks:
            cmd += ["--reference-quirks"]
        if i == 0:  # the per-request rows once; timed runs do not write them
            cmd += ["--per-request", per_request]
        runs.append(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout))
    out = runs[1] if len(runs) > 1 else runs[0]
    with open(per_request) as f:
        out["skipped"] = [int(line.split(",")[2]) for line in list(f)[1:]]
    timed = runs[1:] if len(runs) > 1 else runs
    out["wall_seconds_median"] = statistics.median(r["wall_seconds"] for r in timed)
    out["cpu_seconds_median"] = statistics.median(r["cpu_seconds"] for r in timed)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--marconi-dir", required=True)
    ap.add_argument("--hcbench", required=True)
    ap.add_argument("--trace", action="append", required=True)
    ap.add_argument("--capacities", default="5e9")
    ap.add_argument("--policies", default="sglang+,marconi,vllm+")
    ap.add_argument("--alpha", type=float, default=1.0)
    ap.add_argument("--ours-quirks", action="store_true",
                    help="run our marconi with --reference-quirks (reproduces the reference's V3 rows)")
    ap.add_argument("--repeat", type=int, default=3, help="reference loop repeats (median)")
    ap.add_argument("--repeat-ours", type=int, default=5, help="hcbench runs (median)")
    args = ap.parse_args()
    print("| trace | requests | policy | capacity | ref token hit | ours token hit | requests differing "
          "| ref loop s (wall / cpu) | ours loop ms (wall / cpu) | speed-up wall | speed-up cpu |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for trace in args.trace:
        for policy in args.policies.split(","):
            for cap in args.capacities.split(","):
                ref = run_reference(args, trace, policy, cap)
                ours = run_ours(args, trace, policy, cap)
                ratio = ref["loop_seconds_median"] / max(ours["wall_seconds_median"], 1e-9)
                ratio_cpu = ref["loop_cpu_seconds_median"] / max(ours["cpu_seconds_median"], 1e-9)
                name = policy + (f" (alpha {args.alpha:g}{', quirks' if args.ours_quirks else ''})"
                                 if policy == "marconi" else "")
                print(f"| {os.path.basename(trace)} | {ref['requests']} | {name} | {cap} | "
                      f"{ref['token_hit_rate'] * 100:.4f}% | {ours['token_hit_rate'] * 100:.4f}% | "
                      f"{sum(a != b for a, b in zip(ref['skipped'], ours['skipped']))} | "
                      f"{ref['loop_seconds_median']:.3f} / {ref['loop_cpu_seconds_median']:.3f} | "
                      f"{ours['wall_seconds_median'] * 1e3:.2f} / {ours['cpu_seconds_median'] * 1e3:.2f} | "
                      f"{ratio:.0f}x | {ratio_cpu:.0f}x |",
                      flush=True)


if __name__ == "__main__":
    main()
