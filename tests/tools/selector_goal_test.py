#!/usr/bin/env python3
"""Test of scripts/selector_goal.py on a reduced input (ctest tools.scripts.selector_goal, a few
seconds): chat and agent seed 1 with 20 sessions at 5e8 B, no Mooncake, 50 replays with the built
hcbench, stderr a pipe. Checks that stdout is the goal table alone, that stderr has the plain
progress lines (every ~10 %, no carriage returns) and the SVG's path, that WORK/selector_goal.svg
parses as XML with both series, the goal lines at the script's thresholds, the trace labels and
round ticks, and that a second run reuses all 50 replays (no progress) and prints the same table.

  python3 tests/tools/selector_goal_test.py --script scripts/selector_goal.py \\
      --hcbench build/release/tools/hcbench --work /tmp/selector_goal_test
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import xml.dom.minidom

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--script", required=True)
    p.add_argument("--hcbench", required=True)
    p.add_argument("--work", required=True)
    a = p.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    cmd = [sys.executable, a.script, "--hcbench", a.hcbench, "--work", a.work, "--chat-seeds", "1",
           "--agent-seeds", "1", "--capacities", "5e8", "--sessions", "20", "--mooncake", "", "--jobs", "1"]
    first = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if first.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {first.returncode}:\n{first.stderr}")
    out, err = first.stdout, first.stderr

    # stdout: the table, its summary and the hindsight lines; nothing of the progress.
    lines = out.splitlines()
    check(lines and lines[0].startswith("| trace | capacity | SGLang+ FLOPs saved |"), "stdout starts with the table")
    check(any(l.startswith("| chat seed 1 | 5e8 |") for l in lines), "a row for chat seed 1 at 5e8")
    check(any(l.startswith("| agent seed 1 | 5e8 |") for l in lines), "a row for agent seed 1 at 5e8")
    check(any(l.startswith("- all: goal met in ") for l in lines), "the summary line")
    check(lines and lines[-1].startswith("- the best alpha saves > 3 % more"), "stdout ends with the hindsight lines")
    check("replays" not in out and "selector_goal:" not in out and "\r" not in out, "no progress on stdout")

    # stderr: not a terminal, so plain lines every ~10 %, no carriage returns.
    check("\r" not in err, "no carriage return on stderr when it is not a terminal")
    check("selector_goal: 50 replays to run, 1 at once; 0 reused from " in err, "the count of replays to run")
    progress = re.findall(r"^\[(\d+)/50\] replays, ETA (\d\d):(\d\d)$", err, re.M)
    counts = [int(k) for k, _, _ in progress]
    check(len(counts) >= 5 and counts == sorted(counts) and all(0 < k < 50 for k in counts),
          f"progress lines every ~10 % (got {counts})")
    check(re.search(r"^\[50/50\] replays in \d\d:\d\d$", err, re.M), "the closing progress line")
    svg = os.path.join(a.work, "selector_goal.svg")
    check(f"selector_goal: wrote {svg}" in err, "the SVG's path on stderr")

    # The SVG: well-formed, both series with one mark per case, the goal lines, labels, round ticks.
    if not os.path.exists(svg):
        failures.append(f"{svg} exists")
    else:
        doc = xml.dom.minidom.parse(svg)
        root = doc.documentElement
        check(root.tagName == "svg" and root.getAttribute("xmlns") == "http://www.w3.org/2000/svg", "an <svg> root")
        groups = {g.getAttribute("id"): g for g in doc.getElementsByTagName("g") if g.getAttribute("id")}
        for gid, tag in (("auto-vs-sglang", "circle"), ("auto-vs-best-alpha", "path")):
            check(gid in groups and len(groups[gid].getElementsByTagName(tag)) == 2, f"series {gid}: 2 marks")
        goal_lines = groups["goal-lines"].getElementsByTagName("line") if "goal-lines" in groups else []
        check(len(goal_lines) == 2, "two goal lines")
        texts = [t.firstChild.data for t in doc.getElementsByTagName("text") if t.firstChild]
        joined = "\n".join(texts)
        for want in ("auto / SGLang+", "auto / best fixed alpha", ">= 0.995 x SGLang+", ">= 0.97 x best fixed alpha",
                     "chat 1", "agent 1", "log scale", "The selector (--alpha auto)"):
            check(want in joined, f"the SVG says '{want}'")
        ticks = [t.firstChild.data for t in groups["y-axis"].getElementsByTagName("text")][:-1] \
            if "y-axis" in groups else []
        round_mantissas = {"1", "1.05", "1.1", "1.15", "1.2", "1.3", "1.4", "1.5", "1.6", "1.7", "1.8", "1.9", "2",
                           "2.5", "3", "4", "5", "6", "7", "8", "8.5", "9", "9.5"}
        check("1" in ticks and len(ticks) >= 2 and
              all(f"{float(t):e}".split("e")[0].rstrip("0").rstrip(".") in round_mantissas for t in ticks),
              f"round y ticks including 1 (got {ticks})")

    # Again: every replay reused, no progress lines, the same table.
    second = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    check(second.returncode == 0, "the second run succeeds")
    check("selector_goal: all 50 replays reused from " in second.stderr, "the second run reuses all 50 replays")
    check(not re.search(r"^\[\d+/\d+\] replays", second.stderr, re.M), "no progress when nothing runs")
    check(second.stdout == out, "the second run prints the same table")

    if failures:
        print("stderr of the first run:\n" + err, file=sys.stderr)
        sys.exit("FAIL:\n  " + "\n  ".join(failures))
    print(f"ok: {len(counts)} progress lines, {os.path.getsize(svg)} B SVG")


if __name__ == "__main__":
    main()
