// Conformance suites of the store seams beyond `state_store` (concepts/state_store.hpp,
// concepts/tier_store.hpp): `paged_state_store`, `lower_tier_store` / `layered_tier_store`
// (the tiered store and the pool store's host tier, one protocol), `demoting_store` and
// `replicable_tier_store`. The request
// lifecycle and the prefix cache dispatch on exactly these concepts, so each suite checks
// the laws they rely on, through the concept's calls only (and the pool's `resolve` to read
// bytes). A new model is covered by adding a fixture, a static_assert under it, and naming it
// in the suite's TEST_CASE_TEMPLATE_INVOKE.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "hybridcache/concepts/tier_store.hpp"
#include "hybridcache/memory/asymmetric_pool.hpp"
#include "hybridcache/memory/units.hpp"
#include "hybridcache/model/presets.hpp"
#include "hybridcache/prefix/lru_scorer.hpp"
#include "hybridcache/prefix/prefix_cache.hpp"
#include "hybridcache/prefix/radix_tree.hpp"
#include "hybridcache/stores/counting_store.hpp"
#include "hybridcache/stores/pool_state_store.hpp"
#include "hybridcache/stores/tiered_state_store.hpp"
#include "../support/tiny_hybrid_model.hpp"

using namespace hybridcache;

namespace {

template <class Store>
using tree_of = prefix::radix_tree<Store>;

// --- fixtures ------------------------------------------------------------------------------

// The pool store: 4 tokens per 512 B page, 2 attention layers, 3 recurrent layers of 1 KiB.
template <class Rebalancer>
struct paged_fixture {
  using pool_type = memory::host_asymmetric_pool<Rebalancer>;
  using store_type = stores::pool_state_store<pool_type>;
  pool_type pool{{.capacity_bytes = 16 * 4096, .kv_page_bytes = 512, .ssm_block_bytes = 1024, .granularity_bytes = 4096}};
  store_type store{pool, 4, 2, 3};
};
static_assert(paged_state_store<paged_fixture<memory::no_rebalancer>::store_type>);
static_assert(paged_state_store<paged_fixture<memory::threshold_rebalancer>::store_type>);

// The tiered store over the metadata-only engine, behind a prefix cache (marconi_7b sizes):
// HBM holds one 1,000-token sequence with its checkpoints, the host tier eight, and the
// staging room one (what `load` needs).
struct tiered_fixture {
  using store_type = stores::tiered_state_store<>;
  static constexpr int sequence_tokens = 1000;
  using cache_type = prefix::prefix_cache<cost_model, prefix::judicious_admission, prefix::lru_scorer, store_type>;
  static const cost_model& model() {
    static const cost_model m(presets::marconi_7b());
    return m;
  }
  static std::int64_t hbm() { return 1000 * model().kv_bytes_per_token() + 3 * model().ssm_checkpoint_bytes(); }
  cache_type cache{model(),
                   store_type({.capacity_bytes = hbm(),
                               .host_capacity_bytes = 8 * hbm(),
                               .kv_bytes_per_token = model().kv_bytes_per_token(),
                               .checkpoint_bytes = model().ssm_checkpoint_bytes(),
                               .staging_bytes = hbm()}),
                   prefix::lru_scorer{}};
};
static_assert(layered_tier_store<tiered_fixture::store_type, tree_of<tiered_fixture::store_type>>);

// The pool store with a host tier, behind a prefix cache (a tiny GDN model, 16 tokens a page).
template <class Rebalancer>
struct host_tier_fixture {
  using pool_type = memory::host_asymmetric_pool<Rebalancer>;
  using store_type = stores::pool_state_store<pool_type>;
  using cache_type = prefix::prefix_cache<cost_model, prefix::judicious_admission, prefix::lru_scorer, store_type>;
  static constexpr std::int64_t tpp = 16;
  static constexpr int sequence_tokens = 150;
  cost_model model{test::tiny_gdn_spec("tier_store_conformance")};
  pool_type pool{{.capacity_bytes = std::uint64_t{256} << 10, .kv_page_bytes = memory::kv_page_bytes(model, tpp),
                  .ssm_block_bytes = memory::checkpoint_block_bytes(model), .granularity_bytes = 32 << 10}};
  cache_type cache{model,
                   store_type(pool, tpp, model.attention_layers(), model.recurrent_layers(),
                              stores::host_tier_config{.kv_pages = 256, .checkpoint_blocks = 64}),
                   prefix::lru_scorer{}};
};
static_assert(lower_tier_store<host_tier_fixture<memory::no_rebalancer>::store_type,
                               tree_of<host_tier_fixture<memory::no_rebalancer>::store_type>>);
static_assert(demoting_store<host_tier_fixture<memory::threshold_rebalancer>::store_type,
                             tree_of<host_tier_fixture<memory::threshold_rebalancer>::store_type>>);
static_assert(!layered_tier_store<host_tier_fixture<memory::no_rebalancer>::store_type,
                                  tree_of<host_tier_fixture<memory::no_rebalancer>::store_type>>);

// What each store is not: the runtime takes the plain path for these.
static_assert(!paged_state_store<stores::counting_store> && !paged_state_store<stores::tiered_state_store<>>);
static_assert(!lower_tier_store<stores::counting_store, tree_of<stores::counting_store>>);
static_assert(!demoting_store<stores::counting_store, tree_of<stores::counting_store>>);
static_assert(!demoting_store<stores::tiered_state_store<>, tree_of<stores::tiered_state_store<>>>);
static_assert(!replicable_tier_store<stores::counting_store>);
static_assert(replicable_tier_store<stores::tiered_state_store<>>);

std::vector<token_id> run_of(token_id first, token_id step, int n) {
  std::vector<token_id> v(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = first + step * i;
  return v;
}

}  // namespace

// --- paged_state_store -----------------------------------------------------------------------
// Token t sits in slot t % tokens_per_page() of its block; append_pages names one page per
// block from the block asked for on, so the pages of a sequence's extents form a block
// table; kv_bytes_at is what allocate_kv_at takes; copy_tokens moves exactly the slots of
// [from, to) of every layer and nothing else.

TEST_CASE_TEMPLATE_DEFINE("paged_state_store conformance", F, paged_state_store_conformance) {
  using store_t = typename F::store_type;
  static_assert(paged_state_store<store_t>);
  F f;
  store_t& s = f.store;
  const std::int64_t P = s.tokens_per_page(), L = s.attention_layers();
  const auto page_bytes = static_cast<std::size_t>(f.pool.stats(pool_kind::kv).unit_bytes);
  const std::size_t slot = page_bytes / static_cast<std::size_t>(P);
  // The bytes of token position p in layer l of an extent whose tokens start at `first`.
  auto token_bytes = [&](const typename store_t::kv_extent& e, std::int64_t first, std::int64_t l, std::int64_t p) {
    std::vector<packed_handle> pages;
    s.append_pages(e, first, l, 0, pages);
    const auto b = static_cast<std::size_t>(p / P - first / P);
    REQUIRE(b < pages.size());
    auto bytes = f.pool.resolve(pages[b]);
    REQUIRE(bytes);
    return *bytes + static_cast<std::size_t>(p % P) * slot;
  };

  SUBCASE("allocate_kv_at takes kv_bytes_at; append_pages names one distinct page per block and layer") {
    for (std::int64_t first : {0, 1, 3, 4, 6}) {
      for (std::int64_t n : {1, 3, 4, 9}) {
        CAPTURE(first);
        CAPTURE(n);
        const auto used = s.used_bytes();
        auto e = s.allocate_kv_at(first, n);
        REQUIRE(e);
        CHECK(s.used_bytes() - used == s.kv_bytes_at(first, n));
        const std::int64_t blocks = (first + n - 1) / P - first / P + 1;
        std::vector<packed_handle> all;
        for (std::int64_t l = 0; l < L; ++l) {
          std::vector<packed_handle> pages;
          s.append_pages(*e, first, l, 0, pages);
          CHECK(static_cast<std::int64_t>(pages.size()) == blocks);
          std::vector<packed_handle> later;
          s.append_pages(*e, first, l, first / P + 1, later);  // from the next block on
          CHECK(static_cast<std::int64_t>(later.size()) == blocks - 1);
          all.insert(all.end(), pages.begin(), pages.end());
        }
        for (std::size_t i = 0; i < all.size(); ++i)
          for (std::size_t j = i + 1; j < all.size(); ++j) CHECK(all[i] != all[j]);
        s.free_kv(std::move(*e));
        CHECK(s.used_bytes() == used);
      }
    }
  }
  SUBCASE("copy_tokens copies the slots of [from, to) in every layer, and only those") {
    auto src = s.allocate_kv_at(5, 10);  // positions [5, 15)
    auto dst = s.allocate_kv_at(4, 12);  // positions [4, 16)
    REQUIRE(src);
    REQUIRE(dst);
    for (std::int64_t l = 0; l < L; ++l) {
      for (std::int64_t p = 5; p < 15; ++p) std::memset(token_bytes(*src, 5, l, p), static_cast<int>(1 + p + 16 * l), slot);
      for (std::int64_t p = 4; p < 16; ++p) std::memset(token_bytes(*dst, 4, l, p), 0xEE, slot);
    }
    s.copy_tokens(*src, 5, *dst, 4, 6, 13);
    for (std::int64_t l = 0; l < L; ++l) {
      for (std::int64_t p = 4; p < 16; ++p) {
        CAPTURE(l);
        CAPTURE(p);
        const int want = (p >= 6 && p < 13) ? static_cast<int>(static_cast<unsigned char>(1 + p + 16 * l)) : 0xEE;
        const std::byte* got = token_bytes(*dst, 4, l, p);
        for (std::size_t i = 0; i < slot; ++i) REQUIRE(static_cast<int>(got[i]) == want);
      }
    }
    s.free_kv(std::move(*src));
    s.free_kv(std::move(*dst));
    CHECK(s.used_bytes() == 0);
  }
}

TEST_CASE_TEMPLATE_INVOKE(paged_state_store_conformance, paged_fixture<memory::no_rebalancer>,
                          paged_fixture<memory::threshold_rebalancer>);

// --- lower_tier_store / layered_tier_store / demoting_store ----------------------------------
// One protocol for every store with tiers below HBM. Before the cache evicts a sequence,
// nothing of it is found below HBM; once other sequences pushed it out, the lookup that
// follows the HBM match finds it: the hit adds up (reusable = hbm + host, its KV starts no
// later than the match's common prefix, the KV reach at least as far as the hit, the
// match's namespace); it loads, reports loaded (layer by layer too), lands in a
// reservation, and settles after the commit. A hit shortens to its own resume point and
// to nothing at or before the HBM match; a released hit is stale (load reports it). A
// prefix never committed finds nothing, and releasing that is a no-op.

TEST_CASE_TEMPLATE_DEFINE("lower_tier_store conformance", F, lower_tier_store_conformance) {
  using store_t = typename F::store_type;
  static_assert(lower_tier_store<store_t, tree_of<store_t>>);
  F f;
  auto& c = f.cache;
  auto& st = c.store();
  const int n = F::sequence_tokens;
  auto commit = [&](const std::vector<token_id>& seq, std::int64_t input) {
    auto m = c.match(std::span<const token_id>(seq.data(), static_cast<std::size_t>(input)));
    REQUIRE(m);
    REQUIRE(c.commit(seq, input, &*m));
    st.settle(c.tree(), seq, lower_tier_hit_t<store_t>{});  // names the path (a store that demotes by it)
  };
  auto check_hit = [&](const auto& h, const match_result& m) {
    CHECK(h.hbm_tokens == m.reusable_tokens);
    CHECK(h.reusable_tokens == h.hbm_tokens + h.host_tokens);
    CHECK(h.kv_first <= m.common_prefix);
    CHECK(h.kv_reach >= h.reusable_tokens);
    CHECK(h.salt == m.salt);
  };
  const auto a = run_of(11, 7, n);
  auto a2 = a;
  for (int i = 0; i < n / 10; ++i) a2.push_back(90000 + i);
  // The hit a2 finds below HBM now (released again at once). `peek` neither pins nor
  // refreshes a's path, so the LRU eviction still takes a first.
  auto probe = [&] {
    const match_result m = c.peek(a2);
    auto h = st.lookup(a2, m);
    check_hit(h, m);
    const auto seen = h;
    st.release_hit(h);
    if (seen.host_tokens > 0) CHECK_FALSE(st.load(seen));  // released: stale
    return seen;
  };
  commit(a, n * 9 / 10);
  CHECK(probe().host_tokens == 0);  // still in HBM: nothing below it
  bool found = false;
  for (int k = 0; k < 64 && !found; ++k) {
    commit(run_of(1000000 + 1000 * k, 1, n), n * 9 / 10);  // new sequences push a out (LRU)
    found = probe().host_tokens > 0;
  }
  REQUIRE(found);

  SUBCASE("a hit shortens to its resume point, and not to the HBM match") {
    const match_result m = c.peek(a2);
    auto h = st.lookup(a2, m);
    REQUIRE(h.host_tokens > 0);
    CHECK_FALSE(st.shorten_hit(h, h.hbm_tokens));
    CHECK(st.shorten_hit(h, h.reusable_tokens));
    CHECK(h.host_tokens > 0);
    st.release_hit(h);
  }
  SUBCASE("load, wait, land in a reservation, commit, settle") {
    const match_result m = c.peek(a2);
    auto h = st.lookup(a2, m);
    check_hit(h, m);
    REQUIRE(h.host_tokens > 0);
    REQUIRE(st.load(h));
    REQUIRE(st.wait_loaded(h));
    const auto done = st.loaded(h);
    REQUIRE(done);
    CHECK(*done);
    if constexpr (layered_tier_store<store_t, tree_of<store_t>>) {
      REQUIRE(st.wait_layer(h, layer_kind::attention, 0));
      const auto layer = st.layer_loaded(h, layer_kind::attention, 0);
      REQUIRE(layer);
      CHECK(*layer);
    }
    // The reservation the lifecycle would make: the KV of [kv_first, resume) and a slot
    // (HBM is full: the tree goes first; the hit's holds are the store's, not the tree's).
    c.clear();
    const std::int64_t tokens = h.reusable_tokens - h.kv_first;
    REQUIRE(tokens > 0);
    auto kv = [&] {
      if constexpr (paged_state_store<store_t>) return st.allocate_kv_at(h.kv_first, tokens);
      else return st.allocate_kv(tokens);
    }();
    auto slot = st.allocate_checkpoint();
    REQUIRE(kv);
    REQUIRE(slot);
    st.land(h, *kv, h.kv_first, *slot);
    st.free_kv(std::move(*kv));
    st.free_checkpoint(std::move(*slot));
    REQUIRE(c.commit(a2, static_cast<std::int64_t>(a2.size())));
    st.settle(c.tree(), a2, h);
  }

  const std::vector<token_id> never(200, 42);
  auto m = c.match(never);
  REQUIRE(m);
  auto none = st.lookup(never, *m);
  CHECK(none.host_tokens == 0);
  CHECK(none.reusable_tokens == m->reusable_tokens);
  st.release_hit(none);  // nothing pinned: a no-op
  REQUIRE(c.release(*m));
  if constexpr (demoting_store<store_t, tree_of<store_t>>) CHECK(st.host_counters().demotions > 0);
}

TEST_CASE_TEMPLATE_INVOKE(lower_tier_store_conformance, tiered_fixture, host_tier_fixture<memory::no_rebalancer>,
                          host_tier_fixture<memory::threshold_rebalancer>);

// --- replicable_tier_store ------------------------------------------------------------------
// A replica is an empty store of the same shape: same tiers and byte costs, nothing used.

TEST_CASE("replicable_tier_store conformance: tiered_state_store") {
  using store_t = stores::tiered_state_store<>;
  static_assert(replicable_tier_store<store_t>);
  tiered_fixture f;
  auto& s = f.cache.store();
  auto a = run_of(3, 1, 500);
  auto m = f.cache.match(a);
  REQUIRE(m);
  REQUIRE(f.cache.commit(a, 400, &*m));
  REQUIRE(s.used_bytes() > 0);
  const auto r = s.metadata_replica(s.config());
  static_assert(state_store<std::remove_cvref_t<decltype(r)>>);
  CHECK(r.used_bytes() == 0);
  CHECK(r.capacity_bytes() == s.capacity_bytes());
  CHECK(r.kv_bytes(7) == s.kv_bytes(7));
  CHECK(r.checkpoint_bytes() == s.checkpoint_bytes());
  CHECK(r.tier_count() == s.tier_count());
}
