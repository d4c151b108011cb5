// Conformance suite of `hybridcache::utility_scorer`: every scorer drives a real
// `prefix_cache` over a `counting_store` through random branching request streams (shared
// prefixes, partial hits, matches held across other requests' commits), wrapped in
// `checked_scorer`, which forwards every call and checks each answer the cache acts on:
//
//   select_victim  never the root, never a dead slot, never a pinned node
//   action         remove_leaf only for a leaf, merge_into_child only for a node with one
//                  child, drop_checkpoint only for a node that holds a checkpoint (the cache
//                  counts a victim that frees nothing as progress; one that can never free
//                  anything would be picked forever)
//
// and, through the cache, that eviction run until the scorer has no victim leaves only
// pinned state: every remaining leaf is pinned, and with nothing pinned the tree and the
// store are empty. A match held across other commits keeps its node alive, pinned and
// usable. Checking inside the wrapper sees every victim of every eviction round, not only
// the outcome of a commit.
//
// A new scorer is covered by adding a fixture (how to build it from a cost model) and
// naming it in TEST_CASE_TEMPLATE_INVOKE.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "hybridcache/model/presets.hpp"
#include "hybridcache/compose/adaptive_scorer.hpp"
#include "hybridcache/prefix/admission.hpp"
#include "hybridcache/prefix/flop_aware_scorer.hpp"
#include "hybridcache/prefix/gdsf_scorer.hpp"
#include "hybridcache/prefix/lru_scorer.hpp"
#include "hybridcache/prefix/prefix_cache.hpp"
#include "hybridcache/sim/reference/reference_scorer.hpp"
#include "hybridcache/stores/counting_store.hpp"
#include "hybridcache/tiered/car_score.hpp"

using namespace hybridcache;
using namespace hybridcache::prefix;
using namespace hybridcache::stores;
using namespace hybridcache::compose;

namespace {

using seq_t = std::vector<token_id>;

/// What `checked_scorer` saw. Plain counters: the hooks are noexcept and may not allocate.
struct scorer_report {
  std::int64_t victims = 0;        ///< select_victim answers other than no_node
  std::int64_t no_victim = 0;      ///< no_node answers
  std::int64_t root = 0;           ///< victims that were the root
  std::int64_t dead = 0;           ///< victims that were not live nodes
  std::int64_t pinned = 0;         ///< victims with pins
  std::int64_t actions = 0;
  std::int64_t bad_remove = 0;     ///< remove_leaf for a node with children
  std::int64_t bad_merge = 0;      ///< merge_into_child for a node without exactly one child
  std::int64_t bad_drop = 0;       ///< drop_checkpoint for a node without a checkpoint
  std::int64_t merges = 0, drops = 0, removals = 0;

  [[nodiscard]] std::int64_t violations() const noexcept {
    return root + dead + pinned + bad_remove + bad_merge + bad_drop;
  }
};

/// Forwards every `utility_scorer` call to `Inner` and checks the answers (see the file
/// comment). The optional hooks the cache detects (`reserve`, `accounted_bytes`) are
/// forwarded only when `Inner` has them, so the cache treats the wrapper like the scorer.
template <class Inner>
class checked_scorer {
 public:
  explicit checked_scorer(Inner inner) : inner_(std::move(inner)) {}

  void reserve(std::size_t ids)
    requires reservable_scorer<Inner>
  {
    inner_.reserve(ids);
  }

