// The prefix cache over the tiered store with real bytes: `tiered_state_store<lru_demotion,
// host_copy_engine>` copies every demotion HBM -> host and every `load` host -> HBM through
// the host copy engine; splits and joins re-partition page lists; `settle` hands the loaded
// pages to the tree's new nodes. A tiny hybrid model (64 B of KV per token, a 96 B
// checkpoint, 32 B pages) keeps the arenas small.
//
// The check: a runtime that writes each token's KV and each checkpoint as a function of the
// token prefix it belongs to (and poisons everything it has not computed yet) finds, after
// every request, the right bytes under every node of the tree and in every staged entry,
// over random branching conversations; a failed copy drops or keeps entries, never corrupts.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "hybridcache/core/hash.hpp"
#include "hybridcache/model/cost_model.hpp"
#include "hybridcache/prefix/flop_aware_scorer.hpp"
#include "hybridcache/prefix/lifecycle.hpp"
#include "hybridcache/prefix/prefix_cache.hpp"
#include "hybridcache/stores/counting_store.hpp"
#include "hybridcache/tiered/disk_backend.hpp"
#include "hybridcache/tiered/host_copy_engine.hpp"
#include "hybridcache/stores/tiered_state_store.hpp"

#include "../support/temp_dir.hpp"
#include "tiered_bytes_support.hpp"

using namespace hybridcache;
using hybridcache::token_id;

