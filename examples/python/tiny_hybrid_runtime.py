#!/usr/bin/env python3
"""The request lifecycle end to end from Python: a NumPy port of examples/tiny_hybrid_runtime.cpp.

A tiny hybrid model (2 Gated DeltaNet + 2 attention layers, fp32, seeded random weights,
greedy decoding, the embedding tied as the output head) is served through
``hybridcache.PrefixCache``, whose pool holds the real bytes:

    t = cache.begin(prompt, output_tokens=4)      match + pin, plan, reserve KV and slots
    cache.resume_checkpoint(t)                    the GDN states to resume from (None: a miss)
    cache.block_table(t, layer)                   token p's K and V live in row table[p // 16]
                                                  of cache.kv_pages, slot p % 16
    prefill [prefill_start, |prompt|)             states at state(t)["sites"] copied into the
                                                  reserved slots (cache.checkpoint_slot)
    decode; cache.grow(t, 2) past the reservation, then the block tables again
    end state -> end slot; cache.finish(t, sequence, sites + [len(sequence)])

Every request is also run with no cache (token 0 onwards, a flat KV array, zero states). Both
runs compute every token the same way (the recurrent form of the GDN layer, attention over the
KV read back), so the outputs and every logit vector must be bit-identical; the run fails
otherwise. (The C++ example prefills in the chunkwise form, whose sums are ordered differently
from the recurrent form its decode uses, and so checks logits to 1e-5 instead.)

Workload: branching multi-turn conversations over one shared system prompt, up to 4 requests
in flight, a 1 MiB pool (32 KiB chunks) small enough that the cache evicts.

    PYTHONPATH=build/tests/python python3 examples/python/tiny_hybrid_runtime.py [--requests N]

Prints a detail line and
    identical outputs: N/N requests; reused R% of prompt tokens; evictions E
Exit status 1 unless every request matched, the cache evicted, and no page is left at the end.
"""
import argparse
import random
import sys
import time

import numpy as np

import hybridcache

VOCAB, D = 256, 64
HEADS, KV_HEADS, HEAD_DIM = 2, 1, 32          # attention (GQA 2:1)
GDN_HEADS, DK, DV = 2, 32, 32                 # Gated DeltaNet heads and dims
LAYERS = "RARA"                               # G A G A
P = 16                                        # tokens per KV page
SLOT = 2 * KV_HEADS * HEAD_DIM                # floats of one token of one layer: K then V
RESERVED_OUTPUT = 4
MAX_IN_FLIGHT = 4
F32 = np.float32


def spec():
    s = hybridcache.ModelSpec()
    s.name, s.source = "tiny_hybrid_runtime", "examples/python/tiny_hybrid_runtime.py"
    s.layers = LAYERS
    s.d_model, s.attention_heads, s.kv_heads, s.head_dim = D, HEADS, KV_HEADS, HEAD_DIM
    s.recurrent = "gated_deltanet"
    s.gdn_key_heads = s.gdn_value_heads = GDN_HEADS
    s.gdn_key_dim, s.gdn_value_dim = DK, DV
    s.kv_dtype_bytes = s.state_dtype_bytes = s.activation_dtype_bytes = 4
    s.scan_chunk = 16
    return s


class Model:
    """Seeded random weights (magnitudes in [0.1, 1) x scale, random signs, never zero)."""

    def __init__(self, seed):
        rng = np.random.default_rng(seed)

        def w(rows, cols, scale):
            m = (0.1 + 0.9 * rng.random((rows, cols))) * scale
            return np.where(rng.random((rows, cols)) < 0.5, -m, m).astype(F32)

        self.embed = w(VOCAB, D, 1.0)
        self.final_norm = w(1, D, 1.0)[0]
        s = 1.0 / np.sqrt(D)
        self.layers = []
        for kind in LAYERS:
            if kind == "A":
                self.layers.append(dict(norm=w(1, D, 1.0)[0], wq=w(D, HEADS * HEAD_DIM, s), wk=w(D, KV_HEADS * HEAD_DIM, s),
                                        wv=w(D, KV_HEADS * HEAD_DIM, s),
                                        wo=w(HEADS * HEAD_DIM, D, 0.5 / np.sqrt(HEADS * HEAD_DIM))))
            else:
                self.layers.append(dict(norm=w(1, D, 1.0)[0], wq=w(D, GDN_HEADS * DK, s), wk=w(D, GDN_HEADS * DK, s),
                                        wv=w(D, GDN_HEADS * DV, s), wa=w(D, GDN_HEADS, s), wb=w(D, GDN_HEADS, s),
                                        a_log=w(1, GDN_HEADS, 1.0)[0], dt_bias=w(1, GDN_HEADS, 1.0)[0],
                                        wo=w(GDN_HEADS * DV, D, 0.5 / np.sqrt(GDN_HEADS * DV))))


