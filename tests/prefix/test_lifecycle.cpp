// The request lifecycle (issue #13, "what to build" 1 and 2): begin reserves before prefill,
// finish adopts exactly the reserved pages and the captured states, abort gives everything
// back, many requests are in flight, and every refusal leaves the cache as it was.
// The store tags every token with the allocation that holds it (tests/support/origin_store),
// so "adopted exactly those pages" is checked token by token.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include <cstring>
#include <functional>
#include <mutex>
#include <utility>

#include "hybridcache/core/hash.hpp"
#include "hybridcache/memory/asymmetric_pool.hpp"
#include "hybridcache/model/presets.hpp"
#include "hybridcache/stores/pool_state_store.hpp"
#include "hybridcache/prefix/flop_aware_scorer.hpp"
#include "hybridcache/prefix/lifecycle.hpp"
#include "hybridcache/prefix/lock_policy.hpp"
#include "hybridcache/prefix/lru_scorer.hpp"
#include "hybridcache/prefix/prefix_cache.hpp"
#include "../support/origin_store.hpp"

using namespace hybridcache;
using namespace hybridcache::prefix;
using namespace hybridcache::stores;

namespace {

constexpr std::int64_t kv = 64, ck = 4096;

std::vector<token_id> tokens(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<token_id> v(n);
  for (auto& t : v) t = static_cast<token_id>(rng() % 50000);
  return v;
}
std::vector<token_id> cat(std::vector<token_id> a, const std::vector<token_id>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

template <class Scorer>
using cache_t = prefix_cache<cost_model, judicious_admission, Scorer, test::origin_store>;

template <class Cache>
std::vector<std::uint64_t> origins(const Cache& c, std::span<const token_id> seq) {
  std::vector<node_id> path;
  (void)c.tree().walk(seq, path);
  std::vector<std::uint64_t> out;
  for (node_id n : path) out.insert(out.end(), c.tree().at(n).kv.origin.begin(), c.tree().at(n).kv.origin.end());
  return out;
}

template <class Cache>
std::int64_t tree_bytes(const Cache& c) {
  return c.store().kv_bytes(c.tokens_cached()) + c.checkpoints_cached() * c.store().checkpoint_bytes();
}

template <class State>
std::int64_t reserved_bytes(const State& s) {
  std::int64_t b = 0;
  for (auto t : s.kv_tokens) b += t * kv;
  for (const auto& c : s.checkpoints) b += c.handle.serial != 0 ? ck : 0;
  b += static_cast<std::int64_t>(s.split_room.size()) * kv;
  return b;
}

}  // namespace

TEST_CASE("lifecycle: finish adopts exactly the reserved pages and only the captured states") {
  const cost_model m(presets::marconi_7b());
  cache_t<lru_scorer> c(m, test::origin_store(10'000 * kv + 20 * ck, kv, ck), lru_scorer{});
  request_lifecycle<cache_t<lru_scorer>> requests(c);
  const auto prompt = tokens(500, 1);
  auto t = requests.begin(prompt, {.output_tokens = 40});
  REQUIRE(t);
  const auto* s = *requests.state(*t);
  CHECK(s->match.reusable_tokens == 0);
  CHECK(s->reserved_tokens == 540);
  REQUIRE(s->kv.size() == 1);
  const std::uint64_t reservation = s->kv[0].origin.front();
  CHECK(c.store().used_bytes() == 540 * kv + static_cast<std::int64_t>(s->checkpoints.size()) * ck +
                                     static_cast<std::int64_t>(s->split_room.size()) * kv);
  const auto seq = cat(prompt, tokens(30, 2));  // 30 of the 40 reserved output tokens used
  std::vector<std::int64_t> captured;
  for (const auto& site : s->plan.sites) captured.push_back(site.position);
  captured.push_back(static_cast<std::int64_t>(seq.size()));
  std::sort(captured.begin(), captured.end());
  captured.erase(std::unique(captured.begin(), captured.end()), captured.end());
  auto f = requests.finish(*t, seq, captured);
  REQUIRE(f);
  CHECK(f->commit.evictions == 0);
  CHECK(f->tokens_returned == 10);
  const auto o = origins(c, seq);
  REQUIRE(o.size() == seq.size());
  for (auto x : o) CHECK(x == reservation);  // every token's KV is the page the runtime wrote
  CHECK(c.store().used_bytes() == tree_bytes(c));
  CHECK(requests.in_flight() == 0);
  CHECK(requests.finish(*t, seq, captured).error() == errc::double_free);
  CHECK(requests.abort(*t).error() == errc::double_free);
  CHECK(requests.resume_checkpoint(*t).error() == errc::double_free);  // a finished ticket
  // The next turn hits the whole conversation and resumes from the state it captured at the end.
  auto t2 = requests.begin(cat(seq, tokens(10, 3)));
  REQUIRE(t2);
  CHECK((*requests.state(*t2))->match.reusable_tokens == static_cast<std::int64_t>(seq.size()));
  const auto resume = requests.resume_checkpoint(*t2);
  REQUIRE(resume);
  REQUIRE(*resume != nullptr);
  CHECK((*resume)->serial != 0);
  REQUIRE(requests.abort(*t2));
  CHECK(c.store().used_bytes() == tree_bytes(c));
}

TEST_CASE("lifecycle: a position the runtime did not capture is never kept; bad finishes change nothing") {
  const cost_model m(presets::marconi_7b());
  cache_t<lru_scorer> c(m, test::origin_store(10'000 * kv + 20 * ck, kv, ck), lru_scorer{});
  request_lifecycle<cache_t<lru_scorer>> requests(c);
  const auto prompt = tokens(300, 4);
  auto t = requests.begin(prompt, {.output_tokens = 10});
  REQUIRE(t);
  const auto seq = cat(prompt, tokens(10, 5));
  const std::int64_t used = c.store().used_bytes();
  // Not this request's prompt, longer than reserved, a position without a slot, unsorted.
  auto other = seq;
  other[3] += 1;
  CHECK(requests.finish(*t, other, {}).error() == errc::invalid_argument);
  CHECK(requests.finish(*t, cat(seq, tokens(5, 6)), {}).error() == errc::invalid_argument);
  const std::vector<std::int64_t> unplanned{77};
  CHECK(requests.finish(*t, seq, unplanned).error() == errc::invalid_argument);
  const std::vector<std::int64_t> unsorted{310, 300};
  CHECK(requests.finish(*t, seq, unsorted).error() == errc::invalid_argument);
  CHECK(c.store().used_bytes() == used);
  CHECK(requests.in_flight() == 1);
  // Captured nothing: the tokens are kept as KV, no state is.
  auto f = requests.finish(*t, seq, {});
  REQUIRE(f);
  CHECK(f->checkpoints_kept == 0);
  CHECK(c.checkpoints_cached() == 0);
  CHECK(c.tokens_cached() == static_cast<std::int64_t>(seq.size()));
  CHECK(c.store().used_bytes() == tree_bytes(c));
}

TEST_CASE("lifecycle: a request that cannot fit beside the pinned paths is refused before anything is evicted") {
  const cost_model m(presets::marconi_7b());
  cache_t<lru_scorer> c(m, test::origin_store(1'000 * kv + 4 * ck, kv, ck), lru_scorer{});
  request_lifecycle<cache_t<lru_scorer>> requests(c);
  const auto a = tokens(600, 7);
  auto ta = requests.begin(a, {.output_tokens = 10});
  REQUIRE(ta);
  const auto a_done = cat(a, tokens(10, 8));
  REQUIRE(requests.finish(*ta, a_done, std::vector<std::int64_t>{610}));
  // A request in flight holds a's path pinned (it continues the conversation) ...
  auto tb = requests.begin(cat(a_done, tokens(50, 9)), {.output_tokens = 10});
  REQUIRE(tb);
  REQUIRE((*requests.state(*tb))->match.reusable_tokens == 610);
  const std::int64_t used = c.store().used_bytes(), evictions = c.counters().evictions;
  const auto tokens_before = c.tokens_cached();
  // ... so an unrelated 500-token request cannot fit: refused, nothing evicted.
  auto tc = requests.begin(tokens(500, 10), {.output_tokens = 10});
  REQUIRE_FALSE(tc);
  CHECK(tc.error() == errc::out_of_capacity);
  CHECK(c.store().used_bytes() == used);
  CHECK(c.counters().evictions == evictions);
  CHECK(c.tokens_cached() == tokens_before);
  CHECK(requests.in_flight() == 1);
  REQUIRE(requests.abort(*tb));
  // Without the pin a's path may go: now it fits, by eviction.
  auto td = requests.begin(tokens(500, 10), {.output_tokens = 10});
  REQUIRE(td);
  CHECK(c.counters().evictions > evictions);
  REQUIRE(requests.abort(*td));
  CHECK(c.store().used_bytes() == tree_bytes(c));
}

TEST_CASE_TEMPLATE("lifecycle randomized: many requests in flight, exact byte accounting, reused tokens never re-inserted",
                   Scorer, lru_scorer, flop_aware_scorer) {
  const cost_model m(presets::marconi_7b());
  auto make_scorer = [&] {
    if constexpr (std::is_same_v<Scorer, lru_scorer>) return lru_scorer{};
    else return flop_aware_scorer(m, {.alpha = 1.0});
  };
  for (std::uint32_t seed = 1; seed <= 3; ++seed) {
    cache_t<Scorer> c(m, test::origin_store(3'000 * kv + 12 * ck, kv, ck), make_scorer());
    request_lifecycle<cache_t<Scorer>> requests(c);
    std::mt19937 rng(seed);
    struct live {
      request_ticket t;
      std::vector<token_id> prompt;
      std::uint64_t serial_at_begin = 0;
      std::int64_t reusable = 0;
    };
    std::vector<live> in_flight;
    std::vector<std::vector<token_id>> done;
    int refused = 0, finished = 0, aborted = 0;
    for (int step = 0; step < 600; ++step) {
      const unsigned op = rng() % 10;
      if (op < 4 || in_flight.empty()) {  // begin
        std::vector<token_id> prompt;
        if (!done.empty() && rng() % 4 != 0) {
          const auto& base = done[rng() % done.size()];
          prompt.assign(base.begin(), base.begin() + static_cast<std::ptrdiff_t>(1 + rng() % base.size()));
        }
        prompt = cat(prompt, tokens(10 + rng() % 200, static_cast<std::uint32_t>(rng())));
        const std::uint64_t serial = c.store().serial();
        auto t = requests.begin(prompt, {.output_tokens = static_cast<std::int64_t>(rng() % 40)});
        if (!t) {
          REQUIRE(t.error() == errc::out_of_capacity);
          ++refused;
        } else {
          in_flight.push_back({*t, prompt, serial, (*requests.state(*t))->match.reusable_tokens});
        }
      } else if (op < 5) {  // grow
        auto& r = in_flight[rng() % in_flight.size()];
        const auto g = requests.grow(r.t, 1 + static_cast<std::int64_t>(rng() % 30));
        if (!g) REQUIRE(g.error() == errc::out_of_capacity);
      } else {  // finish or abort
        const std::size_t i = rng() % in_flight.size();
        live r = in_flight[i];
        in_flight.erase(in_flight.begin() + static_cast<std::ptrdiff_t>(i));
        const auto* s = *requests.state(r.t);
        if (op == 9) {
          REQUIRE(requests.abort(r.t));
          ++aborted;
        } else {
          const std::int64_t room = s->kv_from + s->reserved_tokens - static_cast<std::int64_t>(r.prompt.size());
          const auto seq = cat(r.prompt, tokens(static_cast<std::size_t>(room > 0 ? rng() % (room + 1) : 0),
                                                static_cast<std::uint32_t>(rng())));
          std::vector<std::int64_t> captured;
          for (const auto& site : s->plan.sites)
            if (rng() % 3 != 0) captured.push_back(site.position);
          if (static_cast<std::int64_t>(seq.size()) > s->match.reusable_tokens) captured.push_back(static_cast<std::int64_t>(seq.size()));
          std::sort(captured.begin(), captured.end());
          captured.erase(std::unique(captured.begin(), captured.end()), captured.end());
          auto f = requests.finish(r.t, seq, captured);
          REQUIRE(f);
          ++finished;
          const auto o = origins(c, seq);
          REQUIRE(o.size() == seq.size());
          for (std::int64_t k = 0; k < r.reusable; ++k) REQUIRE(o[static_cast<std::size_t>(k)] <= r.serial_at_begin);
          done.push_back(seq);
        }
      }
      // Exact accounting: the store holds the tree plus every live reservation.
      std::int64_t reserved = 0;
      for (const auto& r : in_flight) reserved += reserved_bytes(**requests.state(r.t));
      REQUIRE(c.store().used_bytes() == tree_bytes(c) + reserved);
      REQUIRE(c.store().used_bytes() <= c.store().capacity_bytes());
    }
    for (const auto& r : in_flight) REQUIRE(requests.abort(r.t));
    CHECK(c.store().used_bytes() == tree_bytes(c));
    CHECK(finished > 100);
    MESSAGE("seed " << seed << ": " << finished << " finished, " << aborted << " aborted, " << refused << " refused");
  }
}

TEST_CASE("lifecycle: the destructor aborts what is still in flight") {
  const cost_model m(presets::marconi_7b());
  cache_t<lru_scorer> c(m, test::origin_store(10'000 * kv + 20 * ck, kv, ck), lru_scorer{});
  {
    request_lifecycle<cache_t<lru_scorer>> requests(c);
    REQUIRE(requests.begin(tokens(100, 11), {.output_tokens = 5}));
    REQUIRE(requests.begin(tokens(100, 12)));
    CHECK(c.store().live_kv() > 2);  // two reservations and their split room
  }
  CHECK(c.store().used_bytes() == 0);
  CHECK(c.store().live_kv() == 0);
  CHECK(c.store().live_checkpoints() == 0);
}

TEST_CASE("lifecycle: a request's state stays put while other requests begin (regression)") {
  // Regression: the states lived in a vector that the ticket table resized when it filled
  // (16 tickets at first), so a runtime holding `*state(t)` (as docs/runtime.md shows) read a
  // moved-from state after enough other requests began.
  const cost_model m(presets::marconi_7b());
  cache_t<lru_scorer> c(m, test::origin_store(100'000 * kv + 200 * ck, kv, ck), lru_scorer{});
  request_lifecycle<cache_t<lru_scorer>> requests(c);
  auto t0 = requests.begin(tokens(50, 31), {.output_tokens = 3});
  REQUIRE(t0);
  const auto* s0 = *requests.state(*t0);
  std::vector<request_ticket> more;
  for (std::uint32_t i = 0; i < 40; ++i) {
    auto t = requests.begin(tokens(20, 100 + i));
    REQUIRE(t);
    more.push_back(*t);
  }
  REQUIRE(*requests.state(*t0) == s0);
  CHECK(s0->prompt_tokens == 50);
  CHECK(s0->reserved_tokens == 53);
  CHECK(s0->checkpoints.size() == s0->plan.sites.size() + 1);
  for (auto t : more) REQUIRE(requests.abort(t));
  REQUIRE(requests.abort(*t0));
}

TEST_CASE("lifecycle over the asymmetric pool: the bytes the runtime writes into its reservation are the bytes a later hit reads") {
  // A runtime writes every token's KV (a signature of position and token, per attention
  // layer) into the pages `begin` reserved; after `finish` every cached token of every
  // committed sequence must still read back its signature, through splits (copy-on-split
  // inside a block), evictions and requests that overlap in flight.
  using namespace hybridcache::memory;
  const cost_model m(presets::jamba_1_5_mini());
  using pool_t = host_asymmetric_pool<threshold_rebalancer>;
  using store_t = pool_state_store<pool_t>;
  using cache_type = prefix_cache<cost_model, judicious_admission, lru_scorer, store_t>;
  constexpr std::int64_t tpp = 16;
  pool_t pool({.capacity_bytes = std::uint64_t{64} << 20, .kv_page_bytes = kv_page_bytes(m),
               .ssm_block_bytes = checkpoint_block_bytes(m)},
              threshold_rebalancer({.threshold_low = 0.01, .threshold_high = 0.05, .migration_batch_size = 64,
                                    .min_rebalance_interval_ops = 0, .size_to_demand = true}));
  const std::int64_t layers = m.attention_layers();
  const std::uint64_t slot_bytes = kv_page_bytes(m) / tpp;
  auto sig = [](std::int64_t pos, token_id t, std::int64_t layer) {
    return splitmix64_mix((static_cast<std::uint64_t>(pos) << 32) ^ static_cast<std::uint32_t>(t) ^
                          (static_cast<std::uint64_t>(layer) << 56));
  };
  auto slot = [&](const store_t::kv_extent& e, std::int64_t i, std::int64_t layer) {
    const std::int64_t at = e.offset + i;
    const auto h = e.pages[static_cast<std::size_t>((at / tpp) * layers + layer)];
    return *pool.resolve(h) + static_cast<std::uint64_t>(at % tpp) * slot_bytes;
  };
  {
    cache_type c(m, store_t(pool, tpp, layers, m.recurrent_layers()), lru_scorer{});
    request_lifecycle<cache_type> requests(c);
    std::mt19937 rng(5);
    std::vector<std::vector<token_id>> done;
    int finished = 0, checked_tokens = 0, table_reads = 0, tails = 0;
    std::vector<packed_handle> table;
    for (int step = 0; step < 120; ++step) {
      std::vector<token_id> prompt;
      if (!done.empty() && rng() % 3 != 0) {
        const auto& base = done[rng() % done.size()];
        prompt.assign(base.begin(), base.begin() + static_cast<std::ptrdiff_t>(1 + rng() % base.size()));
      }
      prompt = cat(prompt, tokens(20 + rng() % 120, static_cast<std::uint32_t>(rng())));
      auto t = requests.begin(prompt, {.output_tokens = 8});
      if (!t) {
        REQUIRE(t.error() == errc::out_of_capacity);
        continue;
      }
      const auto* s = *requests.state(*t);
      // Decode: 1..16 tokens; past the 8 reserved at begin the runtime grows (a second
      // segment), after it wrote everything before it, as the lifecycle's contract asks.
      const auto out_tokens = static_cast<std::int64_t>(1 + rng() % 16);
      const auto seq = cat(prompt, tokens(static_cast<std::size_t>(out_tokens), static_cast<std::uint32_t>(rng())));
      // The runtime writes KV from kv_from: the tree holds [0, kv_from) (the matched prefix and
      // any KV-only tail beyond it), read through the table and never written.
      const std::int64_t from = s->kv_from;
      tails += s->kv_from > s->match.reusable_tokens ? 1 : 0;
      // Writes [lo, hi) through the block table, as a kernel would: token p is in page
      // table[p / P] at slot p % P; first checks that the cached prefix reads back its
      // signatures (through the copy-on-write of a block it shares with the request).
      auto run_kernel = [&](std::int64_t lo, std::int64_t hi, bool check_prefix) {
        for (std::int64_t l = 0; l < layers; ++l) {
          REQUIRE(requests.block_table(*t, l, table));
          REQUIRE(static_cast<std::int64_t>(table.size()) * tpp >= hi);
          auto at = [&](std::int64_t p) {
            return *pool.resolve(table[static_cast<std::size_t>(p / tpp)]) + static_cast<std::uint64_t>(p % tpp) * slot_bytes;
          };
          for (std::int64_t p = 0; check_prefix && p < from; ++p) {
            std::uint64_t v = 0;
            std::memcpy(&v, at(p), sizeof v);
            REQUIRE(v == sig(p, seq[static_cast<std::size_t>(p)], l));
            ++table_reads;
          }
          for (std::int64_t p = lo; p < hi; ++p) {
            const std::uint64_t v = sig(p, seq[static_cast<std::size_t>(p)], l);
            std::memcpy(at(p), &v, sizeof v);
          }
        }
      };
      const auto len = static_cast<std::int64_t>(seq.size());
      const std::int64_t first_part = std::min(len, static_cast<std::int64_t>(prompt.size()) + 8);
      run_kernel(from, first_part, true);
      if (out_tokens > 8) {
        REQUIRE(requests.grow(*t, out_tokens - 8));
        run_kernel(first_part, len, false);
      }
      std::vector<std::int64_t> captured;
      for (const auto& site : s->plan.sites)
        if (site.position <= static_cast<std::int64_t>(seq.size())) captured.push_back(site.position);
      captured.push_back(static_cast<std::int64_t>(seq.size()));
      std::sort(captured.begin(), captured.end());
      captured.erase(std::unique(captured.begin(), captured.end()), captured.end());
      const auto f = requests.finish(*t, seq, captured);
      REQUIRE_MESSAGE(f, "finish: " << hybridcache::to_string(f.error()) << " at step " << step);
      ++finished;
      done.push_back(seq);
      // Every cached token of every committed sequence reads back its signature.
      for (const auto& d : done) {
        std::vector<node_id> path;
        (void)c.tree().walk(d, path);
        for (node_id n : path) {
          const auto& nd = c.tree().at(n);
          for (std::int64_t i = 0; i < nd.edge(); ++i) {
            const std::int64_t p = nd.begin() + i;
            for (std::int64_t l = 0; l < layers; ++l) {
              std::uint64_t v = 0;
              std::memcpy(&v, slot(nd.kv, i, l), sizeof v);
              REQUIRE(v == sig(p, d[static_cast<std::size_t>(p)], l));
              ++checked_tokens;
            }
          }
        }
      }
    }
    CHECK(finished > 60);
    CHECK(c.counters().evictions > 0);
    CHECK(table_reads > 1000);
    CHECK(tails > 5);  // requests that reused a KV-only tail instead of reserving it again
    MESSAGE(finished << " requests, " << c.counters().evictions << " evictions, " << checked_tokens
                     << " token-layer reads checked through the tree, " << table_reads << " through block tables");
  }
  CHECK(pool.live_handles() == 0);
}

TEST_CASE("lifecycle over the asymmetric pool: grow keeps a shared block whole through short segments (regression)") {
  // Regression: grow copied into the new segment's first block only the previous segment's
  // tokens of that block. When the block also held cached tokens (a reservation that starts
  // inside it) or an earlier segment's (segments shorter than a page, as a runtime that grows
  // two tokens at a time makes), the block table named a page missing those tokens, and
  // attention read garbage for them (found by examples/tiny_hybrid_runtime.cpp).
  using namespace hybridcache::memory;
  const cost_model m(presets::jamba_1_5_mini());
  using pool_t = host_asymmetric_pool<threshold_rebalancer>;
  using store_t = pool_state_store<pool_t>;
  using cache_type = prefix_cache<cost_model, judicious_admission, lru_scorer, store_t>;
  constexpr std::int64_t tpp = 16;
  pool_t pool({.capacity_bytes = std::uint64_t{256} << 20, .kv_page_bytes = kv_page_bytes(m),
               .ssm_block_bytes = checkpoint_block_bytes(m)},
              threshold_rebalancer({.threshold_low = 0.01, .threshold_high = 0.05, .migration_batch_size = 64,
                                    .min_rebalance_interval_ops = 0, .size_to_demand = true}));
  const std::int64_t layers = m.attention_layers();
  const std::uint64_t slot_bytes = kv_page_bytes(m) / tpp;
  auto sig = [](std::int64_t pos, token_id t, std::int64_t layer) {
    return splitmix64_mix((static_cast<std::uint64_t>(pos) << 32) ^ static_cast<std::uint32_t>(t) ^
                          (static_cast<std::uint64_t>(layer) << 56));
  };
  {
    cache_type c(m, store_t(pool, tpp, layers, m.recurrent_layers()), lru_scorer{});
    request_lifecycle<cache_type> requests(c);
    std::vector<packed_handle> table;
    // Writes [lo, hi) of `seq` through the ticket's block tables, after checking that [0, lo)
    // reads back.
    auto step = [&](request_ticket t, const std::vector<token_id>& seq, std::int64_t lo, std::int64_t hi) {
      for (std::int64_t l = 0; l < layers; ++l) {
        REQUIRE(requests.block_table(t, l, table));
        auto at = [&](std::int64_t p) {
          return *pool.resolve(table[static_cast<std::size_t>(p / tpp)]) + static_cast<std::uint64_t>(p % tpp) * slot_bytes;
        };
        for (std::int64_t p = 0; p < lo; ++p) {
          std::uint64_t v = 0;
          std::memcpy(&v, at(p), sizeof v);
          CAPTURE(p);
          REQUIRE(v == sig(p, seq[static_cast<std::size_t>(p)], l));
        }
        for (std::int64_t p = lo; p < hi; ++p) {
          const std::uint64_t v = sig(p, seq[static_cast<std::size_t>(p)], l);
          std::memcpy(at(p), &v, sizeof v);
        }
      }
    };
    // A: 40 tokens cached with the state after them.
    const auto a = tokens(40, 21);
    auto ta = requests.begin(a);
    REQUIRE(ta);
    step(*ta, a, 0, 40);
    const std::int64_t end_a[] = {40};
    REQUIRE(requests.finish(*ta, a, end_a));
    // B resumes at 40, inside block [32, 48): its reservation [40, 45) starts in that block,
    // then decode grows two tokens at a time, each segment inside the same block.
    const auto b = cat(a, tokens(11, 22));  // prompt 43 tokens + 8 decoded
    const std::vector<token_id> prompt_b(b.begin(), b.begin() + 43);
    auto tb = requests.begin(prompt_b, {.output_tokens = 2});
    REQUIRE(tb);
    REQUIRE((*requests.state(*tb))->match.reusable_tokens == 40);
    step(*tb, b, 40, 45);
    for (std::int64_t p = 45; p < 51; p += 2) {
      REQUIRE(requests.grow(*tb, 2));
      step(*tb, b, p, p + 2);  // checks [0, p) through the new table first
    }
    step(*tb, b, 51, 51);
    std::vector<std::int64_t> captured;
    for (const auto& site : (*requests.state(*tb))->plan.sites) captured.push_back(site.position);
    captured.push_back(51);
    REQUIRE(requests.finish(*tb, b, captured));
    // C hits all of B: every cached token reads back through its block table.
    auto tc = requests.begin(cat(b, tokens(3, 23)));
    REQUIRE_MESSAGE(tc, hybridcache::to_string(tc.error()));
    REQUIRE((*requests.state(*tc))->match.reusable_tokens == 51);
    step(*tc, b, 51, 51);
    REQUIRE(requests.abort(*tc));
  }
  CHECK(pool.live_handles() == 0);
}

TEST_SUITE("concurrency") {
  TEST_CASE("lifecycle: four request threads through one mutex_lock cache keep exact accounting") {
    const cost_model m(presets::marconi_7b());
    using locked_t = prefix_cache<cost_model, judicious_admission, flop_aware_scorer, test::origin_store, mutex_lock>;
    locked_t c(m, test::origin_store(4'000 * kv + 16 * ck, kv, ck), flop_aware_scorer(m, {.alpha = 0.5}));
    request_lifecycle<locked_t> requests(c);
    const auto system = tokens(64, 99);
    std::atomic<int> finished{0}, refused{0};
    std::vector<std::thread> threads;
    for (int th = 0; th < 4; ++th) {
      threads.emplace_back([&, th] {
        std::mt19937 rng(static_cast<std::uint32_t>(th) + 1);
        std::vector<token_id> last = system;
        for (int i = 0; i < 150; ++i) {
          auto prompt = rng() % 3 == 0 ? system : last;
          prompt = cat(prompt, tokens(5 + rng() % 60, static_cast<std::uint32_t>(rng())));
          auto t = requests.begin(prompt, {.output_tokens = 8});
          if (!t) {
            REQUIRE(t.error() == errc::out_of_capacity);
            refused.fetch_add(1);
            continue;
          }
          const auto seq = cat(prompt, tokens(1 + rng() % 8, static_cast<std::uint32_t>(rng())));
          std::vector<std::int64_t> captured{static_cast<std::int64_t>(seq.size())};
          if (rng() % 5 == 0) {
            REQUIRE(requests.abort(*t));
          } else {
            REQUIRE(requests.finish(*t, seq, captured));
            finished.fetch_add(1);
            last = seq;
          }
        }
      });
    }
    for (auto& th : threads) th.join();
    CHECK(requests.in_flight() == 0);
    CHECK(c.store().used_bytes() == tree_bytes(c));
    CHECK(c.store().used_bytes() <= c.store().capacity_bytes());
    CHECK(finished.load() > 300);
    bool pinned = false;
    c.tree().preorder([&](node_id n) { pinned = pinned || c.tree().at(n).pins != 0; });
    CHECK(!pinned);
    MESSAGE(finished.load() << " finished, " << refused.load() << " refused");
  }
}

TEST_CASE("lifecycle: after the cache is cleared, a request's cached path is reported stale, never read") {
  using namespace hybridcache::memory;
  const cost_model m(presets::jamba_1_5_mini());
  using pool_t = host_asymmetric_pool<no_rebalancer>;
  using store_t = pool_state_store<pool_t>;
  using cache_type = prefix_cache<cost_model, judicious_admission, lru_scorer, store_t>;
  pool_t pool({.capacity_bytes = std::uint64_t{64} << 20, .kv_page_bytes = kv_page_bytes(m),
               .ssm_block_bytes = checkpoint_block_bytes(m)});
  {
    cache_type c(m, store_t(pool, 16, m.attention_layers(), m.recurrent_layers()), lru_scorer{});
    request_lifecycle<cache_type> requests(c);
    const auto a = tokens(40, 31);
    auto ta = requests.begin(a, {.output_tokens = 4});
    REQUIRE(ta);
    REQUIRE(requests.finish(*ta, cat(a, tokens(4, 32)), std::vector<std::int64_t>{44}));
    auto tb = requests.begin(cat(cat(a, tokens(4, 32)), tokens(5, 33)), {.output_tokens = 2});
    REQUIRE(tb);
    REQUIRE((*requests.state(*tb))->match.reusable_tokens == 44);
    c.clear();  // ends the request: its reservation goes back at once
    CHECK(pool.live_handles() == 0);
    std::vector<packed_handle> table;
    CHECK(requests.block_table(*tb, 0, table).error() == errc::stale_handle);
    CHECK(requests.resume_checkpoint(*tb).error() == errc::stale_handle);
    CHECK(requests.abort(*tb).error() == errc::stale_handle);
  }
  CHECK(pool.live_handles() == 0);
}

namespace {
// A lock policy that runs an action just before its N-th acquisition from now, on the
// calling thread (the action's own calls take the lock without firing again): it puts
// another request's work exactly between two critical sections of one call.
struct interleave {
  static inline std::function<void()> action;
  static inline int countdown = 0;
  static inline bool running = false;
};
class interleaving_lock {
 public:
  void lock() {
    if (!interleave::running && interleave::countdown > 0 && --interleave::countdown == 0 && interleave::action) {
      interleave::running = true;
      auto act = std::exchange(interleave::action, nullptr);
      act();
      interleave::running = false;
    }
    m_.lock();
  }
  void unlock() { m_.unlock(); }

 private:
  std::mutex m_;
};
static_assert(lock_policy<interleaving_lock>);
}  // namespace

TEST_CASE("lifecycle: begin matches, looks below and pins the KV-only tail in one critical section (regression)") {
  // Found by tiered.concurrency (1 run in ~50): begin matched under one lock and pinned the
  // KV-only tail under another, from the match's common prefix. An eviction in between left
  // kv_from beyond the KV the tree still held: the tokens between were neither pinned nor
  // reserved from, and finish refused the request (invalid_argument) or, with a lower tier,
  // a node adopted pages nobody wrote.
  using locked_t = prefix_cache<cost_model, judicious_admission, lru_scorer, test::origin_store, interleaving_lock>;
  const cost_model m(presets::marconi_7b());
  locked_t c(m, test::origin_store(2'000 * kv + 10 * ck, kv, ck), lru_scorer{});
  request_lifecycle<locked_t> requests(c);
  const auto base = tokens(250, 21), y = tokens(280, 22), z = tokens(150, 23);
  auto serve = [&](const std::vector<token_id>& seq, std::vector<std::int64_t> captured) {
    auto t = requests.begin(seq, {});
    REQUIRE(t);
    REQUIRE(requests.finish(*t, seq, captured));
  };
  // X = [0, 200) with a state at 200; W = [200, 250) KV only (the branch point, no state);
  // Y = [250, 530) and Z = [250, 400), each with a state at its end.
  const std::vector<token_id> x(base.begin(), base.begin() + 200);
  serve(x, {200});
  const auto by = cat(base, y), bz = cat(base, z);
  serve(by, {530});
  serve(bz, {400});
  // A request in flight continues Z: Z stays (pinned), so W stays a branch point.
  auto tz = requests.begin(cat(bz, tokens(10, 24)), {});
  REQUIRE(tz);
  REQUIRE((*requests.state(*tz))->match.reusable_tokens == 400);
  // Q follows Y 50 tokens past W: it reuses X's state (200) and reads KV up to 300.
  const auto q = cat(cat(base, std::vector<token_id>(y.begin(), y.begin() + 50)), tokens(40, 25));
  // Another request that needs Y's room, run between begin's two critical sections when
  // there were two (after the fix: before the next call, when Q's pin keeps Y).
  interleave::countdown = 2;
  interleave::action = [&] {
    const std::int64_t free_kv = (c.store().capacity_bytes() - c.store().used_bytes()) / kv;
    auto t = requests.begin(tokens(10, 26), {.output_tokens = free_kv + 20});
    if (t) REQUIRE(requests.abort(*t));
  };
  auto tq = requests.begin(q, {.output_tokens = 5});
  REQUIRE(tq);
  const auto* s = *requests.state(*tq);
  CHECK(s->match.reusable_tokens == 200);
  CHECK(interleave::action == nullptr);  // the other request ran
  const auto seq = cat(q, tokens(5, 27));
  auto f = requests.finish(*tq, seq, std::vector<std::int64_t>{static_cast<std::int64_t>(seq.size())});
  CHECK_MESSAGE(f, (f ? "" : to_string(f.error())));  // was invalid_argument: the tree's KV ended at 250, kv_from 300
  REQUIRE(requests.abort(*tz));
  interleave::countdown = 0;
  CHECK(c.store().used_bytes() == tree_bytes(c));
  // Every token of Q's path is in the tree, each once.
  CHECK(origins(c, seq).size() == seq.size());
}

TEST_CASE("lifecycle: wait_layer_loaded over a store without lower tiers is wait_loaded (nothing to wait for)") {
  const cost_model m(presets::marconi_7b());
  cache_t<lru_scorer> c(m, test::origin_store(10'000 * kv + 20 * ck, kv, ck), lru_scorer{});
  request_lifecycle<cache_t<lru_scorer>> requests(c);
  auto t = requests.begin(tokens(60, 41), {.output_tokens = 2});
  REQUIRE(t);
  CHECK(requests.wait_layer_loaded(*t, layer_kind::attention, 0).has_value());
  CHECK(requests.wait_layer_loaded(*t, layer_kind::recurrent, 3).has_value());
  REQUIRE(requests.abort(*t));
  CHECK(requests.wait_layer_loaded(*t, layer_kind::attention, 0).error() == errc::double_free);  // no longer in flight
}
