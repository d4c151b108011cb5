#!/usr/bin/env python3
"""End-to-end tests of hybridcache-llama (ctest label llama), one model per run.

  program_tests.py --program P --model M.gguf --trace SHAREGPT.jsonl --agent-dir DIR

Checks, each with a failure that names what went wrong:
  integrity  bytes of the host tier flipped at rest before every third request: the entries
             are found changed (CRC-32C), dropped and recomputed, outputs still identical
  shared     a disk tier below a pool too small for the trace: loads, fewer tokens prefilled,
             identical outputs; every value file damaged: nothing loaded, all recomputed; bad
             tier specs refused; two processes on one redis-server (started here on loopback):
             the second prefills at most 10 % of its prompt tokens; through serve, the
             second server's answer equals the first's (logprobs within 0.05; a token may
             differ only at a near tie, see same_answer)
  replay     a branching multi-turn trace (ShareGPT conversations: every turn continues the
             history) through a small pool with a host tier below it, 3 slots: every request's
             greedy output equals the uncached run's (--verify), with evictions and host-tier
             loads; the same on agent trajectories (tau-bench and SWE-agent formats)
  bad input  a missing model file, a trace of an unknown format, a prompt longer than a slot's
             context: a clear error and a non-zero exit
  serve      /health; /v1/chat/completions and /completion answer with llama-server's fields
             (usage.prompt_tokens, timings.prompt_n, timings.cache_n); a repeated conversation
             reuses its prefix; another cache_salt (tenant) reuses nothing of it; logprobs
             (chat's logprobs / top_logprobs, /completion's n_probs) sorted, the chosen token
             the most likely, log-probabilities that sum to at most 1; a missing API
             key -> 401; bad JSON, an unknown field, sampling, streaming, a token id outside the
             vocabulary, a prompt longer than the context, top_logprobs without logprobs or
             over 20 -> 400 with a message; after the
             refusals the cache's counters (/metrics) are as they were
"""
import argparse
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from llama_http import free_port, http, stop, wait_healthy  # noqa: E402

failures = []


def verified_ok(j, name):
    """--verify's verdict (examples/llama_cpp/verify.hpp): every request compared with its
    uncached run, every logit row within the bound, and a greedy token that differs only at a
    near tie; few of those (llama.cpp's kernels are not batch-invariant, so logits move in the
    last bits; a wrong state moves them by whole units and fails the bound)."""
    return check(j["failed"] == 0 and j["verified"] == j["requests"] and j["verify_failures"] == 0
                 and j["near_ties"] <= max(1, j["requests"] // 10),
                 f"{name}: {j['verified']} of {j['requests']} verified, {j['verify_failures']} beyond the logit bound, "
                 f"{j['near_ties']} near ties, {j['failed']} failed (largest deviation {j['max_logit_deviation']})")


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL: {what}", flush=True)
    return cond


def same_answer(first, second, name, bound=0.05):
    """Two servers' greedy answers to one prompt, with their logprobs: equal tokens, or the
    first difference at a near tie (the first server's two best within `bound` of each other,
    and the second's choice among them). Each shared token's logprob within `bound`: llama.cpp's
    CPU kernels are not batch-invariant, so a server that computes the prompt's last token alone
    (a hit) sees logits that differ in the last bits from one that prefilled it whole."""
    a, b = (x["choices"][0]["logprobs"]["content"] for x in (first, second))
    for i, (ta, tb) in enumerate(zip(a, b)):
        if ta["id"] != tb["id"]:
            top = ta["top_logprobs"]
            near = len(top) >= 2 and top[0]["logprob"] - top[1]["logprob"] <= bound and tb["id"] in (top[0]["id"], top[1]["id"])
            return check(near, f"{name}: token {i} differs ({ta['id']} vs {tb['id']}) and is no near tie: {top[:2]}")
        if not check(abs(ta["logprob"] - tb["logprob"]) <= bound, f"{name}: token {i}'s logprob {ta['logprob']} vs {tb['logprob']}"):
            return False
    return check(len(a) == len(b), f"{name}: {len(a)} vs {len(b)} tokens")


def run(args, timeout=900):
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout)


