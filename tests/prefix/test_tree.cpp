// Randomized differential tests of the prefix cache against naive models, bad-input tests,
// plan() and concept checks.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "hybridcache/model/presets.hpp"
#include "hybridcache/prefix/flop_aware_scorer.hpp"
#include "hybridcache/compose/bundles.hpp"
#include "hybridcache/prefix/prefix_cache.hpp"
#include "hybridcache/stores/counting_store.hpp"
#include "hybridcache/sim/reference/reference_scorer.hpp"

using namespace hybridcache;
using namespace hybridcache::prefix;
using namespace hybridcache::stores;
using namespace hybridcache::compose;

namespace {

using seq_t = std::vector<token_id>;

cost_model small_model() {
  model_spec s = presets::marconi_7b();
  return cost_model(s);
}

/// Structural invariants of a tree: links, child table, ends, byte accounting.
template <class Cache>
void check_invariants(const Cache& c) {
  const auto& t = c.tree();
  std::int64_t tokens = 0, ckpts = 0;
  std::size_t nodes = 0;
  t.preorder([&](node_id n) {
    const auto& nd = t.at(n);
    ++nodes;
    REQUIRE(nd.live);
    REQUIRE(!nd.tokens.empty());
    REQUIRE(t.child(nd.parent, nd.tokens[0]) == n);
    REQUIRE(nd.end == t.at(nd.parent).end + nd.edge());
    std::uint32_t kids = 0;
    for (node_id k = nd.first_child; k != no_node; k = t.at(k).next_sibling) {
      REQUIRE(t.at(k).parent == n);
      ++kids;
    }
    REQUIRE(kids == nd.children);
    tokens += nd.edge();
    ckpts += nd.has_checkpoint ? 1 : 0;
  });
  REQUIRE(nodes == t.size());
  const auto& st = c.store();
  REQUIRE(st.used_bytes() == st.kv_bytes(tokens) + ckpts * st.checkpoint_bytes());
}

/// Naive model: the set of cached prefixes (KV) and of prefixes with a checkpoint.
struct naive_prefixes {
  std::set<seq_t> kv;
  std::set<seq_t> ckpt;

  std::int64_t common_prefix(const seq_t& s) const {
    std::int64_t k = 0;
    while (k < static_cast<std::int64_t>(s.size()) && kv.count(seq_t(s.begin(), s.begin() + k + 1))) ++k;
    return k;
  }
  std::int64_t match(const seq_t& s) const {
    for (std::int64_t p = static_cast<std::int64_t>(s.size()); p >= 1; --p)
      if (ckpt.count(seq_t(s.begin(), s.begin() + p))) return p;
    return 0;
  }
  void commit_judicious(const seq_t& s, const std::vector<std::int64_t>& extra) {
    const std::int64_t cp = common_prefix(s);
    // Every node end of a judicious tree holds a checkpoint, so the insert splits an edge
    // exactly when the common prefix is not a checkpointed prefix.
    const bool branch = cp > 0 && !ckpt.count(seq_t(s.begin(), s.begin() + cp));
    for (std::size_t k = 1; k <= s.size(); ++k) kv.insert(seq_t(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(k)));
    ckpt.insert(s);
    if (branch) ckpt.insert(seq_t(s.begin(), s.begin() + cp));
    for (std::int64_t p : extra) ckpt.insert(seq_t(s.begin(), s.begin() + p));
  }
};

seq_t random_seq(std::mt19937_64& rng, int max_len, int vocab) {
  std::uniform_int_distribution<int> len(1, max_len), tok(1, vocab);
  seq_t s(static_cast<std::size_t>(len(rng)));
  for (auto& t : s) t = tok(rng);
  return s;
}

/// Picks a random sequence that often extends or shares a prefix with earlier ones.
seq_t related_seq(std::mt19937_64& rng, const std::vector<seq_t>& seen, int max_len, int vocab) {
  if (seen.empty() || rng() % 4 == 0) return random_seq(rng, max_len, vocab);
  const seq_t& base = seen[rng() % seen.size()];
  const std::size_t keep = 1 + rng() % base.size();
  seq_t s(base.begin(), base.begin() + static_cast<std::ptrdiff_t>(keep));
  if (rng() % 3 != 0) {
    const seq_t tail = random_seq(rng, max_len / 2 + 1, vocab);
    s.insert(s.end(), tail.begin(), tail.end());
  }
  return s;
}

struct snapshot {
  std::size_t nodes;
  std::int64_t used, tokens, ckpts;
  time_point now;
  bool operator==(const snapshot&) const = default;
};
template <class Cache>
snapshot snap(const Cache& c) {
  return {c.tree().size(), c.store().used_bytes(), c.tokens_cached(), c.checkpoints_cached(), c.now()};
}

/// A test-local naive LRU: scans every node for the unpinned leaf with the smallest
/// (last access, node id). O(n) per eviction.
struct naive_lru {
  template <class Tree>
  void on_match(Tree& t, std::span<const node_id> path, node_id partial, time_point now) noexcept {
    for (node_id n : path) t.touch(n, now);
    if (partial != no_node) t.touch(partial, now);
  }
  template <class Tree>
  void on_insert_path(Tree& t, std::span<const node_id> path, time_point now) noexcept {
    for (node_id n : path) t.touch(n, now);
  }
  template <class Tree>
  void on_update(const Tree&, node_id) noexcept {}
  template <class Tree>
  void on_erase(const Tree&, node_id) noexcept {}
  template <class Tree>
  node_id select_victim(const Tree& t, time_point) noexcept {
    node_id best = no_node;
    for (node_id n = 1; n < t.id_bound(); ++n) {
      if (!t.live(n) || t.at(n).children != 0 || t.at(n).pins != 0) continue;
      if (best == no_node || t.at(n).last_access < t.at(best).last_access) best = n;
    }
    return best;
  }
  template <class Tree>
  evict_action action(const Tree&, node_id) const noexcept {
    return evict_action::remove_leaf;
  }
  double alpha() const noexcept { return 0.0; }
};
static_assert(utility_scorer<naive_lru, radix_tree<counting_store>>);

}  // namespace

