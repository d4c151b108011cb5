#!/usr/bin/env python3
"""Time the replay loop of the Marconi reference simulator (ruipeterpan/marconi) on one trace.

This script only imports and calls the reference's classes; it contains none of its code. It is
for humans reproducing docs/replay.md's side-by-side table and is never run in CI.

    python3 time_marconi_loop.py --marconi-dir /tmp/marconi --trace chat.jsonl \
        --policy sglang+|vllm+|marconi --capacity 5e9 [--alpha 1.0] [--repeat 3]

The reference must be importable from --marconi-dir, with stub `transformers` / `datasets`
packages on PYTHONPATH (see setup_reference.sh). Prints one JSON object: the policy, the
token and request hit rates, the per-request skipped tokens, and the loop time of each repeat
(seconds, trace parsing excluded; wall and process CPU time), and their medians.
"""
import argparse
import json
import statistics
import sys
import time


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--marconi-dir", required=True)
    ap.add_argument("--trace", required=True)
    ap.add_argument("--policy", choices=["sglang+", "vllm+", "marconi"], required=True)
    ap.add_argument("--capacity", type=float, required=True)
    ap.add_argument("--alpha", type=float, default=1.0, help="fixed alpha (reference V3) for --policy marconi")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()

    sys.path.insert(0, args.marconi_dir)
    sys.setrecursionlimit(100000)  # vLLM+ insert recurses once per 32-token block
    from radix_cache_hybrid import RadixCache as HybridTree
    from radix_cache_vllm import RadixCache as BlockTree

    requests = load(args.trace)
    model = dict(num_ssm_layers=24, num_attn_layers=4, num_mlp_layers=28, d=4096, n=128)
    times, cpu_times = [], []
    for _ in range(args.repeat):
        if args.policy == "vllm+":
            tree = BlockTree(capacity_bytes=args.capacity, use_logical_ts=True, block_size=32, **model)
        elif args.policy == "sglang+":
            tree = HybridTree(capacity_bytes=args.capacity, evict_policy_version=1, eff_weight=0.0,
                              use_logical_ts=True, **model)
        else:
            tree = HybridTree(capacity_bytes=args.capacity, evict_policy_version=3, eff_weight=args.alpha,
                              use_logical_ts=True, **model)
        start, cpu_start = time.perf_counter(), time.process_time()
        for r in requests:
            tree.match_prefix(r["input_tokens"])
            tree.insert(token_ids=r["input_tokens"] + r["output_tokens"],
                        state_at_leaf=r["session_id"], state_at_branchoff=r["session_id"])
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
    hist = tree.request_history
    skipped = [h[2] for h in hist]
    total = sum(h[1] for h in hist)
    print(json.dumps({
        "policy": args.policy, "trace": args.trace, "capacity": args.capacity,
        "alpha": args.alpha if args.policy == "marconi" else None,
        "requests": len(hist), "input_tokens": total, "skipped_tokens": sum(skipped),
        "token_hit_rate": sum(skipped) / total if total else 0.0,
        "request_hit_rate": sum(1 for s in skipped if s > 0) / len(hist) if hist else 0.0,
        "loop_seconds": times, "loop_seconds_median": statistics.median(times),
        "loop_cpu_seconds": cpu_times, "loop_cpu_seconds_median": statistics.median(cpu_times),
        "skipped": skipped,
    }))


if __name__ == "__main__":
    main()