def replay_case(a, trace, fmt, extra, name, need_host=True):
    r = run([a.program, "replay", "--model", a.model, "--trace", trace, "--format", fmt, "--json", "--verify"] + extra)
    if not check(r.returncode == 0, f"{name}: exit {r.returncode}: {r.stderr.strip()[-400:]}"):
        return
    j = json.loads(r.stdout)
    print(f"{name}: {json.dumps(j)}", flush=True)
    check(j["requests"] > 0, f"{name}: no request")
    verified_ok(j, name)
    check(j["reused_tokens"] > 0, f"{name}: nothing reused")
    check(j["evictions"] > 0, f"{name}: no eviction (the pool is meant to be too small)")
    if need_host:
        check(j["host_loads"] > 0, f"{name}: no host-tier load")


def bad_input_cases(a):
    r = run([a.program, "replay", "--model", "/nonexistent/model.gguf", "--trace", a.trace])
    check(r.returncode != 0 and "cannot load" in r.stderr, f"missing model: exit {r.returncode}, {r.stderr.strip()[-200:]}")
    r = run([a.program, "replay", "--model", a.model, "--trace", a.trace, "--format", "mooncake"])
    check(r.returncode != 0 and "--format 'mooncake'" in r.stderr, f"unknown format: {r.stderr.strip()[-200:]}")
    r = run([a.program, "replay", "--model", a.model, "--trace", a.trace, "--conversations", "2", "--ctx", "64"])
    check(r.returncode != 0 and "exceeds the context" in r.stderr, f"prompt longer than the context: {r.stderr.strip()[-200:]}")


def replay_json(a, args, name):
    r = run([a.program, "replay", "--model", a.model, "--json"] + args)
    if not check(r.returncode == 0, f"{name}: exit {r.returncode}: {r.stderr.strip()[-400:]}"):
        return None
    j = json.loads(r.stdout)
    print(f"{name}: {json.dumps(j)}", flush=True)
    verified_ok(j, name)
    return j