TEST_CASE("concepts: models satisfy them, broken models do not") {
  static_assert(state_store<counting_store>);
  static_assert(admission_policy<judicious_admission>);
  static_assert(admission_policy<every_block_admission<32>>);
  static_assert(admission_policy<no_admission>);
  static_assert(utility_scorer<lru_scorer, radix_tree<counting_store>>);
  static_assert(utility_scorer<flop_aware_scorer, radix_tree<counting_store>>);
  static_assert(utility_scorer<sim::reference_flop_scorer, radix_tree<counting_store>>);
  static_assert(lock_policy<no_lock> && lock_policy<mutex_lock>);
  static_assert(prefix_cost_model<cost_model>);
  struct no_select {};
  static_assert(!admission_policy<no_select>);
  struct throwing_select {
    void select(const insertion_view&, std::vector<std::int64_t>&) const {}  // not noexcept
  };
  static_assert(!admission_policy<throwing_select>);
  struct no_split_store : counting_store {
    void split_kv() = delete;
  };
  static_assert(!state_store<no_split_store>);
  static_assert(!utility_scorer<judicious_admission, radix_tree<counting_store>>);
  static_assert(!lock_policy<int>);
  static_assert(!prefix_cost_model<model_spec>);
}

TEST_CASE("randomized: judicious tree == naive prefix/checkpoint model (no eviction)") {
  const cost_model m = small_model();
  for (std::uint64_t seed = 1; seed <= 1000; ++seed) {  // 1000 random operation sequences
    CAPTURE(seed);
    std::mt19937_64 rng(seed);
    const int vocab = 2 + static_cast<int>(seed % 4);
    prefix_cache<cost_model, judicious_admission, lru_scorer, counting_store> c(
        m, counting_store(std::int64_t{1} << 60, m.kv_bytes_per_token(), m.ssm_checkpoint_bytes()), lru_scorer{});
    naive_prefixes model;
    std::vector<seq_t> seen;
    for (int op = 0; op < 40; ++op) {
      const seq_t s = related_seq(rng, seen, 24, vocab);
      const auto in = static_cast<std::int64_t>(1 + rng() % s.size());
      const seq_t input(s.begin(), s.begin() + in);
      auto mr = c.match(input);
      REQUIRE(mr);
      REQUIRE(mr->reusable_tokens == model.match(input));
      REQUIRE(mr->common_prefix == model.common_prefix(input));
      if (rng() % 5 == 0) {
        REQUIRE(c.release(*mr));
        continue;
      }
      std::vector<std::int64_t> extra;
      if (rng() % 3 == 0) extra.push_back(static_cast<std::int64_t>(1 + rng() % s.size()));
      // A position inside the reused prefix that holds no state names one this request never
      // computed: refused with nothing changed (break 4 of issue #13); then commit without it.
      if (!extra.empty() && extra[0] <= mr->reusable_tokens &&
          !model.ckpt.count(seq_t(s.begin(), s.begin() + extra[0]))) {
        const auto refused = c.commit(s, in, &*mr, extra);
        REQUIRE_FALSE(refused);
        REQUIRE(refused.error() == errc::invalid_argument);
        extra.clear();
      }
      auto cr = c.commit(s, in, &*mr, extra);
      REQUIRE(cr);
      CHECK(cr->checkpoints_admitted <= 2 + static_cast<std::int64_t>(extra.size()));
      model.commit_judicious(s, extra);
      seen.push_back(s);
      REQUIRE(c.tokens_cached() == static_cast<std::int64_t>(model.kv.size()));
      REQUIRE(c.checkpoints_cached() == static_cast<std::int64_t>(model.ckpt.size()));
      check_invariants(c);
    }
  }
}