namespace {
using namespace hybridcache::test::tiered_bytes;

// A disk tier under the host tier: a directory and its size.
struct disk_under {
  std::string dir;
  std::int64_t bytes = 0;
};

// One random branching conversation run. `fail_every` > 0 makes every n-th copy span fail;
// `slow_span_us` > 0 makes every copy span take that long (copies stay in flight across
// requests, as on a loaded machine), failing none. `disk`: a disk tier below the host one
// (a disk_backend in that directory behind the engine), so entries cascade there and load
// back from it.
template <class Scorer>
run_stats random_run(std::uint64_t seed, std::int64_t hbm, std::int64_t host, int fail_every = 0,
                     int slow_span_us = 0, const disk_under* disk = nullptr) {
  const std::int64_t kv = tiny().kv_bytes_per_token(), ck = tiny().ssm_checkpoint_bytes();
  stores::tiered_state_store_config cfg{.capacity_bytes = hbm,
                                        .host_capacity_bytes = host,
                                        .kv_bytes_per_token = kv,
                                        .checkpoint_bytes = ck,
                                        .staging_bytes = hbm};
  std::optional<tiered::disk_backend<>> backend;
  std::vector<tiered::storage_tier_io> storage;
  if (disk != nullptr) {
    cfg.lower_tiers = {{.kind = tiered::tier_kind::host, .capacity_bytes = host},
                       {.kind = tiered::tier_kind::disk, .capacity_bytes = disk->bytes, .location = disk->dir}};
    cfg.host_capacity_bytes = 0;  // the host tier is lower_tiers' first
    backend.emplace(tiered::disk_backend_config{.directory = disk->dir, .capacity_bytes = 4 * disk->bytes + (1 << 20)});
    storage.push_back(tiered::storage_io_of(*backend));
  }
  engine_t engine(store_t::tiers_for(cfg), store_t::page_bytes_for(cfg), {.measure_bandwidth = false}, storage);
  std::atomic<std::int64_t> spans{0};  // the engine's workers run the hook concurrently
  if (fail_every > 0)
    engine.set_fault_hook([&](const tiered::copy_span&) { return (spans.fetch_add(1) + 1) % fail_every == 0; });
  else if (slow_span_us > 0)
    engine.set_fault_hook([&](const tiered::copy_span&) {
      std::this_thread::sleep_for(std::chrono::microseconds(slow_span_us));
      return false;
    });
  Scorer scorer = [] {
    if constexpr (std::is_same_v<Scorer, prefix::flop_aware_scorer>)
      return prefix::flop_aware_scorer(tiny(), {.alpha = 1.0});
    else
      return Scorer{};
  }();
  prefix::prefix_cache<cost_model, prefix::judicious_admission, Scorer, store_t> c(tiny(), store_t(cfg, engine),
                                                                                 std::move(scorer));
  const bytes_view b{engine, c.store()};
  std::mt19937_64 rng(seed);
  std::vector<std::vector<token_id>> committed, roots;
  for (int i = 0; i < 4; ++i) {
    std::vector<token_id> r(static_cast<std::size_t>(20 + rng() % 150));
    for (auto& t : r) t = static_cast<token_id>(rng() % 3);
    roots.push_back(r);
  }
  run_stats st;
  for (int step = 0; step < 250; ++step) {
    std::vector<token_id> input;
    if (!committed.empty() && rng() % 4 != 0) {
      const auto& base = committed[rng() % committed.size()];
      // a prefix of at most 150 tokens, so that every request fits in HBM
      input.assign(base.begin(), base.begin() + static_cast<std::ptrdiff_t>(1 + rng() % std::min<std::size_t>(base.size(), 150)));
    } else {
      input = roots[rng() % roots.size()];
    }
    const auto extra = 1 + rng() % 100;
    for (std::size_t k = 0; k < extra; ++k) input.push_back(static_cast<token_id>(rng() % 3));
    std::vector<token_id> seq = input;
    const auto out = rng() % 30;
    for (std::size_t k = 0; k < out; ++k) seq.push_back(static_cast<token_id>(rng() % 5));
    const pattern p(seq);
    const auto len = static_cast<std::int64_t>(seq.size());

    auto m = c.match(input);
    REQUIRE(m);
    auto h = c.store().lookup(input, *m);
    bool loaded = false;
    if (h.host_tokens > 0 && rng() % 5 != 0) {
      auto r = c.store().load(h);
      if (r) r = c.store().wait_loaded(h);  // the copies are asynchronous
      if (r) {
        loaded = true;
        ++st.loads;
        st.loaded_tokens += h.host_tokens;
        // What prefill reads from HBM: the staged entries hold the input's bytes.
        for (const auto& s : c.store().staged(h)) {
          REQUIRE(s.end <= static_cast<std::int64_t>(input.size()));
          REQUIRE(c.store().table().locate(s.id)->first == hbm_tier);
          const auto sb = b(s.id);
          if (s.checkpoint) {
            for (std::int64_t j = 0; j < ck; ++j)
              if (sb[j] != p.state(s.end, j)) FAIL("a staged checkpoint holds the wrong state");
          } else {
            for (std::int64_t t = s.begin; t < s.end; ++t)
              for (std::int64_t j = 0; j < kv; ++j)
                if (sb[(t - s.begin) * kv + j] != p.kv(t, j)) FAIL("staged KV of token " << t << " is wrong");
          }
        }
      } else {
        INFO("load refused: " << to_string(r.error()) << " at step " << step);
        REQUIRE(fail_every > 0);  // staging is as large as HBM: only an injected failure refuses
        REQUIRE(r.error() == errc::busy);
        REQUIRE(c.store().staged(h).empty());
        h = stores::tiered_hit{.reusable_tokens = m->reusable_tokens, .hbm_tokens = m->reusable_tokens};
        ++st.failures;
      }
    }
    if (rng() % 10 == 0) {  // abandoned: staged entries go back to the host tier
      c.store().release_hit(h);
      REQUIRE(c.release(*m));
    } else {
      // Before commit: which entries and pages the tree holds, and what `load` staged.
      std::set<entry_id> old_kv, old_ckpts;
      std::map<std::uint32_t, entry_id> old_page_owner;
      for (node_id n = 1; n < c.tree().id_bound(); ++n) {
        if (!c.tree().live(n)) continue;
        const auto& nd = c.tree().at(n);
        if (nd.has_checkpoint) old_ckpts.insert(nd.checkpoint.id);
        if (nd.kv.id == no_entry) continue;
        old_kv.insert(nd.kv.id);
        const auto row = c.store().table().find(nd.kv.id);
        for (auto pg : bytes_view::pages_of(row->home()->pages)) old_page_owner[pg] = nd.kv.id;
      }
      std::vector<std::pair<std::int64_t, std::int64_t>> staged_kv;
      for (const auto& s : c.store().staged(h))
        if (!s.checkpoint) staged_kv.emplace_back(s.begin, s.end);
      const auto cr = c.commit(seq, static_cast<std::int64_t>(input.size()), &*m);
      if (!cr) {
        // Refused up front: the continuation does not fit in HBM beside the prefix it
        // extends (a commit never evicts that prefix). Nothing changed; hand everything back.
        REQUIRE(cr.error() == errc::out_of_capacity);
        c.store().release_hit(h);
        REQUIRE(c.release(*m));
        ++st.refused;
        continue;
      }
      std::set<entry_id> live_kv;
      for (node_id n = 1; n < c.tree().id_bound(); ++n)
        if (c.tree().live(n)) live_kv.insert(c.tree().at(n).kv.id);
      // An extent holds carried bytes if it existed before the commit or was split off one
      // that did and still does (same pages); anything else is new and holds garbage.
      const auto carried = [&](entry_id id) {
        if (old_kv.contains(id)) return true;
        const auto pages = bytes_view::pages_of(c.store().table().find(id)->home()->pages);
        const auto o = old_page_owner.find(pages.front());
        if (o == old_page_owner.end() || !live_kv.contains(o->second)) return false;
        for (auto pg : pages)
          if (const auto q = old_page_owner.find(pg); q == old_page_owner.end() || q->second != o->second) return false;
        return true;
      };
      std::vector<node_id> path;
      (void)c.tree().walk(seq, path);
      std::set<entry_id> fresh_kv;
      for (node_id n : path) {
        const auto& nd = c.tree().at(n);
        if (nd.kv.id != no_entry && !carried(nd.kv.id)) {
          fresh_kv.insert(nd.kv.id);
          const auto kvb = b(nd.kv.id);
          for (std::int64_t i = 0; i < nd.edge() * kv; ++i) kvb[i] = std::byte{0xcd};
        }
        if (nd.has_checkpoint && !old_ckpts.contains(nd.checkpoint.id)) {
          const auto ckb = b(nd.checkpoint.id);
          for (std::int64_t j = 0; j < ck; ++j) ckb[j] = std::byte{0xcd};
        }
      }
      c.store().settle(c.tree(), seq, h);
      // The runtime writes what it computed (from where prefill started: the loaded hit, or
      // the HBM match when it fetched the host hit itself) and copies the tokens it reused
      // into new extents, except those `settle` filled from the staged entries; likewise
      // new checkpoints, except the loaded one.
      const std::int64_t computed_from = loaded ? h.reusable_tokens : m->common_prefix;
      const auto staged_token = [&](std::int64_t t) {
        for (const auto& [lo, hi] : staged_kv)
          if (lo <= t && t < hi) return true;
        return false;
      };
      (void)c.tree().walk(seq, path);
      for (node_id n : path) {
        const auto& nd = c.tree().at(n);
        const auto kvb = b(nd.kv.id);
        for (std::int64_t t = nd.begin(); t < nd.end; ++t) {
          const bool write = t >= computed_from || (fresh_kv.contains(nd.kv.id) && !staged_token(t));
          if (write)
            for (std::int64_t j = 0; j < kv; ++j) kvb[(t - nd.begin()) * kv + j] = p.kv(t, j);
        }
        const bool loaded_state = loaded && h.host_checkpoint && nd.end == h.reusable_tokens;
        if (nd.has_checkpoint && !old_ckpts.contains(nd.checkpoint.id) && !loaded_state) {
          const auto ckb = b(nd.checkpoint.id);
          for (std::int64_t j = 0; j < ck; ++j) ckb[j] = p.state(nd.end, j);
        }
      }
      committed.push_back(seq);
      (void)len;
    }
    REQUIRE(c.store().outstanding_hits() == 0);
    REQUIRE(c.store().staged_bytes() == 0);
    const std::string bad = c.store().check_invariants(c.tree());
    REQUIRE_MESSAGE(bad.empty(), bad);
    check_tree_bytes(c.tree(), b, kv, ck);
  }
  engine.synchronize();
  st.adopted = c.store().counters().adopted_entries;
  st.demoted = c.store().counters().demoted_entries;
  if (disk != nullptr) {
    const auto pc = engine.storage_pages(tier_id{2})->counters();
    st.disk_puts = pc.puts;
    st.disk_gets = pc.gets;
    CHECK(pc.get_failures == 0);
    const std::string bad = engine.storage_pages(tier_id{2})->check_invariants();
    CHECK_MESSAGE(bad.empty(), bad);
  }
  if (fail_every > 0) CHECK(c.store().counters().copy_failures > 0);
  return st;
}

}  // namespace

TEST_CASE("tiny_hybrid test model: 64 B of KV per token, a 96 B checkpoint") {
  CHECK(tiny().kv_bytes_per_token() == 64);
  CHECK(tiny().ssm_checkpoint_bytes() == 96);
}

