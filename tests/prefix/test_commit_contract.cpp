// The commit contract a runtime that holds real KV and SSM bytes relies on (issue #13,
// breaks 1, 2, 3 and 5):
//   - a commit that cannot fit, even with every node it may evict gone, is refused up front
//     and evicts nothing;
//   - a commit never evicts the prefix it extends (those tokens' KV was computed by an
//     earlier request and lives in the cache's pages; re-inserting them into fresh pages
//     that nobody fills would hand the next hit wrong bytes);
//   - after any failed commit the match's pin is still held (release succeeds once);
//   - destroying the cache, or clear(), gives every handle back to the store.
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "hybridcache/memory/asymmetric_pool.hpp"
#include "hybridcache/model/presets.hpp"
#include "hybridcache/prefix/flop_aware_scorer.hpp"
#include "hybridcache/prefix/lru_scorer.hpp"
#include "hybridcache/prefix/prefix_cache.hpp"
#include "hybridcache/stores/counting_store.hpp"
#include "hybridcache/stores/pool_state_store.hpp"
#include "../support/origin_store.hpp"
#include "../support/random_tokens.hpp"

using namespace hybridcache;
using namespace hybridcache::prefix;
using namespace hybridcache::stores;

namespace {

using hybridcache::test::random_tokens;

std::vector<token_id> concat(std::vector<token_id> a, const std::vector<token_id>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

/// What a snapshot of the cache compares: the tree's shape and the store's bytes.
struct snapshot {
  std::int64_t used = 0, tokens = 0, checkpoints = 0, nodes = 0;
  friend bool operator==(const snapshot&, const snapshot&) = default;
};
template <class Cache>
snapshot take(const Cache& c) {
  snapshot s{c.store().used_bytes(), c.tokens_cached(), c.checkpoints_cached(), 0};
  c.tree().preorder([&](node_id) { ++s.nodes; });
  return s;
}

/// The allocation serial of every token of `seq` that the tree holds on its path, in order.
template <class Cache>
std::vector<std::uint64_t> origins_on_path(const Cache& c, std::span<const token_id> seq) {
  std::vector<node_id> path;
  const auto w = c.tree().walk(seq, path);
  (void)w;
  std::vector<std::uint64_t> out;
  for (node_id n : path) {
    const auto& o = c.tree().at(n).kv.origin;
    out.insert(out.end(), o.begin(), o.end());
  }
  return out;
}

}  // namespace

TEST_CASE_TEMPLATE("commit refuses up front what cannot fit beside the prefix it extends, evicting nothing", Scorer,
                   lru_scorer, flop_aware_scorer) {
  // marconi_7b, 1 GB: a 10k-token conversation (655 MB of KV + a 26.8 MB checkpoint) is
  // cached and matched; its continuation by 5.5k tokens needs 387 MB more, which fits only
  // if the conversation itself is evicted. Before the fix the commit unpinned the match,
  // evicted everything and still failed.
  const cost_model m(presets::marconi_7b());
  auto make_scorer = [&] {
    if constexpr (std::is_same_v<Scorer, lru_scorer>) return lru_scorer{};
    else return flop_aware_scorer(m, {.alpha = 1.0});
  };
  prefix_cache<cost_model, judicious_admission, Scorer, counting_store> c(
      m, counting_store(1'000'000'000, m.kv_bytes_per_token(), m.ssm_checkpoint_bytes()), make_scorer());
  const auto a = random_tokens(10'000, 1);
  {
    auto miss = c.match(a);
    REQUIRE(miss);
    REQUIRE(c.commit(a, 10'000, &*miss));
  }
  auto hit = c.match(a);
  REQUIRE(hit);
  REQUIRE(hit->reusable_tokens == 10'000);
  const snapshot before = take(c);
  const auto longer = concat(a, random_tokens(5'500, 2));
  const auto r = c.commit(longer, 15'000, &*hit);
  REQUIRE_FALSE(r);
  CHECK(r.error() == errc::out_of_capacity);
  CHECK(take(c) == before);  // nothing evicted, nothing inserted
  CHECK(c.counters().evictions == 0);
  CHECK(c.release(*hit));  // the pin is still held after the failure
  CHECK(c.release(*hit).error() == errc::double_free);
}

TEST_CASE("commit never evicts the prefix it extends (its KV is the earlier request's bytes)") {
  // Capacity: 800 tokens + 1.5 checkpoints. A (400) is cached with its checkpoint; A+T (800)
  // fits only if A is dropped and re-inserted (one checkpoint instead of two). Before the
  // fix the commit did exactly that: the KV of A's 400 tokens went to fresh allocations
  // nobody filled. Now the commit either keeps A's allocations or is refused unchanged.
  constexpr std::int64_t kv = 100, ck = 10'000;
  prefix_cache<cost_model, judicious_admission, lru_scorer, test::origin_store> c(
      cost_model(presets::marconi_7b()), test::origin_store(800 * kv + 3 * ck / 2, kv, ck), lru_scorer{});
  const auto a = random_tokens(400, 3);
  {
    auto miss = c.match(a);
    REQUIRE(miss);
    REQUIRE(c.commit(a, 400, &*miss));
  }
  const auto at = concat(a, random_tokens(400, 4));
  auto hit = c.match(std::span<const token_id>(at).first(600));
  REQUIRE(hit);
  REQUIRE(hit->reusable_tokens == 400);
  const auto before_origins = origins_on_path(c, a);
  REQUIRE(before_origins.size() == 400);
  const std::uint64_t serial_before = c.store().serial();
  const snapshot before = take(c);
  const auto r = c.commit(at, 600, &*hit);
  if (r) {
    const auto after = origins_on_path(c, at);
    REQUIRE(after.size() == 800);
    for (std::size_t i = 0; i < 400; ++i) {
      INFO("token ", i);
      REQUIRE(after[i] <= serial_before);  // written by the earlier request, not re-inserted
    }
  } else {
    CHECK(r.error() == errc::out_of_capacity);
    CHECK(take(c) == before);
    CHECK(origins_on_path(c, a) == before_origins);
    CHECK(c.release(*hit));
  }
}

TEST_CASE("randomized: no commit re-inserts tokens below the reused prefix, and a failed commit changes nothing") {
  // Branching conversations through a small origin store, LRU and FLOP-aware: after every
  // successful commit the tokens [0, reusable) of the request are still the allocations
  // an earlier request made; after every failed commit the cache is as before and the pin
  // is released exactly once.
  const cost_model m(presets::marconi_7b());
  constexpr std::int64_t kv = 64, ck = 4096;
  for (int scorer_kind = 0; scorer_kind < 2; ++scorer_kind) {
    for (std::uint32_t seed = 1; seed <= 4; ++seed) {
      auto run = [&](auto c) {
        std::mt19937 rng(seed);
        std::vector<std::vector<token_id>> convs;
        int failures = 0, successes = 0;
        for (int i = 0; i < 300; ++i) {
          std::vector<token_id> input;
          if (!convs.empty() && rng() % 4 != 0) {
            const auto& base = convs[rng() % convs.size()];
            input.assign(base.begin(), base.begin() + static_cast<std::ptrdiff_t>(1 + rng() % base.size()));
          }
          const auto ext = random_tokens(20 + rng() % 300, static_cast<std::uint32_t>(rng()));
          input.insert(input.end(), ext.begin(), ext.end());
          const auto out = random_tokens(1 + rng() % 60, static_cast<std::uint32_t>(rng()));
          const auto seq = concat(input, out);
          auto mt = c->match(input);
          REQUIRE(mt);
          const auto reuse = static_cast<std::size_t>(mt->reusable_tokens);
          const auto before_origins = origins_on_path(*c, std::span<const token_id>(seq).first(reuse));
          const std::uint64_t serial_before = c->store().serial();
          const snapshot before = take(*c);
          const auto r = c->commit(seq, static_cast<std::int64_t>(input.size()), &*mt);
          if (r) {
            ++successes;
            const auto after = origins_on_path(*c, seq);
            REQUIRE(after.size() >= reuse);
            for (std::size_t t = 0; t < reuse; ++t) REQUIRE(after[t] <= serial_before);
            CHECK(c->store().used_bytes() <= c->store().capacity_bytes());
            convs.push_back(seq);
          } else {
            ++failures;
            REQUIRE(r.error() == errc::out_of_capacity);
            REQUIRE(take(*c) == before);
            REQUIRE(origins_on_path(*c, std::span<const token_id>(seq).first(reuse)) == before_origins);
            REQUIRE(c->release(*mt));
          }
        }
        CHECK(successes > 100);
        CHECK(failures > 0);
        MESSAGE("seed " << seed << ": " << successes << " commits, " << failures << " refused");
      };
      const auto cap = 700 * kv + 3 * ck;  // tight: many commits evict, some are refused
      if (scorer_kind == 0)
        run(std::make_unique<prefix_cache<cost_model, judicious_admission, lru_scorer, test::origin_store>>(
            m, test::origin_store(cap, kv, ck), lru_scorer{}));
      else
        run(std::make_unique<prefix_cache<cost_model, judicious_admission, flop_aware_scorer, test::origin_store>>(
            m, test::origin_store(cap, kv, ck), flop_aware_scorer(m, {.alpha = 1.0})));
    }
  }
}

TEST_CASE("destroying the cache, or clear(), gives every handle back to the pool") {
  using namespace hybridcache::memory;
  const cost_model m(presets::jamba_1_5_mini());
  using pool_t = host_asymmetric_pool<no_rebalancer>;
  using store_t = pool_state_store<pool_t>;
  pool_t pool({.capacity_bytes = std::uint64_t{256} << 20, .kv_page_bytes = kv_page_bytes(m),
               .ssm_block_bytes = checkpoint_block_bytes(m)});
  auto fill = [&](auto& c) {
    for (std::uint32_t s = 1; s <= 40; ++s) {
      const auto input = random_tokens(100 + s * 7, s);
      auto mt = c.match(input);
      REQUIRE(mt);
      (void)c.commit(concat(input, random_tokens(30, s + 1000)), static_cast<std::int64_t>(input.size()), &*mt);
    }
  };
  {
    prefix_cache<cost_model, judicious_admission, lru_scorer, store_t> c(
        m, store_t(pool, 16, m.attention_layers(), m.recurrent_layers()), lru_scorer{});
    fill(c);
    REQUIRE(pool.live_handles() > 0);
    c.clear();
    CHECK(pool.live_handles() == 0);
    CHECK(c.store().used_bytes() == 0);
    CHECK(c.tokens_cached() == 0);
    fill(c);  // usable after clear
    CHECK(c.tokens_cached() > 0);
    REQUIRE(pool.live_handles() > 0);
  }
  CHECK(pool.live_handles() == 0);  // the destructor freed the rest
}

TEST_CASE("the eviction listener hears every eviction step, and a commit says which checkpoints it kept") {
  const cost_model m(presets::marconi_7b());
  constexpr std::int64_t kv = 64, ck = 4096;
  struct heard {
    std::int64_t events = 0, checkpoints = 0, leaves = 0, merged = 0, kv_tokens_freed = 0;
  } h;
  prefix_cache<cost_model, judicious_admission, flop_aware_scorer, counting_store> c(m, counting_store(600 * kv + 3 * ck, kv, ck),
                                                                     flop_aware_scorer(m, {.alpha = 1.0}));
  c.set_eviction_listener({.fn = [](void* ctx, const eviction_event& e) noexcept {
                             auto& s = *static_cast<heard*>(ctx);
                             ++s.events;
                             s.checkpoints += e.checkpoint_freed ? 1 : 0;
                             s.leaves += e.kv_freed ? 1 : 0;
                             s.merged += e.kv_moved_to_child ? 1 : 0;
                             if (e.kv_freed) s.kv_tokens_freed += e.end - e.begin;
                             CHECK(e.begin < e.end);
                           },
                           .context = &h});
  std::mt19937 rng(9);
  std::vector<std::vector<token_id>> convs;
  for (int i = 0; i < 200; ++i) {
    std::vector<token_id> input;
    if (!convs.empty() && rng() % 3 != 0) {
      const auto& base = convs[rng() % convs.size()];
      input.assign(base.begin(), base.begin() + static_cast<std::ptrdiff_t>(1 + rng() % base.size()));
    }
    const auto ext = random_tokens(10 + rng() % 150, static_cast<std::uint32_t>(rng()));
    input.insert(input.end(), ext.begin(), ext.end());
    const auto seq = concat(input, random_tokens(1 + rng() % 20, static_cast<std::uint32_t>(rng())));
    auto mt = c.match(input);
    REQUIRE(mt);
    const auto r = c.commit(seq, static_cast<std::int64_t>(input.size()), &*mt);
    if (!r) {
      REQUIRE(c.release(*mt));
      continue;
    }
    convs.push_back(seq);
    // Judicious admission keeps the state after the last token; every kept position is on
    // the sequence and now holds a checkpoint.
    const auto kept = c.committed_checkpoints();
    REQUIRE(!kept.empty());
    CHECK(kept.back() == static_cast<std::int64_t>(seq.size()));
    for (std::int64_t p : kept) {
      CHECK(p >= 1);
      CHECK(p <= static_cast<std::int64_t>(seq.size()));
    }
  }
  CHECK(h.events == c.counters().evictions);
  CHECK(h.checkpoints == c.counters().checkpoints_evicted);
  CHECK(h.leaves > 0);
  CHECK(h.kv_tokens_freed * kv + h.checkpoints * ck == c.counters().bytes_evicted);
  c.set_eviction_listener({});
}

TEST_CASE("protected_bytes (pinned paths only) equals the O(n) scan of every node, on random trees and pins") {
  // The fit check of commit and begin counts what eviction may never free by climbing the
  // pinned paths (detail::protected_bytes); the reference is the scan of every node
  // (detail::count_tree_bytes). Random branching trees, random matches held open, random
  // guarded nodes, both scorer kinds (leaves only / inner nodes).
  const cost_model m(presets::marconi_7b());
  const std::int64_t kv = m.kv_bytes_per_token(), ck = m.ssm_checkpoint_bytes();
  prefix_cache<cost_model, every_block_admission<8>, lru_scorer, counting_store> c(m, counting_store(1'000'000'000'000, kv, ck),
                                                                   lru_scorer{});
  std::mt19937 rng(17);
  std::vector<std::vector<token_id>> seqs;
  std::vector<token_id> base = random_tokens(30, 99);
  for (int i = 0; i < 150; ++i) {
    std::vector<token_id> s = seqs.empty() || rng() % 5 == 0 ? base : seqs[rng() % seqs.size()];
    s.resize(s.size() - rng() % std::min<std::size_t>(s.size(), 20));
    const auto tail = random_tokens(1 + rng() % 40, static_cast<std::uint32_t>(rng()));
    s.insert(s.end(), tail.begin(), tail.end());
    REQUIRE(c.commit(s, static_cast<std::int64_t>(s.size())));
    seqs.push_back(std::move(s));
  }
  std::vector<node_id> live;
  c.tree().preorder([&](node_id n) { live.push_back(n); });
  prefix::detail::protect_scratch scratch;
  std::vector<char> marked;
  int with_branching = 0;
  for (int round = 0; round < 200; ++round) {
    std::vector<match_result> held;
    std::vector<node_id> pinned;
    const int k = static_cast<int>(rng() % 6);
    for (int j = 0; j < k; ++j) {
      auto r = c.match(seqs[rng() % seqs.size()]);
      REQUIRE(r);
      if (r->node != no_node) pinned.push_back(r->node);
      held.push_back(*r);
    }
    const node_id g1 = rng() % 3 == 0 ? no_node : live[rng() % live.size()];
    const node_id g2 = rng() % 2 == 0 ? no_node : live[rng() % live.size()];
    const auto leaves_only = prefix::detail::count_tree_bytes<false>(c.tree(), c.store(), g1, g2, marked);
    const auto inner = prefix::detail::count_tree_bytes<true>(c.tree(), c.store(), g1, g2, marked);
    CHECK(prefix::detail::protected_bytes<false>(c.tree(), c.store(), g1, g2, pinned, scratch) == leaves_only.protected_);
    CHECK(prefix::detail::protected_bytes<true>(c.tree(), c.store(), g1, g2, pinned, scratch) == inner.protected_);
    CHECK(leaves_only.total == c.tree().bytes());
    with_branching += inner.protected_ != leaves_only.protected_ ? 1 : 0;
    for (const auto& r : held) REQUIRE(c.release(r));
  }
  CHECK(with_branching > 20);  // the branch rule (inner-node scorers) was exercised
}

TEST_CASE_TEMPLATE("break 4: a commit after a hit keeps no state inside the reused prefix (it was never computed)", Scorer,
                   lru_scorer, flop_aware_scorer) {
  // every_block_admission asks for a state at every block boundary, including those inside
  // the prefix the request reused; after evictions (merges, tombstones) some of them hold no
  // state. The request resumed from its match's checkpoint, so it never computed them: the
  // commit must not keep them (before the fix it split the path there and kept fresh,
  // unfilled checkpoint slots). An explicit position there is refused.
  const cost_model m(presets::marconi_7b());
  const std::int64_t kv = m.kv_bytes_per_token(), ck = m.ssm_checkpoint_bytes();
  auto make_scorer = [&] {
    if constexpr (std::is_same_v<Scorer, lru_scorer>) return lru_scorer{};
    else return flop_aware_scorer(m, {.alpha = 1.0});
  };
  prefix_cache<cost_model, every_block_admission<16>, Scorer, counting_store> c(m, counting_store(2000 * kv + 40 * ck, kv, ck),
                                                               make_scorer());
  std::mt19937 rng(23);
  std::vector<std::vector<token_id>> seqs{random_tokens(48, 5)};
  std::int64_t checked = 0, inside_before = 0;
  for (int i = 0; i < 400; ++i) {
    std::vector<token_id> s = seqs[rng() % seqs.size()];
    if (rng() % 3 == 0 && s.size() > 20) s.resize(s.size() - rng() % 20);
    const auto tail = random_tokens(5 + rng() % 50, static_cast<std::uint32_t>(rng()));
    s.insert(s.end(), tail.begin(), tail.end());
    if (s.size() > 600) s = random_tokens(48, static_cast<std::uint32_t>(rng()));
    const auto input = static_cast<std::int64_t>(s.size()) - 4;
    auto mt = c.match(std::span<const token_id>(s).first(static_cast<std::size_t>(input)));
    REQUIRE(mt);
    if (mt->reusable_tokens > 16) {
      // Count the block boundaries inside the reused prefix that hold no state now.
      std::vector<node_id> path;
      (void)c.tree().walk(s, path);
      for (std::int64_t p = 16; p < mt->reusable_tokens; p += 16) {
        bool held = false;
        for (node_id n : path) held |= c.tree().at(n).end == p && c.tree().at(n).has_checkpoint;
        inside_before += held ? 0 : 1;
      }
      bool held_at_1 = false;  // a node ending after the first token is (almost) never there
      for (node_id n : path) held_at_1 |= c.tree().at(n).end == 1 && c.tree().at(n).has_checkpoint;
      if (!held_at_1) {
        const std::vector<std::int64_t> extra{1};
        const auto refused = c.commit(s, input, &*mt, extra);
        REQUIRE_FALSE(refused);
        CHECK(refused.error() == errc::invalid_argument);
      }
    }
    auto r = c.commit(s, input, &*mt);
    if (!r) {
      REQUIRE(c.release(*mt));
      continue;
    }
    for (std::int64_t p : c.committed_checkpoints()) {
      CHECK(p > mt->reusable_tokens);
      ++checked;
    }
    seqs.push_back(std::move(s));
  }
  CHECK(checked > 500);
  // The case arose: boundaries inside reused prefixes without a state (only a scorer that
  // takes inner nodes' states leaves such holes; LRU takes leaves only).
  if constexpr (std::is_same_v<Scorer, flop_aware_scorer>) CHECK(inside_before > 20);
}
