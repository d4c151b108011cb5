"""PrefixCache's policies and cache salts.

Each policy is hcbench's composition (admission + scorer); driven from Python over the
byte-counting store, a trace makes the decisions `hcbench replay --drive lifecycle` makes in
C++ (the same hits, admissions and evictions), and the policies make different ones. Salts
keep tenants apart, in the pool and in its host tier."""
import json

import numpy as np
import pytest

import hybridcache
from hybridcache import HandleError, InvalidArgument
from conftest import run_hcbench
from test_runtime import run_request, snapshot, tiny_spec

# (policy, alpha, hcbench's flags for it)
POLICIES = [
    ("sglang+", None, ["--policy", "sglang+"]),
    ("lru", None, ["--policy", "lru"]),
    ("vllm+", None, ["--policy", "vllm+"]),
    ("gdsf", None, ["--policy", "gdsf"]),
    ("marconi", 0.0, ["--policy", "marconi", "--alpha", "0"]),
    ("marconi", 1.0, ["--policy", "marconi", "--alpha", "1"]),
    ("marconi", 4.0, ["--policy", "marconi", "--alpha", "4"]),
    ("marconi", None, ["--policy", "marconi"]),  # the adaptive selector (hcbench's default tuner)
]
COMPARED = ("skipped_tokens", "hit_requests", "checkpoints_admitted", "checkpoints_reused", "checkpoints_evicted",
            "kv_bytes_admitted", "evictions", "refused_commits")


def load_trace(path):
    """The Marconi-format trace as (input, input ++ output) int32 arrays."""
    out = []
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            prompt = np.asarray(r["input_tokens"], dtype=np.int32)
            out.append((prompt, np.concatenate([prompt, np.asarray(r["output_tokens"], dtype=np.int32)])))
    return out


def drive(cache, trace):
    """A runtime's loop at concurrency 1, as sim's lifecycle_adapter drives the cache for hcbench:
    begin the prompt, grow by the output, finish with every planned site and the end captured;
    a request with no room is refused (not cached). Returns hcbench's replay counters."""
    m = {"skipped_tokens": 0, "hit_requests": 0, "refused_commits": 0}
    for prompt, seq in trace:
        found = cache.peek(prompt)  # what begin's lookup finds
        try:
            t = cache.begin(prompt)
        except hybridcache.OutOfCapacity:  # refused: the lookup still counts
            t = None
        # begin reuses less than it found when the deepest hit leaves no room to reserve.
        reuse = found if t is None else cache.state(t)["reusable_tokens"]
        assert reuse <= found
        if reuse > 0:
            m["hit_requests"] += 1
        m["skipped_tokens"] += reuse
        if t is None:
            m["refused_commits"] += 1
            continue
        st = cache.state(t)
        need = len(seq) - (st["kv_from"] + st["reserved_tokens"])
        if need > 0:
            try:
                cache.grow(t, need)
            except hybridcache.OutOfCapacity:
                cache.abort(t)
                m["refused_commits"] += 1
                continue
        cache.finish(t, seq, sorted(set(st["sites"]) | {len(seq)}))
    k = cache.counters
    for n in ("checkpoints_admitted", "checkpoints_reused", "checkpoints_evicted", "kv_bytes_admitted", "evictions"):
        m[n] = k[n]
    return m


@pytest.mark.parametrize("capacity", [200_000_000, 500_000_000])
def test_policies_decide_as_hcbench(hcbench, chat_trace, capacity):
    trace = load_trace(chat_trace)
    model = hybridcache.CostModel("jamba_1_5_mini")
    seen = {}
    for policy, alpha, flags in POLICIES:
        cache = hybridcache.PrefixCache(model, capacity, policy=policy, alpha=alpha, store="bytes")
        assert cache.policy == policy and cache.store == "bytes"
        ours = drive(cache, trace)
        rc, out, err = run_hcbench(hcbench, "replay", "--trace", chat_trace, "--format", "marconi", "--model", "jamba_1_5_mini",
                                   "--capacity", str(capacity), *flags, "--drive", "lifecycle", "--strict-capacity",
                                   "--lru-ties", "node-id", "--json")
        assert rc == 0, err
        ref = json.loads(out)
        assert ours == {n: ref[n] for n in COMPARED}, (policy, alpha)
        assert ours["evictions"] > 0  # the capacity makes the policy decide
        if alpha is not None:
            assert cache.alpha == alpha and cache.followed is None
        elif policy == "marconi":  # the selector follows what hcbench's selector follows
            assert cache.followed == ref["selector_followed"]
        else:
            assert cache.alpha is None and cache.followed is None
        seen[(policy, alpha)] = ours
    # Every policy decides differently on this trace (the run would be the same if the
    # argument were dropped and one scorer ran them all).
    distinct = {tuple(sorted(v.items())) for v in seen.values()}
    assert len(distinct) == len(POLICIES)