  template <class Tree>
  void on_match(Tree& tree, std::span<const node_id> path, node_id partial, time_point now) noexcept {
    inner_.on_match(tree, path, partial, now);
  }
  template <class Tree>
  void on_insert_path(Tree& tree, std::span<const node_id> path, time_point now) noexcept {
    inner_.on_insert_path(tree, path, now);
  }
  template <class Tree>
  void on_update(const Tree& tree, node_id n) noexcept {
    inner_.on_update(tree, n);
  }
  template <class Tree>
  void on_erase(const Tree& tree, node_id n) noexcept {
    inner_.on_erase(tree, n);
  }
  template <class Tree>
  [[nodiscard]] node_id select_victim(const Tree& tree, time_point now) noexcept {
    const node_id v = inner_.select_victim(tree, now);
    if (v == no_node) {
      ++report_.no_victim;
      return v;
    }
    ++report_.victims;
    if (v == Tree::root()) ++report_.root;
    else if (!tree.live(v)) ++report_.dead;
    else if (tree.at(v).pins > 0) ++report_.pinned;
    return v;
  }
  template <class Tree>
  [[nodiscard]] evict_action action(const Tree& tree, node_id n) const noexcept {
    const evict_action a = inner_.action(tree, n);
    ++report_.actions;
    if (n == Tree::root() || !tree.live(n)) return a;  // already counted by select_victim
    const auto& nd = tree.at(n);
    switch (a) {
      case evict_action::remove_leaf:
        ++report_.removals;
        if (nd.children != 0) ++report_.bad_remove;
        break;
      case evict_action::merge_into_child:
        ++report_.merges;
        if (nd.children != 1) ++report_.bad_merge;
        break;
      case evict_action::drop_checkpoint:
        ++report_.drops;
        if (!nd.has_checkpoint) ++report_.bad_drop;
        break;
    }
    return a;
  }
  [[nodiscard]] double alpha() const noexcept { return inner_.alpha(); }

  template <class Tree>
  [[nodiscard]] std::int64_t accounted_bytes(const Tree& tree, node_id n, evict_action act,
                                             std::int64_t actual) const noexcept
    requires requires(const Inner& i) { i.accounted_bytes(tree, n, act, actual); }
  {
    return inner_.accounted_bytes(tree, n, act, actual);
  }

  // What the cache asks of some scorers (the fit check, the adaptive selector's shadows).
  static constexpr bool evicts_inner_nodes = inner_node_evicting_scorer<Inner>;
  [[nodiscard]] bool takes_inner_nodes() const noexcept
    requires inner_node_reporting_scorer<Inner>
  {
    return inner_.takes_inner_nodes();
  }
  [[nodiscard]] bool protects_branches() const noexcept
    requires branch_protecting_scorer<Inner>
  {
    return inner_.protects_branches();
  }
  template <class Store>
  void attach_store(const Store& store, const prefix_cache_config& cfg)
    requires store_aware_scorer<Inner, Store, prefix_cache_config>
  {
    inner_.attach_store(store, cfg);
  }
  void observe_request(std::span<const token_id> seq, std::int64_t n, const cache_salt& salt)
    requires request_observer<Inner>
  {
    inner_.observe_request(seq, n, salt);
  }
  void observe_request(std::span<const token_id> seq, std::int64_t n, const cache_salt& salt, std::int64_t live_reused)
    requires live_hit_observer<Inner>
  {
    inner_.observe_request(seq, n, salt, live_reused);
  }

  [[nodiscard]] const scorer_report& report() const noexcept { return report_; }
  [[nodiscard]] const Inner& inner() const noexcept { return inner_; }

