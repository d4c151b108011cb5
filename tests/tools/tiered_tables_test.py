#!/usr/bin/env python3
"""tools.scripts.tiered_tables: scripts/tiered_tables.py (the generated tables of
docs/results/tiered.md) against a stub hcbench that answers each replay with JSON made from its
arguments, so the test needs no trace (107 stub replays: a few seconds). Checks what the page quotes: the cells'
formats (ms with one decimal below 1,000 and thousands commas above, `*` when saturated, the
change against the baseline with its sign, -0 included), the rows in the page's order, the
ratio and switch columns of the decay table, progress on stderr only, and that a failing replay
fails the script naming its command.

  python3 tests/tools/tiered_tables_test.py --script scripts/tiered_tables.py --work /tmp/tt
"""
import argparse
import os
import stat
import subprocess
import sys

STUB = r'''#!PYTHON -S
import json, sys
a = sys.argv[1:]
def opt(name, default=None):
    return a[a.index(name) + 1] if name in a else default
import os
if os.environ.get("STUB_FAIL_LINK") and os.environ["STUB_FAIL_LINK"] == opt("--link-gbps"):
    sys.exit("stub: refused this link")
g = float(opt("--link-gbps", "50"))
base = {"1": 1500.0, "5": 984.24, "10": 976.66, "50": 969.04}.get(opt("--link-gbps"), 1000.0)
ttft = base
if opt("--layerwise") == "on": ttft = base * 0.96
if opt("--scheduler") == "car": ttft = base * 0.998   # -0.2 %: prints -0
if opt("--demotion") == "flop": ttft = base * 1.27
if opt("--prefetch") == "deadline" and g == 1: ttft = 5642574.4
policy, decay = opt("--policy"), opt("--selector-decay")
flops = {"sglang+": 1e17, "gdsf": 1.0062e17}.get(policy, 1.0022e17 if decay is None else 0.9919e17)
d = {"ttft_p50_ms": ttft, "ttft_p95_ms": ttft * 6, "token_hit_rate": 0.1926, "saturated": ttft > 1e6,
     "single_tier_saturated": False, "single_tier_ttft_p50_ms": 1325.0 + g / 10, "prefill_engines": 3,
     "prefill_engines_auto": "--prefill-engines" not in a, "load_hidden_fraction": 0.9487,
     "split_load_recompute": 1675, "bytes_loaded": 11.4e12, "flops_saved": flops,
     "selector_switches": 1 if decay is None else 6}
print(json.dumps(d))
'''


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--script", required=True)
    p.add_argument("--work", required=True)
    a = p.parse_args()
    os.makedirs(a.work, exist_ok=True)
    stub = os.path.join(a.work, "hcbench_stub.py")
    with open(stub, "w") as f:
        f.write(STUB.replace("PYTHON", sys.executable, 1))  # -S: no site import, ~107 quick starts
    os.chmod(stub, os.stat(stub).st_mode | stat.S_IXUSR)
    failures = []

    def run(table, extra=()):
        r = subprocess.run([sys.executable, a.script, "--hcbench", stub, "--shared", a.work, "--table", table, *extra],
                           capture_output=True, text=True)
        return r.returncode, r.stdout, r.stderr

    def check(ok, what, text=""):
        if not ok:
            failures.append(what + (":\n" + text if text else ""))

    rc, out, err = run("mechanisms")
    check(rc == 0, f"--table mechanisms exits 0 (got {rc})", err)
    for line in ["| mechanism alone | 1 GB/s | 5 GB/s | 10 GB/s | 50 GB/s |",
                 "| baseline (all off) | 1,500, 19.3 % | 984.2, 19.3 % | 976.7, 19.3 % | 969.0, 19.3 % |",
                 "| layer-wise loading | 1,440 (-4 %), 19.3 % | 944.9 (-4 %), 19.3 % |",
                 "| CaR queue | 1,497 (-0 %), 19.3 % |",
                 "| deadline prefetch | 5,642,574* (+376072 %), 19.3 % | 984.2 (+0 %), 19.3 % |",
                 "| FLOP-aware demotion | 1,905 (+27 %), 19.3 % |",
                 "Mooncake jamba: single tier P50 1,325-1,330 ms, 3 prefill engines"]:
        check(line in out, f"mechanisms: '{line}' in stdout", out)
    titles = [l.split(" (")[0] for l in out.split("\n") if l.endswith("`*` saturated)")]
    check(titles == ["Mooncake jamba", "ShareGPT jamba", "Mooncake llama2_7b"], f"three tables in order: {titles}")
    check(out.count("| baseline (all off) |") == 3, "a baseline row per table")
    check("ETA" not in out and "[72/72] replays in" in err, "progress on stderr only, 72 replays", err)

    rc, out, err = run("decay")
    check(rc == 0, f"--table decay exits 0 (got {rc})", err)
    check("| Mooncake jamba, 64 GiB + 256 GiB | 0.9919 (6) | **1.0022** (1) | 1.0062 |" in out, "decay row", out)
    check(out.count("(held out) |") == 4, "four held-out rows", out)

    rc, out, err = run("hiding")
    check(rc == 0, f"--table hiding exits 0 (got {rc})", err)
    check("| 50 GB/s (default) | 94.9 % | 1,675 | 19.26 % | 969.0 (5,814) ms | 11.4 TB |" in out, "hiding row", out)
    check("llama2_7b: 3 prefill engines (auto), single tier TTFT P50 1,326.0/1,330.0/1,345.0 ms, saturated: none" in out,
          "hiding summary line", out)

    # A replay that fails stops the script with its command and hcbench's message.
    r = subprocess.run([sys.executable, a.script, "--hcbench", stub, "--shared", a.work, "--table", "hiding"],
                       capture_output=True, text=True, env=dict(os.environ, STUB_FAIL_LINK="200"))
    check(r.returncode != 0 and "--link-gbps 200 --json exited 1" in r.stderr and "stub: refused this link" in r.stderr
          and "| link |" not in r.stdout, f"a failing replay fails the script naming it (rc {r.returncode})", r.stderr)

    for f in failures:
        print("FAIL", f)
    if not failures:
        print("ok: tiered_tables.py's three tables from a stub hcbench")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
