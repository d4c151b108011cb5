"""The runtime from Python: cost models, the prefix cache over a pool with the request
lifecycle, pool memory as NumPy arrays without a copy, and bad input that changes nothing."""
import shutil
import socket
import subprocess
import threading
import time

import numpy as np
import pytest

import hybridcache
from hybridcache import HandleError, InvalidArgument, OutOfCapacity


def tiny_spec():
    """examples/tiny_hybrid_runtime.cpp's model: 2 Gated DeltaNet + 2 attention layers, fp32."""
    s = hybridcache.ModelSpec()
    s.name = "tiny"
    s.layers = "RARA"
    s.d_model, s.attention_heads, s.kv_heads, s.head_dim = 64, 2, 1, 32
    s.recurrent = "gated_deltanet"
    s.gdn_key_heads = s.gdn_value_heads = 2
    s.gdn_key_dim = s.gdn_value_dim = 32
    s.kv_dtype_bytes = s.state_dtype_bytes = s.activation_dtype_bytes = 4
    s.scan_chunk = 16
    return s


@pytest.fixture
def cache():
    return hybridcache.PrefixCache(hybridcache.CostModel(tiny_spec()), capacity_bytes=256 << 10, granularity_bytes=32 << 10)


LOOKUP = ("matches", "hits", "tokens_matched", "tokens_skipped")


def snapshot(c, lookups=True):
    """What a refused call must leave as it was. begin's out_of_capacity still counts its lookup
    (docs/runtime.md's error contract: "nothing but the lookup's tick and recency")."""
    k = {n: v for n, v in c.counters.items() if lookups or n not in LOOKUP}
    return (k, c.in_flight, c.tokens_cached, c.checkpoints_cached)


def test_cost_models_and_presets():
    assert "jamba_1_5_mini" in hybridcache.preset_names()
    m = hybridcache.CostModel("marconi_7b")  # README: 26,787,840 B per checkpoint, 65,536 B of KV per token
    assert m.ssm_checkpoint_bytes == 26_787_840 and m.kv_bytes_per_token == 65_536
    assert hybridcache.CostModel("jamba_1_5_mini").ssm_checkpoint_bytes == 9_175_040  # docs/runtime.md
    assert m.prefill_flops(1000) > m.prefill_flops(100) > 0
    assert m.saved_flops(100, 1000) > 0
    spec = hybridcache.ModelSpec.preset("mamba2_2_7b") if "mamba2_2_7b" in hybridcache.preset_names() else m.spec
    assert spec.layers and set(spec.layers) <= set("ARM")
    with pytest.raises(InvalidArgument, match="no_such"):
        hybridcache.CostModel("no_such")
    with pytest.raises(InvalidArgument):
        m.prefill_flops(-1)
    bad = tiny_spec()
    bad.head_dim = 0
    with pytest.raises(InvalidArgument):
        hybridcache.CostModel(bad)
    with pytest.raises(InvalidArgument, match="recurrent"):
        bad.recurrent = "transformer"