def rms_norm(x, g):
    return (x / np.sqrt(np.mean(x * x, dtype=F32) + F32(1e-6)) * g).astype(F32)


def l2norm(x):
    return (x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + F32(1e-6))).astype(F32)


def step(m, token, pos, kv, states):
    """One token through the model at position `pos`: the recurrent GDN update of `states`
    (list of [heads, dk, dv] float32), attention over kv.read(layer, 0..pos) after
    kv.write(layer, pos, k, v). Returns the logits."""
    x = m.embed[token].copy()
    attn, gdn = 0, 0
    for kind, w in zip(LAYERS, m.layers):
        h = rms_norm(x, w["norm"])
        if kind == "A":
            q = (h @ w["wq"]).reshape(HEADS, HEAD_DIM)
            kv.write(attn, pos, np.concatenate([h @ w["wk"], h @ w["wv"]]))
            slots = kv.read(attn, pos + 1)                     # [pos + 1, SLOT]
            keys, values = slots[:, :HEAD_DIM], slots[:, HEAD_DIM:]
            out = np.empty((HEADS, HEAD_DIM), F32)
            for hd in range(HEADS):                            # both query heads share the one KV head
                scores = (keys @ q[hd]) * F32(1 / np.sqrt(HEAD_DIM))
                p = np.exp(scores - scores.max())
                out[hd] = (p / p.sum()) @ values
            x = (x + out.reshape(-1) @ w["wo"]).astype(F32)
            attn += 1
        else:
            q = l2norm((h @ w["wq"]).reshape(GDN_HEADS, DK))
            k = l2norm((h @ w["wk"]).reshape(GDN_HEADS, DK))
            v = (h @ w["wv"]).reshape(GDN_HEADS, DV)
            g = -np.exp(w["a_log"]) * np.logaddexp(F32(0), h @ w["wa"] + w["dt_bias"])   # log decay, Qwen3-Next gating
            beta = F32(1) / (F32(1) + np.exp(-(h @ w["wb"])))
            S = states[gdn]
            S *= np.exp(g).astype(F32)[:, None, None]
            pred = np.einsum("hk,hkv->hv", k, S)
            S += beta[:, None, None] * np.einsum("hk,hv->hkv", k, v - pred)
            out = np.einsum("hk,hkv->hv", q, S) * F32(1 / np.sqrt(DK))
            x = (x + out.reshape(-1).astype(F32) @ w["wo"]).astype(F32)
            gdn += 1
    return rms_norm(x, m.final_norm) @ m.embed.T


class FlatKV:
    """The uncached run's KV: one array per attention layer."""

    def __init__(self):
        self.kv = [np.zeros((0, SLOT), F32) for _ in range(2)]

    def write(self, layer, pos, slot):
        assert pos == len(self.kv[layer])
        self.kv[layer] = np.vstack([self.kv[layer], slot[None, :]])

    def read(self, layer, n):
        return self.kv[layer][:n]