TEST_CASE_TEMPLATE("tiered_state_store over a host copy engine: every node holds its own bytes after demotion, "
                   "load and promotion",
                   Scorer, prefix::lru_scorer, prefix::flop_aware_scorer) {
  const std::int64_t kv = 64, ck = 96;
  for (std::uint64_t seed : {11u, 12u, 13u}) {
    const auto st = random_run<Scorer>(seed, 300 * kv + 4 * ck, 20 * (200 * kv + 2 * ck));
    MESSAGE("seed " << seed << ": " << st.loads << " loads (" << st.loaded_tokens << " tokens), " << st.adopted
                    << " entries adopted, " << st.demoted << " demoted, " << st.refused << " commits refused");
    CHECK(st.loads > 10);
    CHECK(st.adopted > 0);
  }
}

TEST_CASE_TEMPLATE("tiered_state_store over a host copy engine with a disk tier: entries cascade to disk and load back "
                   "with their bytes",
                   Scorer, prefix::lru_scorer, prefix::flop_aware_scorer) {
  // A host tier of ~3 conversations over a disk tier of ~40: the store cascades host entries
  // to disk (puts through the engine's disk backend) and loads hits from there (gets), and
  // every node and staged entry holds its own bytes after each request.
  const std::int64_t kv = 64, ck = 96;
  for (std::uint64_t seed : {11u, 14u}) {
    INFO("seed " << seed);
    test::temp_dir dir("hc_tiered_disk");
    const disk_under d{dir.path().string(), 40 * (200 * kv + 2 * ck)};
    const auto st = random_run<Scorer>(seed, 300 * kv + 4 * ck, 3 * (200 * kv + 2 * ck), 0, 0, &d);
    MESSAGE("seed " << seed << ": " << st.loads << " loads (" << st.loaded_tokens << " tokens), " << st.disk_puts
                    << " disk puts, " << st.disk_gets << " disk gets");
    CHECK(st.loads > 10);
    CHECK(st.disk_puts > 10);
    CHECK(st.disk_gets > 5);
  }
}

TEST_CASE_TEMPLATE("tiered_state_store over a host copy engine: slow copies still in flight never refuse a load",
                   Scorer, prefix::lru_scorer, prefix::flop_aware_scorer) {
  // Copies that take 200 us per span are still in flight when the next request looks up and
  // loads. HBM beyond the budget then holds free entries whose HBM copy, clean below, goes
  // once nothing reads it; a hit that pins such a copy and never lets go of it made `load`
  // wait for pages nothing freed, and refuse. Seeds that failed before: 11 with lru (the
  // hit pinned an entry it did not read: the ones before it covered its tokens) and 32 with
  // flop-aware (it kept pinning a source whose bytes its own copy had already read).
  const std::int64_t kv = 64, ck = 96;
  for (const int seed : {11, 12, 13, 32}) {
    INFO("seed " << seed);
    const auto st = random_run<Scorer>(static_cast<std::uint64_t>(seed), 300 * kv + 4 * ck, 20 * (200 * kv + 2 * ck), 0, 200);
    CHECK(st.loads > 10);
  }
}

TEST_CASE("tiered_state_store over a host copy engine: failed copies drop or keep entries, never corrupt them") {
  const std::int64_t kv = 64, ck = 96;
  for (int fail_every : {3, 7}) {
    const auto st = random_run<prefix::lru_scorer>(21, 300 * kv + 4 * ck, 20 * (200 * kv + 2 * ck), fail_every);
    MESSAGE("a copy span in " << fail_every << " fails: " << st.loads << " loads, " << st.failures
                              << " refused loads");
    CHECK(st.failures > 0);
  }
}

TEST_CASE("tiered_state_store::load: a mismatched engine, bad tickets, a staging room too small, and a second call") {
  const std::int64_t kv = tiny().kv_bytes_per_token(), ck = tiny().ssm_checkpoint_bytes();
  stores::tiered_state_store_config cfg{.capacity_bytes = 40 * kv + 2 * ck,
                                        .host_capacity_bytes = 400 * kv,
                                        .kv_bytes_per_token = kv,
                                        .checkpoint_bytes = ck,
                                        .staging_bytes = 8 * kv};
  engine_t engine(store_t::tiers_for(cfg), store_t::page_bytes_for(cfg), {.measure_bandwidth = false});
  {  // an engine laid out for other tiers or another page size is refused up front
    auto small = store_t::tiers_for(cfg);
    small[1].capacity_bytes /= 2;
    engine_t e1(small, store_t::page_bytes_for(cfg), {.measure_bandwidth = false});
    CHECK_THROWS_AS(store_t(cfg, e1), invalid_argument);
    engine_t e2(store_t::tiers_for(cfg), 2 * store_t::page_bytes_for(cfg), {.measure_bandwidth = false});
    CHECK_THROWS_AS(store_t(cfg, e2), invalid_argument);
    auto bad = cfg;
    bad.staging_bytes = -1;
    CHECK_THROWS_AS(store_t(bad, engine), invalid_argument);
  }
  prefix::prefix_cache<cost_model, prefix::judicious_admission, prefix::lru_scorer, store_t> c(
      tiny(), store_t(cfg, engine), prefix::lru_scorer{});
  std::vector<token_id> a(30, 1), bseq(30, 2);
  for (const auto* s : {&a, &bseq}) {  // a, then b evicts a into the host tier
    auto m = c.match(*s);
    REQUIRE(m);
    REQUIRE(c.commit(*s, static_cast<std::int64_t>(s->size()), &*m));
    c.store().settle(c.tree(), *s);
  }
  REQUIRE(c.store().host_entries() > 0);
  std::vector<token_id> again = a;
  again.push_back(3);
  auto m = c.match(again);
  REQUIRE(m);
  const auto h = c.store().lookup(again, *m);
  REQUIRE(h.host_tokens == 30);
  CHECK(c.store().load(stores::tiered_hit{}).error() == errc::stale_handle);
  auto forged = h;
  forged.ticket += 1;
  CHECK(c.store().load(forged).error() == errc::stale_handle);
  // 30 tokens of KV + a checkpoint do not fit in 8 tokens of staging: nothing moves
  const auto host_before = c.store().host_used_bytes();
  CHECK(c.store().load(h).error() == errc::out_of_capacity);
  CHECK(c.store().staged(h).empty());
  CHECK(c.store().host_used_bytes() == host_before);
  CHECK(c.store().check_invariants(c.tree()).empty());
  c.store().release_hit(h);
  REQUIRE(c.release(*m));

  // With room, a second load of the same hit is a no-op; release drops the staged copies.
  cfg.staging_bytes = 40 * kv + 2 * ck;
  engine_t engine2(store_t::tiers_for(cfg), store_t::page_bytes_for(cfg), {.measure_bandwidth = false});
  prefix::prefix_cache<cost_model, prefix::judicious_admission, prefix::lru_scorer, store_t> c2(
      tiny(), store_t(cfg, engine2), prefix::lru_scorer{});
  for (const auto* s : {&a, &bseq}) {
    auto m2 = c2.match(*s);
    REQUIRE(m2);
    REQUIRE(c2.commit(*s, static_cast<std::int64_t>(s->size()), &*m2));
    c2.store().settle(c2.tree(), *s);
  }
  auto m2 = c2.match(again);
  REQUIRE(m2);
  const auto h2 = c2.store().lookup(again, *m2);
  REQUIRE(c2.store().load(h2));
  const auto staged = c2.store().staged(h2).size();
  CHECK(staged > 0);
  CHECK(c2.store().staged_bytes() == 30 * kv + ck);
  REQUIRE(c2.store().load(h2));
  CHECK(c2.store().staged(h2).size() == staged);
  CHECK(c2.store().check_invariants(c2.tree()).empty());
  const auto host_entries = c2.store().host_entries();
  c2.store().release_hit(h2);
  REQUIRE(c2.release(*m2));
  c2.store().drain();  // the staged copies were still in flight: they go when they land
  CHECK(c2.store().staged_bytes() == 0);
  CHECK(c2.store().host_entries() == host_entries);  // the sources stay below
  CHECK(c2.store().check_invariants(c2.tree()).empty());
}