def test_lifecycle_writes_and_reads_real_bytes(cache):
    P = cache.tokens_per_page
    assert P == 16 and cache.page_bytes == 16 * 256 and cache.block_bytes == 2 * 32 * 32 * 4
    pages = cache.kv_pages
    assert pages.dtype == np.uint8 and pages.shape[1] == cache.page_bytes
    prompt = np.arange(1, 41, dtype=np.int32)
    t = cache.begin(prompt, output_tokens=4)
    st = cache.state(t)
    assert st["reusable_tokens"] == 0 and st["kv_from"] == 0 and st["reserved_tokens"] == 44
    assert cache.resume_checkpoint(t) is None
    # Write every token's KV through the block table: token p's slot holds p + 1000 * layer.
    for layer in range(2):
        table = cache.block_table(t, layer)
        assert table.dtype == np.int64 and len(table) == 3  # 44 tokens in pages of 16
        view = pages.view(np.float32).reshape(len(pages), P, -1)
        for p in range(44):
            view[table[p // P], p % P, :] = p + 1000 * layer
    # Capture the planned sites and the end state into the reserved slots.
    sequence = np.concatenate([prompt, np.array([7, 8, 9, 10], dtype=np.int32)])
    captured = []
    for i, pos in enumerate(st["slots"]):
        pos = pos or len(sequence)
        for layer, block in enumerate(cache.checkpoint_slot(t, i)):
            block.view(np.float32)[:] = pos + 0.5 * layer
        captured.append(pos)
    r = cache.finish(t, sequence, sorted(set(captured)))
    assert r["checkpoints_kept"] >= 1 and cache.in_flight == 0
    # A continuation hits: the cached KV reads back through its block table, the state too.
    t2 = cache.begin(np.concatenate([sequence, np.array([11, 12], dtype=np.int32)]), output_tokens=2)
    st2 = cache.state(t2)
    assert st2["reusable_tokens"] == len(sequence)
    resume = cache.resume_checkpoint(t2)
    assert [b.view(np.float32)[0] for b in resume] == [len(sequence), len(sequence) + 0.5]
    view = cache.kv_pages.view(np.float32).reshape(len(pages), P, -1)
    for layer in range(2):
        table = cache.block_table(t2, layer)
        for p in range(st2["kv_from"]):
            assert view[table[p // P], p % P, 0] == p + 1000 * layer
    # The arrays are the pool's memory: a write through one is seen through the other.
    block = resume[0]
    assert np.shares_memory(block, cache.kv_pages) or block.__array_interface__["data"][0] >= pages.__array_interface__["data"][0]
    cache.abort(t2)
    assert cache.in_flight == 0


def snapshot_after_lookup(s):
    return ({n: v for n, v in s[0].items() if n not in LOOKUP},) + s[1:]


def test_bad_input_raises_and_changes_nothing(cache):
    t = cache.begin([1, 2, 3, 4, 5], output_tokens=2)
    before = snapshot(cache)
    cases = [
        (TypeError, lambda: cache.begin("abc")),
        (TypeError, lambda: cache.begin(np.array([1.0, 2.0]))),
        (TypeError, lambda: cache.begin([1, 2.5])),
        (InvalidArgument, lambda: cache.begin(np.ones((2, 2), dtype=np.int32))),
        (InvalidArgument, lambda: cache.begin([])),
        (InvalidArgument, lambda: cache.begin([1, -1])),
        (InvalidArgument, lambda: cache.begin([1, 2], output_tokens=-5)),
        (TypeError, lambda: cache.begin([1, 2], output_tokens="many")),
        (InvalidArgument, lambda: cache.begin([1, 2, 3], extra_checkpoints=[9])),
        (OutOfCapacity, lambda: cache.begin(list(range(1, 5000)))),
        (InvalidArgument, lambda: cache.block_table(t, 7)),
        (TypeError, lambda: cache.block_table("ticket", 0)),
        (InvalidArgument, lambda: cache.grow(t, -3)),
        (InvalidArgument, lambda: cache.checkpoint_slot(t, 99)),
        (InvalidArgument, lambda: cache.finish(t, [9, 9, 9, 9, 9], [5])),       # does not extend the prompt
        (InvalidArgument, lambda: cache.finish(t, [1, 2, 3, 4, 5, 6], [4])),    # 4 is no planned site
        (InvalidArgument, lambda: cache.finish(t, [1, 2, 3, 4, 5], [-1])),
        (TypeError, lambda: cache.finish(t, [1, 2, 3, 4, 5], np.array([5.0]))),
    ]
    for exc, call in cases:
        with pytest.raises(exc) as e:
            call()
        assert str(e.value), call
        if exc is OutOfCapacity:
            assert snapshot(cache, lookups=False) == snapshot_after_lookup(before), e.value
            before = snapshot(cache)
        else:
            assert snapshot(cache) == before, e.value
    # The library's own message, code attached.
    with pytest.raises(InvalidArgument) as e:
        cache.grow(t, -3)
    assert str(e.value) == "invalid_argument: grow: tokens must be > 0 (got -3)" and e.value.code == "invalid_argument"
    cache.finish(t, [1, 2, 3, 4, 5, 6], [6])
    # A stale ticket: ended by finish, then by abort; one of another cache; one ended by clear().
    for call in (lambda: cache.finish(t, [1, 2, 3, 4, 5, 6], [6]), lambda: cache.abort(t), lambda: cache.block_table(t, 0),
                 lambda: cache.state(t), lambda: cache.grow(t, 1)):
        with pytest.raises(HandleError) as e:
            call()
        assert e.value.code == "double_free"
    other = hybridcache.PrefixCache(cache.model, capacity_bytes=256 << 10, granularity_bytes=32 << 10)
    t3 = other.begin([4, 5, 6])
    with pytest.raises(HandleError) as e:
        cache.abort(t3)
    assert e.value.code == "foreign_handle" and other.in_flight == 1
    other.clear()
    with pytest.raises(HandleError) as e:
        other.abort(t3)
    assert e.value.code == "stale_handle"
    # Bad configurations build nothing.
    for kw in ({"capacity_bytes": -1}, {"capacity_bytes": 1 << 20, "tokens_per_page": 0},
               {"capacity_bytes": 1 << 20, "granularity_bytes": -4}, {"capacity_bytes": 1 << 20, "ssm_fraction": 1.5}, {"capacity_bytes": 100}):
        with pytest.raises((InvalidArgument, OutOfCapacity)):  # 100 B: smaller than one chunk per side
            hybridcache.PrefixCache(cache.model, **kw)


def test_arrays_keep_the_cache_alive():
    c = hybridcache.PrefixCache(hybridcache.CostModel(tiny_spec()), capacity_bytes=256 << 10, granularity_bytes=32 << 10)
    pages = c.kv_pages
    del c  # the array owns a reference: the pool's memory stays valid
    pages[:] = 7
    assert int(pages.sum()) == 7 * pages.size


def run_request(c, prompt, out):
    """A runtime's request: write token p's KV (p + 1000 * layer, and its token) from kv_from on
    and the state after each captured position (its length + 0.5 * layer); returns the sequence."""
    P = c.tokens_per_page
    t = c.begin(prompt, output_tokens=len(out))
    st = c.state(t)
    seq = np.concatenate([np.asarray(prompt, dtype=np.int32), np.asarray(out, dtype=np.int32)])
    view = c.kv_pages.view(np.float32).reshape(len(c.kv_pages), P, -1)
    for layer in range(2):
        table = c.block_table(t, layer)
        for p in range(st["kv_from"], len(seq)):
            view[table[p // P], p % P, 0] = p + 1000 * layer
            view[table[p // P], p % P, 1] = seq[p]
    captured = []
    for i, pos in enumerate(st["slots"]):
        pos = pos or len(seq)
        for layer, block in enumerate(c.checkpoint_slot(t, i)):
            block.view(np.float32)[:2] = (pos + 0.5 * layer, seq[:pos].sum())
        captured.append(pos)
    c.finish(t, seq, sorted(set(captured)))
    return seq



def assert_loaded_bytes(c, t, first, at):
    """Request `t` holds conversation `first`'s KV rows for [0, at) (as run_request wrote them)
    through its block tables, and the recurrent state after them as its resume checkpoint."""
    P = c.tokens_per_page
    view = c.kv_pages.view(np.float32).reshape(len(c.kv_pages), P, -1)
    for layer in range(2):
        table = c.block_table(t, layer)
        for p in range(at):
            assert view[table[p // P], p % P, 0] == p + 1000 * layer and view[table[p // P], p % P, 1] == first[p]
    resume = c.resume_checkpoint(t)
    assert [tuple(b.view(np.float32)[:2]) for b in resume] == [(at + 0.5 * r, first[:at].sum()) for r in range(2)]

def test_host_tier_brings_evicted_bytes_back():
    """What the pool evicts is demoted to the host tier; a continuation loads it back into its
    reservation: the same KV through the block table and the same state, as if never evicted."""
    model = hybridcache.CostModel(tiny_spec())
    with pytest.raises(InvalidArgument):  # too small for one checkpoint
        hybridcache.PrefixCache(model, capacity_bytes=256 << 10, granularity_bytes=32 << 10, host_tier_bytes=1024)
    with pytest.raises(InvalidArgument):
        hybridcache.PrefixCache(model, capacity_bytes=256 << 10, granularity_bytes=32 << 10, host_tier_bytes=-1)
    c = hybridcache.PrefixCache(model, capacity_bytes=256 << 10, granularity_bytes=32 << 10, host_tier_bytes=512 << 10)
    rng = np.random.default_rng(5)
    first = run_request(c, rng.integers(1, 30000, 60), [7, 8])
    for i in range(40):  # other conversations push it out of the pool
        run_request(c, rng.integers(1, 30000, 90), [9])
        if c.counters["host_demotions"] > 0 and c.counters["evictions"] > 8:
            break
    k = c.counters
    assert k["host_demotions"] > 0 and k["host_entries"] > 0
    # The host tier's memory, read-only and not a copy (two reads see one buffer; it changes
    # under the view as the cache demotes), holding what was demoted.
    host = c.host_memory
    assert host.dtype == np.uint8 and host.ndim == 1 and host.nbytes >= 256 << 10 and not host.flags.writeable
    assert host.__array_interface__["data"][0] == c.host_memory.__array_interface__["data"][0]
    with pytest.raises(ValueError):
        host[0] = 1
    held = host.copy()
    prompt = np.concatenate([first, np.array([11, 12], dtype=np.int32)])
    t = c.begin(prompt, output_tokens=1)
    st = c.state(t)
    assert st["reusable_tokens"] == 0  # nothing of it left in the pool
    # Loaded up to the deepest state the conversation kept (its prompt's end, or its end).
    at = st["loaded_at"]
    assert at in (60, len(first)) and st["prefill_start"] == at
    # Every KV row it loaded was in the host tier's memory before the load: (p + 1000 * layer, token).
    floats = held.view(np.float32)
    pairs = set(zip(floats[:-1].tolist(), floats[1:].tolist()))
    assert all((float(p + 1000 * layer), float(first[p])) in pairs for layer in range(2) for p in range(at))
    assert c.counters["host_loads"] == 1 and c.counters["host_tokens_loaded"] == at
    assert_loaded_bytes(c, t, first, at)
    c.abort(t)
    # Without a host tier the same run recomputes it: no host counters move.
    plain = hybridcache.PrefixCache(model, capacity_bytes=256 << 10, granularity_bytes=32 << 10)
    run_request(plain, np.arange(1, 50), [3])
    assert all(plain.counters[n] == 0 for n in ("host_demotions", "host_loads", "host_entries"))
    assert plain.host_memory.size == 0
    with pytest.raises(InvalidArgument):  # a bytes-only store holds no memory
        hybridcache.PrefixCache(model, capacity_bytes=256 << 10, store="bytes").host_memory


def test_disk_tier_below_the_host_tier(tmp_path):
    """A host tier too small for the conversations moves its victims down to a disk tier; a
    continuation brings them back and reads the same KV and state, as if never evicted."""
    model = hybridcache.CostModel(tiny_spec())
    base = dict(capacity_bytes=256 << 10, granularity_bytes=32 << 10)
    for bad in (dict(disk_tier_dir=str(tmp_path / "a")),                                  # no size
                dict(host_tier_bytes=128 << 10, disk_tier_dir=str(tmp_path / "b"), disk_tier_bytes=0),
                dict(disk_tier_dir=str(tmp_path / "c"), disk_tier_bytes=1 << 20),          # no host tier
                dict(host_tier_bytes=128 << 10, disk_tier_dir="", disk_tier_bytes=1 << 20)):
        with pytest.raises(InvalidArgument):
            hybridcache.PrefixCache(model, **base, **bad)
    with pytest.raises(InvalidArgument):  # the pool's arguments with a bytes store
        hybridcache.PrefixCache(model, 1 << 20, store="bytes", disk_tier_dir=str(tmp_path / "d"), disk_tier_bytes=1 << 20)
    c = hybridcache.PrefixCache(model, **base, host_tier_bytes=128 << 10, disk_tier_dir=str(tmp_path / "disk"),
                                disk_tier_bytes=8 << 20)
    push_down_and_bring_back(c)
    assert any(f.suffix == ".hcv" for f in (tmp_path / "disk").rglob("*"))


def push_down_and_bring_back(c):
    """Pushes a conversation out of the pool, then out of `c`'s host tier into the storage tier
    below it; continues it: brought back up, loaded, its KV and state as written."""
    rng = np.random.default_rng(5)
    first = run_request(c, rng.integers(1, 30000, 60), [7, 8])
    for i in range(80):  # other conversations push it out of the pool, then out of the host tier
        run_request(c, rng.integers(1, 30000, 90), [9])
        if c.counters["host_moved_down"] > 12:
            break
    k = c.counters
    assert k["host_demotions"] > 0 and k["host_moved_down"] > 0 and k["host_storage_dropped"] == 0
    prompt = np.concatenate([first, np.array([11, 12], dtype=np.int32)])
    t = c.begin(prompt, output_tokens=1)
    st = c.state(t)
    at = st["loaded_at"]
    assert st["reusable_tokens"] == 0 and at in (60, len(first)) and st["prefill_start"] == at
    assert c.counters["host_brought_up"] > 0 and c.counters["host_loads"] == k["host_loads"] + 1
    assert_loaded_bytes(c, t, first, at)
    c.abort(t)
    return first


def redis_command(port, *args):
    """One command to the redis-server on 127.0.0.1:port (RESP over a socket); its reply line."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"".join([f"*{len(args)}\r\n".encode()] + [f"${len(a)}\r\n{a}\r\n".encode() for a in args]))
        return s.recv(4096).split(b"\r\n")[0].decode()


def test_redis_tier_below_the_host_tier(tmp_path):
    """The same through a Redis tier (a redis-server started here on loopback): victims move
    down into it and come back; a second cache on the same server sees none of them (each
    cache keys its values by its own random salt); bad endpoints are refused."""
    model = hybridcache.CostModel(tiny_spec())
    base = dict(capacity_bytes=256 << 10, granularity_bytes=32 << 10)
    for bad in (dict(host_tier_bytes=128 << 10, redis_tier="localhost", redis_tier_bytes=1 << 20),      # no port
                dict(host_tier_bytes=128 << 10, redis_tier="127.0.0.1:0", redis_tier_bytes=1 << 20),
                dict(host_tier_bytes=128 << 10, redis_tier="127.0.0.1:6379", redis_tier_bytes=0),
                dict(host_tier_bytes=128 << 10, redis_tier="127.0.0.1:6379"),                            # no size
                dict(redis_tier="127.0.0.1:6379", redis_tier_bytes=1 << 20)):                           # no host tier
        with pytest.raises(InvalidArgument):
            hybridcache.PrefixCache(model, **base, **bad)
    if not hybridcache.has_redis_tier:
        pytest.skip("this build has no Redis tier (hiredis)")
    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("redis-server is not installed (Debian redis-server)")
    with socket.socket() as s:  # a free loopback port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(hybridcache.Error, match=f"127.0.0.1:{port}"):  # nothing listens there yet
        hybridcache.PrefixCache(model, **base, host_tier_bytes=128 << 10, redis_tier=f"127.0.0.1:{port}", redis_tier_bytes=8 << 20)
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                if redis_command(port, "PING") == "+PONG":
                    break
            except OSError:
                time.sleep(0.05)
        tiers = dict(host_tier_bytes=128 << 10, redis_tier=f"127.0.0.1:{port}", redis_tier_bytes=8 << 20)
        c = hybridcache.PrefixCache(model, **base, **tiers)
        first = push_down_and_bring_back(c)
        assert int(redis_command(port, "DBSIZE")[1:]) > 0
        other = hybridcache.PrefixCache(model, **base, **tiers)
        t = other.begin(np.concatenate([first, np.array([11, 12], dtype=np.int32)]), output_tokens=1)
        assert other.state(t)["reusable_tokens"] == 0 and other.state(t)["loaded_at"] == 0
        assert other.counters["host_brought_up"] == 0
        other.abort(t)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_memory_read_lock_holds_back_the_calls_that_move_memory():
    """Inside `with cache.memory_read_lock():` another thread's begin waits for the block to end
    (its arrays stay where they are); the same thread's grow raises instead of deadlocking."""
    model = hybridcache.CostModel(tiny_spec())
    c = hybridcache.PrefixCache(model, capacity_bytes=256 << 10, granularity_bytes=32 << 10, compaction=True)
    rng = np.random.default_rng(11)
    t = c.begin(rng.integers(1, 30000, 40), output_tokens=2)
    events, entered = [], threading.Event()

    def other_thread():
        entered.wait(5)
        events.append("begin called")
        t2 = c.begin(rng.integers(1, 30000, 30), output_tokens=1)
        events.append("begin returned")
        c.abort(t2)

    worker = threading.Thread(target=other_thread)
    worker.start()
    with c.memory_read_lock() as lock:
        assert lock.held
        table = c.block_table(t, 0)  # reads are allowed inside
        assert c.state(t)["prompt_tokens"] == 40 and len(table) > 0
        with c.memory_read_lock():  # a second lock object on the same thread: counted, no wait
            pass
        with pytest.raises(InvalidArgument, match="memory_read_lock"):
            c.grow(t, 4)
        with pytest.raises(InvalidArgument, match="already entered"):
            lock.__enter__()
        entered.set()
        time.sleep(0.3)  # the other thread's begin is waiting now
        events.append("block ends")
    worker.join(10)
    assert not worker.is_alive()
    assert events == ["begin called", "block ends", "begin returned"]
    assert not lock.held
    c.grow(t, 4)  # outside the block the same call goes through
    # Left by another thread than the one that entered: refused (the lock stays held), then left.
    lock2 = c.memory_read_lock()
    lock2.__enter__()
    errors = []
    leaver = threading.Thread(target=lambda: errors.append(pytest.raises(InvalidArgument, lock2.__exit__, None, None, None)))
    leaver.start()
    leaver.join(5)
    assert len(errors) == 1 and lock2.held
    lock2.__exit__(None, None, None)
    c.abort(t)
    assert c.in_flight == 0