def test_policies_over_the_pool():
    """On the pool store the policy is the one asked for too: the same requests leave
    different caches behind, and the bytes they hold stay readable (the lifecycle of
    test_runtime on each)."""
    model = hybridcache.CostModel(tiny_spec())
    results = {}
    for policy, alpha, _ in POLICIES:
        c = hybridcache.PrefixCache(model, 512 << 10, granularity_bytes=32 << 10, policy=policy, alpha=alpha)
        assert c.store == "pool" and c.policy == policy
        rng = np.random.default_rng(3)
        bases = [rng.integers(1, 30000, int(n)) for n in rng.integers(20, 70, 6)]
        for i in range(60):  # conversations branching off a few shared prefixes
            b = bases[int(rng.integers(0, len(bases)))]
            run_request(c, np.concatenate([b, rng.integers(1, 30000, int(rng.integers(1, 40)))]), [int(i) + 1])
        k = c.counters
        assert k["evictions"] > 0 and c.in_flight == 0
        results[(policy, alpha)] = (k["tokens_skipped"], k["evictions"], k["checkpoints_admitted"], c.tokens_cached)
    # The seven fixed rules leave seven different caches (the selector may follow one of them).
    fixed = [v for (p, a), v in results.items() if not (p == "marconi" and a is None)]
    assert len(set(fixed)) == 7, results


def test_policy_arguments_are_checked():
    model = hybridcache.CostModel(tiny_spec())
    bad = [
        (InvalidArgument, dict(policy="fifo"), "fifo"),
        (InvalidArgument, dict(policy="marconi", alpha=-1.0), "alpha"),
        (InvalidArgument, dict(policy="marconi", alpha=float("nan")), "alpha"),
        (InvalidArgument, dict(policy="marconi", alpha=float("inf")), "alpha"),
        (InvalidArgument, dict(policy="sglang+", alpha=1.0), "alpha applies to policy='marconi'"),
        (InvalidArgument, dict(policy="gdsf", alpha="auto"), "alpha applies"),
        (TypeError, dict(policy="marconi", alpha="fast"), "alpha"),
        (TypeError, dict(policy="marconi", alpha=True), "alpha"),
        (TypeError, dict(policy=3), None),
        (InvalidArgument, dict(store="disk"), "store"),
        (InvalidArgument, dict(store="bytes", tokens_per_page=16), "tokens_per_page"),
        (InvalidArgument, dict(store="bytes", granularity_bytes=32 << 10, compaction=False), "granularity_bytes, compaction"),
        (InvalidArgument, dict(store="bytes", host_tier_bytes=1 << 20), "host_tier_bytes"),
        (InvalidArgument, dict(store="pool", tokens_per_page=0), "tokens_per_page"),
    ]
    for exc, kw, text in bad:
        kw.setdefault("granularity_bytes", None if kw.get("store") == "bytes" else 32 << 10)
        with pytest.raises(exc, match=text):
            hybridcache.PrefixCache(model, 256 << 10, **kw)
    with pytest.raises(InvalidArgument, match="smaller than one checkpoint"):
        hybridcache.PrefixCache(model, 1000, store="bytes")
    # alpha "auto" (hcbench's spelling) and None both give the selector.
    assert hybridcache.PrefixCache(model, 256 << 10, granularity_bytes=32 << 10, policy="marconi", alpha="auto").followed
    # A bytes store holds no memory: what reads it says so.
    c = hybridcache.PrefixCache(model, 256 << 10, store="bytes", policy="gdsf")
    t = c.begin(np.arange(1, 30), output_tokens=1)
    before = snapshot(c)
    for call in (lambda: c.kv_pages, lambda: c.block_table(t, 0), lambda: c.resume_checkpoint(t),
                 lambda: c.checkpoint_slot(t, 0), lambda: c.page_bytes, lambda: c.tokens_per_page):
        with pytest.raises(InvalidArgument, match="store='bytes'"):
            call()
    assert snapshot(c) == before
    c.finish(t, np.arange(1, 31), [30])
    assert c.peek(np.arange(1, 40)) == 30 and c.used_bytes > 0


