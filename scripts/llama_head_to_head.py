#!/usr/bin/env python3
"""hybridcache-llama against llama-server on the same model, conversations and order.

One client drives each server in turn (standard library only): it asks hybridcache-llama for
the trace's requests (`hybridcache-llama requests`: every assistant turn's history, in the
order a sequential client sends them: conversations round-robin, one turn each per round,
with the prefill a keep-everything prefix cache needs), then for each server configuration
starts the server on 127.0.0.1, sends every request to POST /v1/chat/completions (greedy,
`max_tokens`), and reads what the server reports: usage.prompt_tokens, timings.prompt_n
(tokens prefilled) and timings.cache_n (tokens reused); it also times the whole trace and
reads the server's peak RSS (VmHWM) before stopping it.

Configurations: hybridcache-llama (`serve --tiers hbm=BUDGET`), llama-server at its defaults
(4 slots unless --slots, --ctx-checkpoints 32, --cache-ram 8192 MiB), and llama-server with
--cache-ram equal to BUDGET. Both servers get the same context per slot, threads and slots.

  llama_head_to_head.py --program P --server S --model M.gguf --trace T --format F
                        [--conversations N] [--slots 4] [--budget-mib 256] [--max-tokens 8]
                        [--threads 1] [--ctx 16384] [--json OUT.json] [--label NAME]

Prints one table row per configuration; --json writes the numbers. Exit 1 when the servers
disagree on a prompt's token count (they would not be computing the same thing).
"""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_http import free_port, http, peak_rss, stop, wait_healthy  # noqa: E402