TEST_CASE("tiered_state_store: a staged entry the committed sequence does not cover goes; its host copy stays intact") {
  const std::int64_t kv = tiny().kv_bytes_per_token(), ck = tiny().ssm_checkpoint_bytes();
  const stores::tiered_state_store_config cfg{.capacity_bytes = 40 * kv + 2 * ck,
                                              .host_capacity_bytes = 400 * kv,
                                              .kv_bytes_per_token = kv,
                                              .checkpoint_bytes = ck,
                                              .staging_bytes = 40 * kv + 2 * ck};
  engine_t engine(store_t::tiers_for(cfg), store_t::page_bytes_for(cfg), {.measure_bandwidth = false});
  prefix::prefix_cache<cost_model, prefix::judicious_admission, prefix::lru_scorer, store_t> c(
      tiny(), store_t(cfg, engine), prefix::lru_scorer{});
  const bytes_view b{engine, c.store()};
  const std::vector<token_id> a(30, 1), other(30, 2);
  const pattern pa(a);
  auto commit = [&](const std::vector<token_id>& s) {
    auto m = c.match(s);
    REQUIRE(m);
    REQUIRE(c.commit(s, static_cast<std::int64_t>(s.size()), &*m));
    c.store().settle(c.tree(), s);
  };
  commit(a);
  std::vector<node_id> path;
  (void)c.tree().walk(a, path);
  REQUIRE(path.size() == 1);
  REQUIRE(c.tree().at(path[0]).has_checkpoint);
  const auto kvb = b(c.tree().at(path[0]).kv.id);
  for (std::int64_t t = 0; t < 30; ++t)
    for (std::int64_t j = 0; j < kv; ++j) kvb[t * kv + j] = pa.kv(t, j);
  const auto ckb = b(c.tree().at(path[0]).checkpoint.id);
  for (std::int64_t j = 0; j < ck; ++j) ckb[j] = pa.state(30, j);
  commit(other);  // demotes a (KV + checkpoint) to the host tier
  REQUIRE(c.store().host_entries() == 2);

  const auto loaded_and_checked = [&](const stores::tiered_hit& h) {
    REQUIRE(c.store().load(h));
    REQUIRE(c.store().wait_loaded(h));
    REQUIRE(c.store().staged(h).size() == 2);
    for (const auto& s : c.store().staged(h)) {
      const auto sb = b(s.id);
      if (s.checkpoint)
        for (std::int64_t j = 0; j < ck; ++j) REQUIRE(sb[j] == pa.state(30, j));
      else
        for (std::int64_t t = s.begin; t < s.end; ++t)
          for (std::int64_t j = 0; j < kv; ++j) REQUIRE(sb[(t - s.begin) * kv + j] == pa.kv(t, j));
    }
  };
  // The runtime loads a's hit but then commits a sequence that leaves a after 10 tokens
  // (allowed: nothing of the hit was reused from HBM). Neither staged entry is covered.
  std::vector<token_id> again = a;
  again.push_back(3);
  auto m = c.match(again);
  REQUIRE(m);
  auto h = c.store().lookup(again, *m);
  REQUIRE(h.host_tokens == 30);
  loaded_and_checked(h);
  std::vector<token_id> diverged(a.begin(), a.begin() + 10);
  diverged.insert(diverged.end(), 8, 5);
  REQUIRE(c.commit(diverged, static_cast<std::int64_t>(diverged.size()), &*m));
  (void)c.tree().walk(diverged, path);
  for (node_id n : path) {  // not computed yet
    const auto nb = b(c.tree().at(n).kv.id);
    for (std::int64_t i = 0; i < c.tree().at(n).edge() * kv; ++i) nb[i] = std::byte{0xcd};
  }
  c.store().settle(c.tree(), diverged, h);
  CHECK(c.store().counters().adopted_entries == 0);
  CHECK(c.store().staged_bytes() == 0);
  CHECK(c.store().check_invariants(c.tree()).empty());
  // Both host entries still hold a's bytes: a later request loads them again.
  auto m2 = c.match(again);
  REQUIRE(m2);
  const auto h2 = c.store().lookup(again, *m2);
  REQUIRE(h2.host_tokens == 30);
  loaded_and_checked(h2);
  c.store().release_hit(h2);
  REQUIRE(c.release(*m2));
  CHECK(c.store().check_invariants(c.tree()).empty());
}

