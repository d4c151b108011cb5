// The one multi-tier cache under concurrent requests (issue #15): several runtime threads
// run requests through `request_lifecycle` over a `prefix_cache<..., mutex_lock>` whose
// store is `tiered_state_store<lru_demotion, host_copy_engine>`, while a
// `tiered_offloader` thread completes copies and runs the watermark cleaner, and the
// engine's fault hook makes some copies fail.
//
// Each request does what a runtime does: begin (a lower-tier hit is loaded), wait for the
// load without holding the cache's lock, look up its pages under the lock, then, without
// the lock, check that every byte it reads (the HBM path, the resume state, the loaded
// KV and state) is the right token prefix's, write what its prefill computes into its
// reservation, and finish. Another thread's finish must never move or free pages a request
// in flight is reading (a settle once exchanged pages with any node covering the loaded
// tokens). After the run, every node of the tree holds its own tokens' bytes and every
// store invariant holds. Runs under TSan (label `concurrency`).
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "hybridcache/prefix/lifecycle.hpp"
#include "hybridcache/prefix/lock_policy.hpp"
#include "hybridcache/prefix/prefix_cache.hpp"
#include "hybridcache/stores/tiered_offloader.hpp"

#include "tiered_bytes_support.hpp"

using namespace hybridcache;
using hybridcache::token_id;

