#!/usr/bin/env python3
"""Measures issue #14's goal for `--alpha auto` (docs/prefix-cache.md, "The goal, measured").

For every trace x capacity case it replays SGLang+, GDSF, the 21 fixed alphas 0, 0.1, ..., 2
of the Marconi family, the one-shot tuner (`--tuner one-shot`) and the selector (`--policy marconi`, `--alpha auto`, plus any
--auto-args), with hcbench, marconi_7b, the reference's commit model; then prints the goal
table (auto against SGLang+ and against the best fixed alpha), the summary per seed group,
and what selection in hindsight could reach: the best of a candidate set chosen per case
after the fact (no switching, the future known), for the selector's default six and for the
best sets of 1-4 fixed policies.

  python3 scripts/selector_goal.py --hcbench build/release/tools/hcbench --work /tmp/goal
  python3 scripts/selector_goal.py ... --auto-args="--candidates sglang+,marconi:0,gdsf"

Replays already in WORK/results.tsv are not run again (delete it after changing hcbench);
the selector's rows are keyed by --auto-args. Standard library only; --jobs replays at once.
"""
import argparse
import concurrent.futures
import itertools
import json
import math
import os
import subprocess
import sys

ALPHAS = ["0", "0.1", "0.2", "0.3", "0.4", "0.5", "0.6", "0.7", "0.8", "0.9", "1",
          "1.1", "1.2", "1.3", "1.4", "1.5", "1.6", "1.7", "1.8", "1.9", "2"]
DEFAULT_CANDIDATES = ["sglang+", "marconi:0", "marconi:0.5", "marconi:1", "marconi:2", "gdsf"]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hcbench", required=True)
    p.add_argument("--work", required=True, help="traces and results.tsv go here")
    p.add_argument("--chat-seeds", default="1,2,3,4,5,6,10,11,12,20,21,22")
    p.add_argument("--agent-seeds", default="1,2,3,4,5,6,10,11,12,20,21,22")
    p.add_argument("--capacities", default="1e9,2e9,5e9,1e10")
    p.add_argument("--mooncake", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared",
                                                        "data", "traces", "mooncake", "conversation_trace.jsonl"))
    p.add_argument("--mooncake-capacities", default="1e11,3e11,1e12")
    p.add_argument("--auto-args", default="", help="extra hcbench replay arguments for the selector's runs")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    return p.parse_args()


def group_of(seed):
    return "tuning seeds 1-3" if seed <= 3 else "report seeds 4-6" if seed <= 6 else \
        "held-out seeds 10-12" if seed <= 12 else "held-out seeds 20+"


def cases(a):
    out = []  # (label, group, trace, format, capacity)
    for profile, seeds in (("chat", a.chat_seeds), ("agent", a.agent_seeds)):
        for s in [int(x) for x in seeds.split(",") if x]:
            trace = os.path.join(a.work, f"{profile}{s}.jsonl")
            if not os.path.exists(trace):
                subprocess.run([a.hcbench, "gen", "--profile", profile, "--seed", str(s), "--out", trace], check=True,
                               stdout=subprocess.DEVNULL)
            for c in a.capacities.split(","):
                out.append((f"{profile} seed {s}", group_of(s), trace, "marconi", c))
    if os.path.exists(a.mooncake):
        for c in a.mooncake_capacities.split(","):
            out.append(("mooncake", "mooncake", a.mooncake, "mooncake", c))
    else:
        print(f"absent, Mooncake rows skipped: {a.mooncake}", file=sys.stderr)
    return out


def replay(a, trace, fmt, capacity, policy_args):
    cmd = [a.hcbench, "replay", "--trace", trace, "--format", fmt, "--model", "marconi_7b", "--capacity", capacity,
           "--json"] + policy_args
    r = subprocess.run(cmd, check=True, capture_output=True, text=True)
    d = json.loads(r.stdout)
    return d["flops_saved"], d.get("selector_switches", 0), d.get("selector_followed") or "-"


