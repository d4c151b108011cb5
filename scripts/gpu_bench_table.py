#!/usr/bin/env python3
"""The speed table of docs/results/linear-attention.md from a recorded `bench_linear_attention`
output (bench/run-gpu.sh keeps it as bench.txt): per batch, recurrent decode's time and eta /
eta_peak, KVBuffer's time and its speedup over recurrent, the 4-draft verification's two times
and its speedup. The timings are the GPU's; this only tabulates a recorded run, so the page's
table is checked against the file it came from.

  python3 scripts/gpu_bench_table.py docs/results/gpu-h200-2026-11-27/bench.txt
"""
import argparse
import re
import sys


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("bench_txt")
    a = p.parse_args()
    rows, order, batch = {}, [], None
    with open(a.bench_txt, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"^(\S+)\s+(\d+)\s+([\d.]+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$", line)
            if m:
                form, batch = m.group(1), int(m.group(2))
                if batch not in rows:
                    rows[batch] = {}
                    order.append(batch)
                rows[batch][form] = {"us": float(m.group(3)), "eta": m.group(6), "eta_peak": m.group(7)}
                continue
            s = re.match(r"^\s+(kvbuffer speedup over recurrent|verify speedup): ([\d.]+x)", line)
            if s and batch is not None:
                rows[batch][s.group(1)] = s.group(2)
    if not order:
        sys.exit(f"gpu_bench_table.py: no benchmark rows in {a.bench_txt}")
    print("| batch | recurrent us | eta / eta_peak | kvbuffer us (B 16, a whole flush cycle) | kvbuffer vs recurrent | "
          "verify 4 drafts: per-draft states / KVBuffer us | speedup |")
    print("|---|---|---|---|---|---|---|")
    for b in order:
        r = rows[b]
        rec, kvb, vr, vk = r["recurrent"], r["kvbuffer"], r["verify4-rec"], r["verify4-kvb"]
        print(f"| {b} | {rec['us']:.2f} | {rec['eta']} / {rec['eta_peak']} | {kvb['us']:.2f} | "
              f"{r['kvbuffer speedup over recurrent']} | {vr['us']:.1f} / {vk['us']:.1f} | {r['verify speedup']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
