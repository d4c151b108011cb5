// gdsf_scorer (GreedyDual-Size-Frequency over FLOPs saved per byte) against an obviously
// right model: the same bookkeeping (frequency, L at last access) but the victim found by
// scoring every candidate in the tree, O(n) per eviction. On random branching streams the
// two caches must answer every request identically (hits, evictions, bytes).
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <span>
#include <vector>

#include "hybridcache/model/presets.hpp"
#include "hybridcache/prefix/gdsf_scorer.hpp"
#include "hybridcache/prefix/lru_scorer.hpp"
#include "hybridcache/prefix/prefix_cache.hpp"
#include "hybridcache/stores/counting_store.hpp"
#include "../support/naive_scorers.hpp"

using namespace hybridcache;
using namespace hybridcache::prefix;
using namespace hybridcache::stores;
using hybridcache::test::naive_gdsf;

namespace {

std::vector<token_id> random_tokens(std::mt19937_64& rng, std::size_t n, int vocab) {
  std::vector<token_id> v(n);
  for (auto& t : v) t = static_cast<token_id>(rng() % static_cast<unsigned>(vocab));
  return v;
}

}  // namespace

TEST_CASE("gdsf_scorer picks the naive full scan's victims on random branching streams") {
  const cost_model m(presets::marconi_7b());
  const std::int64_t kv = m.kv_bytes_per_token(), ck = m.ssm_checkpoint_bytes();
  std::int64_t evictions = 0, hits = 0;
  for (std::uint64_t seed = 1; seed <= 120; ++seed) {
    CAPTURE(seed);
    std::mt19937_64 rng(seed);
    const gdsf_config cfg{.intermediate = seed % 3 == 0 ? intermediate_eviction::tombstone : intermediate_eviction::merge,
                          .candidates = seed % 2 == 0 ? flop_candidates::paper : flop_candidates::protect_branches};
    const std::int64_t cap = 6 * ck + 300 * kv;
    prefix_cache<cost_model, judicious_admission, gdsf_scorer, counting_store> fast(m, counting_store(cap, kv, ck), gdsf_scorer(m, cfg));
    prefix_cache<cost_model, judicious_admission, naive_gdsf, counting_store> naive(m, counting_store(cap, kv, ck), naive_gdsf(m, cfg));
    std::vector<std::vector<token_id>> seen{random_tokens(rng, 30, 3)};
    for (int op = 0; op < 60; ++op) {
      std::vector<token_id> s = seen[rng() % seen.size()];
      s.resize(1 + rng() % s.size());
      const auto tail = random_tokens(rng, 1 + rng() % 50, 3);
      s.insert(s.end(), tail.begin(), tail.end());
      const auto in = static_cast<std::int64_t>(1 + rng() % s.size());
      const std::span<const token_id> input(s.data(), static_cast<std::size_t>(in));
      auto a = fast.match(input);
      auto b = naive.match(input);
      REQUIRE(a);
      REQUIRE(b);
      REQUIRE(a->reusable_tokens == b->reusable_tokens);
      hits += a->hit() ? 1 : 0;
      auto ca = fast.commit(s, in, &*a);
      auto cb = naive.commit(s, in, &*b);
      REQUIRE(ca.has_value() == cb.has_value());
      if (!ca) {
        REQUIRE(fast.release(*a));
        REQUIRE(naive.release(*b));
        continue;
      }
      REQUIRE(ca->evictions == cb->evictions);
      REQUIRE(fast.store().used_bytes() == naive.store().used_bytes());
      // Every priority the index holds is the one computed afresh (the cached efficiency
      // included), bit for bit; the trees evolve alike, so their node ids agree.
      REQUIRE(fast.tree().id_bound() == naive.tree().id_bound());
      for (node_id n = 1; n < fast.tree().id_bound(); ++n) {
        if (!fast.tree().live(n)) continue;
        CAPTURE(n);
        REQUIRE(std::bit_cast<std::uint64_t>(fast.scorer().priority(n)) ==
                std::bit_cast<std::uint64_t>(naive.scorer().priority(naive.tree(), n)));
      }
      evictions += ca->evictions;
      seen.push_back(s);
    }
  }
  CHECK(evictions > 2000);
  CHECK(hits > 500);
}

