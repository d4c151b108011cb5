"""replay() and compare() give what hcbench gives for the same arguments (docs/python.md)."""
import csv
import json
import os
import threading
import time

import numpy as np
import pytest

import hybridcache
from hybridcache._harness import _number
from conftest import run_hcbench

# Keys whose values differ between two runs of the same replay: timings and provenance.
VOLATILE = {"wall_seconds", "cpu_seconds", "date", "command", "selector_shadow_seconds", "selector_shadow_fraction"}


def stable(obj):
    return {k: v for k, v in obj.items() if k not in VOLATILE}


def cli_replay(hcbench, *args):
    rc, out, err = run_hcbench(hcbench, "replay", *args, "--json")
    assert rc == 0, err
    return json.loads(out)


@pytest.mark.parametrize("extra", [
    {"policy": "sglang+"},
    {"policy": "marconi"},  # alpha auto: the adaptive selector
    {"policy": "marconi", "alpha": 0.5, "drive": "lifecycle"},
    {"policy": "vllm+", "block_size": 16, "strict_capacity": True},
])
def test_replay_equals_hcbench(hcbench, chat_trace, extra):
    kw = dict(format="marconi", model="jamba_1_5_mini", capacity="2e8", **extra)
    got = hybridcache.replay(trace=chat_trace, **kw)
    want = cli_replay(hcbench, *hybridcache.command_line("replay", trace=chat_trace, **kw)[1:])
    assert set(got) == set(want)
    assert stable(got) == stable(want)
    assert got["requests"] > 0 and (got["skipped_tokens"] > 0 or extra["policy"] == "vllm+")  # it hit something
    # The provenance names the equivalent hcbench command line.
    assert got["command"].startswith("hcbench replay --trace " + chat_trace)
    assert got["version"] == hybridcache.build_version


def test_repeated_calls_start_from_the_defaults(chat_trace):
    # hcbench binds its options to static structs; a value given once must not leak into the next call.
    a = hybridcache.replay(chat_trace, capacity="2e8", policy="lru", strict_capacity=True)
    b = hybridcache.replay(chat_trace, capacity="2e8", policy="lru")
    c = hybridcache.replay(chat_trace, capacity="2e8", policy="lru", strict_capacity=False)
    assert stable(b) == stable(c)
    assert a["refused_commits"] >= b["refused_commits"] == 0


def test_in_memory_token_trace_equals_the_file(tmp_path, hcbench, chat_trace):
    rows = [json.loads(line) for line in open(chat_trace, encoding="utf-8") if line.strip()]
    trace = [{"input_tokens": np.asarray(r["input_tokens"], dtype=np.int32), "output_tokens": r["output_tokens"],
              "session_id": r["session_id"], "turn_id": r["turn_id"], "ts": r["ts"]} for r in rows]
    got = hybridcache.replay(trace, capacity="2e8", policy="sglang+")
    want = hybridcache.replay(chat_trace, capacity="2e8", policy="sglang+")
    assert got["trace"] == "python"
    assert {**stable(got), "trace": "chat"} == stable(want)
    # Bare token arrays: one request each, no output.
    bare = hybridcache.replay([np.asarray(r["input_tokens"]) for r in rows[:30]], capacity="2e8", policy="lru")
    assert bare["requests"] == 30 and bare["input_tokens"] == sum(len(r["input_tokens"]) for r in rows[:30])


def test_in_memory_openai_trace(tmp_path, hcbench):
    system = {"role": "system", "content": "You are a careful assistant. " * 20}
    convs = []
    for i in range(6):
        convs.append([system, {"role": "user", "content": f"question {i}: how do caches work?"},
                      {"role": "assistant", "content": "They keep what was computed." * 3},
                      {"role": "user", "content": "and then?"}, {"role": "assistant", "content": "They reuse it."}])
    got = hybridcache.replay(convs, capacity="1GB", policy="marconi", model="marconi_7b")
    path = tmp_path / "python.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for c in convs:
            f.write(json.dumps({"messages": c}) + "\n")
    want = cli_replay(hcbench, "--trace", str(path), "--format", "openai", "--capacity", "1GB", "--policy", "marconi")
    assert stable(got) == stable(want)
    assert got["requests"] == 12 and got["skipped_tokens"] > 0 and got["tokenizer"] == "built-in approximation"