TEST_CASE("randomized: FLOP-aware threshold walk picks the naive scorer's victims") {
  const cost_model m = small_model();
  const std::int64_t ck = m.ssm_checkpoint_bytes(), kv = m.kv_bytes_per_token();
  int compared = 0;
  for (std::uint64_t seed = 1; seed <= 600; ++seed) {  // 600 random operation sequences
    CAPTURE(seed);
    std::mt19937_64 rng(seed * 7919);
    const double alpha = static_cast<double>(rng() % 21) / 10.0;
    const auto mode = seed % 3 == 0 ? intermediate_eviction::tombstone : intermediate_eviction::merge;
    const std::int64_t cap = 6 * ck + 200 * kv;
    // Both candidate rules: the paper's, and branch points protected (the default).
    const auto rule = seed % 2 == 0 ? flop_candidates::paper : flop_candidates::protect_branches;
    prefix_cache<cost_model, judicious_admission, flop_aware_scorer, counting_store> fast(
        m, counting_store(cap, kv, ck), flop_aware_scorer(m, {.alpha = alpha, .intermediate = mode, .candidates = rule}));
    prefix_cache<cost_model, judicious_admission, sim::reference_flop_scorer, counting_store> naive(
        m, counting_store(cap, kv, ck),
        sim::reference_flop_scorer(m, {.alpha = alpha, .intermediate = mode, .candidates = rule}));
    std::vector<seq_t> seen;
    for (int op = 0; op < 50; ++op) {
      const seq_t s = related_seq(rng, seen, 60, 3);
      const auto in = static_cast<std::int64_t>(1 + rng() % s.size());
      const seq_t input(s.begin(), s.begin() + in);
      auto a = fast.match(input);
      auto b = naive.match(input);
      REQUIRE(a);
      REQUIRE(b);
      REQUIRE(a->reusable_tokens == b->reusable_tokens);
      auto ca = fast.commit(s, in, &*a);
      auto cb = naive.commit(s, in, &*b);
      REQUIRE(ca.has_value() == cb.has_value());
      if (ca) {
        REQUIRE(ca->evictions == cb->evictions);
        REQUIRE(ca->bytes_evicted == cb->bytes_evicted);
        compared += static_cast<int>(ca->evictions);
      }
      seen.push_back(s);
      REQUIRE(fast.tokens_cached() == naive.tokens_cached());
      REQUIRE(fast.checkpoints_cached() == naive.checkpoints_cached());
      REQUIRE(fast.store().used_bytes() <= cap);
      check_invariants(fast);
    }
  }
  CHECK(compared > 10000);  // the comparison really exercised eviction
}

TEST_CASE("randomized: LRU heap == naive O(n) LRU scan") {
  const cost_model m = small_model();
  const std::int64_t ck = m.ssm_checkpoint_bytes(), kv = m.kv_bytes_per_token();
  int compared = 0;
  for (std::uint64_t seed = 1; seed <= 400; ++seed) {  // 400 random operation sequences
    CAPTURE(seed);
    std::mt19937_64 rng(seed * 104729);
    const std::int64_t cap = 5 * ck + 150 * kv;
    prefix_cache<cost_model, every_block_admission<8>, lru_scorer, counting_store> fast(m, counting_store(cap, kv, ck), lru_scorer{});
    prefix_cache<cost_model, every_block_admission<8>, naive_lru, counting_store> naive(m, counting_store(cap, kv, ck), naive_lru{});
    std::vector<seq_t> seen;
    for (int op = 0; op < 50; ++op) {
      const seq_t s = related_seq(rng, seen, 50, 3);
      const auto in = static_cast<std::int64_t>(1 + rng() % s.size());
      const seq_t input(s.begin(), s.begin() + in);
      auto a = fast.match(input);
      auto b = naive.match(input);
      REQUIRE(a->reusable_tokens == b->reusable_tokens);
      auto ca = fast.commit(s, in, &*a);
      auto cb = naive.commit(s, in, &*b);
      REQUIRE(ca.has_value() == cb.has_value());
      if (ca) {
        REQUIRE(ca->evictions == cb->evictions);
        compared += static_cast<int>(ca->evictions);
      }
      seen.push_back(s);
      REQUIRE(fast.tokens_cached() == naive.tokens_cached());
      check_invariants(fast);
    }
  }
  CHECK(compared > 5000);
}

TEST_CASE("pinned nodes are never evicted") {
  const cost_model m = small_model();
  const std::int64_t ck = m.ssm_checkpoint_bytes(), kv = m.kv_bytes_per_token();
  prefix_cache<cost_model, judicious_admission, flop_aware_scorer, counting_store> c(m, counting_store(3 * ck + 100 * kv, kv, ck),
                                                                     flop_aware_scorer(m, {.alpha = 1.0}));
  const seq_t a = {1, 2, 3, 4, 5, 6, 7, 8};
  REQUIRE(c.commit(a, 8));
  auto held = c.match(a);
  REQUIRE(held->reusable_tokens == 8);
  std::mt19937_64 rng(5);
  for (int i = 0; i < 50; ++i) {
    seq_t s = random_seq(rng, 40, 50);
    s[0] = 100 + i;  // never shares a prefix with `a`
    auto r = c.commit(s, static_cast<std::int64_t>(s.size()));
    REQUIRE(r);
    CHECK(c.tree().live(held->node));
    CHECK(c.tree().at(held->node).end == 8);
  }
  CHECK(c.release(*held));
  CHECK(c.release(*held).error() == errc::double_free);
}