TEST_CASE("gdsf_scorer breaks equal priorities by the lower node id, as the naive scan does") {
  // Conversations that share a 16-token head and differ in one token after it, each with the
  // same tail length: their leaves have the same extent, so the same efficiency, and those
  // created between two evictions the same L, so equal priorities; which one goes is
  // visible only in which conversation a later turn finds again.
  const cost_model m(presets::marconi_7b());
  const std::int64_t kv = m.kv_bytes_per_token(), ck = m.ssm_checkpoint_bytes();
  std::int64_t hits = 0, evictions = 0;
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    CAPTURE(seed);
    std::mt19937_64 rng(seed);
    const std::int64_t cap = 5 * ck + 200 * kv;
    prefix_cache<cost_model, judicious_admission, gdsf_scorer, counting_store> fast(m, counting_store(cap, kv, ck), gdsf_scorer(m));
    prefix_cache<cost_model, judicious_admission, naive_gdsf, counting_store> naive(m, counting_store(cap, kv, ck), naive_gdsf(m));
    std::vector<std::vector<token_id>> seen;
    token_id next = 10;
    for (int op = 0; op < 80; ++op) {
      std::vector<token_id> s;
      std::int64_t in = 17;
      if (!seen.empty() && rng() % 3 == 0) {  // the next turn: the whole conversation, one token, 7 more
        auto& conv = seen[rng() % seen.size()];
        conv.push_back(next++);
        in = static_cast<std::int64_t>(conv.size());
        conv.resize(conv.size() + 7, 0);
        s = conv;
      } else {
        s.assign(16, 1);
        s.push_back(next++);
        s.resize(s.size() + (rng() % 4 == 0 ? 31 : 15), 0);
        seen.push_back(s);
      }
      const std::span<const token_id> input(s.data(), static_cast<std::size_t>(in));
      auto a = fast.match(input);
      auto b = naive.match(input);
      REQUIRE(a);
      REQUIRE(b);
      REQUIRE(a->reusable_tokens == b->reusable_tokens);
      hits += a->reusable_tokens > 16 ? 1 : 0;
      auto ca = fast.commit(s, in, &*a);
      auto cb = naive.commit(s, in, &*b);
      REQUIRE(ca.has_value() == cb.has_value());
      if (!ca) {
        REQUIRE(fast.release(*a));
        REQUIRE(naive.release(*b));
        continue;
      }
      REQUIRE(ca->evictions == cb->evictions);
      REQUIRE(fast.store().used_bytes() == naive.store().used_bytes());
      evictions += ca->evictions;
    }
  }
  CHECK(evictions > 500);
  CHECK(hits > 100);
}

TEST_CASE("gdsf_scorer: frequency and inflation — a node hit often outlives a colder one of the same efficiency") {
  const cost_model m(presets::marconi_7b());
  const std::int64_t kv = m.kv_bytes_per_token(), ck = m.ssm_checkpoint_bytes();
  // Room for two conversations of 100 tokens; a third evicts one of them.
  prefix_cache<cost_model, judicious_admission, gdsf_scorer, counting_store> c(m, counting_store(2 * ck + 210 * kv, kv, ck), gdsf_scorer(m));
  std::vector<token_id> a(100, 1), b(100, 2), x(100, 3);
  for (auto* s : {&a, &b}) {
    auto r = c.match(*s);
    REQUIRE(r);
    REQUIRE(c.commit(*s, 100, &*r));
  }
  for (int i = 0; i < 3; ++i) {  // a is hit three times; b never
    std::vector<token_id> q = a;
    q.push_back(9);
    auto r = c.match(q);
    REQUIRE(r);
    CHECK(r->reusable_tokens == 100);
    REQUIRE(c.release(*r));
  }
  auto r = c.match(x);
  REQUIRE(r);
  REQUIRE(c.commit(x, 100, &*r));
  CHECK(c.scorer().inflation() > 0.0);  // L rose to the victim's priority
  auto ra = c.match(a);
  auto rb = c.match(b);
  CHECK(ra->common_prefix == 100);  // kept: hit three times
  CHECK(rb->common_prefix == 0);    // evicted
}