def test_compare_rows_equal_hcbench_csv(tmp_path, hcbench, chat_trace):
    rows = hybridcache.compare(trace=chat_trace, policies="marconi,lru", capacities=["1e8", "2e8"], threads=1)
    out = tmp_path / "cli"
    rc, _, err = run_hcbench(hcbench, "compare", "--trace", chat_trace, "--policies", "marconi,lru",
                             "--capacities", "1e8,2e8", "--threads", "1", "--out", str(out))
    assert rc == 0, err
    with open(out / "results.csv", newline="", encoding="utf-8") as f:
        want = list(csv.DictReader(f))
    assert len(rows) == len(want) == 4
    for got, w in zip(rows, want):
        assert set(got) == set(w)
        for k, v in w.items():
            if k not in VOLATILE:
                assert got[k] == (v if k in ("trace", "model", "policy", "followed") else _number(v)), k
    assert isinstance(rows[0]["capacity_bytes"], int) and isinstance(rows[0]["token_hit_rate"], float)
    # out= keeps hcbench's files.
    kept = tmp_path / "kept"
    hybridcache.compare(trace=chat_trace, policies="lru", capacities="1e8", out=kept)
    assert sorted(os.listdir(kept)) == ["hit_rate_vs_capacity.svg", "results.csv", "table.txt"]


def test_unknown_keywords_are_refused(chat_trace):
    with pytest.raises(TypeError, match=r"'capcity'.*'polcy'"):
        hybridcache.replay(chat_trace, capcity="1e9", polcy="lru")
    with pytest.raises(TypeError, match="'json'"):  # always on: the result is the JSON object
        hybridcache.replay(chat_trace, capacity="1e9", json=True)
    with pytest.raises(TypeError, match="strict_capacity"):
        hybridcache.replay(chat_trace, capacity="1e9", strict_capacity="yes")
    with pytest.raises(TypeError, match="'nope'"):
        hybridcache.compare(nope=1)


def test_bad_values_raise_hcbench_message(hcbench, chat_trace):
    rc, _, err = run_hcbench(hcbench, "replay", "--trace", chat_trace, "--capacity", "12 parsecs")
    assert rc == 1
    with pytest.raises(hybridcache.InvalidArgument) as e:
        hybridcache.replay(chat_trace, capacity="12 parsecs")
    assert str(e.value) == err.strip().removeprefix("hcbench: ")
    assert isinstance(e.value, ValueError) and e.value.code == "invalid_argument"
    with pytest.raises(hybridcache.InvalidArgument, match="does not apply"):  # an option of another mode
        hybridcache.replay(chat_trace, capacity="1e9", policy="lru", alpha=0.5)
    with pytest.raises(hybridcache.InvalidArgument, match="does not exist"):
        hybridcache.replay("/nonexistent/trace.jsonl", capacity="1e9")
    with pytest.raises(hybridcache.InvalidArgument, match="model"):
        hybridcache.replay(chat_trace, capacity="1e9", model="no_such_model")
    with pytest.raises(ValueError, match="empty"):
        hybridcache.replay([], capacity="1e9")
    with pytest.raises(TypeError, match=r"trace\[0\]\[1\]"):
        hybridcache.replay([[1, "2"]], capacity="1e9")
    with pytest.raises(TypeError, match="dtype"):
        hybridcache.replay([np.zeros(4, dtype=np.float32)], capacity="1e9")
    with pytest.raises(ValueError, match="marconi"):
        hybridcache.replay([[1, 2, 3]], format="mooncake", capacity="1e9")


def test_replay_releases_the_gil(chat_trace):
    done = threading.Event()
    result = {}

    def work():
        result["r"] = hybridcache.replay(chat_trace, capacity="2e8", policy="marconi", alpha=0.5,
                                         flop_index="threshold", concurrency=4)
        done.set()

    ticks = 0
    t = threading.Thread(target=work)
    start = time.perf_counter()
    t.start()
    while not done.is_set():
        ticks += 1  # runs only while the replay does not hold the GIL
        time.sleep(0)
    t.join()
    elapsed = time.perf_counter() - start
    assert result["r"]["requests"] > 0
    # With the GIL held for the whole replay this loop would run a handful of times.
    assert ticks > 50 or elapsed < 0.005, (ticks, elapsed)