namespace {
using namespace hybridcache::test::tiered_bytes;

using cache_t =
    prefix::prefix_cache<cost_model, prefix::judicious_admission, prefix::lru_scorer, store_t, prefix::mutex_lock>;
using lifecycle_t = prefix::request_lifecycle<cache_t>;

/// Bytes a request reads: tokens [begin, end) of KV, or the state after `end`.
struct read_span {
  std::vector<std::uint32_t> pages;
  std::int64_t begin = 0, end = 0;
  bool checkpoint = false;
  const char* source = "";  // for the failure message: a staged entry or a path node
  std::int64_t id = -1;
};

/// The HBM pages of an entry (called under the cache's lock).
std::vector<std::uint32_t> hbm_pages(const store_t& st, entry_id id) {
  const auto e = st.table().find(id);
  if (!e) return {};
  const tier_copy* c = e->in(hbm_tier);
  return c == nullptr ? std::vector<std::uint32_t>{} : bytes_view::pages_of(c->pages);
}

struct shared_run {
  std::mutex mu;
  std::vector<std::vector<token_id>> committed;  // sequences to branch from
  std::string first_error;
  std::atomic<std::int64_t> errors{0}, finished{0}, aborted{0}, refused{0}, host_hits{0}, failed_loads{0},
      bytes_checked{0};
  void fail(const std::string& what) {
    if (errors.fetch_add(1) == 0) {
      std::lock_guard l(mu);
      first_error = what;
    }
  }
};

/// A request's state, for a failure message.
template <class State>
std::string describe(const State& s) {
  return "common prefix " + std::to_string(s.match.common_prefix) + ", reusable " +
         std::to_string(s.match.reusable_tokens) + ", kv_from " + std::to_string(s.kv_from) + ", reserved " +
         std::to_string(s.reserved_tokens) + ", loaded_at " + std::to_string(s.loaded_at) + ", prefill from " +
         std::to_string(s.plan.prefill_start) + (s.kv_pin.is_null() ? "" : ", KV-only tail pinned");
}

struct concurrency_stats {
  std::int64_t finished = 0, host_hits = 0, failed_loads = 0, copy_failures = 0, write_backs = 0, replicas = 0,
               cleaned_bytes = 0, passes = 0, bytes_checked = 0;
};

concurrency_stats run_concurrent(std::uint64_t seed, stores::write_policy write, int threads, int requests_each) {
  const std::int64_t kv = tiny().kv_bytes_per_token(), ck = tiny().ssm_checkpoint_bytes();
  const std::int64_t hbm = 600 * kv + 12 * ck;
  const stores::tiered_state_store_config cfg{.capacity_bytes = hbm,
                                              .host_capacity_bytes = 2500 * kv + 40 * ck,
                                              .kv_bytes_per_token = kv,
                                              .checkpoint_bytes = ck,
                                              .staging_bytes = hbm,
                                              .write = write,
                                              .offload = {.high = 0.7, .low = 0.5}};
  engine_t engine(store_t::tiers_for(cfg), store_t::page_bytes_for(cfg), {.measure_bandwidth = false});
  std::atomic<std::int64_t> spans{0};
  engine.set_fault_hook([&](const tiered::copy_span&) { return spans.fetch_add(1) % 61 == 60; });
  cache_t c(tiny(), store_t(cfg, engine), prefix::lru_scorer{});
  lifecycle_t requests(c);
  stores::tiered_offloader<cache_t> offloader(c);
  offloader.start(std::chrono::microseconds(200));

  std::vector<std::vector<token_id>> roots;
  {
    std::mt19937_64 rng(seed);
    for (int i = 0; i < 4; ++i) {
      std::vector<token_id> r(static_cast<std::size_t>(20 + rng() % 100));
      for (auto& t : r) t = static_cast<token_id>(rng() % 3);
      roots.push_back(std::move(r));
    }
  }
  shared_run run;
  std::byte* const hbm_base = engine.base(hbm_tier);
  const std::int64_t page = c.store().page_bytes();
  auto byte_at = [&](const std::vector<std::uint32_t>& pages, std::int64_t i) -> std::byte& {
    return hbm_base[static_cast<std::int64_t>(pages[static_cast<std::size_t>(i / page)]) * page + i % page];
  };

  auto runtime_thread = [&](std::uint64_t thread_seed) {
    std::mt19937_64 rng(thread_seed);
    std::vector<read_span> reads;
    std::vector<std::uint32_t> reservation;
    std::vector<std::pair<std::int64_t, std::vector<std::uint32_t>>> state_slots;
    for (int step = 0; step < requests_each && run.errors.load() == 0; ++step) {
      std::vector<token_id> prompt;
      {
        std::lock_guard l(run.mu);
        if (!run.committed.empty() && rng() % 4 != 0) {
          const auto& base = run.committed[rng() % run.committed.size()];
          prompt.assign(base.begin(),
                        base.begin() + static_cast<std::ptrdiff_t>(1 + rng() % std::min<std::size_t>(base.size(), 120)));
        }
      }
      if (prompt.empty()) prompt = roots[rng() % roots.size()];
      const auto more = 1 + rng() % 60;
      for (std::size_t k = 0; k < more; ++k) prompt.push_back(static_cast<token_id>(rng() % 3));
      std::vector<token_id> seq = prompt;
      const auto out = static_cast<std::int64_t>(rng() % 20);
      for (std::int64_t k = 0; k < out; ++k) seq.push_back(static_cast<token_id>(rng() % 5));
      const auto len = static_cast<std::int64_t>(seq.size());
      const pattern p(seq);

      auto t = requests.begin(prompt, {.output_tokens = out});
      if (!t) {
        if (t.error() != errc::out_of_capacity) run.fail("begin: " + std::string(to_string(t.error())));
        run.refused += 1;
        std::this_thread::yield();
        continue;
      }
      const auto* s = *requests.state(*t);
      if (s->loaded_at > 0) {
        if (const auto w = requests.wait_loaded(*t); !w) {  // an injected copy failure: the hit is gone
          if (w.error() != errc::busy) run.fail("wait_loaded: " + std::string(to_string(w.error())));
          run.failed_loads += 1;
          (void)requests.abort(*t);
          continue;
        }
        run.host_hits += 1;
      }
      // Where the bytes are, under the cache's lock.
      reads.clear();
      state_slots.clear();
      reservation.clear();
      c.with_store([&](store_t& st) {
        if (!s->kv.empty()) reservation = hbm_pages(st, s->kv[0].id);
        for (const auto& slot : s->checkpoints)
          state_slots.emplace_back(slot.position == 0 ? len : slot.position, hbm_pages(st, slot.handle.id));
        for (const auto& x : st.staged(s->host_hit))
          reads.push_back({hbm_pages(st, x.id), x.begin, x.end, x.checkpoint, "staged entry", static_cast<std::int64_t>(x.id)});
        const auto& tree = c.tree();
        const std::int64_t hbm_reach = s->match.reusable_tokens;
        for (node_id n = s->match.node; n != no_node && n != cache_t::tree_type::root();
             n = tree.at(n).parent) {
          const auto& nd = tree.at(n);
          if (nd.kv.id != no_entry && nd.begin() < hbm_reach)
            reads.push_back({hbm_pages(st, nd.kv.id), nd.begin(), std::min(nd.end, hbm_reach), false, "path node", static_cast<std::int64_t>(n)});
        }
        if (s->loaded_at == 0 && s->match.node != no_node && hbm_reach > 0) {
          const auto& nd = tree.at(s->match.node);
          if (nd.has_checkpoint) reads.push_back({hbm_pages(st, nd.checkpoint.id), nd.end, nd.end, true});
        }
      });
      // Prefill reads (without the lock; other requests run meanwhile) ...
      for (const auto& r : reads) {
        if (r.pages.empty()) {
          run.fail("an entry a request reads has no HBM copy");
          continue;
        }
        if (r.checkpoint) {
          for (std::int64_t j = 0; j < ck; ++j)
            if (byte_at(r.pages, j) != p.state(r.end, j)) {
              run.fail("a state read at " + std::to_string(r.end) + " holds another prefix's bytes");
              break;
            }
          run.bytes_checked += ck;
          continue;
        }
        // The KV entry starts at r.begin for staged entries; a node's entry at its begin.
        for (std::int64_t tok = r.begin; tok < r.end; ++tok)
          for (std::int64_t j = 0; j < kv; ++j)
            if (byte_at(r.pages, (tok - r.begin) * kv + j) != p.kv(tok, j)) {
              run.fail("KV of token " + std::to_string(tok) + " read by a request is another token's (" + r.source + " " +
                       std::to_string(r.id) + " [" + std::to_string(r.begin) + ", " + std::to_string(r.end) + "); " +
                       describe(*s) + ")");
              tok = r.end;
              break;
            }
        run.bytes_checked += (r.end - r.begin) * kv;
      }
      // ... and writes what it computes: KV from where prefill starts, the planned states.
      if (!reservation.empty())
        for (std::int64_t pos = std::max(s->plan.prefill_start, s->kv_from); pos < len; ++pos)
          for (std::int64_t j = 0; j < kv; ++j) byte_at(reservation, (pos - s->kv_from) * kv + j) = p.kv(pos, j);
      for (const auto& [at, pages] : state_slots) {
        if (s->loaded_at > 0 && at == s->loaded_at) continue;  // loaded, not computed
        for (std::int64_t j = 0; j < ck; ++j) byte_at(pages, j) = p.state(at, j);
      }
      std::this_thread::yield();  // decode: other requests begin and finish meanwhile
      if (rng() % 10 == 0) {
        (void)requests.abort(*t);
        run.aborted += 1;
        continue;
      }
      std::vector<std::int64_t> captured;
      for (const auto& site : s->plan.sites) captured.push_back(site.position);
      if (len > s->match.reusable_tokens) captured.push_back(len);  // a full hit computed nothing
      std::sort(captured.begin(), captured.end());
      captured.erase(std::unique(captured.begin(), captured.end()), captured.end());
      std::string before = describe(*s) + ", slots";  // finish gives the reservation back, even when it fails
      for (const auto& slot : s->checkpoints) before += " " + std::to_string(slot.position);
      if (const auto f = requests.finish(*t, seq, captured); !f) {
        std::string what = "finish: " + std::string(to_string(f.error())) + " (len " + std::to_string(len) + ", " +
                           before + ", captured";
        for (const auto p : captured) what += " " + std::to_string(p);
        run.fail(what + ")");
        continue;
      }
      offloader.notify();
      run.finished += 1;
      std::lock_guard l(run.mu);
      run.committed.push_back(std::move(seq));
    }
  };
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) pool.emplace_back(runtime_thread, seed * 100 + static_cast<std::uint64_t>(i));
  for (auto& th : pool) th.join();
  offloader.stop();
  INFO(run.first_error);
  CHECK(run.errors.load() == 0);
  CHECK(requests.in_flight() == 0);
  c.with_store([](store_t& st) { st.drain(); });
  engine.synchronize();
  const std::string bad = c.store().check_invariants(c.tree());
  CHECK_MESSAGE(bad.empty(), bad);
  CHECK(c.store().outstanding_hits() == 0);
  check_tree_bytes(c.tree(), bytes_view{engine, c.store()}, kv, ck);
  const auto& k = c.store().counters();
  return {.finished = run.finished.load(),
          .host_hits = run.host_hits.load(),
          .failed_loads = run.failed_loads.load(),
          .copy_failures = k.copy_failures,
          .write_backs = k.write_backs,
          .replicas = k.replicas,
          .cleaned_bytes = offloader.stats().cleaned_bytes,
          .passes = offloader.stats().passes,
          .bytes_checked = run.bytes_checked.load()};
}

}  // namespace