def run_config(name, argv, port, requests, max_tokens, log_dir):
    log = open(os.path.join(log_dir, f"{name}.log"), "w")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        rows = []
        t0 = time.perf_counter()
        for i, req in enumerate(requests):
            t = time.perf_counter()
            status, text = http(url + "/v1/chat/completions", {"messages": req["messages"], "max_tokens": max_tokens, "temperature": 0})
            if status != 200:
                raise RuntimeError(f"{name}: request {req['id']} (conversation {req['conversation']}, turn {req['turn']}): {status} {text[:300]}")
            r = json.loads(text)
            rows.append({
                "prompt_tokens": r["usage"]["prompt_tokens"],
                "prefilled": r["timings"]["prompt_n"],
                "reused": r["timings"]["cache_n"],
                "ms": (time.perf_counter() - t) * 1000.0,
                "content": r["choices"][0]["message"]["content"],
            })
            if sys.stderr.isatty():
                print(f"\r{name}: {i + 1}/{len(requests)}", end="", file=sys.stderr, flush=True)
        wall = time.perf_counter() - t0
        if sys.stderr.isatty():
            print(file=sys.stderr)
        rss = peak_rss(proc.pid)
        metrics = {}
        if name == "hybridcache":  # the cache's own time, from its /metrics
            status, text = http(url + "/metrics")
            if status != 200:
                raise RuntimeError(f"{name}: GET /metrics: {status} {text[:300]}")
            for line in text.splitlines():
                if line.startswith("hybridcache_"):
                    key, value = line.split()
                    metrics[key[len("hybridcache_"):]] = float(value)
    finally:
        stop(proc)
        log.close()
    return {"name": name, "rows": rows, "wall_s": wall, "peak_rss_bytes": rss, "metrics": metrics}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--program", required=True)
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--trace", required=True)
    ap.add_argument("--format", default="sharegpt")
    ap.add_argument("--conversations", type=int, default=0)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--budget-mib", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ctx", type=int, default=16384)
    ap.add_argument("--configs", default="hybridcache,llama-server,llama-server-cache-ram",
                    help="which configurations to run, comma-separated")
    ap.add_argument("--json", default="")
    ap.add_argument("--label", default="")
    ap.add_argument("--log-dir", default="")
    a = ap.parse_args()
    log_dir = a.log_dir or os.path.join("/tmp", f"h2h-{os.getpid()}")
    os.makedirs(log_dir, exist_ok=True)

    # A prompt must leave room for the output in a slot of either server.
    cmd = [a.program, "requests", "--model", a.model, "--trace", a.trace, "--format", a.format,
           "--max-prompt-tokens", str(a.ctx - a.max_tokens - 1)]
    if a.conversations:
        cmd += ["--conversations", str(a.conversations)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    requests = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    bound = sum(r["bound_prefill"] for r in requests)
    prompt = sum(r["prompt_tokens"] for r in requests)

    common = ["--model", a.model]
    configs = {
        "hybridcache": lambda p: [a.program, "serve", *common, "--port", str(p), "--slots", str(a.slots), "--threads",
                                  str(a.threads), "--ctx", str(a.ctx), "--tiers", f"hbm={a.budget_mib}MiB"],
        "llama-server": lambda p: [a.server, "-m", a.model, "--host", "127.0.0.1", "--port", str(p), "-np", str(a.slots),
                                   "-t", str(a.threads), "-tb", str(a.threads), "-c", str(a.ctx * a.slots)],
        "llama-server-cache-ram": lambda p: [a.server, "-m", a.model, "--host", "127.0.0.1", "--port", str(p), "-np",
                                             str(a.slots), "-t", str(a.threads), "-tb", str(a.threads), "-c",
                                             str(a.ctx * a.slots), "--cache-ram", str(a.budget_mib)],
    }
    results = []
    for name in a.configs.split(","):
        port = free_port()
        results.append(run_config(name, configs[name](port), port, requests, a.max_tokens, log_dir))

    # The servers must have computed the same prompts.
    mismatched = 0
    for i in range(len(requests)):
        counts = {res["rows"][i]["prompt_tokens"] for res in results} | {requests[i]["prompt_tokens"]}
        mismatched += len(counts) > 1
    base = next((r for r in results if r["name"] == "llama-server"), None)
    label = a.label or os.path.basename(a.trace)
    print(f"{label}: {len(requests)} requests, {prompt} prompt tokens, keep-everything bound {bound} prefilled\n")
    print("| configuration | prefilled | / bound | / llama-server | wall s | / llama-server | peak RSS MiB | TTFT-ish p50 ms |")
    print("|---|---|---|---|---|---|---|---|")
    for res in results:
        pre = sum(r["prefilled"] for r in res["rows"])
        res["prefilled"] = pre
        ms = sorted(r["ms"] for r in res["rows"])
        bpre = sum(r["prefilled"] for r in base["rows"]) if base else 0
        print(f"| {res['name']} | {pre} | {pre / bound:.3f} | {pre / bpre if bpre else float('nan'):.3f} | {res['wall_s']:.1f} | "
              f"{res['wall_s'] / base['wall_s'] if base else float('nan'):.3f} | {res['peak_rss_bytes'] / 2**20:.0f} | "
              f"{ms[len(ms) // 2]:.0f} |")
    same = 0
    if base and results[0]["name"] == "hybridcache":
        same = sum(x["content"] == y["content"] for x, y in zip(results[0]["rows"], base["rows"]))
        print(f"hybridcache and llama-server produced the same text for {same} of {len(requests)} requests")
    ours = results[0] if results and results[0]["name"] == "hybridcache" else None
    if ours and base:
        cache_s = sum(ours["metrics"].get(k, 0.0) for k in
                      ("restore_seconds_total", "snapshot_seconds_total", "capture_seconds_total", "bookkeeping_seconds_total"))
        saved_s = base["wall_s"] - ours["wall_s"]
        share = f"{100.0 * cache_s / saved_s:.1f} % of the {saved_s:.1f} s it saved against llama-server" if saved_s > 0 else \
            f"and saved nothing against llama-server ({saved_s:.1f} s)"
        print(f"hybridcache's cache work (restore {ours['metrics'].get('restore_seconds_total', 0):.2f} s, snapshots "
              f"{ours['metrics'].get('snapshot_seconds_total', 0):.2f} s, capture {ours['metrics'].get('capture_seconds_total', 0):.2f} s, "
              f"bookkeeping {ours['metrics'].get('bookkeeping_seconds_total', 0):.2f} s): {cache_s:.2f} s, {share}")
        ours["cache_work_s"] = cache_s
    if mismatched:
        print(f"ERROR: {mismatched} requests with different prompt token counts between the servers", file=sys.stderr)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"label": label, "requests": len(requests), "prompt_tokens": prompt, "bound_prefill": bound,
                       "same_text": same, "mismatched_prompts": mismatched,
                       "configs": [{k: v for k, v in r.items() if k != "rows"} for r in results]}, f, indent=1)
    return 1 if mismatched else 0


if __name__ == "__main__":
    sys.exit(main())
