// Conformance suite of `hybridcache::state_store`: every model is run through the
// same laws, taken from the concept's contract (concepts/prefix.hpp), on random operation
// sequences. The prefix cache relies on exactly these: it evicts `kv_bytes(n)` /
// `checkpoint_bytes()` before allocating, retries after a failed allocation, rolls a commit
// back after a failed split and tombstones after a failed join, so a model that breaks a law
// here corrupts the cache's byte accounting even if every call compiles.
//
// A new store is covered by adding a fixture and naming it in TEST_CASE_TEMPLATE_INVOKE.
// A fixture holds the store (and what the store borrows, e.g. its pool) and two traits:
//   byte_budget  the store is one byte budget, so it refuses an allocation only when
//                capacity - used is short of the bytes it needs (counting, tiered). A pool
//                store keeps KV and SSM units in separate pools and may refuse earlier.
//   exact_split  split/join move no bytes. A paged store may copy the block shared by both
//                halves of an in-block split into fresh pages (at most kv_bytes(1) more).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "hybridcache/core/error.hpp"
#include "hybridcache/memory/asymmetric_pool.hpp"
#include "hybridcache/stores/counting_store.hpp"
#include "hybridcache/stores/pool_state_store.hpp"
#include "hybridcache/stores/tiered_state_store.hpp"

using namespace hybridcache;

namespace {

constexpr std::int64_t kv_per_token = 256;  // the pool fixture's page: 4 tokens x 2 layers x 128 B
constexpr std::int64_t ckpt_bytes = 3 * 1024;

struct counting_fixture {
  using store_type = stores::counting_store;
  static constexpr bool byte_budget = true;
  static constexpr bool exact_split = true;
  store_type store{48 * 1024, kv_per_token, ckpt_bytes};
};

template <class Rebalancer>
struct pool_fixture {
  using pool_type = memory::host_asymmetric_pool<Rebalancer>;
  using store_type = stores::pool_state_store<pool_type>;
  static constexpr bool byte_budget = false;
  static constexpr bool exact_split = false;
  // 4 tokens per 512 B page, 2 attention layers (1 KiB per block), 3 recurrent layers of
  // 1 KiB (one checkpoint = 3 KiB); 12 chunks of 4 KiB.
  pool_type pool{{.capacity_bytes = 12 * 4096, .kv_page_bytes = 512, .ssm_block_bytes = 1024, .granularity_bytes = 4096}};
  store_type store{pool, 4, 2, 3};
};

struct tiered_fixture {
  using store_type = stores::tiered_state_store<>;
  static constexpr bool byte_budget = true;
  static constexpr bool exact_split = true;
  store_type store{stores::tiered_state_store_config{
      .capacity_bytes = 48 * 1024, .host_capacity_bytes = 16 * 1024, .kv_bytes_per_token = kv_per_token, .checkpoint_bytes = ckpt_bytes}};
};

// The concept does not expose an extent's length; every model names it `tokens`. A model
// that does not adds an overload here.
template <class Extent>
std::int64_t tokens(const Extent& e) {
  return e.tokens;
}

template <class Store>
struct held_state {
  std::vector<typename Store::kv_extent> kv;
  std::vector<typename Store::checkpoint_handle> ckpt;