def test_salts_isolate_tenants():
    """Requests with different salts never reuse each other's prefixes; the same salt does,
    and no salt is a namespace of its own."""
    model = hybridcache.CostModel(tiny_spec())
    for store in ("pool", "bytes"):
        kw = dict(granularity_bytes=32 << 10) if store == "pool" else {}
        c = hybridcache.PrefixCache(model, 256 << 10, store=store, **kw)
        prompt = np.arange(1, 41, dtype=np.int32)
        t = c.begin(prompt, output_tokens=2, salt=7)
        assert c.state(t)["salt"] == 7
        seq = np.concatenate([prompt, [5, 6]]).astype(np.int32)
        c.finish(t, seq, sorted(set(c.state(t)["sites"]) | {len(seq)}))
        longer = np.concatenate([seq, [9]]).astype(np.int32)
        assert c.peek(longer, salt=7) == len(seq)
        for other in (8, None, 2**64 - 1, 0):
            assert c.peek(longer, salt=other) == 0
            t = c.begin(longer, salt=other)
            st = c.state(t)
            assert st["reusable_tokens"] == 0 and st["kv_from"] == 0 and st["salt"] == other
            c.abort(t)
        t = c.begin(longer, salt=7)
        assert c.state(t)["reusable_tokens"] == len(seq)
        c.abort(t)
        # The same tokens in two namespaces are two copies.
        cached = c.tokens_cached
        t = c.begin(prompt, output_tokens=2, salt=8)
        c.finish(t, seq, [len(seq)])
        assert c.tokens_cached == 2 * cached
        assert c.peek(longer, salt=8) == len(seq) and c.peek(longer, salt=7) == len(seq) and c.peek(longer) == 0


def test_salts_isolate_the_host_tier():
    """A tenant's conversation demoted to the host tier loads back for that tenant only."""
    model = hybridcache.CostModel(tiny_spec())
    # A host tier large enough that nothing leaves it: only the salt can keep a tenant out.
    c = hybridcache.PrefixCache(model, capacity_bytes=256 << 10, granularity_bytes=32 << 10, host_tier_bytes=4 << 20)
    rng = np.random.default_rng(5)
    prompt = rng.integers(1, 30000, 60)
    t = c.begin(prompt, output_tokens=2, salt=1)
    first = np.concatenate([prompt, [7, 8]]).astype(np.int32)
    c.finish(t, first, sorted(set(c.state(t)["sites"]) | {len(first)}))
    for i in range(40):  # other conversations (no salt) push it out of the pool
        run_request(c, rng.integers(1, 30000, 90), [9])
        if c.counters["host_demotions"] > 0 and c.counters["evictions"] > 8:
            break
    assert c.counters["host_entries"] > 0
    cont = np.concatenate([first, [11, 12]]).astype(np.int32)
    loads = c.counters["host_loads"]
    for other in (2, None):
        t = c.begin(cont, output_tokens=1, salt=other)
        st = c.state(t)
        assert st["reusable_tokens"] == 0 and st["loaded_at"] == 0
        c.abort(t)
    assert c.counters["host_loads"] == loads
    t = c.begin(cont, output_tokens=1, salt=1)
    assert c.state(t)["loaded_at"] in (60, len(first)) and c.counters["host_loads"] == loads + 1
    c.abort(t)
    assert c.counters["host_evictions"] == 0


def test_bad_salts_change_nothing(cache):
    prompt = np.arange(1, 30, dtype=np.int32)
    t = cache.begin(prompt, salt=3)
    before = snapshot(cache)
    for salt, exc in ((-1, InvalidArgument), (2**64, InvalidArgument), ("tenant", TypeError), (True, TypeError),
                      (1.0, TypeError), (np.bool_(True), TypeError)):
        with pytest.raises(exc, match="salt"):
            cache.begin(prompt, salt=salt)
        with pytest.raises(exc, match="salt"):
            cache.peek(prompt, salt=salt)
    assert snapshot(cache) == before
    assert cache.peek(prompt, salt=np.uint64(3)) == 0  # a NumPy integer is an int
    cache.abort(t)
    with pytest.raises(HandleError):
        cache.state(t)


@pytest.fixture
def cache():
    return hybridcache.PrefixCache(hybridcache.CostModel(tiny_spec()), capacity_bytes=256 << 10, granularity_bytes=32 << 10)


def test_token_arrays_of_any_layout_read_alike(cache):
    """A contiguous int32 array (the fast path), a strided one, an int64 one and a list give the
    same lookup, and a negative id the same refusal, whichever way it comes."""
    seq = np.arange(1, 81, dtype=np.int32)
    t = cache.begin(seq[:40], output_tokens=40)
    cache.finish(t, seq, [80])
    wide = np.zeros(160, dtype=np.int32)
    wide[::2] = seq
    forms = [seq, wide[::2], seq.astype(np.int64), seq.astype(np.uint16), seq.tolist()]
    assert [cache.peek(f) for f in forms] == [80] * 5
    for bad in (np.array([3, -2], dtype=np.int32), np.array([3, 0, -2], dtype=np.int32)[::2], [3, -2]):
        with pytest.raises(InvalidArgument, match=r"prompt\[1\] = -2: expected a value in \[0, 2147483647\]"):
            cache.peek(bad)