def shared_tier_cases(a, tmp):
    """The shared tier: a disk tier below a pool too small for the trace, its bytes damaged at
    rest, and two processes sharing entries through a real redis-server on loopback."""
    trace = ["--trace", a.trace, "--format", "sharegpt", "--conversations", "8", "--verify", "--slots", "3", "--max-tokens", "4"]
    disk = os.path.join(tmp, "disk")
    base = replay_json(a, trace + ["--tiers", "hbm=8MiB"], "pool only")
    j = replay_json(a, trace + ["--tiers", f"hbm=8MiB,disk@{disk}=256MiB"], "disk tier")
    if base and j:
        check(j["disk_loads"] > 0 and j["shared_loaded_tokens"] > 0, "disk tier: nothing loaded from disk")
        check(j["prefilled_tokens"] < base["prefilled_tokens"],
              f"disk tier: prefilled {j['prefilled_tokens']}, not fewer than the pool alone ({base['prefilled_tokens']})")
    # A host tier over the disk tier: the host tier's victims move down to disk and a hit
    # brings them back (the same backend also holds the shared tier's prefixes).
    small_host = replay_json(a, trace + ["--tiers", "hbm=8MiB,host=4MiB"], "host tier alone")
    spill = replay_json(a, trace + ["--tiers", f"hbm=8MiB,host=4MiB,disk@{os.path.join(tmp, 'disk2')}=256MiB"], "host tier over the disk tier")
    if small_host and spill:
        check(spill["moved_down"] > 0 and spill["brought_up"] > 0,
              f"host over disk: moved down {spill['moved_down']}, brought up {spill['brought_up']}")
        check(small_host["moved_down"] == 0, "host tier alone: entries moved down with no tier below")
        check(spill["host_loads"] > small_host["host_loads"] and spill["prefilled_tokens"] < small_host["prefilled_tokens"],
              f"host over disk: {spill['host_loads']} host loads, {spill['prefilled_tokens']} prefilled; host alone "
              f"{small_host['host_loads']}, {small_host['prefilled_tokens']}")
    # Every stored value damaged at rest: found corrupt when read, dropped, recomputed.
    files = [os.path.join(d, f) for d, _, fs in os.walk(disk) for f in fs if f.endswith(".hcv")]
    check(len(files) > 0, "disk tier: no value files written")
    for f in files:
        with open(f, "r+b") as h:
            size = os.path.getsize(f)
            h.seek(size - 1)
            last = h.read(1)
            h.seek(size - 1)
            h.write(bytes([last[0] ^ 0x20]))
    clean = j
    j = replay_json(a, trace + ["--tiers", f"hbm=8MiB,disk@{disk}=256MiB"], "disk tier, every value damaged")
    if j and clean:
        # The run rewrites what it computes, so later requests hit its own fresh values: it
        # must reuse no more than the run that started from an empty disk (a damaged value
        # loaded would show as more reuse; outputs are checked against uncached above).
        check(j["shared_dropped"] > 0, "damaged disk values: none was found damaged")
        check(j["prefilled_tokens"] >= clean["prefilled_tokens"],
              f"damaged disk values: prefilled {j['prefilled_tokens']} < {clean['prefilled_tokens']} from an empty disk")
    # Bad tier specs: refused with the reason, never ignored.
    for spec, text in ((f"hbm=8MiB,disk@{disk}=256MiB:gbps=2", "modelled link"), ("hbm=8MiB,redis@localhost=1GiB", "HOST:PORT"),
                       (f"hbm=8MiB,disk@{disk}=64MiB,redis@127.0.0.1:1=64MiB", "one shared tier"), ("hbm=8MiB,cxl=1GiB", "not a tier")):
        r = run([a.program, "replay", "--model", a.model, "--trace", a.trace, "--conversations", "1", "--tiers", spec])
        check(r.returncode != 0 and text in r.stderr, f"--tiers {spec}: exit {r.returncode}, {r.stderr.strip()[-200:]}")
    # Two processes, one Redis: the second finds what the first computed.
    server = shutil.which("redis-server")
    if not check(server is not None, "redis-server is not installed (Debian redis-server)"):
        return
    port = free_port()
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            with socket.socket() as sk:
                if sk.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        tiers = ["--tiers", f"hbm=8MiB,redis@127.0.0.1:{port}=1GiB"]
        first = replay_json(a, trace + tiers, "redis, first process")
        second = replay_json(a, trace + tiers, "redis, second process")
        if first and second:
            check(second["redis_loads"] > 0, "redis: the second process loaded nothing")
            check(second["prefilled_tokens"] <= 0.1 * second["prompt_tokens"],
                  f"redis: the second process prefilled {second['prefilled_tokens']} of {second['prompt_tokens']} prompt tokens (> 10 %)")
        # The host tier over the Redis tier: its victims move down to Redis and come back.
        spill = replay_json(a, trace + ["--tiers", f"hbm=8MiB,host=4MiB,redis@127.0.0.1:{port}=1GiB"], "host tier over redis")
        if spill:
            check(spill["moved_down"] > 0 and spill["brought_up"] > 0,
                  f"host over redis: moved down {spill['moved_down']}, brought up {spill['brought_up']}")
        # The same through serve: one server answers a conversation and is stopped; a second
        # one, started afterwards on the same Redis, reuses all of it but the last token; a
        # request of another tenant reuses nothing.
        conv = [{"role": "system", "content": "You are a terse assistant."},
                {"role": "user", "content": "Name three rivers of Europe and say which is longest, with its length."}]
        served = []
        for name in ("first server", "second server"):
            sport = free_port()
            sp = subprocess.Popen([a.program, "serve", "--model", a.model, "--port", str(sport), "--slots", "2", "--ctx", "2048"]
                                  + tiers, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            try:
                wait_healthy(f"http://127.0.0.1:{sport}", sp)
                status, body = http(f"http://127.0.0.1:{sport}/v1/chat/completions",
                                    {"messages": conv, "max_tokens": 3, "temperature": 0, "cache_salt": "redis-test",
                                     "logprobs": True, "top_logprobs": 2})
                check(status == 200, f"redis, {name}: {status} {body[:200]}")
                served.append(json.loads(body) if status == 200 else None)
                if name == "second server":
                    status, body = http(f"http://127.0.0.1:{sport}/v1/chat/completions",
                                        {"messages": conv, "max_tokens": 3, "temperature": 0, "cache_salt": "another-tenant"})
                    check(status == 200 and json.loads(body)["timings"]["cache_n"] == 0,
                          f"redis, another tenant reused the first tenant's entries: {body[:200]}")
            finally:
                stop(sp)
        if len(served) == 2 and all(served):
            first_s, second_s = served
            check(second_s["timings"]["cache_n"] == second_s["usage"]["prompt_tokens"] - 1,
                  f"redis, serve: the second server reused {second_s['timings']['cache_n']} of {second_s['usage']['prompt_tokens']} tokens")
            same_answer(first_s, second_s, "redis, serve: the second server's answer against the first's")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def serve_cases(a):
    port = free_port()
    key = "test-key"
    proc = subprocess.Popen([a.program, "serve", "--model", a.model, "--port", str(port), "--api-key", key, "--slots", "2",
                             "--ctx", "2048", "--tiers", "hbm=64MiB"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_healthy(base, proc)
        except RuntimeError as e:
            check(False, f"serve: {e}: {proc.stderr.read()[-400:] if proc.poll() is not None else ''}")
            return
        chat = base + "/v1/chat/completions"
        conv = [{"role": "system", "content": "You are a careful assistant. " * 20},
                {"role": "user", "content": "Summarise the plot of a long novel about the sea in three sentences."}]
        status, body = http(chat, {"messages": conv, "max_tokens": 4, "temperature": 0}, key)
        check(status == 200, f"chat: {status} {body[:200]}")
        first = json.loads(body)
        for f in ("prompt_tokens",):
            check(f in first["usage"], f"chat: usage.{f} missing")
        for f in ("prompt_n", "cache_n"):
            check(f in first["timings"], f"chat: timings.{f} missing")
        # The next turn of the same conversation reuses its history.
        turn2 = conv + [{"role": "assistant", "content": "It is a story."}, {"role": "user", "content": "And the ending?"}]
        status, body = http(chat, {"messages": turn2, "max_tokens": 4, "temperature": 0}, key)
        second = json.loads(body)
        check(status == 200 and second["timings"]["cache_n"] >= first["usage"]["prompt_tokens"] - 1,
              f"second turn reused {second['timings'].get('cache_n')} of the first turn's {first['usage']['prompt_tokens']} tokens")
        check(second["timings"]["prompt_n"] + second["timings"]["cache_n"] == second["usage"]["prompt_tokens"],
              "prompt_n + cache_n != prompt_tokens")
        # Another tenant reuses nothing of it; the same tenant twice does.
        status, body = http(chat, {"messages": turn2, "max_tokens": 2, "temperature": 0, "cache_salt": "tenant-b"}, key)
        check(status == 200 and json.loads(body)["timings"]["cache_n"] == 0, f"another cache_salt reused: {body[:200]}")
        status, body = http(chat, {"messages": turn2, "max_tokens": 2, "temperature": 0, "cache_salt": "tenant-b"}, key)
        check(status == 200 and json.loads(body)["timings"]["cache_n"] > 0, f"the same cache_salt did not reuse: {body[:200]}")
        status, body = http(base + "/completion", {"prompt": "Once upon a time there was", "n_predict": 3, "temperature": 0}, key)
        check(status == 200 and "content" in json.loads(body) and "tokens_evaluated" in json.loads(body), f"/completion: {status} {body[:200]}")
        status, body = http(base + "/completion", {"prompt": [1, 2, 3, 4], "n_predict": 2, "temperature": 0}, key)
        check(status == 200, f"/completion with token ids: {status} {body[:200]}")
        # Logprobs, as llama-server reports them: the chosen token is the most likely one, the
        # alternatives are sorted and are log-probabilities (<= 0, and e^x sums to at most 1).
        status, body = http(chat, {"messages": turn2, "max_tokens": 3, "temperature": 0, "logprobs": True, "top_logprobs": 5}, key)
        check(status == 200, f"chat logprobs: {status} {body[:200]}")
        if status == 200:
            content = json.loads(body)["choices"][0]["logprobs"]["content"]
            check(len(content) == json.loads(body)["usage"]["completion_tokens"], f"chat logprobs: {len(content)} entries")
            for t in content:
                top = t["top_logprobs"]
                check(len(top) == 5 and top[0]["id"] == t["id"] and abs(top[0]["logprob"] - t["logprob"]) < 1e-6
                      and all(x["logprob"] >= y["logprob"] for x, y in zip(top, top[1:])) and top[0]["logprob"] <= 0
                      and sum(math.exp(x["logprob"]) for x in top) <= 1 + 1e-5 and all(0 <= b < 256 for b in t["bytes"]),
                      f"chat logprobs: {t}")
        status, body = http(chat, {"messages": turn2, "max_tokens": 2, "temperature": 0, "logprobs": True}, key)
        check(status == 200 and all(t["top_logprobs"] == [] for t in json.loads(body)["choices"][0]["logprobs"]["content"]),
              f"chat logprobs without top_logprobs: {body[:300]}")
        status, body = http(base + "/completion", {"prompt": "Once upon a time there was", "n_predict": 2, "temperature": 0, "n_probs": 3}, key)
        check(status == 200 and all(len(t["top_logprobs"]) == 3 for t in json.loads(body)["completion_probabilities"]),
              f"/completion n_probs: {status} {body[:300]}")
        # Refusals: each a clear error, nothing cached changes.
        _, metrics_before = http(base + "/metrics", key=key)
        cases = [
            ("no API key", None, {"messages": conv}, None, 401, "API key"),
            ("bad JSON", key, None, b'{"messages": [', 400, "bad JSON"),
            ("unknown field", key, {"messages": conv, "frobnicate": 1}, None, 400, "frobnicate"),
            ("sampling", key, {"messages": conv, "temperature": 0.7}, None, 400, "temperature"),
            ("streaming", key, {"messages": conv, "stream": True}, None, 400, "stream"),
            ("empty messages", key, {"messages": []}, None, 400, "messages"),
            ("top_logprobs without logprobs", key, {"messages": conv, "top_logprobs": 2}, None, 400, "logprobs"),
            ("top_logprobs out of range", key, {"messages": conv, "logprobs": True, "top_logprobs": 21}, None, 400, "top_logprobs"),
            ("prompt longer than the context", key, {"messages": [{"role": "user", "content": "word " * 4000}]}, None, 400, "context"),
        ]
        for name, k, body, raw, want, text in cases:
            status, resp = http(chat, body, k, raw)
            check(status == want and text in resp, f"{name}: {status} {resp[:200]}")
        status, resp = http(base + "/completion", {"prompt": [10 ** 9], "n_predict": 1}, key)
        check(status == 400 and "vocabulary" in resp, f"token id outside the vocabulary: {status} {resp[:200]}")
        _, metrics_after = http(base + "/metrics", key=key)
        check(metrics_before == metrics_after, "a refused request changed the cache's counters")
        for counter in ("reused_tokens_total", "restore_seconds_total", "snapshot_seconds_total", "capture_seconds_total",
                        "bookkeeping_seconds_total", "decode_seconds_total"):
            values = [line.split()[1] for line in metrics_after.splitlines() if line.startswith(f"hybridcache_{counter} ")]
            check(len(values) == 1 and float(values[0]) > 0, f"/metrics {counter}: {values}")
        check(http(base + "/metrics")[0] == 401, "/metrics without a key")
    finally:
        stop(proc)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--program", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--trace", required=True)
    ap.add_argument("--agents", required=True, help="scripts/make_agent_traces.py")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, a.agents, "--sharegpt", a.trace, "--out", tmp, "--episodes", "5", "--steps", "3-5"],
                       check=True, capture_output=True)
        small = ["--slots", "3", "--max-tokens", "4", "--tiers", "hbm=8MiB,host=16MiB"]
        replay_case(a, a.trace, "sharegpt", ["--conversations", "8"] + small, "replay sharegpt")
        replay_case(a, os.path.join(tmp, "tau_bench.json"), "tau-bench", small, "replay tau-bench")
        replay_case(a, os.path.join(tmp, "swe_agent"), "swe-agent", ["--policy", "sglang+"] + small, "replay swe-agent (sglang+)",
                    need_host=False)
        # Bytes flipped in the host tier at rest: detected by their CRC, dropped, recomputed.
        r = run([a.program, "replay", "--model", a.model, "--trace", a.trace, "--format", "sharegpt", "--json", "--verify",
                 "--conversations", "8", "--fault-flip-host-every", "3"] + small)
        if check(r.returncode == 0, f"flipped host bytes: exit {r.returncode}: {r.stderr.strip()[-300:]}"):
            j = json.loads(r.stdout)
            print(f"flipped host bytes: {json.dumps(j)}", flush=True)
            check(j["host_corrupt_dropped"] > 0, "flipped host bytes: no corrupt entry detected")
            verified_ok(j, "flipped host bytes")
        shared_tier_cases(a, tmp)
    bad_input_cases(a)
    serve_cases(a)
    print(f"{0 if failures else 1} passed, {1 if failures else 0} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