class PagedKV:
    """The cached run's KV: rows of cache.kv_pages through the block tables. Positions before
    `write_from` belong to the tree (shared with other requests): read, never written."""

    def __init__(self, cache, ticket, write_from):
        self.cache, self.ticket, self.write_from = cache, ticket, write_from
        self.pages = cache.kv_pages.view(F32).reshape(len(cache.kv_pages), P, SLOT)
        self.load_tables()

    def load_tables(self):
        self.tables = [self.cache.block_table(self.ticket, layer) for layer in range(2)]

    def write(self, layer, pos, slot):
        if pos >= self.write_from:
            self.pages[self.tables[layer][pos // P], pos % P] = slot

    def read(self, layer, n):
        pos = np.arange(n)
        return self.pages[self.tables[layer][pos // P], pos % P]


def argmax(logits):
    return int(np.argmax(logits))


def run_uncached(m, prompt, decode):
    kv, states = FlatKV(), [np.zeros((GDN_HEADS, DK, DV), F32) for _ in range(2)]
    seq, logits_all = list(prompt), []
    for p in range(len(seq)):
        logits = step(m, seq[p], p, kv, states)
    logits_all.append(logits)
    for _ in range(decode):
        seq.append(argmax(logits))
        logits = step(m, seq[-1], len(seq) - 1, kv, states)
        logits_all.append(logits)
    return seq[len(prompt):], logits_all


def serve(m, cache, t, prompt, decode):
    """Prefill from the resumed state, greedy decode, capture, finish. None when a grow is
    refused (the request is aborted and retried later)."""
    st = cache.state(t)
    start, n = st["prefill_start"], len(prompt)
    if start >= n:
        raise RuntimeError("a whole-prompt hit leaves no token to compute logits from")
    resume = cache.resume_checkpoint(t)
    states = [np.zeros((GDN_HEADS, DK, DV), F32) if resume is None else
              resume[layer].view(F32).reshape(GDN_HEADS, DK, DV).copy() for layer in range(2)]
    kv = PagedKV(cache, t, st["kv_from"])
    sites = st["sites"]
    seq, logits_all = list(prompt), []
    for p in range(start, n):
        logits = step(m, seq[p], p, kv, states)
        if p + 1 in sites:  # the state after p + 1 tokens into its reserved slot
            for layer, block in enumerate(cache.checkpoint_slot(t, sites.index(p + 1))):
                block.view(F32)[:] = states[layer].reshape(-1)
    logits_all.append(logits)
    for _ in range(decode):
        seq.append(argmax(logits))
        p = len(seq) - 1
        st = cache.state(t)
        if p >= st["kv_from"] + st["reserved_tokens"]:
            try:
                cache.grow(t, 2)
            except hybridcache.OutOfCapacity:
                cache.abort(t)
                return None
            kv.load_tables()
        logits = step(m, seq[p], p, kv, states)
        logits_all.append(logits)
    for layer, block in enumerate(cache.checkpoint_slot(t, len(sites))):  # the end slot, after the sites
        block.view(F32)[:] = states[layer].reshape(-1)
    cache.finish(t, np.asarray(seq, dtype=np.int32), sites + [len(seq)])
    return seq[n:], logits_all


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=400)
    a = ap.parse_args()
    t0 = time.perf_counter()
    model = Model(0x5EED74174B1D)
    cache = hybridcache.PrefixCache(hybridcache.CostModel(spec()), capacity_bytes=1 << 20, granularity_bytes=32 << 10)
    assert cache.page_bytes == P * SLOT * 4 and cache.block_bytes == GDN_HEADS * DK * DV * 4

    wl = random.Random(42)
    words = lambda n: [wl.randrange(VOCAB) for _ in range(n)]
    system_prompt = words(40)
    sessions = []  # [history, turn_ends]

    def make_request():
        decode = 3 + wl.randrange(6)  # 3..8 tokens: many pass the 4 reserved and grow
        u, session, branch = wl.random(), -1, False
        prompt = list(system_prompt)
        if sessions and u >= 0.15:
            n = len(sessions)
            session = n - 1 - wl.randrange(min(n, 6)) if wl.random() < 0.8 else wl.randrange(n)
            history, ends = sessions[session]
            cut = len(history)
            if u < 0.35 and len(ends) > 1:
                branch, cut = True, ends[wl.randrange(len(ends) - 1)]
            if cut > 220:
                session, branch = -1, False
            else:
                prompt = history[:cut]
        return dict(prompt=prompt + words(8 + wl.randrange(25)), decode=decode, session=session, branch=branch)

    served = identical = misses = grows_refused = 0
    prompt_tokens = reused = 0
    pending = []
    while served < a.requests:
        batch = []
        while len(batch) < MAX_IN_FLIGHT and served + len(batch) < a.requests:
            r = pending.pop() if pending else make_request()
            try:
                t = cache.begin(np.asarray(r["prompt"], dtype=np.int32), output_tokens=RESERVED_OUTPUT)
            except hybridcache.OutOfCapacity as e:
                if not batch:
                    print(f"begin refused with nothing in flight: {e}")
                    return 1
                pending.append(r)
                break
            batch.append((t, r))
        for t, r in batch:
            st = cache.state(t)
            result = serve(model, cache, t, r["prompt"], r["decode"])
            if result is None:
                grows_refused += 1
                pending.append(r)
                continue
            output, logits = result
            want_output, want_logits = run_uncached(model, r["prompt"], r["decode"])
            same = output == want_output and all(np.array_equal(x, y) for x, y in zip(logits, want_logits))
            identical += same
            if not same:
                print(f"request {served}: outputs differ (cached {output}, uncached {want_output})")
            misses += st["reusable_tokens"] == 0
            prompt_tokens += len(r["prompt"])
            reused += st["prefill_start"]
            served += 1
            seq = r["prompt"] + output
            if r["session"] < 0 or r["branch"]:
                sessions.append([seq, [len(seq)]])
            else:
                sessions[r["session"]] = [seq, sessions[r["session"]][1] + [len(seq)]]
    counters = cache.counters
    cache.clear()
    left = cache.counters["kv_pages_used"] + cache.counters["blocks_used"]
    print(f"details: {misses} misses, {grows_refused} grows refused and retried, {counters['pool_rebalances']} rebalances, "
          f"{left} pool units left, {time.perf_counter() - t0:.1f} s")
    print(f"identical outputs: {identical}/{served} requests; reused {100.0 * reused / prompt_tokens:.1f}% of prompt tokens; "
          f"evictions {counters['evictions']}")
    return 0 if identical == served and counters["evictions"] > 0 and left == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