TEST_CASE("tiered_state_store: an entry larger than the host tier is dropped alone, not after emptying the host") {
  // Host tier: 45 tokens of KV. a (10 tokens) is demoted first and fits; b's 60-token KV
  // can never fit, so it must be dropped without dropping a's entries to make room.
  const std::int64_t kv = tiny().kv_bytes_per_token(), ck = tiny().ssm_checkpoint_bytes();
  using meta_store = stores::tiered_state_store<>;
  prefix::prefix_cache<cost_model, prefix::judicious_admission, prefix::lru_scorer, meta_store> c(
      tiny(),
      meta_store({.capacity_bytes = 70 * kv + 2 * ck, .host_capacity_bytes = 45 * kv, .kv_bytes_per_token = kv, .checkpoint_bytes = ck}),
      prefix::lru_scorer{});
  const std::vector<token_id> a(10, 1), b2(60, 2), c3(60, 3);
  for (const auto* s : {&a, &b2, &c3}) {
    auto m = c.match(*s);
    REQUIRE(m);
    REQUIRE(c.commit(*s, static_cast<std::int64_t>(s->size()), &*m));
    c.store().settle(c.tree(), *s);
    REQUIRE(c.store().check_invariants(c.tree()).empty());
  }
  const auto& k = c.store().counters();
  CHECK(k.demoted_entries >= 4);  // a's KV + checkpoint, b's KV + checkpoint
  CHECK(k.dropped_bytes == 60 * kv);  // b's KV only
  std::vector<token_id> again = a;
  again.push_back(4);
  auto m = c.match(again);
  REQUIRE(m);
  const auto h = c.store().lookup(again, *m);
  CHECK(h.host_tokens == 10);  // a is still in the host tier
  c.store().release_hit(h);
  REQUIRE(c.release(*m));
}

TEST_CASE("tiered_state_store: several host hits outstanding at once, each loaded, read and settled (issue #13 break 6)") {
  // Two requests in flight hit two different demoted conversations. Before, the second
  // lookup silently released the first hit: its pins went, and its load reported stale.
  const std::int64_t kv = tiny().kv_bytes_per_token(), ck = tiny().ssm_checkpoint_bytes();
  const stores::tiered_state_store_config cfg{.capacity_bytes = 70 * kv + 3 * ck,
                                              .host_capacity_bytes = 400 * kv,
                                              .kv_bytes_per_token = kv,
                                              .checkpoint_bytes = ck,
                                              .staging_bytes = 80 * kv + 4 * ck};
  engine_t engine(store_t::tiers_for(cfg), store_t::page_bytes_for(cfg), {.measure_bandwidth = false});
  prefix::prefix_cache<cost_model, prefix::judicious_admission, prefix::lru_scorer, store_t> c(
      tiny(), store_t(cfg, engine), prefix::lru_scorer{});
  const bytes_view b{engine, c.store()};
  const std::vector<token_id> a(30, 1), d(30, 4), other(60, 2);
  const pattern pa(a), pd(d);
  auto commit_and_fill = [&](const std::vector<token_id>& s, const pattern& p) {
    auto m = c.match(s);
    REQUIRE(m);
    REQUIRE(c.commit(s, static_cast<std::int64_t>(s.size()), &*m));
    c.store().settle(c.tree(), s);
    std::vector<node_id> path;
    (void)c.tree().walk(s, path);
    const auto& nd = c.tree().at(path.back());
    const auto kvb = b(nd.kv.id);
    for (std::int64_t t = 0; t < nd.edge(); ++t)
      for (std::int64_t j = 0; j < kv; ++j) kvb[t * kv + j] = p.kv(nd.begin() + t, j);
    const auto ckb = b(nd.checkpoint.id);
    for (std::int64_t j = 0; j < ck; ++j) ckb[j] = p.state(nd.end, j);
  };
  commit_and_fill(a, pa);
  commit_and_fill(d, pd);
  {
    auto m = c.match(other);
    REQUIRE(m);
    REQUIRE(c.commit(other, 60, &*m));  // demotes a and d
    c.store().settle(c.tree(), other);
  }
  REQUIRE(c.store().host_entries() == 4);
  auto with = [](std::vector<token_id> s, token_id t) {
    s.push_back(t);
    return s;
  };
  const auto qa = with(a, 9), qd = with(d, 9);
  auto ma = c.match(qa);
  auto md = c.match(qd);
  REQUIRE(ma);
  REQUIRE(md);
  const auto ha = c.store().lookup(qa, *ma);
  const auto hd = c.store().lookup(qd, *md);  // a's hit stays outstanding
  REQUIRE(ha.host_tokens == 30);
  REQUIRE(hd.host_tokens == 30);
  CHECK(c.store().outstanding_hits() == 2);
  REQUIRE(c.store().load(ha));
  REQUIRE(c.store().load(hd));
  REQUIRE(c.store().wait_loaded(ha));  // the copies are asynchronous
  REQUIRE(c.store().wait_loaded(hd));
  for (const auto& [h, p] : {std::pair{&ha, &pa}, std::pair{&hd, &pd}}) {
    REQUIRE(c.store().staged(*h).size() == 2);
    for (const auto& s : c.store().staged(*h)) {
      const auto sb = b(s.id);
      if (s.checkpoint)
        for (std::int64_t j = 0; j < ck; ++j) REQUIRE(sb[j] == p->state(30, j));
      else
        for (std::int64_t t = 0; t < 30; ++t)
          for (std::int64_t j = 0; j < kv; ++j) REQUIRE(sb[t * kv + j] == p->kv(t, j));
    }
  }
  CHECK(c.store().check_invariants(c.tree()).empty());
  // d settles first, then a: each hit's staged pages go to its own new nodes.
  REQUIRE(c.commit(qd, 31, &*md));
  c.store().settle(c.tree(), qd, hd);
  CHECK(c.store().outstanding_hits() == 1);
  REQUIRE(c.commit(qa, 31, &*ma));
  c.store().settle(c.tree(), qa, ha);
  CHECK(c.store().outstanding_hits() == 0);
  CHECK(c.store().staged_bytes() == 0);
  // Each hit's KV entry went to its new node; the checkpoints at 30 are not node ends of the
  // committed paths (judicious admission keeps 31), so they return to the host tier intact.
  CHECK(c.store().counters().adopted_entries == 2);
  for (const auto& [q, p] : {std::pair{&qa, &pa}, std::pair{&qd, &pd}}) {
    std::vector<node_id> path;
    (void)c.tree().walk(*q, path);
    const auto& first = c.tree().at(path[0]);
    REQUIRE(first.end >= 30);
    const auto kvb = b(first.kv.id);
    for (std::int64_t t = 0; t < 30; ++t)
      for (std::int64_t j = 0; j < kv; ++j) REQUIRE(kvb[t * kv + j] == p->kv(t, j));
  }
  CHECK(c.store().check_invariants(c.tree()).empty());
  // Stale tickets after settle.
  CHECK(c.store().load(ha).error() == errc::stale_handle);
}

