#!/usr/bin/env python3
"""The table of docs/runtime.md "Replaying through the lifecycle": synth-v1 chat seed 1,
marconi_7b, strict capacity, each policy and capacity replayed with --drive commit and with
--drive lifecycle; prints the markdown table (token hit rates, refused commits, the lifecycle's
FLOPs saved over the commit model's). 24 replays, a few seconds.

  python3 scripts/lifecycle_table.py --hcbench build/release/tools/hcbench [--work DIR]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

POLICIES = [("sglang+", ["--policy", "sglang+"]),
            ("marconi (alpha 1)", ["--policy", "marconi", "--alpha", "1"]),
            ("vllm+", ["--policy", "vllm+"])]
CAPACITIES = ["1e9", "2e9", "5e9", "1e10"]


def replay(hcbench, trace, capacity, policy_args, drive):
    cmd = [hcbench, "replay", "--trace", trace, "--format", "marconi", "--capacity", capacity,
           *policy_args, "--strict-capacity", "--drive", drive, "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"lifecycle_table.py: {' '.join(cmd)} exited {r.returncode}: {r.stderr.strip()}")
    return json.loads(r.stdout)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hcbench", required=True)
    p.add_argument("--work", default=None, help="folder for the generated trace (default: a temp folder)")
    a = p.parse_args()
    work = a.work or tempfile.mkdtemp(prefix="lifecycle_table_")
    os.makedirs(work, exist_ok=True)
    trace = os.path.join(work, "chat1.jsonl")
    subprocess.run([a.hcbench, "gen", "--profile", "chat", "--seed", "1", "--out", trace],
                   check=True, capture_output=True)
    print("| policy | capacity | commit: hit rate | lifecycle: hit rate | commit: refused | "
          "lifecycle: refused | lifecycle / commit FLOPs saved |")
    print("|---|---|---|---|---|---|---|")
    for name, args in POLICIES:
        for c in CAPACITIES:
            commit = replay(a.hcbench, trace, c, args, "commit")
            life = replay(a.hcbench, trace, c, args, "lifecycle")
            ratio = life["flops_saved"] / commit["flops_saved"] if commit["flops_saved"] else float("nan")
            print(f"| {name} | {c} | {100 * commit['token_hit_rate']:.2f} % | {100 * life['token_hit_rate']:.2f} % | "
                  f"{commit['refused_commits']} | {life['refused_commits']} | {ratio:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
