// Conformance suite of `hybridcache::demotion_scorer`: every scorer against what
// `tiered_store` relies on (tiered/demotion_policy.hpp, tiered/tiered_store.hpp). The store
// keeps evictable entries in an ordered index under the key computed when a row changes
// (insert, touch, score update) and takes the smallest first, so:
//
//   - a key is a function of the entry: the same row, and a copy of the scorer, give the same
//     key (the store copies scorers and re-keys rows at different times);
//   - it depends only on what the store re-keys on (recency, CaR score, the node's span), not
//     on where the entry is, its pages, pins or moves, or the index would go stale;
//   - keys are strictly weakly ordered by `<` (no NaN component), or std::set misbehaves;
//   - every scorer breaks ties by recency: of two rows that differ only in last access, the
//     older one leaves first.
//
// A new scorer is covered by adding a fixture and naming it in TEST_CASE_TEMPLATE_INVOKE.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "hybridcache/model/presets.hpp"
#include "hybridcache/tiered/demotion_policy.hpp"

using namespace hybridcache;
using namespace hybridcache::tiered;

namespace {

struct lru_fixture {
  [[nodiscard]] lru_demotion make() const { return {}; }
};
struct car_fixture {
  [[nodiscard]] car_score_demotion make() const { return {}; }
};
struct flop_fixture {
  cost_model model{presets::marconi_7b()};  // the scorer borrows it
  [[nodiscard]] flop_aware_demotion make() const { return flop_aware_demotion(model); }
};

cache_entry random_entry(std::mt19937_64& rng) {
  cache_entry e;
  e.id = make_entry_id(rng() % 1000);
  tier_copy c;
  c.tier = tier_id{static_cast<std::uint8_t>(rng() % 3)};
  c.state = static_cast<copy_state>(rng() % 3);
  c.pins = static_cast<std::int32_t>(rng() % 3);
  c.readers = static_cast<std::int32_t>(rng() % 2);
  c.bytes = static_cast<std::int64_t>(1 + rng() % (1 << 20));
  for (std::uint64_t k = rng() % 4; k > 0; --k) c.pages.push_back({static_cast<std::uint32_t>(rng() % 64), 1});
  c.seq = rng() % 5;
  e.copies.push_back(c);
  // CaR scores are sums of +1, +1 and -2 steps.
  e.score = static_cast<double>(static_cast<int>(rng() % 7) - 3);
  e.last_access = rng() % 50;  // small range: ties on recency are common
  e.info.prefix_begin = static_cast<std::int64_t>(rng() % 4096);
  // Empty spans too (prefix_end <= prefix_begin): a row inserted without span information.
  e.info.prefix_end = rng() % 5 == 0 ? e.info.prefix_begin : e.info.prefix_begin + static_cast<std::int64_t>(1 + rng() % 4096);
  e.info.has_checkpoint = rng() % 2 == 0;
  return e;
}

bool less(const demotion_key& a, const demotion_key& b) { return a < b; }
bool equivalent(const demotion_key& a, const demotion_key& b) { return !less(a, b) && !less(b, a); }

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("demotion_scorer conformance", F, demotion_scorer_conformance) {
  const F fixture;
  const auto scorer = fixture.make();
  using scorer_t = std::remove_const_t<decltype(scorer)>;
  static_assert(demotion_scorer<scorer_t>);
  std::mt19937_64 rng(21);
  std::vector<cache_entry> rows;
  for (int i = 0; i < 400; ++i) rows.push_back(random_entry(rng));

  SUBCASE("a key is a function of the row: same row, copied row and copied scorer agree") {
    const scorer_t copy = scorer;  // NOLINT(performance-unnecessary-copy-initialization): copying is the law
    for (const auto& e : rows) {
      const demotion_key k = scorer.key(e);
      const cache_entry same = e;
      CHECK(scorer.key(e) == k);
      CHECK(scorer.key(same) == k);
      CHECK(copy.key(e) == k);
    }
  }

  SUBCASE("the key ignores what the store changes without re-keying (copies: tier, state, pages, pins, moves)") {
    for (const auto& e : rows) {
      const demotion_key k = scorer.key(e);
      cache_entry moved = e;
      tier_copy& c = moved.copies.front();
      c.tier = tier_id{static_cast<std::uint8_t>((c.tier.value + 1) % 3)};
      c.state = static_cast<copy_state>((static_cast<int>(c.state) + 1) % 3);
      c.pages.push_back({7, 1});
      c.pins += 1;
      c.readers += 1;
      c.seq += 1;
      c.indexed_key = demotion_key{-1.0, -1.0};
      moved.copies.push_back(tier_copy{.tier = tier_id{3}, .state = copy_state::filling});
      CHECK(scorer.key(moved) == k);
    }
  }

  SUBCASE("keys are strictly weakly ordered (no NaN; irreflexive, transitive, transitive equivalence)") {
    std::vector<demotion_key> keys;
    for (const auto& e : rows) {
      const demotion_key k = scorer.key(e);
      CHECK_FALSE(std::isnan(k.primary));
      CHECK_FALSE(std::isnan(k.secondary));
      keys.push_back(k);
    }
    for (int i = 0; i < 20000; ++i) {
      const auto& a = keys[rng() % keys.size()];
      const auto& b = keys[rng() % keys.size()];
      const auto& c = keys[rng() % keys.size()];
      CHECK_FALSE(less(a, a));
      if (less(a, b)) CHECK_FALSE(less(b, a));
      if (less(a, b) && less(b, c)) CHECK(less(a, c));
      if (equivalent(a, b) && equivalent(b, c)) CHECK(equivalent(a, c));
    }
    std::sort(keys.begin(), keys.end());
    CHECK(std::is_sorted(keys.begin(), keys.end()));
  }

  SUBCASE("among rows that differ only in recency, the least recently used leaves first") {
    for (const auto& e : rows) {
      cache_entry newer = e;
      newer.last_access = e.last_access + 1 + rng() % 100;
      CHECK(less(scorer.key(e), scorer.key(newer)));
    }
  }
}

TEST_CASE_TEMPLATE_INVOKE(demotion_scorer_conformance, lru_fixture, car_fixture, flop_fixture);

// --- negative cases ------------------------------------------------------------------------

namespace {

// The store keeps its own copy of the scorer.
struct move_only_scorer {
  move_only_scorer() = default;
  move_only_scorer(move_only_scorer&&) = default;
  move_only_scorer(const move_only_scorer&) = delete;
  [[nodiscard]] demotion_key key(const cache_entry&) const noexcept { return {}; }
};
// A bare double cannot carry the tie-break.
struct double_key {
  [[nodiscard]] double key(const cache_entry&) const noexcept { return 0.0; }
};
// key is asked through a const scorer.
struct mutable_key {
  [[nodiscard]] demotion_key key(const cache_entry&) noexcept { return {}; }
};
struct no_key {};

}  // namespace

static_assert(!demotion_scorer<move_only_scorer>);
static_assert(!demotion_scorer<double_key>);
static_assert(!demotion_scorer<mutable_key>);
static_assert(!demotion_scorer<no_key>);