def main():
    a = parse_args()
    os.makedirs(a.work, exist_ok=True)
    results_path = os.path.join(a.work, "results.tsv")
    done = {}
    if os.path.exists(results_path):
        for line in open(results_path):
            trace, cap, key, flops, switches, followed = line.rstrip("\n").split("\t")
            done[(trace, cap, key)] = (float(flops), int(switches), followed)
    policies = [("sglang+", ["--policy", "sglang+"]), ("gdsf", ["--policy", "gdsf"])]
    policies += [(f"marconi:{x}", ["--policy", "marconi", "--alpha", x]) for x in ALPHAS]
    auto_key = "auto " + a.auto_args
    policies.append(("one-shot", ["--policy", "marconi", "--tuner", "one-shot"]))
    policies.append((auto_key, ["--policy", "marconi"] + a.auto_args.split()))
    all_cases = cases(a)
    todo = [(c, k, args) for c in all_cases for k, args in policies if (c[2], c[4], k) not in done]
    with open(results_path, "a") as out, concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        futures = {pool.submit(replay, a, c[2], c[3], c[4], args): (c, k) for c, k, args in todo}
        for f in concurrent.futures.as_completed(futures):
            c, k = futures[f]
            done[(c[2], c[4], k)] = f.result()
            out.write("\t".join([c[2], c[4], k] + [str(x) for x in f.result()]) + "\n")

    def flops(c, k):
        return done[(c[2], c[4], k)][0]

    print("| trace | capacity | SGLang+ FLOPs saved | best alpha | best alpha / SGLang+ | GDSF / SGLang+ | "
          "one-shot / SGLang+ | **auto / SGLang+** | **auto / best alpha** | switches | followed at the end | |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    groups = {}
    for c in all_cases:
        sg = flops(c, "sglang+")
        best_alpha = max(ALPHAS, key=lambda x: flops(c, f"marconi:{x}"))
        best = flops(c, f"marconi:{best_alpha}")
        auto = flops(c, auto_key)
        r_sg, r_best = auto / sg, auto / best
        lost = [w for w, bad in (("< SGLang+", r_sg < 0.995), ("< 0.97 best", r_best < 0.97)) if bad]
        groups.setdefault(c[1], []).append((r_sg, r_best))
        print(f"| {c[0]} | {c[4]} | {sg:.3e} | {best_alpha} | {best / sg:.3f} | {flops(c, 'gdsf') / sg:.3f} | "
              f"{flops(c, 'one-shot') / sg:.3f} | {r_sg:.3f} | {r_best:.3f} | {done[(c[2], c[4], auto_key)][1]} | "
              f"{done[(c[2], c[4], auto_key)][2]} | "
              f"{'**lost**: ' + ', '.join(lost) if lost else ''}")
    print()
    everything = []
    for g, rs in list(groups.items()) + [("all", None)]:
        if rs is None:
            rs = everything
        else:
            everything += rs
        met = sum(1 for x, y in rs if x >= 0.995 and y >= 0.97)
        geo = math.exp(sum(math.log(x) for x, _ in rs) / len(rs))
        print(f"- {g}: goal met in {met} of {len(rs)}; >= SGLang+ (0.5 %) in {sum(1 for x, _ in rs if x >= 0.995)}, "
              f">= 0.97 best alpha in {sum(1 for _, y in rs if y >= 0.97)}; geometric mean {geo:.3f}x SGLang+; "
              f"worst {min(x for x, _ in rs):.3f}x SGLang+, {min(y for _, y in rs):.3f}x best alpha")

    # Selection in hindsight: the best member of a set, chosen per case after the fact.
    fixed = ["sglang+", "gdsf"] + [f"marconi:{x}" for x in ALPHAS]

    def missed(members):  # the cases where no member meets the goal
        out = []
        for c in all_cases:
            m = max(flops(c, k) for k in members)
            best = max(flops(c, f"marconi:{x}") for x in ALPHAS)
            if not (m >= 0.995 * flops(c, "sglang+") and m >= 0.97 * best):
                out.append(f"{c[0]} at {c[4]} ({m / best:.3f}x best alpha)")
        return out

    def covered(members):
        return len(all_cases) - len(missed(members))

    print()
    print(f"- in hindsight, the selector's default six: the goal holds in {covered(DEFAULT_CANDIDATES)} of {len(all_cases)}"
          f" (not in: {'; '.join(missed(DEFAULT_CANDIDATES)) or 'none'})")
    for size in (1, 2, 3, 4):
        best_sets = sorted(((covered(s), s) for s in itertools.combinations(fixed, size)), key=lambda t: -t[0])[:2]
        print(f"- in hindsight, the best sets of {size}: " +
              "; ".join(f"{{{', '.join(s)}}} {n} of {len(all_cases)}" for n, s in best_sets))
    spikes = 0
    for c in all_cases:
        f = [flops(c, f"marconi:{x}") for x in ALPHAS]
        i = max(range(len(f)), key=lambda j: f[j])
        neighbours = [f[j] for j in (i - 1, i + 1) if 0 <= j < len(f)]
        spikes += f[i] > 1.03 * max(neighbours)
    print(f"- the best alpha saves > 3 % more than both alphas 0.1 away in {spikes} of {len(all_cases)} cases")


if __name__ == "__main__":
    main()