TEST_CASE("bad input: clear error, tree and store unchanged") {
  const cost_model m = small_model();
  const std::int64_t ck = m.ssm_checkpoint_bytes(), kv = m.kv_bytes_per_token();
  prefix_cache<cost_model, judicious_admission, lru_scorer, counting_store> c(m, counting_store(10 * ck + 1000 * kv, kv, ck),
                                                              lru_scorer{});
  const seq_t a = {1, 2, 3, 4, 5, 6};
  REQUIRE(c.commit(a, 4));
  auto m1 = c.match(seq_t{1, 2, 3, 4, 5, 6, 7});
  REQUIRE(m1->reusable_tokens == 6);
  const snapshot before = snap(c);

  SUBCASE("empty sequences") {
    CHECK(c.match(seq_t{}).error() == errc::invalid_argument);
    CHECK(c.commit(seq_t{}, 0).error() == errc::invalid_argument);
    CHECK(c.plan(seq_t{}, *m1).error() == errc::invalid_argument);
  }
  SUBCASE("input_tokens outside the sequence") {
    CHECK(c.commit(a, 7).error() == errc::invalid_argument);
    CHECK(c.commit(a, -1).error() == errc::invalid_argument);
  }
  SUBCASE("checkpoint positions outside the sequence") {
    const std::int64_t zero[] = {0};
    const std::int64_t past[] = {7};
    CHECK(c.commit(a, 6, nullptr, zero).error() == errc::invalid_argument);
    CHECK(c.commit(a, 6, nullptr, past).error() == errc::invalid_argument);
    CHECK(c.plan(a, *m1, past).error() == errc::invalid_argument);
  }
  SUBCASE("commit that does not extend the pinned match") {
    CHECK(c.commit(seq_t{9, 9, 9, 9, 9, 9, 9}, 7, &*m1).error() == errc::invalid_argument);
    CHECK(c.commit(seq_t{1, 2, 3}, 3, &*m1).error() == errc::invalid_argument);
  }
  SUBCASE("a new state larger than the whole capacity") {
    const seq_t huge(6000, 7);
    CHECK(c.commit(huge, 6000).error() == errc::out_of_capacity);
  }
  CHECK(snap(c) == before);
  check_invariants(c);

  SUBCASE("a result from another cache") {
    prefix_cache<cost_model, judicious_admission, lru_scorer, counting_store> other(m, counting_store(10 * ck + 1000 * kv, kv, ck),
                                                                    lru_scorer{});
    CHECK(other.release(*m1).error() == errc::foreign_handle);
    CHECK(other.commit(seq_t{1, 2, 3, 4, 5, 6, 7}, 7, &*m1).error() == errc::foreign_handle);
  }
  SUBCASE("release twice / commit after release") {
    REQUIRE(c.release(*m1));
    CHECK(c.release(*m1).error() == errc::double_free);
    CHECK(c.commit(seq_t{1, 2, 3, 4, 5, 6, 7}, 7, &*m1).error() == errc::double_free);
  }
}

TEST_CASE("bad input: capacity smaller than one checkpoint") {
  const cost_model m = small_model();
  CHECK_THROWS_AS(counting_store(m.ssm_checkpoint_bytes() - 1, m.kv_bytes_per_token(), m.ssm_checkpoint_bytes()),
                  capacity_error);
  CHECK_THROWS_AS(counting_store(0, 1, 1), invalid_argument);
}

TEST_CASE("bad input: a store that refuses allocation") {
  const cost_model m = small_model();
  const std::int64_t ck = m.ssm_checkpoint_bytes(), kv = m.kv_bytes_per_token();
  prefix_cache<cost_model, judicious_admission, lru_scorer, counting_store> c(m, counting_store(10 * ck + 1000 * kv, kv, ck),
                                                              lru_scorer{});
  const seq_t a = {1, 2, 3, 4, 5, 6};
  // Nothing evictable: the commit fails and nothing changes (apart from the clock's ticks).
  for (int k = 1; k <= 2; ++k) {
    c.store().fail_next(k);
    auto r = c.commit(a, 6);
    CHECK(r.error() == errc::out_of_capacity);
    CHECK(c.tree().size() == 0);
    CHECK(c.store().used_bytes() == 0);
  }
  c.store().fail_next(0);
  REQUIRE(c.commit(a, 6));
  // One evictable leaf: a refusal evicts it and retries (documented), the tree stays sound.
  c.store().fail_next(1);
  auto r = c.commit(seq_t{7, 8, 9}, 3);
  REQUIRE(r);
  CHECK(r->evictions == 1);
  check_invariants(c);
}