TEST_CASE("lifecycle over the tiered store: a host hit is loaded at begin, prefill resumes after it, finish adopts the loaded pages (issue #13 item 5)") {
  const std::int64_t kv = tiny().kv_bytes_per_token(), ck = tiny().ssm_checkpoint_bytes();
  const stores::tiered_state_store_config cfg{.capacity_bytes = 70 * kv + 3 * ck,
                                              .host_capacity_bytes = 400 * kv,
                                              .kv_bytes_per_token = kv,
                                              .checkpoint_bytes = ck,
                                              .staging_bytes = 40 * kv + 2 * ck};
  engine_t engine(store_t::tiers_for(cfg), store_t::page_bytes_for(cfg), {.measure_bandwidth = false});
  using cache_t = prefix::prefix_cache<cost_model, prefix::judicious_admission, prefix::lru_scorer, store_t>;
  cache_t c(tiny(), store_t(cfg, engine), prefix::lru_scorer{});
  prefix::request_lifecycle<cache_t> requests(c);
  const bytes_view b{engine, c.store()};
  const std::vector<token_id> a(30, 1), other(60, 2);
  const pattern pa(a), po(other);
  // A runtime's request: prefill writes every computed token's KV into the reservation and
  // the final state into the end slot; finish keeps the end state.
  auto serve = [&](const std::vector<token_id>& seq, const pattern& p) {
    auto t = requests.begin(seq);
    REQUIRE(t);
    const auto& st = **requests.state(*t);
    const std::int64_t from = std::max(st.plan.prefill_start, st.kv_from);  // the tree holds [0, kv_from)
    const auto kvb = b(st.kv[0].id);
    for (std::int64_t pos = from; pos < static_cast<std::int64_t>(seq.size()); ++pos)
      for (std::int64_t j = 0; j < kv; ++j) kvb[(pos - st.kv_from) * kv + j] = p.kv(pos, j);
    for (const auto& slot : st.checkpoints) {  // every planned state, and the end one
      const std::int64_t at = slot.position == 0 ? static_cast<std::int64_t>(seq.size()) : slot.position;
      const auto ckb = b(slot.handle.id);
      for (std::int64_t j = 0; j < ck; ++j) ckb[j] = p.state(at, j);
    }
    return *t;
  };
  auto finish = [&](prefix::request_ticket t, const std::vector<token_id>& seq) {
    const std::vector<std::int64_t> captured{static_cast<std::int64_t>(seq.size())};
    REQUIRE(requests.finish(t, seq, captured));
    const std::string bad = c.store().check_invariants(c.tree());
    REQUIRE_MESSAGE(bad.empty(), bad);
  };
  finish(serve(a, pa), a);
  finish(serve(other, po), other);  // a is demoted to the host tier (finish names the path)
  REQUIRE(c.store().host_entries() == 2);

  std::vector<token_id> q = a;
  q.push_back(9);
  const pattern pq(q);  // token 30 and the state after 31 come from q; [0, 30) is a's
  {  // Abandoned: the staged copies go (once they landed), the host entries stay.
    auto t = requests.begin(q);
    REQUIRE(t);
    CHECK((*requests.state(*t))->host_hit.host_tokens == 30);
    CHECK(requests.resume_checkpoint(*t).error() == errc::not_found);  // it is staged
    REQUIRE(requests.abort(*t));
    c.store().drain();
    CHECK(c.store().outstanding_hits() == 0);
    CHECK(c.store().staged_bytes() == 0);
    CHECK(c.store().host_entries() >= 2);  // a's two, and whatever the reservation demoted
    CHECK(c.store().check_invariants(c.tree()).empty());
  }
  auto t = requests.begin(q);
  REQUIRE(t);
  const auto& st = **requests.state(*t);
  REQUIRE(st.match.reusable_tokens == 0);  // nothing of a in HBM
  REQUIRE(st.host_hit.host_tokens == 30);
  CHECK(st.loaded_at == 30);
  CHECK(st.plan.prefill_start == 30);
  REQUIRE(requests.wait_loaded(*t));  // the load is asynchronous
  // What prefill reads: a's KV and the state after 30 tokens, staged in HBM.
  for (const auto& s : c.store().staged(st.host_hit)) {
    const auto sb = b(s.id);
    if (s.checkpoint)
      for (std::int64_t j = 0; j < ck; ++j) REQUIRE(sb[j] == pa.state(30, j));
    else
      for (std::int64_t tok = s.begin; tok < s.end; ++tok)
        for (std::int64_t j = 0; j < kv; ++j) REQUIRE(sb[(tok - s.begin) * kv + j] == pa.kv(tok, j));
  }
  const auto kvb = b(st.kv[0].id);  // the runtime computes token 30 only
  for (std::int64_t j = 0; j < kv; ++j) kvb[(30 - st.kv_from) * kv + j] = pq.kv(30, j);
  for (const auto& slot : st.checkpoints) {  // the states prefill computes (not the loaded one)
    if (slot.position == st.loaded_at) continue;
    const std::int64_t at = slot.position == 0 ? 31 : slot.position;
    const auto ckb = b(slot.handle.id);
    for (std::int64_t j = 0; j < ck; ++j) ckb[j] = pq.state(at, j);
  }
  const auto adopted_before = c.store().counters().adopted_entries;
  finish(*t, q);
  CHECK(c.store().counters().adopted_entries == adopted_before + 2);  // a's KV and state, no copy
  CHECK(c.store().outstanding_hits() == 0);
  // The tree holds q: [0, 30) = a's loaded KV with the loaded state at 30, then token 30.
  std::vector<node_id> path;
  (void)c.tree().walk(q, path);
  REQUIRE(path.size() == 2);
  const auto& head = c.tree().at(path[0]);
  const auto& tail = c.tree().at(path[1]);
  REQUIRE(head.end == 30);
  REQUIRE(head.has_checkpoint);
  const auto hk = b(head.kv.id);
  for (std::int64_t tok = 0; tok < 30; ++tok)
    for (std::int64_t j = 0; j < kv; ++j) REQUIRE(hk[tok * kv + j] == pa.kv(tok, j));
  const auto hc = b(head.checkpoint.id);
  for (std::int64_t j = 0; j < ck; ++j) REQUIRE(hc[j] == pa.state(30, j));
  const auto tk = b(tail.kv.id);
  for (std::int64_t j = 0; j < kv; ++j) REQUIRE(tk[j] == pq.kv(30, j));
  const auto tc = b(tail.checkpoint.id);
  for (std::int64_t j = 0; j < ck; ++j) REQUIRE(tc[j] == pq.state(31, j));
  CHECK(c.store().check_invariants(c.tree()).empty());
}