  void free_all(Store& s) {
    for (auto& e : kv) s.free_kv(std::move(e));
    for (auto& c : ckpt) s.free_checkpoint(std::move(c));
    kv.clear();
    ckpt.clear();
  }
};

template <class V>
std::size_t pick(std::mt19937_64& rng, const V& v) {
  return static_cast<std::size_t>(rng() % v.size());
}

template <class V>
auto take(V& v, std::size_t i) {
  auto x = std::move(v[i]);
  v.erase(v.begin() + static_cast<std::ptrdiff_t>(i));
  return x;
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("state_store conformance", F, state_store_conformance) {
  static_assert(state_store<typename F::store_type>);
  using store_t = typename F::store_type;

  SUBCASE("holds: an allocated checkpoint holds a state, the empty handle does not") {
    F f;
    store_t& s = f.store;
    CHECK_FALSE(store_t::holds(typename store_t::checkpoint_handle{}));
    std::vector<typename store_t::checkpoint_handle> held;
    for (int i = 0; i < 3; ++i) {
      auto c = s.allocate_checkpoint();
      REQUIRE(c);
      CHECK(store_t::holds(*c));
      held.push_back(std::move(*c));
    }
    for (auto& c : held) CHECK(store_t::holds(c));  // moved into place, still held
    for (auto& c : held) s.free_checkpoint(std::move(c));
    CHECK(s.used_bytes() == 0);
  }

  SUBCASE("kv_bytes(n) is exactly what allocate_kv(n) adds, and free_kv gives it back") {
    for (std::uint64_t seed = 1; seed <= 40; ++seed) {
      CAPTURE(seed);
      F f;
      store_t& s = f.store;
      std::mt19937_64 rng(seed);
      held_state<store_t> held;
      const std::int64_t base = s.used_bytes();
      for (int op = 0; op < 200; ++op) {
        if (held.kv.empty() || rng() % 3 != 0) {
          const auto n = static_cast<std::int64_t>(1 + rng() % 40);
          const std::int64_t before = s.used_bytes();
          auto e = s.allocate_kv(n);
          if (e) {
            CHECK(s.used_bytes() - before == s.kv_bytes(n));
            CHECK(tokens(*e) == n);
            held.kv.push_back(std::move(*e));
          } else {
            CHECK(e.error() == errc::out_of_capacity);
            CHECK(s.used_bytes() == before);
            if (F::byte_budget) CHECK(s.capacity_bytes() - s.used_bytes() < s.kv_bytes(n));
          }
        } else {
          auto e = take(held.kv, pick(rng, held.kv));
          const std::int64_t n = tokens(e), before = s.used_bytes();
          s.free_kv(std::move(e));
          CHECK(before - s.used_bytes() == s.kv_bytes(n));
        }
        CHECK(s.used_bytes() <= s.capacity_bytes());
      }
      held.free_all(s);
      CHECK(s.used_bytes() == base);
    }
  }

  SUBCASE("checkpoint_bytes() is what allocate_checkpoint adds and free_checkpoint gives back") {
    for (std::uint64_t seed = 1; seed <= 20; ++seed) {
      CAPTURE(seed);
      F f;
      store_t& s = f.store;
      std::mt19937_64 rng(seed);
      const std::int64_t ck = s.checkpoint_bytes();
      CHECK(ck >= 0);
      CHECK(ck <= s.capacity_bytes());  // the cache needs room for one checkpoint
      held_state<store_t> held;
      for (int op = 0; op < 100; ++op) {
        const std::int64_t before = s.used_bytes();
        if (held.ckpt.empty() || rng() % 3 != 0) {
          auto c = s.allocate_checkpoint();
          if (c) {
            CHECK(s.used_bytes() - before == ck);
            held.ckpt.push_back(std::move(*c));
          } else {
            CHECK(c.error() == errc::out_of_capacity);
            CHECK(s.used_bytes() == before);
            if (F::byte_budget) CHECK(s.capacity_bytes() - s.used_bytes() < ck);
          }
        } else {
          s.free_checkpoint(take(held.ckpt, pick(rng, held.ckpt)));
          CHECK(before - s.used_bytes() == ck);
        }
        CHECK(s.checkpoint_bytes() == ck);  // a property of the store, not of its load
        CHECK(s.used_bytes() <= s.capacity_bytes());
      }
      held.free_all(s);
      CHECK(s.used_bytes() == 0);
    }
  }

  SUBCASE("split_kv keeps the token count, join_kv of the halves restores the extent and its bytes") {
    for (std::uint64_t seed = 1; seed <= 60; ++seed) {
      CAPTURE(seed);
      F f;
      store_t& s = f.store;
      std::mt19937_64 rng(seed);
      // Some unrelated load first, so the extent does not start at the arena's origin.
      held_state<store_t> load;
      for (int i = 0; i < static_cast<int>(rng() % 4); ++i)
        if (auto e = s.allocate_kv(static_cast<std::int64_t>(1 + rng() % 9))) load.kv.push_back(std::move(*e));
      const auto n = static_cast<std::int64_t>(2 + rng() % 40);
      auto whole = s.allocate_kv(n);
      REQUIRE(whole);
      const std::int64_t allocated = s.used_bytes();
      // Cut the extent into pieces (split a random piece at a random point), then join them
      // back left to right. Tokens are conserved at every step.
      std::vector<typename store_t::kv_extent> pieces;
      pieces.push_back(std::move(*whole));
      for (int cut = 0; cut < 6; ++cut) {
        const std::size_t i = pick(rng, pieces);
        const std::int64_t t = tokens(pieces[i]);
        if (t < 2) continue;
        const auto h = static_cast<std::int64_t>(1 + rng() % static_cast<std::uint64_t>(t - 1));
        const std::int64_t before = s.used_bytes();
        auto head = s.split_kv(pieces[i], h);
        if (!head) {  // allowed (a paged store copying a shared block); nothing may change
          CHECK(tokens(pieces[i]) == t);
          CHECK(s.used_bytes() == before);
          continue;
        }
        CHECK(tokens(*head) == h);
        CHECK(tokens(pieces[i]) == t - h);
        CHECK(s.used_bytes() >= before);
        CHECK(s.used_bytes() - before <= (F::exact_split ? 0 : s.kv_bytes(1)));
        pieces.insert(pieces.begin() + static_cast<std::ptrdiff_t>(i), std::move(*head));
      }
      std::int64_t sum = 0;
      for (const auto& p : pieces) sum += tokens(p);
      CHECK(sum == n);
      while (pieces.size() > 1) {
        const std::int64_t before = s.used_bytes();
        const std::int64_t a = tokens(pieces[0]), b = tokens(pieces[1]);
        auto j = s.join_kv(pieces[0], std::move(pieces[1]));
        REQUIRE(j);  // the halves of a split always join back
        CHECK(tokens(pieces[0]) == a + b);
        CHECK(s.used_bytes() <= before);
        pieces.erase(pieces.begin() + 1);
      }
      CHECK(tokens(pieces[0]) == n);
      CHECK(s.used_bytes() == allocated);
      s.free_kv(std::move(pieces[0]));
      load.free_all(s);
      CHECK(s.used_bytes() == 0);
    }
  }

  SUBCASE("join_kv of unrelated extents either joins or leaves both unchanged") {
    for (std::uint64_t seed = 1; seed <= 40; ++seed) {
      CAPTURE(seed);
      F f;
      store_t& s = f.store;
      std::mt19937_64 rng(seed);
      auto a = s.allocate_kv(static_cast<std::int64_t>(1 + rng() % 15));
      auto b = s.allocate_kv(static_cast<std::int64_t>(1 + rng() % 15));
      REQUIRE(a);
      REQUIRE(b);
      const std::int64_t ta = tokens(*a), tb = tokens(*b), before = s.used_bytes();
      if (s.join_kv(*a, std::move(*b))) {
        CHECK(tokens(*a) == ta + tb);
        CHECK(s.used_bytes() <= before);
      } else {
        CHECK(tokens(*a) == ta);
        CHECK(tokens(*b) == tb);
        CHECK(s.used_bytes() == before);
        s.free_kv(std::move(*b));
      }
      s.free_kv(std::move(*a));
      CHECK(s.used_bytes() == 0);
    }
  }

  SUBCASE("a failed call changes nothing: allocations at capacity, oversized requests, splits") {
    for (std::uint64_t seed = 1; seed <= 20; ++seed) {
      CAPTURE(seed);
      F f;
      store_t& s = f.store;
      std::mt19937_64 rng(seed);
      // Larger than the whole store: refused, whatever the store holds.
      const std::int64_t oversized = s.capacity_bytes() / std::max<std::int64_t>(s.kv_bytes(1), 1) * 4 + 7;
      auto big = s.allocate_kv(oversized);
      REQUIRE_FALSE(big);
      CHECK(big.error() == errc::out_of_capacity);
      CHECK(s.used_bytes() == 0);
      // Fill with KV and checkpoints until both are refused a few times in a row.
      held_state<store_t> held;
      int refusals = 0;
      while (refusals < 8) {
        const std::int64_t before = s.used_bytes();
        if (rng() % 4 == 0) {
          auto c = s.allocate_checkpoint();
          if (c) {
            held.ckpt.push_back(std::move(*c));
            continue;
          }
          CHECK(c.error() == errc::out_of_capacity);
        } else {
          auto e = s.allocate_kv(static_cast<std::int64_t>(1 + rng() % 12));
          if (e) {
            held.kv.push_back(std::move(*e));
            continue;
          }
          CHECK(e.error() == errc::out_of_capacity);
        }
        CHECK(s.used_bytes() == before);
        ++refusals;
      }
      CHECK(s.used_bytes() <= s.capacity_bytes());
      // A split at capacity may need room it does not have; then nothing changes.
      for (auto& e : held.kv) {
        const std::int64_t t = tokens(e);
        if (t < 2) continue;
        const std::int64_t before = s.used_bytes();
        auto head = s.split_kv(e, 1 + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(t - 1)));
        if (head) {
          REQUIRE(s.join_kv(*head, std::move(e)));
          e = std::move(*head);
          CHECK(s.used_bytes() == before);
        } else {
          CHECK(tokens(e) == t);
          CHECK(s.used_bytes() == before);
        }
      }
      held.free_all(s);
      CHECK(s.used_bytes() == 0);
    }
  }

  SUBCASE("empty (default-constructed) handles free as no-ops") {
    F f;
    store_t& s = f.store;
    auto keep = s.allocate_kv(3);
    REQUIRE(keep);
    const std::int64_t before = s.used_bytes();
    s.free_kv(typename store_t::kv_extent{});
    s.free_checkpoint(typename store_t::checkpoint_handle{});
    CHECK(s.used_bytes() == before);
    s.free_kv(std::move(*keep));
    CHECK(s.used_bytes() == 0);
  }

  SUBCASE("kv_bytes is a pure, non-decreasing function of the token count") {
    F f;
    store_t& s = f.store;
    std::vector<std::int64_t> fresh;
    for (std::int64_t n = 0; n <= 64; ++n) fresh.push_back(s.kv_bytes(n));
    CHECK(fresh[0] == 0);
    CHECK(std::is_sorted(fresh.begin(), fresh.end()));
    auto e = s.allocate_kv(17);
    REQUIRE(e);
    for (std::int64_t n = 0; n <= 64; ++n) CHECK(s.kv_bytes(n) == fresh[static_cast<std::size_t>(n)]);
    s.free_kv(std::move(*e));
  }
}

TEST_CASE_TEMPLATE_INVOKE(state_store_conformance, counting_fixture, pool_fixture<memory::no_rebalancer>,
                          pool_fixture<memory::threshold_rebalancer>, tiered_fixture);

// --- side_placing_store: a store with two sides (KV units, checkpoint units) -------------
// The per-side fit check must agree with what the store can really allocate: `need` fits
// exactly when each side's units can be taken, `freed` counts whole units given back, what
// fits now fits an empty store, and `kv_bytes_at` is what `allocate_kv_at` takes. With the
// split held, a full side fails instead of borrowing; preparing a placement moves no live
// unit.

TEST_CASE_TEMPLATE_DEFINE("side_placing_store conformance", F, side_placing_store_conformance) {
  static_assert(side_placing_store<typename F::store_type>);
  F f;
  auto& s = f.store;
  const std::int64_t page_set = s.kv_bytes(1), ckpt = s.checkpoint_bytes();
  SUBCASE("kv_bytes_at is what allocate_kv_at takes") {
    for (std::int64_t first : {0, 1, 3, 4, 7}) {
      for (std::int64_t n : {1, 2, 3, 4, 5, 9}) {
        const auto used = s.used_bytes();
        auto e = s.allocate_kv_at(first, n);
        REQUIRE(e);
        CHECK(s.used_bytes() - used == s.kv_bytes_at(first, n));
        s.free_kv(std::move(*e));
      }
    }
  }
  SUBCASE("placement_fits_when_empty: what fits an empty store now fits when empty; more than the store never does") {
    for (std::int64_t k = 0; k <= 64; ++k) {
      const side_bytes need{k * page_set, (k % 5) * ckpt};
      if (s.placement_fits(need, side_bytes{})) CHECK(s.placement_fits_when_empty(need));
    }
    CHECK_FALSE(s.placement_fits_when_empty(side_bytes{s.capacity_bytes() + page_set, 0}));
    CHECK_FALSE(s.placement_fits_when_empty(side_bytes{0, s.capacity_bytes() + ckpt}));
  }
  SUBCASE("placement_fits agrees with what each side can allocate, with the split held") {
    s.hold_split(true);
    std::vector<typename F::store_type::kv_extent> kv;
    while (s.placement_fits(side_bytes{page_set, 0}, side_bytes{})) {
      auto e = s.allocate_kv(1);
      REQUIRE(e);  // what the check promised is there
      kv.push_back(std::move(*e));
    }
    CHECK_FALSE(s.allocate_kv(1));  // and nothing more: the KV side is full
    const auto unit = static_cast<std::int64_t>(f.pool.stats(pool_kind::kv).unit_bytes);
    const std::int64_t missing = page_set - static_cast<std::int64_t>(f.pool.stats(pool_kind::kv).free_units) * unit;
    REQUIRE(missing > 0);
    CHECK(s.placement_fits(side_bytes{page_set, 0}, side_bytes{missing, 0}));  // once that is freed
    CHECK_FALSE(s.placement_fits(side_bytes{page_set, 0}, side_bytes{missing - 1, 0}));  // whole units only
    CHECK(s.placement_fits(side_bytes{0, ckpt}, side_bytes{}));  // the other side is free
    const auto live = f.pool.live_handles();
    s.prepare_placement(side_bytes{2 * page_set, 0});  // may borrow free chunks, never moves a live unit
    CHECK(f.pool.live_handles() == live);
    s.hold_split(false);
    for (auto& e : kv) s.free_kv(std::move(e));
    CHECK(s.used_bytes() == 0);
  }
}

TEST_CASE_TEMPLATE_INVOKE(side_placing_store_conformance, pool_fixture<memory::no_rebalancer>,
                          pool_fixture<memory::threshold_rebalancer>);
static_assert(!side_placing_store<stores::counting_store>, "one side: the byte check is all there is");

// --- negative cases: one missing or wrong call and the type is not a state_store ---------

namespace {

// A complete model (the concept's archetype), then copies that each break one requirement:
// those that shadow one member derive from it, those that lack one spell the rest out.
struct full_store : state_store_archetype {};

struct no_used_bytes {
  struct kv_extent {};
  struct checkpoint_handle {};
  expected<kv_extent> allocate_kv(std::int64_t) noexcept { return kv_extent{}; }
  void free_kv(kv_extent&&) noexcept {}
  expected<kv_extent> split_kv(kv_extent&, std::int64_t) noexcept { return kv_extent{}; }
  expected<void> join_kv(kv_extent&, kv_extent&&) noexcept { return {}; }
  expected<checkpoint_handle> allocate_checkpoint() noexcept { return checkpoint_handle{}; }
  void free_checkpoint(checkpoint_handle&&) noexcept {}
  std::int64_t kv_bytes(std::int64_t) const noexcept { return 0; }
  std::int64_t checkpoint_bytes() const noexcept { return 0; }
  std::int64_t capacity_bytes() const noexcept { return 1; }
  static bool holds(const checkpoint_handle&) noexcept { return true; }
};

// allocate_kv may throw: the cache calls it on its noexcept hot path.
struct throwing_allocate : full_store {
  expected<kv_extent> allocate_kv(std::int64_t) { return kv_extent{}; }
};

// join_kv cannot report a failure, so the cache could not tombstone instead.
struct join_returns_void : full_store {
  void join_kv(kv_extent&, kv_extent&&) noexcept {}
};

// A handle without an empty state (not default constructible). Declared only: expected<T>
// itself refuses such a T once instantiated, and the concept must refuse it first.
struct handle_without_empty_state : full_store {
  struct checkpoint_handle {
    explicit checkpoint_handle(int) {}
  };
  expected<checkpoint_handle> allocate_checkpoint() noexcept;
  void free_checkpoint(checkpoint_handle&&) noexcept;
};

// The byte queries must work on a const store (the cache reads them from const paths).
struct mutable_byte_queries : full_store {
  std::int64_t used_bytes() noexcept { return 0; }
};

// The lifecycle cannot tell a reserved checkpoint slot from an empty one.
struct no_holds {
  struct kv_extent {};
  struct checkpoint_handle {};
  expected<kv_extent> allocate_kv(std::int64_t) noexcept { return kv_extent{}; }
  void free_kv(kv_extent&&) noexcept {}
  expected<kv_extent> split_kv(kv_extent&, std::int64_t) noexcept { return kv_extent{}; }
  expected<void> join_kv(kv_extent&, kv_extent&&) noexcept { return {}; }
  expected<checkpoint_handle> allocate_checkpoint() noexcept { return checkpoint_handle{}; }
  void free_checkpoint(checkpoint_handle&&) noexcept {}
  std::int64_t kv_bytes(std::int64_t) const noexcept { return 0; }
  std::int64_t checkpoint_bytes() const noexcept { return 0; }
  std::int64_t used_bytes() const noexcept { return 0; }
  std::int64_t capacity_bytes() const noexcept { return 1; }
};

// holds must be a static, noexcept query of a handle (the lifecycle asks it on noexcept paths).
struct holds_may_throw : full_store {
  static bool holds(const checkpoint_handle&) { return true; }
};

}  // namespace

static_assert(state_store<full_store>, "the reference shape must model the concept");
static_assert(!state_store<no_used_bytes>);
static_assert(!state_store<throwing_allocate>);
static_assert(!state_store<join_returns_void>);
static_assert(!state_store<handle_without_empty_state>);
static_assert(!state_store<mutable_byte_queries>);
static_assert(!state_store<no_holds>);
static_assert(!state_store<holds_may_throw>);