TEST_CASE("plan: checkpoint sites with chunk boundary and roll-forward") {
  const cost_model m = small_model();  // marconi_7b: scan_chunk from the preset
  const std::int64_t ck = m.ssm_checkpoint_bytes(), kv = m.kv_bytes_per_token();
  prefix_cache<cost_model, judicious_admission, lru_scorer, counting_store> c(m, counting_store(100 * ck + 100000 * kv, kv, ck),
                                                              lru_scorer{});
  seq_t sys(300);
  for (std::size_t i = 0; i < sys.size(); ++i) sys[i] = static_cast<token_id>(i + 10);
  seq_t a = sys, b = sys;
  a.insert(a.end(), {1, 2, 3});
  b.insert(b.end(), {4, 5, 6, 7});
  REQUIRE(c.commit(a, 303));
  auto mb = c.match(b);
  CHECK(mb->reusable_tokens == 0);  // discovered on the 2nd occurrence...
  CHECK(mb->common_prefix == 300);
  const std::int64_t extra[] = {150};
  auto p = c.plan(b, *mb, extra);
  REQUIRE(p);
  const std::int64_t C = m.spec().scan_chunk;
  REQUIRE(p->sites.size() == 3);  // 150 (application), 300 (branch point), 304 (end)
  CHECK(p->sites[0].position == 150);
  CHECK(p->sites[1].position == 300);
  CHECK(p->sites[2].position == 304);
  for (const auto& s : p->sites) {
    CHECK(s.chunk_boundary == (s.position / C) * C);
    CHECK(s.roll_forward == s.position - s.chunk_boundary);
    CHECK(s.roll_forward < C);
  }
  CHECK(p->two_pass_splits() == std::vector<std::int64_t>{150, 300, 304});
  REQUIRE(c.commit(b, 304, &*mb, extra));
  seq_t d = sys;
  d.push_back(99);
  auto md = c.match(d);
  CHECK(md->reusable_tokens == 300);  // ...and hits from the 3rd on
  CHECK(md->flops_saved == m.hit_flops(300));
  auto pd = c.plan(d, *md);
  REQUIRE(pd->sites.size() == 1);
  CHECK(pd->sites[0].position == 301);
  CHECK(pd->sites[0].chunk_boundary == 300);  // never before the prefill start
  CHECK(c.release(*md));
}

TEST_CASE("every_block admission: states every B tokens and at the end") {
  const cost_model m = small_model();
  const std::int64_t ck = m.ssm_checkpoint_bytes(), kv = m.kv_bytes_per_token();
  prefix_cache<cost_model, every_block_admission<4>, lru_scorer, counting_store> c(m, counting_store(100 * ck + 1000 * kv, kv, ck),
                                                                   lru_scorer{});
  const seq_t a = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  auto r = c.commit(a, 10);
  REQUIRE(r);
  CHECK(r->checkpoints_admitted == 3);  // 4, 8, 10
  CHECK(c.match(seq_t{1, 2, 3, 4, 5, 6, 7, 9})->reusable_tokens == 4);
  CHECK(c.match(seq_t{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11})->reusable_tokens == 10);
}

TEST_CASE("no_admission: KV only, never a hit; extra positions still apply") {
  const cost_model m = small_model();
  const std::int64_t ck = m.ssm_checkpoint_bytes(), kv = m.kv_bytes_per_token();
  prefix_cache<cost_model, no_admission, lru_scorer, counting_store> c(m, counting_store(100 * ck + 1000 * kv, kv, ck), lru_scorer{});
  const seq_t a = {1, 2, 3, 4, 5, 6};
  REQUIRE(c.commit(a, 6));
  auto r = c.match(a);
  CHECK(r->reusable_tokens == 0);
  CHECK(r->common_prefix == 6);
  const std::int64_t keep[] = {3};
  REQUIRE(c.commit(a, 6, nullptr, keep));
  CHECK(c.match(a)->reusable_tokens == 3);
}

TEST_CASE("tombstone eviction keeps the KV and drops the checkpoint") {
  const cost_model m = small_model();
  const std::int64_t ck = m.ssm_checkpoint_bytes(), kv = m.kv_bytes_per_token();
  // Room for 2 checkpoints and 10 tokens: the 3rd checkpoint forces one eviction.
  prefix_cache<cost_model, judicious_admission, flop_aware_scorer, counting_store> c(
      m, counting_store(2 * ck + 10 * kv, kv, ck),
      flop_aware_scorer(m, {.alpha = 0.0, .intermediate = intermediate_eviction::tombstone}));
  REQUIRE(c.commit(seq_t{1, 2, 3, 4}, 4));
  REQUIRE(c.commit(seq_t{1, 2, 3, 4, 5, 6}, 6));  // node [1..4] now has one child
  auto r = c.commit(seq_t{1, 2, 3, 4, 5, 6, 7, 8}, 8);
  REQUIRE(r);
  CHECK(r->evictions == 1);
  CHECK(c.tokens_cached() == 8);       // KV kept
  CHECK(c.checkpoints_cached() == 2);  // [1..4] tombstoned
  CHECK(c.match(seq_t{1, 2, 3, 4, 9})->reusable_tokens == 0);
  check_invariants(c);
}

TEST_CASE("merge eviction moves the KV into the child") {
  const cost_model m = small_model();
  const std::int64_t ck = m.ssm_checkpoint_bytes(), kv = m.kv_bytes_per_token();
  prefix_cache<cost_model, judicious_admission, flop_aware_scorer, counting_store> c(m, counting_store(2 * ck + 10 * kv, kv, ck),
                                                                     flop_aware_scorer(m, {.alpha = 0.0}));
  REQUIRE(c.commit(seq_t{1, 2, 3, 4}, 4));
  REQUIRE(c.commit(seq_t{1, 2, 3, 4, 5, 6}, 6));
  auto r = c.commit(seq_t{1, 2, 3, 4, 5, 6, 7, 8}, 8);
  REQUIRE(r);
  CHECK(r->evictions == 1);
  CHECK(r->nodes_removed == 1);
  CHECK(c.tokens_cached() == 8);
  CHECK(c.checkpoints_cached() == 2);
  CHECK(c.tree().size() == 2);  // [1..6] (merged) -> [7, 8]
  CHECK(c.match(seq_t{1, 2, 3, 4, 5, 6, 0})->reusable_tokens == 6);
  check_invariants(c);
}