namespace {
struct lifecycle_stats {
  std::int64_t finished = 0, aborted = 0, refused = 0, host_hits = 0, loaded_tokens = 0, max_in_flight = 0;
};

// Random branching conversations through the request lifecycle over the tiered store, up
// to four requests in flight. The runtime writes exactly what prefill computes (KV from
// plan.prefill_start, the planned states and the end state) and never the loaded span:
// after every finish every node of the tree must hold its own tokens' bytes, so a loaded
// span that did not reach its node (or a wrong exchange) fails.
template <class Scorer>
lifecycle_stats random_lifecycle_run(std::uint64_t seed, std::int64_t hbm, std::int64_t host) {
  const std::int64_t kv = tiny().kv_bytes_per_token(), ck = tiny().ssm_checkpoint_bytes();
  const stores::tiered_state_store_config cfg{
      .capacity_bytes = hbm, .host_capacity_bytes = host, .kv_bytes_per_token = kv, .checkpoint_bytes = ck, .staging_bytes = hbm};
  engine_t engine(store_t::tiers_for(cfg), store_t::page_bytes_for(cfg), {.measure_bandwidth = false});
  Scorer scorer = [] {
    if constexpr (std::is_same_v<Scorer, prefix::flop_aware_scorer>) return prefix::flop_aware_scorer(tiny(), {.alpha = 1.0});
    else return Scorer{};
  }();
  using cache_t = prefix::prefix_cache<cost_model, prefix::judicious_admission, Scorer, store_t>;
  cache_t c(tiny(), store_t(cfg, engine), std::move(scorer));
  prefix::request_lifecycle<cache_t> requests(c);
  const bytes_view b{engine, c.store()};
  std::mt19937_64 rng(seed);
  std::vector<std::vector<token_id>> committed, roots;
  for (int i = 0; i < 4; ++i) {
    std::vector<token_id> r(static_cast<std::size_t>(20 + rng() % 100));
    for (auto& t : r) t = static_cast<token_id>(rng() % 3);
    roots.push_back(r);
  }
  struct in_flight {
    prefix::request_ticket t;
    std::vector<token_id> seq;
  };
  std::vector<in_flight> running;
  lifecycle_stats st;
  std::string last;
  auto end_one = [&] {
    const std::size_t i = rng() % running.size();
    in_flight r = std::move(running[i]);
    running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
    if (rng() % 8 == 0) {
      REQUIRE(requests.abort(r.t));
      ++st.aborted;
    } else {
      const auto& s = **requests.state(r.t);
      last = "finishing: reusable " + std::to_string(s.match.reusable_tokens) + " common " + std::to_string(s.match.common_prefix) + " host " + std::to_string(s.host_hit.host_tokens) + " loaded_at " + std::to_string(s.loaded_at) + " len " + std::to_string(r.seq.size()) + " in flight " + std::to_string(running.size() + 1) + " step " + std::to_string(st.finished) + " start " + std::to_string(s.plan.prefill_start);
      std::vector<std::int64_t> captured;
      for (const auto& site : s.plan.sites) captured.push_back(site.position);
      captured.push_back(static_cast<std::int64_t>(r.seq.size()));
      std::sort(captured.begin(), captured.end());
      captured.erase(std::unique(captured.begin(), captured.end()), captured.end());
      REQUIRE(requests.finish(r.t, r.seq, captured));
      committed.push_back(r.seq);
      ++st.finished;
    }
    if (running.empty()) {  // with requests in flight, their reservations are HBM entries no node owns
      const std::string bad = c.store().check_invariants(c.tree());
      REQUIRE_MESSAGE(bad.empty(), bad);
    }
    INFO(last);
    check_tree_bytes(c.tree(), b, kv, ck);
  };
  for (int step = 0; step < 200; ++step) {
    std::vector<token_id> prompt;
    if (!committed.empty() && rng() % 4 != 0) {
      const auto& base = committed[rng() % committed.size()];
      prompt.assign(base.begin(), base.begin() + static_cast<std::ptrdiff_t>(1 + rng() % std::min<std::size_t>(base.size(), 120)));
    } else {
      prompt = roots[rng() % roots.size()];
    }
    const auto more = 1 + rng() % 60;
    for (std::size_t k = 0; k < more; ++k) prompt.push_back(static_cast<token_id>(rng() % 3));
    std::vector<token_id> seq = prompt;
    const auto out = static_cast<std::int64_t>(rng() % 20);
    for (std::int64_t k = 0; k < out; ++k) seq.push_back(static_cast<token_id>(rng() % 5));
    auto t = requests.begin(prompt, {.output_tokens = out});
    if (!t) {
      REQUIRE(t.error() == errc::out_of_capacity);
      ++st.refused;
    } else {
      const auto& s = **requests.state(*t);
      if (s.host_hit.host_tokens > 0) {
        ++st.host_hits;
        st.loaded_tokens += s.host_hit.host_tokens;
        REQUIRE(s.plan.prefill_start == s.loaded_at);
        REQUIRE(requests.wait_loaded(*t));  // before prefill reads the loaded bytes
      }
      const pattern p(seq);
      const std::int64_t len = static_cast<std::int64_t>(seq.size());
      if (!s.kv.empty()) {  // the runtime writes KV from kv_from: the tree holds [0, kv_from)
        const auto kvb = b(s.kv[0].id);
        for (std::int64_t pos = std::max(s.plan.prefill_start, s.kv_from); pos < len; ++pos)
          for (std::int64_t j = 0; j < kv; ++j) kvb[(pos - s.kv_from) * kv + j] = p.kv(pos, j);
      }
      for (const auto& slot : s.checkpoints) {
        if (s.loaded_at > 0 && slot.position == s.loaded_at) continue;  // loaded, not computed
        const auto ckb = b(slot.handle.id);
        for (std::int64_t j = 0; j < ck; ++j) ckb[j] = p.state(slot.position == 0 ? len : slot.position, j);
      }
      running.push_back({*t, std::move(seq)});
      st.max_in_flight = std::max<std::int64_t>(st.max_in_flight, static_cast<std::int64_t>(running.size()));
    }
    while (!running.empty() && (running.size() >= 4 || rng() % 3 == 0)) end_one();
  }
  while (!running.empty()) end_one();
  CHECK(c.store().outstanding_hits() == 0);
  CHECK(c.store().staged_bytes() == 0);
  return st;
}
}  // namespace

