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

Besides the table on stdout it writes WORK/selector_goal.svg (its path on stderr): per case,
grouped by trace with the capacity rising left to right, the selector's FLOPs saved against
SGLang+ and against the best fixed alpha, two dot series on a log ratio axis, with the goal's
two thresholds (GOAL_VS_SGLANG, GOAL_VS_BEST) as dashed lines and the cases that miss the goal
shaded. While the replays run, progress goes to stderr: on a terminal one line rewritten in
place, `[k/N] replays, ETA mm:ss` (the mean time per finished replay times the replays left,
over --jobs); otherwise a plain line every ~10 %. Replays reused from WORK/results.tsv are not
counted (the first line says how many were reused). stdout is the table and its summary only.

A reduced run (a few seconds; the test tools.scripts.selector_goal runs one):

  python3 scripts/selector_goal.py --hcbench build/release/tools/hcbench --work /tmp/goal-small \\
      --chat-seeds 1 --agent-seeds 1 --capacities 5e8 --sessions 20 --mooncake '' --jobs 1

--sessions N generates the synth traces with N sessions instead of hcbench gen's 100 (their
own files in WORK; the table's numbers are then not the documented ones); --mooncake ''
leaves the Mooncake rows out.
"""
import argparse
import concurrent.futures
import itertools
import json
import math
import os
import subprocess
import sys
import time
from xml.sax.saxutils import escape

from replay_progress import Progress

ALPHAS = ["0", "0.1", "0.2", "0.3", "0.4", "0.5", "0.6", "0.7", "0.8", "0.9", "1",
          "1.1", "1.2", "1.3", "1.4", "1.5", "1.6", "1.7", "1.8", "1.9", "2"]
DEFAULT_CANDIDATES = ["sglang+", "marconi:0", "marconi:0.5", "marconi:1", "marconi:2", "gdsf"]
# The goal per case (docs/prefix-cache.md): auto >= GOAL_VS_SGLANG x SGLang+ and >= GOAL_VS_BEST x
# the best fixed alpha. The table, the summary, the hindsight analysis and the SVG all use these.
GOAL_VS_SGLANG = 0.995
GOAL_VS_BEST = 0.97


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hcbench", required=True)
    p.add_argument("--work", required=True, help="traces and results.tsv go here")
    p.add_argument("--chat-seeds", default="1,2,3,4,5,6,10,11,12,20,21,22")
    p.add_argument("--agent-seeds", default="1,2,3,4,5,6,10,11,12,20,21,22")
    p.add_argument("--capacities", default="1e9,2e9,5e9,1e10")
    p.add_argument("--sessions", type=int, default=100,
                   help="sessions per generated synth trace (hcbench gen's default 100; fewer for a quick run)")
    p.add_argument("--mooncake", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared",
                                                        "data", "traces", "mooncake", "conversation_trace.jsonl"),
                   help="the Mooncake trace ('' leaves its rows out)")
    p.add_argument("--mooncake-capacities", default="1e11,3e11,1e12")
    p.add_argument("--auto-args", default="", help="extra hcbench replay arguments for the selector's runs")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    return p.parse_args()


def group_of(seed):
    return "tuning seeds 1-3" if seed <= 3 else "report seeds 4-6" if seed <= 6 else \
        "held-out seeds 10-12" if seed <= 12 else "held-out seeds 20+"


def cases(a):
    out = []  # (label, group, trace, format, capacity)
    traces = []  # (profile, seed, path)
    suffix = "" if a.sessions == 100 else f"-{a.sessions}sessions"
    for profile, seeds in (("chat", a.chat_seeds), ("agent", a.agent_seeds)):
        for s in [int(x) for x in seeds.split(",") if x]:
            trace = os.path.join(a.work, f"{profile}{s}{suffix}.jsonl")
            traces.append((profile, s, trace))
            for c in a.capacities.split(","):
                out.append((f"{profile} seed {s}", group_of(s), trace, "marconi", c))
    missing = [t for t in traces if not os.path.exists(t[2])]
    if missing:
        print(f"selector_goal: generating {len(missing)} trace{'s' if len(missing) != 1 else ''} in {a.work}",
              file=sys.stderr, flush=True)
    for profile, s, trace in missing:
        subprocess.run([a.hcbench, "gen", "--profile", profile, "--seed", str(s), "--sessions", str(a.sessions),
                        "--out", trace], check=True, stdout=subprocess.DEVNULL)
    if a.mooncake and os.path.exists(a.mooncake):
        for c in a.mooncake_capacities.split(","):
            out.append(("mooncake", "mooncake", a.mooncake, "mooncake", c))
    elif a.mooncake:
        print(f"absent, Mooncake rows skipped: {a.mooncake}", file=sys.stderr)
    return out


def replay(a, trace, fmt, capacity, policy_args):
    cmd = [a.hcbench, "replay", "--trace", trace, "--format", fmt, "--model", "marconi_7b", "--capacity", capacity,
           "--json"] + policy_args
    r = subprocess.run(cmd, check=True, capture_output=True, text=True)
    d = json.loads(r.stdout)
    return d["flops_saved"], d.get("selector_switches", 0), d.get("selector_followed") or "-"


def timed(fn, *args):
    start = time.monotonic()
    return fn(*args), time.monotonic() - start


def log_ticks(lo, hi, px_per_e, min_px=20):
    """Round ticks for a log axis from lo to hi (px_per_e pixels per unit of ln), by levels: 1; 2, 5;
    1.5, 3; 0.9, 1.1; 1.2, 4, 6, 8; 1.3, 1.4, 1.6, ..., 2.5, 7; 0.85, 0.95, 1.05, 1.15 (each x every
    power of ten), a level taken whole while no two ticks come closer than min_px."""
    levels = [[1], [2, 5], [1.5, 3], [9, 1.1], [1.2, 4, 6, 8], [1.3, 1.4, 1.6, 1.7, 1.8, 1.9, 2.5, 7],
              [1.05, 1.15, 8.5, 9.5]]
    ticks = []
    for level in levels:
        more = [round(m * 10.0 ** k, 12) for m in level
                for k in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1)]
        merged = sorted(set(ticks + [v for v in more if lo <= v <= hi]))
        if ticks and any(math.log(b / a) * px_per_e < min_px for a, b in zip(merged, merged[1:])):
            break
        ticks = merged
    return ticks


def log_axis(lo, hi, length):
    """A log axis showing lo..hi on length pixels that starts and ends at round ticks:
    (start, end, ticks)."""
    lo, hi = lo / 1.02, hi * 1.02
    for _ in range(4):
        wide = log_ticks(lo / 10, hi * 10, length / math.log(hi / lo))
        snapped = max(t for t in wide if t <= lo), min(t for t in wide if t >= hi)
        if snapped == (lo, hi):
            break
        lo, hi = snapped
    return lo, hi, log_ticks(lo, hi, length / math.log(hi / lo))


def write_svg(path, points, auto_args):
    """The goal table as a picture. points: (trace label, capacity, auto / SGLang+, auto / best alpha),
    in the table's order (grouped by trace, capacity rising)."""
    n = len(points)
    left, right, top, plot_h = 72, 24, 112, 400
    plot_w = max(640, 14 * n)
    slot = plot_w / n
    groups = []  # [label, first index, count]
    for i, p in enumerate(points):
        label = p[0].replace(" seed ", " ")
        if groups and groups[-1][0] == label:
            groups[-1][2] += 1
        else:
            groups.append([label, i, 1])
    font_w = 6.2  # px per character at font-size 11, roughly
    flat = all(len(g[0]) * font_w + 4 <= g[2] * slot for g in groups)
    label_h = 16 if flat else max(len(g[0]) for g in groups) * font_w * 0.72 + 12
    cap_h = max(len(p[1]) for p in points) * 5.6 + 8
    bottom = cap_h + label_h + 34
    ratios = [r for p in points for r in p[2:] if r > 0]
    lo, hi, ticks = log_axis(min(ratios + [GOAL_VS_BEST, GOAL_VS_SGLANG]), max(ratios + [1.0]), plot_h)
    px_per_e = plot_h / math.log(hi / lo)

    def y(v):
        return top + plot_h - math.log(max(v, lo) / lo) * px_per_e

    def x(i):
        return left + (i + 0.5) * slot

    blue, orange = "#1f77b4", "#e6780c"
    met = sum(1 for p in points if p[2] >= GOAL_VS_SGLANG and p[3] >= GOAL_VS_BEST)
    title = "The selector (--alpha auto): FLOPs saved against SGLang+ and the best fixed alpha"
    subtitle = (f"hcbench replay, marconi_7b; goal met in {met} of {n} case{'s' if n != 1 else ''}"
                f" (auto >= {GOAL_VS_SGLANG:g}x SGLang+ and >= {GOAL_VS_BEST:g}x the best of the 21 fixed alphas)")
    if auto_args.strip():
        subtitle += f"; selector runs with {auto_args.strip()}"
    width = max(left + plot_w + right, len(subtitle) * 6.2 + 40, len(title) * 9 + 40)
    height = top + plot_h + bottom
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
           f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="sans-serif" font-size="11">',
           f'<title>{escape(title)}</title>',
           f'<rect width="{width:.0f}" height="{height:.0f}" fill="white"/>',
           f'<text x="{width / 2:.1f}" y="24" text-anchor="middle" font-size="15" font-weight="bold">{escape(title)}</text>',
           f'<text x="{width / 2:.1f}" y="43" text-anchor="middle" fill="#444">{escape(subtitle)}</text>']
    # Legend: two rows above the plot.
    lx, ly = left, 64
    out.append('<g id="legend">')
    out.append(f'<circle cx="{lx + 8}" cy="{ly - 4}" r="4" fill="{blue}"/>'
               f'<text x="{lx + 18}" y="{ly}">auto / SGLang+</text>')
    out.append(f'<path d="M{lx + 208},{ly - 9} l5,5 l-5,5 l-5,-5 z" fill="{orange}"/>'
               f'<text x="{lx + 218}" y="{ly}">auto / best fixed alpha</text>')
    out.append(f'<rect x="{lx + 402}" y="{ly - 10}" width="12" height="12" fill="#f8d7d7"/>'
               f'<text x="{lx + 420}" y="{ly}">goal missed in this case</text>')
    ly += 20
    out.append(f'<line x1="{lx}" y1="{ly - 4}" x2="{lx + 16}" y2="{ly - 4}" stroke="{blue}" stroke-width="1.5" '
               f'stroke-dasharray="6 3"/><text x="{lx + 22}" y="{ly}">goal: auto &gt;= {GOAL_VS_SGLANG:g} x SGLang+</text>')
    out.append(f'<line x1="{lx + 258}" y1="{ly - 4}" x2="{lx + 274}" y2="{ly - 4}" stroke="{orange}" '
               f'stroke-width="1.5" stroke-dasharray="2 2"/>'
               f'<text x="{lx + 280}" y="{ly}">goal: auto &gt;= {GOAL_VS_BEST:g} x best fixed alpha</text>')
    out.append('</g>')
    # Cases that miss the goal, shaded; the y grid and its round ticks.
    out.append('<g id="goal-missed">')
    for i, p in enumerate(points):
        if not (p[2] >= GOAL_VS_SGLANG and p[3] >= GOAL_VS_BEST):
            out.append(f'<rect x="{left + i * slot:.1f}" y="{top}" width="{slot:.1f}" height="{plot_h}" fill="#f8d7d7"/>')
    out.append('</g>')
    out.append('<g id="y-axis">')
    for t in ticks:
        out.append(f'<line x1="{left}" y1="{y(t):.1f}" x2="{left + plot_w}" y2="{y(t):.1f}" '
                   f'stroke="{"#888" if t == 1 else "#e2e2e2"}"/>'
                   f'<text x="{left - 6}" y="{y(t) + 4:.1f}" text-anchor="end">{t:g}</text>')
    out.append(f'<text transform="translate(18,{top + plot_h / 2:.1f}) rotate(-90)" text-anchor="middle">'
               f'FLOPs saved by auto / by the reference (log scale)</text>')
    out.append('</g>')
    # Traces: separators, capacity per case, trace label per group.
    out.append('<g id="x-axis">')
    for label, first, count in groups:
        x0 = left + first * slot
        if first:
            out.append(f'<line x1="{x0:.1f}" y1="{top}" x2="{x0:.1f}" y2="{top + plot_h + cap_h:.1f}" stroke="#bbb"/>')
        gx, gy = x0 + count * slot / 2, top + plot_h + cap_h + 14
        if flat:
            out.append(f'<text class="trace" x="{gx:.1f}" y="{gy:.1f}" text-anchor="middle">{escape(label)}</text>')
        else:
            out.append(f'<text class="trace" transform="translate({gx:.1f},{gy - 4:.1f}) rotate(-45)" '
                       f'text-anchor="end">{escape(label)}</text>')
    for i, p in enumerate(points):
        out.append(f'<text class="capacity" transform="translate({x(i) + 3:.1f},{top + plot_h + 5}) rotate(-90)" '
                   f'text-anchor="end" font-size="9" fill="#555">{escape(p[1])}</text>')
    out.append(f'<text x="{left + plot_w / 2:.1f}" y="{height - 10:.0f}" text-anchor="middle">'
               f'case: trace (profile and seed, or mooncake), capacity in bytes rising left to right</text>')
    out.append('</g>')
    out.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#444"/>')
    out.append('<g id="goal-lines">')
    out.append(f'<line x1="{left}" y1="{y(GOAL_VS_SGLANG):.1f}" x2="{left + plot_w}" y2="{y(GOAL_VS_SGLANG):.1f}" '
               f'stroke="{blue}" stroke-width="1.5" stroke-dasharray="6 3"/>')
    out.append(f'<line x1="{left}" y1="{y(GOAL_VS_BEST):.1f}" x2="{left + plot_w}" y2="{y(GOAL_VS_BEST):.1f}" '
               f'stroke="{orange}" stroke-width="1.5" stroke-dasharray="2 2"/>')
    out.append('</g>')
    dx = min(4.0, slot * 0.2)
    out.append('<g id="auto-vs-sglang">')
    for i, p in enumerate(points):
        out.append(f'<circle cx="{x(i) - dx:.1f}" cy="{y(p[2]):.1f}" r="4" fill="{blue}">'
                   f'<title>{escape(p[0])}, {escape(p[1])}: auto / SGLang+ {p[2]:.3f}</title></circle>')
    out.append('</g>')
    out.append('<g id="auto-vs-best-alpha">')
    for i, p in enumerate(points):
        cx, cy = x(i) + dx, y(p[3])
        out.append(f'<path d="M{cx:.1f},{cy - 5:.1f} l5,5 l-5,5 l-5,-5 z" fill="{orange}">'
                   f'<title>{escape(p[0])}, {escape(p[1])}: auto / best fixed alpha {p[3]:.3f}</title></path>')
    out.append('</g>')
    out.append('</svg>')
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


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
    reused = len(all_cases) * len(policies) - len(todo)
    jobs = max(1, a.jobs)
    if todo:
        print(f"selector_goal: {len(todo)} replay{'s' if len(todo) != 1 else ''} to run, {jobs} at once; "
              f"{reused} reused from {results_path}", file=sys.stderr, flush=True)
    else:
        print(f"selector_goal: all {reused} replays reused from {results_path}", file=sys.stderr, flush=True)
    progress = Progress(len(todo), jobs)
    progress.begin()
    try:
        with open(results_path, "a") as out, concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(timed, replay, a, c[2], c[3], c[4], args): (c, k) for c, k, args in todo}
            for f in concurrent.futures.as_completed(futures):
                c, k = futures[f]
                result, seconds = f.result()
                done[(c[2], c[4], k)] = result
                out.write("\t".join([c[2], c[4], k] + [str(x) for x in result]) + "\n")
                progress.step(seconds)
    finally:
        progress.end()

    def flops(c, k):
        return done[(c[2], c[4], k)][0]

    print("| trace | capacity | SGLang+ FLOPs saved | best alpha | best alpha / SGLang+ | GDSF / SGLang+ | "
          "one-shot / SGLang+ | **auto / SGLang+** | **auto / best alpha** | switches | followed at the end | |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    groups = {}
    points = []  # for the SVG
    for c in all_cases:
        sg = flops(c, "sglang+")
        best_alpha = max(ALPHAS, key=lambda x: flops(c, f"marconi:{x}"))
        best = flops(c, f"marconi:{best_alpha}")
        auto = flops(c, auto_key)
        r_sg, r_best = auto / sg, auto / best
        lost = [w for w, bad in (("< SGLang+", r_sg < GOAL_VS_SGLANG), (f"< {GOAL_VS_BEST:g} best", r_best < GOAL_VS_BEST))
                if bad]
        groups.setdefault(c[1], []).append((r_sg, r_best))
        points.append((c[0], c[4], r_sg, r_best))
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
        met = sum(1 for x, y in rs if x >= GOAL_VS_SGLANG and y >= GOAL_VS_BEST)
        geo = math.exp(sum(math.log(x) for x, _ in rs) / len(rs))
        print(f"- {g}: goal met in {met} of {len(rs)}; >= SGLang+ ({(1 - GOAL_VS_SGLANG) * 100:.2g} %) in "
              f"{sum(1 for x, _ in rs if x >= GOAL_VS_SGLANG)}, >= {GOAL_VS_BEST:g} best alpha in "
              f"{sum(1 for _, y in rs if y >= GOAL_VS_BEST)}; geometric mean {geo:.3f}x SGLang+; "
              f"worst {min(x for x, _ in rs):.3f}x SGLang+, {min(y for _, y in rs):.3f}x best alpha")

    # Selection in hindsight: the best member of a set, chosen per case after the fact.
    fixed = ["sglang+", "gdsf"] + [f"marconi:{x}" for x in ALPHAS]

    def missed(members):  # the cases where no member meets the goal
        out = []
        for c in all_cases:
            m = max(flops(c, k) for k in members)
            best = max(flops(c, f"marconi:{x}") for x in ALPHAS)
            if not (m >= GOAL_VS_SGLANG * flops(c, "sglang+") and m >= GOAL_VS_BEST * best):
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
    if points:
        svg_path = os.path.join(a.work, "selector_goal.svg")
        write_svg(svg_path, points, a.auto_args)
        print(f"selector_goal: wrote {svg_path}", file=sys.stderr)


if __name__ == "__main__":
    main()