TEST_CASE("docs/prefix-cache.md example") {
  // example-begin
  const cost_model model(presets::marconi_7b());
  counting_store store(5'000'000'000, model.kv_bytes_per_token(), model.ssm_checkpoint_bytes());
  // marconi_tuned_cache = alpha_tuned_cache<prefix_cache<cost_model, judicious_admission,
  // flop_aware_scorer, counting_store>> (compose/bundles.hpp).
  marconi_tuned_cache<> cache(model, std::move(store), flop_aware_scorer(model, {.alpha = 0.0}), {}, {},
                              {.bootstrap_multiplier = 5});

  std::vector<token_id> system_prompt(1000, 42), history;
  for (int turn = 0; turn < 3; ++turn) {
    std::vector<token_id> input = system_prompt;
    input.insert(input.end(), history.begin(), history.end());
    input.push_back(1000 + turn);  // the user's new message
    auto m = cache.match(input);   // expected<match_result>; pins the reused checkpoint
    REQUIRE(m);
    auto plan = cache.plan(input, *m);  // where prefill must save SSM states
    for (const checkpoint_site& s : plan->sites) {
      // prefill from m->reusable_tokens; save the chunked-scan state at s.chunk_boundary,
      // step s.roll_forward tokens recurrently, keep that state for position s.position
      (void)s;
    }
    std::vector<token_id> output = {7, 8, 9};  // decoded tokens
    std::vector<token_id> sequence = input;
    sequence.insert(sequence.end(), output.begin(), output.end());
    auto r = cache.commit(sequence, static_cast<std::int64_t>(input.size()), &*m);  // releases the pin
    REQUIRE(r);
    CHECK(m->reusable_tokens == (turn == 0 ? 0 : static_cast<std::int64_t>(input.size()) - 1));
    history.assign(sequence.begin() + 1000, sequence.end());
  }
  // example-end
  CHECK(cache.counters().hits == 2);
}

TEST_CASE("branch-protecting candidates: a branch point is not merged while it has a child; a turn's end still is") {
  using tree_t = radix_tree<counting_store>;
  tree_t t;
  const std::vector<token_id> sys_a = {1, 2, 3, 4, 10, 11}, b = {20, 21}, turn2 = {30, 31};
  const node_id a = t.add_leaf(tree_t::root(), sys_a, {6}, 1);
  const node_id sys = t.split(a, 4, {4}, 2);  // a later request leaves at token 4
  const node_id leaf_b = t.add_leaf(sys, b, {2}, 3);
  t.set_checkpoint(sys, {true});
  t.set_checkpoint(a, {true});
  CHECK(t.at(sys).branched);
  CHECK_FALSE(t.at(a).branched);
  (void)t.remove_leaf(leaf_b);  // sys has one child again
  REQUIRE(t.at(sys).children == 1);
  CHECK(prefix::detail::flop_candidate(t, sys, /*protect_branches=*/false));  // the paper merges it
  CHECK_FALSE(prefix::detail::flop_candidate(t, sys, true));
  // a (a turn's end) extended by the next turn: one child, never branched: still a candidate.
  (void)t.add_leaf(a, turn2, {2}, 4);
  CHECK(prefix::detail::flop_candidate(t, a, true));
  CHECK(prefix::detail::flop_candidate(t, a, false));
  // Once its last child is gone, the branch point is an ordinary leaf candidate.
  const node_id tail = t.at(a).first_child;
  (void)t.remove_leaf(tail);
  (void)t.take_checkpoint(a);
  (void)t.remove_leaf(a);
  CHECK(prefix::detail::flop_candidate(t, sys, true));
  // A slot reused by a new node starts unbranched.
  const node_id fresh = t.add_leaf(tree_t::root(), std::vector<token_id>{40}, {1}, 5);
  CHECK_FALSE(t.at(fresh).branched);
}

namespace {
/// The obviously-right model of `flop_index::efficiency_classes`: score every candidate's
/// class, take each class's least recently used node (ties: lowest id), and the lowest
/// exact utility among those heads (ties: DFS order). O(n) per victim.
/// With `walk_limit` > 0, of `flop_index::bounded_walk`: sort the candidates by last access
/// and by efficiency, score the k-th of each for k = 0, 1, ... until the threshold (the
/// k-th pair's score) exceeds the best, and after `walk_limit` pairs add the class heads.
class naive_class_scorer {
 public:
  static constexpr bool evicts_inner_nodes = true;
  naive_class_scorer(cost_model m, double alpha, std::int64_t walk_limit = 0)
      : model_(std::move(m)), alpha_(alpha), walk_limit_(walk_limit) {}
  [[nodiscard]] double alpha() const noexcept { return alpha_; }
  [[nodiscard]] bool protects_branches() const noexcept { return true; }
  template <class Tree>
  void on_match(Tree& tree, std::span<const node_id> path, node_id, time_point now) noexcept {
    for (auto it = path.rbegin(); it != path.rend(); ++it)
      if (tree.at(*it).has_checkpoint) {
        tree.touch(*it, now);
        return;
      }
  }
  template <class Tree>
  void on_insert_path(Tree&, std::span<const node_id>, time_point) noexcept {}
  template <class Tree>
  void on_update(const Tree&, node_id) noexcept {}
  template <class Tree>
  void on_erase(const Tree&, node_id) noexcept {}
  template <class Tree>
  [[nodiscard]] node_id select_victim(const Tree& tree, time_point now) noexcept {
    std::vector<node_id> cand;
    tree.preorder([&](node_id n) {
      if (prefix::detail::flop_candidate(tree, n, true)) cand.push_back(n);
    });
    if (cand.empty()) return no_node;
    double emin = 0, emax = 0, rmin = 0, rmax = 0;
    std::map<node_id, double> eff, rec;
    for (std::size_t i = 0; i < cand.size(); ++i) {
      const node_id n = cand[i];
      eff[n] = prefix::detail::node_efficiency(model_, tree, n);
      rec[n] = prefix::detail::recency(now, tree.at(n).last_access);
      emin = i == 0 ? eff[n] : std::min(emin, eff[n]);
      emax = i == 0 ? eff[n] : std::max(emax, eff[n]);
      rmin = i == 0 ? rec[n] : std::min(rmin, rec[n]);
      rmax = i == 0 ? rec[n] : std::max(rmax, rec[n]);
    }
    std::map<std::uint32_t, node_id> head;
    for (node_id n : cand) {
      const auto c = prefix::detail::efficiency_class(eff[n]);
      const auto it = head.find(c);
      if (it == head.end() || std::pair{tree.at(n).last_access, n} < std::pair{tree.at(it->second).last_access, it->second})
        head[c] = n;
    }
    const bool single = cand.size() == 1;
    auto score = [&](double e, double r) {
      return prefix::detail::utility_no_fma(alpha_, prefix::detail::normalise(e, emin, emax, single),
                                            prefix::detail::normalise(r, rmin, rmax, single));
    };
    node_id best = no_node;
    double best_u = 0;
    auto consider = [&](node_id n) {
      const double u = score(eff[n], rec[n]);
      if (best == no_node || u < best_u || (u == best_u && tree.dfs_before(n, best))) {
        best = n;
        best_u = u;
      }
    };
    if (walk_limit_ > 0) {
      std::vector<node_id> by_time = cand, by_eff = cand;
      std::sort(by_time.begin(), by_time.end(), [&](node_id a, node_id b) {
        return std::pair{tree.at(a).last_access, a} < std::pair{tree.at(b).last_access, b};
      });
      std::sort(by_eff.begin(), by_eff.end(), [&](node_id a, node_id b) { return std::pair{eff[a], a} < std::pair{eff[b], b}; });
      for (std::size_t k = 0; k < cand.size(); ++k) {
        if (static_cast<std::int64_t>(k) == walk_limit_) {
          ++cuts_;
          break;  // to the class heads
        }
        consider(by_time[k]);
        consider(by_eff[k]);
        if (score(eff[by_eff[k]], rec[by_time[k]]) > best_u) return best;
      }
      if (static_cast<std::int64_t>(cand.size()) <= walk_limit_) return best;  // walked to the end
    }
    for (const auto& [c, n] : head) consider(n);
    return best;
  }
  [[nodiscard]] std::int64_t cuts() const noexcept { return cuts_; }
  template <class Tree>
  [[nodiscard]] evict_action action(const Tree& tree, node_id n) const noexcept {
    return tree.at(n).children == 0 ? evict_action::remove_leaf : evict_action::merge_into_child;
  }

 private:
  cost_model model_;
  double alpha_;
  std::int64_t walk_limit_;
  std::int64_t cuts_ = 0;
};
}  // namespace

TEST_CASE("randomized: FLOP-aware efficiency classes pick the naive class-head model's victims") {
  const cost_model m = small_model();
  const std::int64_t ck = m.ssm_checkpoint_bytes(), kv = m.kv_bytes_per_token();
  int compared = 0;
  for (std::uint64_t seed = 1; seed <= 300; ++seed) {
    CAPTURE(seed);
    std::mt19937_64 rng(seed * 104729);
    const double alpha = static_cast<double>(rng() % 21) / 10.0;
    const std::int64_t cap = 6 * ck + 200 * kv;
    prefix_cache<cost_model, judicious_admission, flop_aware_scorer, counting_store> fast(
        m, counting_store(cap, kv, ck), flop_aware_scorer(m, {.alpha = alpha, .index = flop_index::efficiency_classes}));
    prefix_cache<cost_model, judicious_admission, naive_class_scorer, counting_store> naive(m, counting_store(cap, kv, ck),
                                                                            naive_class_scorer(m, alpha));
    std::vector<seq_t> seen;
    for (int op = 0; op < 50; ++op) {
      const seq_t s = related_seq(rng, seen, 60, 3);
      const auto in = static_cast<std::int64_t>(1 + rng() % s.size());
      const seq_t input(s.begin(), s.begin() + in);
      auto a = fast.match(input);
      auto b = naive.match(input);
      REQUIRE(a);
      REQUIRE(b);
      REQUIRE(a->reusable_tokens == b->reusable_tokens);
      auto ca = fast.commit(s, in, &*a);
      auto cb = naive.commit(s, in, &*b);
      REQUIRE(ca.has_value() == cb.has_value());
      if (ca) {
        REQUIRE(ca->evictions == cb->evictions);
        compared += static_cast<int>(ca->evictions);
      } else {
        REQUIRE(fast.release(*a));
        REQUIRE(naive.release(*b));
      }
      seen.push_back(s);
    }
  }
  CHECK(compared > 2000);
}

TEST_CASE("randomized: the bounded walk picks the naive model's victims, exact until its limit, class heads after") {
  const cost_model m = small_model();
  const std::int64_t ck = m.ssm_checkpoint_bytes(), kv = m.kv_bytes_per_token();
  std::int64_t compared = 0, cuts = 0;
  for (std::uint64_t seed = 1; seed <= 300; ++seed) {
    CAPTURE(seed);
    std::mt19937_64 rng(seed * 7919);
    const double alpha = static_cast<double>(rng() % 21) / 10.0;
    const std::int64_t limit = 1 + static_cast<std::int64_t>(rng() % 3);  // small: the walk is cut often
    const std::int64_t cap = 6 * ck + 200 * kv;
    prefix_cache<cost_model, judicious_admission, flop_aware_scorer, counting_store> fast(
        m, counting_store(cap, kv, ck),
        flop_aware_scorer(m, {.alpha = alpha, .index = flop_index::bounded_walk, .walk_limit = limit}));
    prefix_cache<cost_model, judicious_admission, naive_class_scorer, counting_store> naive(m, counting_store(cap, kv, ck),
                                                                            naive_class_scorer(m, alpha, limit));
    std::vector<seq_t> seen;
    for (int op = 0; op < 50; ++op) {
      const seq_t s = related_seq(rng, seen, 60, 3);
      const auto in = static_cast<std::int64_t>(1 + rng() % s.size());
      const seq_t input(s.begin(), s.begin() + in);
      auto a = fast.match(input);
      auto b = naive.match(input);
      REQUIRE(a);
      REQUIRE(b);
      REQUIRE(a->reusable_tokens == b->reusable_tokens);
      auto ca = fast.commit(s, in, &*a);
      auto cb = naive.commit(s, in, &*b);
      REQUIRE(ca.has_value() == cb.has_value());
      if (ca) {
        REQUIRE(ca->evictions == cb->evictions);
        REQUIRE(fast.store().used_bytes() == naive.store().used_bytes());
        compared += ca->evictions;
      } else {
        REQUIRE(fast.release(*a));
        REQUIRE(naive.release(*b));
      }
      seen.push_back(s);
    }
    REQUIRE(static_cast<std::int64_t>(fast.scorer().walks_cut()) == naive.scorer().cuts());
    cuts += naive.scorer().cuts();
  }
  CHECK(compared > 2000);
  CHECK(cuts > 500);  // the class-head half of the model is exercised, not only the walk
}

// prefix_cache reuses a walk within one commit when radix_tree::edits() has not moved, so
// every edit that can change a walk must count, and what a walk ignores need not.
TEST_CASE("radix_tree::edits: add_leaf, split, remove_leaf and merge count; touch, pins, checkpoints do not") {
  using kv = counting_store::kv_extent;
  radix_tree<counting_store> t;
  std::vector<node_id> path;
  const seq_t a{7, 3, 11, 5, 2, 9}, b{7, 3, 11, 4};
  std::uint64_t e = t.edits();
  const node_id na = t.add_leaf(radix_tree<counting_store>::root(), a, kv{6}, 1);
  REQUIRE(t.edits() == ++e);
  t.touch(na, 2);
  t.pin(na);
  t.unpin(na);
  t.set_checkpoint(na, counting_store::checkpoint_handle{true});
  (void)t.take_checkpoint(na);
  CHECK(t.edits() == e);
  CHECK(t.walk(b, path).common_prefix == 3);
  const node_id h = t.split(na, 3, kv{3}, 3);
  REQUIRE(t.edits() == ++e);
  const node_id nb = t.add_leaf(h, seq_t{4}, kv{1}, 4);
  REQUIRE(t.edits() == ++e);
  CHECK(t.walk(b, path).common_prefix == 4);
  CHECK(path == std::vector<node_id>{h, nb});
  (void)t.remove_leaf(nb);
  REQUIRE(t.edits() == ++e);
  CHECK(t.walk(b, path).common_prefix == 3);
  CHECK(t.merge_into_child(h, kv{6}) == na);
  REQUIRE(t.edits() == ++e);
  CHECK(t.walk(a, path).common_prefix == 6);
  CHECK(path == std::vector<node_id>{na});
}