TEST_CASE_TEMPLATE("lifecycle over the tiered store randomized: several requests in flight with host hits loaded; every node holds its bytes",
                   Scorer, prefix::lru_scorer, prefix::flop_aware_scorer) {
  const std::int64_t kv = tiny().kv_bytes_per_token(), ck = tiny().ssm_checkpoint_bytes();
  lifecycle_stats total;
  for (std::uint64_t seed = 1; seed <= 3; ++seed) {
    const auto st = random_lifecycle_run<Scorer>(seed, 700 * kv + 8 * ck, 4000 * kv + 60 * ck);
    total.finished += st.finished;
    total.host_hits += st.host_hits;
    total.loaded_tokens += st.loaded_tokens;
    total.refused += st.refused;
    total.max_in_flight = std::max(total.max_in_flight, st.max_in_flight);
  }
  MESSAGE(total.finished << " finished, " << total.host_hits << " host hits loaded (" << total.loaded_tokens
                         << " tokens), " << total.refused << " refused, up to " << total.max_in_flight << " in flight");
  CHECK(total.host_hits > 20);
  CHECK(total.max_in_flight >= 3);
}

TEST_CASE("tiered_state_store: two hits on the same host entries share one load (issue #15: a promotion in flight is joined)") {
  // Before: an entry two hits pinned could be staged by neither (load reported busy), so a
  // batch of requests on one conversation recomputed it. Now the second load joins the
  // first one's copies: the bytes cross the link once, and the second hit gets its own
  // staged copy inside HBM once they landed, so each hit's pages go to its own nodes.
  const std::int64_t kv = tiny().kv_bytes_per_token(), ck = tiny().ssm_checkpoint_bytes();
  const stores::tiered_state_store_config cfg{.capacity_bytes = 100 * kv + 4 * ck,
                                              .host_capacity_bytes = 400 * kv,
                                              .kv_bytes_per_token = kv,
                                              .checkpoint_bytes = ck,
                                              .staging_bytes = 70 * kv + 3 * ck};
  engine_t engine(store_t::tiers_for(cfg), store_t::page_bytes_for(cfg), {.measure_bandwidth = false});
  prefix::prefix_cache<cost_model, prefix::judicious_admission, prefix::lru_scorer, store_t> c(
      tiny(), store_t(cfg, engine), prefix::lru_scorer{});
  const bytes_view b{engine, c.store()};
  const std::vector<token_id> a(30, 1), other(90, 2);
  const pattern pa(a);
  {
    auto m = c.match(a);
    REQUIRE(c.commit(a, 30, &*m));
    c.store().settle(c.tree(), a);
    std::vector<node_id> path;
    (void)c.tree().walk(a, path);
    const auto kvb = b(c.tree().at(path[0]).kv.id);
    for (std::int64_t t = 0; t < 30; ++t)
      for (std::int64_t j = 0; j < kv; ++j) kvb[t * kv + j] = pa.kv(t, j);
    const auto ckb = b(c.tree().at(path[0]).checkpoint.id);
    for (std::int64_t j = 0; j < ck; ++j) ckb[j] = pa.state(30, j);
    auto mo = c.match(other);  // demotes a
    REQUIRE(c.commit(other, 90, &*mo));
    c.store().settle(c.tree(), other);
  }
  c.store().drain();
  REQUIRE(c.store().host_entries() == 2);
  std::vector<token_id> q1 = a, q2 = a;
  q1.push_back(5);
  q2.push_back(6);
  auto m1 = c.match(q1);
  auto m2 = c.match(q2);
  const auto h1 = c.store().lookup(q1, *m1);
  const auto h2 = c.store().lookup(q2, *m2);  // the same two host entries, pinned twice
  REQUIRE(h1.host_tokens == 30);
  REQUIRE(h2.host_tokens == 30);
  REQUIRE(c.store().load(h1));
  REQUIRE(c.store().load(h2));  // joins: nothing crosses the link twice
  CHECK(c.store().counters().joined_loads == 2);
  CHECK(c.store().counters().staged_bytes == 30 * kv + ck);  // over the link, once
  CHECK(c.store().staged_bytes() == 2 * (30 * kv + ck));     // each hit's own copy in HBM
  REQUIRE(c.store().wait_loaded(h2));
  REQUIRE(c.store().wait_loaded(h1));
  for (const auto* h : {&h1, &h2}) {
    REQUIRE(c.store().staged(*h).size() == 2);
    for (const auto& s : c.store().staged(*h)) {
      const auto sb = b(s.id);
      if (s.checkpoint)
        for (std::int64_t j = 0; j < ck; ++j) REQUIRE(sb[j] == pa.state(30, j));
      else
        for (std::int64_t t = s.begin; t < s.end; ++t)
          for (std::int64_t j = 0; j < kv; ++j) REQUIRE(sb[(t - s.begin) * kv + j] == pa.kv(t, j));
    }
  }
  CHECK(c.store().check_invariants(c.tree()).empty());
  // q1 finishes first while q2 still reads its own staged copy: q1's pages go to q1's nodes.
  auto finish = [&](const std::vector<token_id>& q, const match_result& m, const stores::tiered_hit& h) {
    REQUIRE(c.commit(q, static_cast<std::int64_t>(q.size()), &m));
    c.store().settle(c.tree(), q, h);
    std::vector<node_id> path;
    (void)c.tree().walk(q, path);
    for (node_id n : path) {
      const auto& nd = c.tree().at(n);
      if (nd.end > 30) continue;
      const auto kb = b(nd.kv.id);
      for (std::int64_t t = nd.begin(); t < nd.end; ++t)
        for (std::int64_t j = 0; j < kv; ++j) REQUIRE(kb[(t - nd.begin()) * kv + j] == pa.kv(t, j));
    }
  };
  finish(q1, *m1, h1);
  CHECK(c.store().counters().adopted_entries >= 1);  // the KV (a plain commit keeps no checkpoint at 30)
  CHECK(c.store().staged_bytes() == 30 * kv + ck);    // q2 still holds its copy
  CHECK(c.store().check_invariants(c.tree()).empty());
  c.store().release_hit(h2);  // q2 gives up: its staged copy goes
  REQUIRE(c.release(*m2));
  c.store().drain();
  CHECK(c.store().staged_bytes() == 0);
  CHECK(c.store().check_invariants(c.tree()).empty());
}
