#!/usr/bin/env python3
"""The table of docs/prefix-cache.md "The branch-protecting rule, measured": FLOPs saved by the
Marconi family's fixed alphas 0, 0.5, 1, 2 relative to SGLang+, with the paper's candidate rule
(`--flop-candidates paper`) and with branch points protected (`protect-branches`), on synth-v1
chat and agent traces of seeds 1 and 2 (`hcbench gen`), marconi_7b, the reference's commit model.
Prints the markdown table, then the summary the page quotes (cases where the best alpha saves at
least as much as SGLang+, geometric means). 144 replays, one `hcbench replay ... --json` each.

  python3 scripts/branch_table.py --hcbench build/release/tools/hcbench --work DIR
  python3 scripts/branch_table.py ... --seeds 1 --profiles chat --capacities 1e9 --sessions 20   # reduced

Standard library only; --jobs replays at once.
"""
import argparse
import concurrent.futures
import json
import math
import os
import subprocess
import sys

ALPHAS = ["0", "0.5", "1", "2"]
RULES = ["paper", "protect-branches"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hcbench", required=True)
    p.add_argument("--work", required=True, help="folder for the generated traces")
    p.add_argument("--profiles", default="chat,agent")
    p.add_argument("--seeds", default="1,2")
    p.add_argument("--capacities", default="1e9,2e9,5e9,1e10")
    p.add_argument("--sessions", type=int, default=0, help="sessions per synth trace (0: hcbench gen's default)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    a = p.parse_args()
    os.makedirs(a.work, exist_ok=True)

    cases = []  # (label, trace, capacity)
    for profile in a.profiles.split(","):
        for seed in a.seeds.split(","):
            trace = os.path.join(a.work, f"{profile}{seed}" + (f"-s{a.sessions}" if a.sessions else "") + ".jsonl")
            if not os.path.exists(trace):
                cmd = [a.hcbench, "gen", "--profile", profile, "--seed", seed, "--out", trace]
                if a.sessions:
                    cmd += ["--sessions", str(a.sessions)]
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            for c in a.capacities.split(","):
                cases.append((f"{profile} {seed}", trace, c))

    def replay(trace, capacity, args):
        cmd = [a.hcbench, "replay", "--trace", trace, "--format", "marconi", "--model", "marconi_7b",
               "--capacity", capacity, "--json", *args]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"branch_table.py: {' '.join(cmd)} exited {r.returncode}: {r.stderr.strip()}")
        return json.loads(r.stdout)["flops_saved"]

    runs = {}
    for label, trace, c in cases:
        runs[(label, c, "sglang+")] = (trace, c, ["--policy", "sglang+"])
        for rule in RULES:
            for alpha in ALPHAS:
                runs[(label, c, rule, alpha)] = (trace, c, ["--policy", "marconi", "--alpha", alpha,
                                                            "--flop-candidates", rule])
    print(f"branch_table: {len(runs)} replays, {a.jobs} at once", file=sys.stderr, flush=True)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        futures = {k: pool.submit(replay, *v) for k, v in runs.items()}
        flops = {k: f.result() for k, f in futures.items()}

    print("| trace | capacity | SGLang+ FLOPs saved | paper: best alpha / SGLang+ | protect-branches: alpha 0 | "
          "alpha 1 | alpha 2 | best alpha |")
    print("|---|---|---|---|---|---|---|---|")
    paper_best, protect_best, at_least_paper = [], [], 0
    for label, _, c in cases:
        base = flops[(label, c, "sglang+")]
        ratio = {(rule, alpha): flops[(label, c, rule, alpha)] / base if base else float("nan")
                 for rule in RULES for alpha in ALPHAS}
        pb = max(ratio[("paper", x)] for x in ALPHAS)
        bb = max(ratio[("protect-branches", x)] for x in ALPHAS)
        paper_best.append(pb)
        protect_best.append(bb)
        at_least_paper += bb >= pb
        print(f"| {label} | {c} | {base:.3e} | {pb:.3f} | {ratio[('protect-branches', '0')]:.3f} | "
              f"{ratio[('protect-branches', '1')]:.3f} | {ratio[('protect-branches', '2')]:.3f} | {bb:.3f} |")

    def geomean(v):
        return math.exp(sum(math.log(x) for x in v) / len(v)) if v and all(x > 0 for x in v) else float("nan")

    n = len(cases)
    print()
    print(f"protect-branches: best alpha >= SGLang+ in {sum(x >= 1 for x in protect_best)} of {n} cases, "
          f">= the paper rule's best in {at_least_paper} of {n}; geometric mean {geomean(protect_best):.3f}x SGLang+")
    print(f"paper: best alpha >= SGLang+ in {sum(x >= 1 for x in paper_best)} of {n} cases, worst "
          f"{min(paper_best):.2f}x; geometric mean {geomean(paper_best):.3f}x SGLang+")
    return 0


if __name__ == "__main__":
    sys.exit(main())