 private:
  Inner inner_;
  mutable scorer_report report_;
};

static_assert(utility_scorer<checked_scorer<lru_scorer>, radix_tree<counting_store>>);

cost_model small_model() { return cost_model(presets::marconi_7b()); }

// --- fixtures: how each model is built ---------------------------------------------------

struct lru_fixture {
  using scorer_type = lru_scorer;
  static scorer_type make(const cost_model&, std::mt19937_64&) { return lru_scorer{}; }
};
struct lru_heapq_fixture {  // the reference's per-round heapify order
  using scorer_type = lru_scorer;
  static scorer_type make(const cost_model&, std::mt19937_64&) {
    return lru_scorer(lru_config{.ties = lru_ties::python_heapq});
  }
};
template <intermediate_eviction Mode>
struct flop_fixture {
  using scorer_type = flop_aware_scorer;
  static scorer_type make(const cost_model& m, std::mt19937_64& rng) {
    return flop_aware_scorer(m, {.alpha = static_cast<double>(rng() % 21) / 10.0, .intermediate = Mode});
  }
};
template <intermediate_eviction Mode>
struct gdsf_fixture {
  using scorer_type = gdsf_scorer;
  static scorer_type make(const cost_model& m, std::mt19937_64& rng) {
    return gdsf_scorer(m, {.intermediate = Mode,
                           .candidates = rng() % 2 == 0 ? flop_candidates::paper : flop_candidates::protect_branches});
  }
};
template <intermediate_eviction Mode>
struct reference_fixture {
  using scorer_type = sim::reference_flop_scorer;
  static scorer_type make(const cost_model& m, std::mt19937_64& rng) {
    return sim::reference_flop_scorer(m, {.alpha = static_cast<double>(rng() % 21) / 10.0, .intermediate = Mode});
  }
};

struct switching_fixture {  // the three library rules over one index, any of them followed
  using scorer_type = lru_flop_gdsf_scorer;
  static scorer_type make(const cost_model& m, std::mt19937_64& rng) {
    return lru_flop_gdsf_scorer(lru_scorer{}, flop_aware_scorer(m, {.alpha = static_cast<double>(rng() % 21) / 10.0}),
                                gdsf_scorer(m), static_cast<std::size_t>(rng() % 3));
  }
};
struct switching_every_part_fixture {  // the same, every part's index current on every hook
  using scorer_type = lru_flop_gdsf_scorer;
  static scorer_type make(const cost_model& m, std::mt19937_64& rng) {
    return lru_flop_gdsf_scorer(lru_scorer{}, flop_aware_scorer(m, {.alpha = static_cast<double>(rng() % 21) / 10.0}),
                                gdsf_scorer(m), static_cast<std::size_t>(rng() % 3), index_upkeep::every_part);
  }
};
struct adaptive_fixture {  // switching at almost every request (no hysteresis, short memory)
  using scorer_type = marconi_adaptive_scorer;
  static scorer_type make(const cost_model& m, std::mt19937_64&) {
    return make_marconi_adaptive_scorer(m, {.decay = 0.8, .switch_margin = 0.0, .confidence = 0.0});
  }
};

struct car_fixture {  // CaR's score (tiered/car_score.hpp): requests in flight credit random node ids
  using scorer_type = tiered::car_scorer;
  static scorer_type make(const cost_model&, std::mt19937_64& rng) {
    static std::deque<tiered::car_score_board> boards;  // each outlives its cache (the test's)
    auto& b = boards.emplace_back();
    b.reserve(4096);
    for (std::uint64_t r = 0; r < 64; ++r) {  // some never complete: their nodes keep a score
      const std::vector<node_id> path{static_cast<node_id>(1 + rng() % 600), static_cast<node_id>(1 + rng() % 600)};
      b.enter_window(r, path);
      if (r % 2 == 0) b.dispatch(r, path);
      if (r % 3 == 0) b.complete(r);
    }
    return tiered::car_scorer(b);
  }
};

/// A sequence that shares a random prefix with one seen before (or none) and continues
/// with fresh random tokens from a small vocabulary, so requests branch inside edges.
/// At most `max_len` tokens, so one request always fits the store.
seq_t branching_seq(std::mt19937_64& rng, const std::vector<seq_t>& seen, std::size_t max_len) {
  seq_t s;
  if (!seen.empty() && rng() % 4 != 0) {
    const seq_t& base = seen[rng() % seen.size()];
    s.assign(base.begin(), base.begin() + static_cast<std::ptrdiff_t>(rng() % std::min(base.size() + 1, max_len)));
  }
  const std::size_t extra = 1 + rng() % (max_len - s.size());
  for (std::size_t i = 0; i < extra; ++i) s.push_back(static_cast<token_id>(1 + rng() % 3));
  return s;
}

template <class Cache>
void check_held_matches(const Cache& c, const std::vector<match_result>& held) {
  const auto& t = c.tree();
  for (const match_result& m : held) {
    if (m.node == no_node) continue;
    REQUIRE(t.live(m.node));
    CHECK(t.at(m.node).pins > 0);
    CHECK(t.at(m.node).end == m.reusable_tokens);
    CHECK(t.at(m.node).has_checkpoint);  // still usable: its state was not dropped
  }
}

void require_no_violation(const scorer_report& rep) {
  REQUIRE(rep.root == 0);
  REQUIRE(rep.dead == 0);
  REQUIRE(rep.pinned == 0);
  REQUIRE(rep.bad_remove == 0);
  REQUIRE(rep.bad_merge == 0);
  REQUIRE(rep.bad_drop == 0);
}

/// Leaves that are not pinned (what eviction must have taken when it has no victim).
template <class Tree>
std::int64_t unpinned_leaves(const Tree& t) {
  std::int64_t n = 0;
  t.preorder([&](node_id x) { n += t.at(x).children == 0 && t.at(x).pins == 0 ? 1 : 0; });
  return n;
}

/// Runs random streams through prefix_cache<..., checked_scorer<scorer>> and checks the
/// laws. Returns the victims checked.
template <class Fixture, class Admission>
std::int64_t run_streams(std::uint64_t seeds) {
  using scorer_t = checked_scorer<typename Fixture::scorer_type>;
  using cache_t = prefix_cache<cost_model, Admission, scorer_t, counting_store>;
  const cost_model m = small_model();
  const std::int64_t ck = m.ssm_checkpoint_bytes(), kv = m.kv_bytes_per_token();
  std::int64_t victims = 0;
  for (std::uint64_t seed = 1; seed <= seeds; ++seed) {
    CAPTURE(seed);
    std::mt19937_64 rng(seed * 6364136223846793005ULL + 1);
    // Room for a few requests of at most 48 tokens (6 checkpoints with every_block<8>), so
    // the streams evict all the time. Held matches pin their ancestors' state too (LRU never
    // takes an inner node), so a commit may be refused while two are held.
    const std::int64_t cap = 14 * ck + 200 * kv;
    cache_t c(m, counting_store(cap, kv, ck), scorer_t(Fixture::make(m, rng)), Admission{},
              prefix_cache_config{.admit_oversized = true});
    const double a = c.scorer().alpha();
    CHECK(std::isfinite(a));
    CHECK(a >= 0.0);
    std::vector<seq_t> seen;
    std::vector<match_result> held;  // matches kept across other requests (their nodes stay pinned)
    std::vector<seq_t> held_seq;
    for (int op = 0; op < 60; ++op) {
      const seq_t s = branching_seq(rng, seen, 48);
      const auto in = static_cast<std::int64_t>(1 + rng() % s.size());
      const seq_t input(s.begin(), s.begin() + in);
      auto r = c.match(input);
      REQUIRE(r);
      if (r->node != no_node && held.size() < 2 && rng() % 3 == 0) {
        held.push_back(*r);
        held_seq.push_back(s);
      } else {
        auto cr = c.commit(s, in, &*r);
        if (held.empty()) CHECK(cr);  // nothing pinned: eviction can always make room
        else CHECK((cr || cr.error() == errc::out_of_capacity));
      }
      seen.push_back(s);
      // Finish a held request now and then: commit it (hands its pin over) or drop it.
      if (!held.empty() && rng() % 4 == 0) {
        const std::size_t i = static_cast<std::size_t>(rng() % held.size());
        if (rng() % 2 == 0) {
          auto cr = c.commit(held_seq[i], held[i].input_tokens, &held[i]);
          CHECK((cr || cr.error() == errc::out_of_capacity));
          if (!cr) (void)c.release(held[i]);  // whether a refused commit already unpinned is not the point here
        } else {
          CHECK(c.release(held[i]));
        }
        held.erase(held.begin() + static_cast<std::ptrdiff_t>(i));
        held_seq.erase(held_seq.begin() + static_cast<std::ptrdiff_t>(i));
      }
      CAPTURE(op);
      require_no_violation(c.scorer().report());  // first: it names the broken answer
      CHECK(c.store().used_bytes() <= cap);
      check_held_matches(c, held);
      // Now and then evict everything the scorer will give up: a commit larger than the
      // whole store (admit_oversized) evicts until select_victim has nothing, then fails.
      if (op % 15 == 14) {
        seq_t huge(static_cast<std::size_t>(cap / kv + 1));
        for (std::size_t i = 0; i < huge.size(); ++i) huge[i] = static_cast<token_id>(100 + i);
        const std::int64_t no_victim_before = c.scorer().report().no_victim;
        auto cr = c.commit(huge, static_cast<std::int64_t>(huge.size()));
        REQUIRE_FALSE(cr);
        CHECK(cr.error() == errc::out_of_capacity);
        CHECK(c.scorer().report().no_victim > no_victim_before);  // it did run dry
        require_no_violation(c.scorer().report());
        CHECK(unpinned_leaves(c.tree()) == 0);
        if (held.empty()) {
          CHECK(c.tree().size() == 0);
          CHECK(c.store().used_bytes() == 0);
        }
        check_held_matches(c, held);
      }
    }
    for (const match_result& h : held) CHECK(c.release(h));
    victims += c.scorer().report().victims;
  }
  return victims;
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("utility_scorer conformance", F, utility_scorer_conformance) {
  static_assert(utility_scorer<typename F::scorer_type, radix_tree<counting_store>>);
  // Called outside CHECK so that a failed REQUIRE inside reports itself, not an exception.
  SUBCASE("judicious admission: few checkpoints, long KV-only edges") {
    const std::int64_t victims = run_streams<F, judicious_admission>(40);
    CHECK(victims > 1000);  // the streams really evicted
  }
  SUBCASE("a checkpoint every 8 tokens: chains of single-child nodes with states") {
    const std::int64_t victims = run_streams<F, every_block_admission<8>>(40);
    CHECK(victims > 1000);
  }
}

TEST_CASE_TEMPLATE_INVOKE(utility_scorer_conformance, lru_fixture, lru_heapq_fixture,
                          flop_fixture<intermediate_eviction::merge>, flop_fixture<intermediate_eviction::tombstone>,
                          gdsf_fixture<intermediate_eviction::merge>, gdsf_fixture<intermediate_eviction::tombstone>,
                          reference_fixture<intermediate_eviction::merge>,
                          reference_fixture<intermediate_eviction::tombstone>, switching_fixture,
                          switching_every_part_fixture, adaptive_fixture,
                          car_fixture);

static_assert(switchable_scorer<lru_flop_gdsf_scorer, radix_tree<counting_store>>);
static_assert(request_observer<marconi_adaptive_scorer> && replicable_scorer<lru_scorer> &&
              replicable_scorer<flop_aware_scorer> && replicable_scorer<gdsf_scorer>);
// Index upkeep: LRU and FLOP-aware rebuild their index; GDSF's clock needs its index current.
static_assert(rebuildable_scorer<lru_scorer, radix_tree<counting_store>> &&
              rebuildable_scorer<flop_aware_scorer, radix_tree<counting_store>> &&
              !rebuildable_scorer<gdsf_scorer, radix_tree<counting_store>>);

// --- negative cases ------------------------------------------------------------------------

namespace {

using tree_t = radix_tree<counting_store>;

struct full_scorer {
  template <class Tree>
  void on_match(Tree&, std::span<const node_id>, node_id, time_point) noexcept {}
  template <class Tree>
  void on_insert_path(Tree&, std::span<const node_id>, time_point) noexcept {}
  template <class Tree>
  void on_update(const Tree&, node_id) noexcept {}
  template <class Tree>
  void on_erase(const Tree&, node_id) noexcept {}
  template <class Tree>
  node_id select_victim(const Tree&, time_point) noexcept { return no_node; }
  template <class Tree>
  evict_action action(const Tree&, node_id) const noexcept { return evict_action::remove_leaf; }
  double alpha() const noexcept { return 0.0; }
};

struct no_alpha {
  template <class Tree>
  void on_match(Tree&, std::span<const node_id>, node_id, time_point) noexcept {}
  template <class Tree>
  void on_insert_path(Tree&, std::span<const node_id>, time_point) noexcept {}
  template <class Tree>
  void on_update(const Tree&, node_id) noexcept {}
  template <class Tree>
  void on_erase(const Tree&, node_id) noexcept {}
  template <class Tree>
  node_id select_victim(const Tree&, time_point) noexcept { return no_node; }
  template <class Tree>
  evict_action action(const Tree&, node_id) const noexcept { return evict_action::remove_leaf; }
};

// Eviction runs inside noexcept commit paths: a throwing select_victim is refused.
struct throwing_select : full_scorer {
  template <class Tree>
  node_id select_victim(const Tree&, time_point) { return no_node; }
};

// action is asked through a const scorer.
struct mutable_action : full_scorer {
  template <class Tree>
  evict_action action(const Tree&, node_id) noexcept { return evict_action::remove_leaf; }
};

// The victim must be a node id, not e.g. a bool "found".
struct victim_is_bool : full_scorer {
  template <class Tree>
  bool select_victim(const Tree&, time_point) noexcept { return false; }
};

// on_update must accept the const tree the cache hands it.
struct update_needs_mutable_tree : full_scorer {
  void on_update(tree_t&, node_id) noexcept {}
};

}  // namespace

static_assert(utility_scorer<full_scorer, tree_t>, "the reference shape must model the concept");
static_assert(!utility_scorer<no_alpha, tree_t>);
static_assert(!utility_scorer<throwing_select, tree_t>);
static_assert(!utility_scorer<mutable_action, tree_t>);
static_assert(!utility_scorer<victim_is_bool, tree_t>);
static_assert(!utility_scorer<update_needs_mutable_tree, tree_t>);

// switchable_scorer: the three calls, noexcept, with their result types.
struct switchable_shape : full_scorer {
  [[nodiscard]] std::size_t rules() const noexcept { return 2; }
  [[nodiscard]] std::size_t active_rule() const noexcept { return 0; }
  bool switch_to(std::size_t, double) noexcept { return true; }
};
struct switch_may_throw : full_scorer {
  [[nodiscard]] std::size_t rules() const noexcept { return 2; }
  [[nodiscard]] std::size_t active_rule() const noexcept { return 0; }
  bool switch_to(std::size_t, double) { return true; }
};
struct switch_returns_void : full_scorer {
  [[nodiscard]] std::size_t rules() const noexcept { return 2; }
  [[nodiscard]] std::size_t active_rule() const noexcept { return 0; }
  void switch_to(std::size_t, double) noexcept {}
};
static_assert(switchable_scorer<switchable_shape, tree_t>);
static_assert(!switchable_scorer<full_scorer, tree_t>);
static_assert(!switchable_scorer<switch_may_throw, tree_t>);
static_assert(!switchable_scorer<switch_returns_void, tree_t>);
static_assert(!request_observer<full_scorer>);
// A live_hit_observer takes the live cache's hit too, and is a request_observer first.
struct observer_shape : full_scorer {
  void observe_request(std::span<const token_id>, std::int64_t, const cache_salt&) {}
};
struct hit_observer_shape : observer_shape {
  using observer_shape::observe_request;
  void observe_request(std::span<const token_id>, std::int64_t, const cache_salt&, std::int64_t) {}
};
struct hit_only_shape : full_scorer {
  void observe_request(std::span<const token_id>, std::int64_t, const cache_salt&, std::int64_t) {}
};
static_assert(request_observer<observer_shape> && !live_hit_observer<observer_shape>);
static_assert(live_hit_observer<hit_observer_shape>);
static_assert(!live_hit_observer<hit_only_shape> && !live_hit_observer<full_scorer>);
static_assert(live_hit_observer<marconi_adaptive_scorer> && live_hit_observer<checked_scorer<marconi_adaptive_scorer>>);
static_assert(!replicable_scorer<full_scorer>);

// The optional capabilities: the bare shape has none; each is one member away, and the
// hooks the cache calls from noexcept code must be noexcept.
static_assert(!inner_node_evicting_scorer<full_scorer> && !inner_node_reporting_scorer<full_scorer> &&
              !branch_protecting_scorer<full_scorer> && !alpha_settable_scorer<full_scorer> &&
              !reservable_scorer<full_scorer> && !store_aware_scorer<full_scorer, counting_store, prefix_cache_config> &&
              !refusal_observer<full_scorer> && !victim_observer<full_scorer, tree_t> &&
              !byte_accounting_scorer<full_scorer, tree_t> && !rebuildable_scorer<full_scorer, tree_t>);
struct capable_shape : full_scorer {
  static constexpr bool evicts_inner_nodes = true;
  [[nodiscard]] bool takes_inner_nodes() const noexcept { return true; }
  [[nodiscard]] bool protects_branches() const noexcept { return true; }
  void set_alpha(double) {}
  void reserve(std::size_t) {}
  template <class Store, class Config>
  void attach_store(const Store&, const Config&) {}
  void observe_refused(std::span<const token_id>, std::int64_t, const cache_salt&) {}
  template <class View>
  void observe_victim(const View&, node_id) noexcept {}
  template <class Tree>
  [[nodiscard]] std::int64_t accounted_bytes(const Tree&, node_id, evict_action, std::int64_t actual) {
    return actual;
  }
  void suspend_index() noexcept {}
  template <class Tree>
  void resume_index(const Tree&) noexcept {}
};
static_assert(inner_node_evicting_scorer<capable_shape> && inner_node_reporting_scorer<capable_shape> &&
              branch_protecting_scorer<capable_shape> && alpha_settable_scorer<capable_shape> &&
              reservable_scorer<capable_shape> && store_aware_scorer<capable_shape, counting_store, prefix_cache_config> &&
              refusal_observer<capable_shape> && victim_observer<capable_shape, tree_t> &&
              byte_accounting_scorer<capable_shape, tree_t> && rebuildable_scorer<capable_shape, tree_t>);
struct resume_may_throw : full_scorer {  // a rebuild runs inside the noexcept hooks
  void suspend_index() noexcept {}
  template <class Tree>
  void resume_index(const Tree&) {}
};
static_assert(!rebuildable_scorer<resume_may_throw, tree_t>);
struct says_no_inner_nodes : full_scorer {
  static constexpr bool evicts_inner_nodes = false;
};
struct reports_may_throw : full_scorer {
  [[nodiscard]] bool takes_inner_nodes() const { return true; }
  [[nodiscard]] bool protects_branches() const { return true; }
};
static_assert(!inner_node_evicting_scorer<says_no_inner_nodes>);
static_assert(!inner_node_reporting_scorer<reports_may_throw> && !branch_protecting_scorer<reports_may_throw>);
// The library's scorers, where each capability is used.
static_assert(byte_accounting_scorer<hybridcache::sim::reference_flop_scorer, radix_tree<counting_store>>);
static_assert(victim_observer<gdsf_scorer, radix_tree<counting_store>> && !victim_observer<lru_scorer, radix_tree<counting_store>>);