TEST_CASE("tiered cache under concurrent requests, an offload thread and failing copies: every byte read is right" *
          doctest::test_suite("concurrency")) {
  for (const auto write : {stores::write_policy::write_back, stores::write_policy::write_through}) {
    CAPTURE(stores::to_string(write));
    concurrency_stats total;
    for (std::uint64_t seed = 1; seed <= 2; ++seed) {
      const auto st = run_concurrent(seed, write, 3, 120);
      total.finished += st.finished;
      total.host_hits += st.host_hits;
      total.failed_loads += st.failed_loads;
      total.copy_failures += st.copy_failures;
      total.write_backs += st.write_backs;
      total.replicas += st.replicas;
      total.cleaned_bytes += st.cleaned_bytes;
      total.passes += st.passes;
      total.bytes_checked += st.bytes_checked;
    }
    MESSAGE(stores::to_string(write) << ": " << total.finished << " finished, " << total.host_hits << " host hits loaded ("
                                     << total.failed_loads << " failed), " << total.copy_failures << " copy failures, "
                                     << total.write_backs << " write-backs, " << total.replicas << " replicas, "
                                     << total.cleaned_bytes << " B cleaned in " << total.passes << " passes, "
                                     << total.bytes_checked << " B read and checked");
    CHECK(total.finished > 300);
    CHECK(total.host_hits > 10);
    CHECK(total.copy_failures > 0);
    CHECK(total.bytes_checked > 0);
    if (write == stores::write_policy::write_back) {
      CHECK(total.write_backs > 0);
      CHECK(total.cleaned_bytes > 0);  // the cleaner copied cold dirty entries down
    } else {
      CHECK(total.replicas > 0);
    }
  }
}
