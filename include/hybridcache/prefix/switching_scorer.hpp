// hybridcache/prefix/switching_scorer.hpp
//
// `switching_scorer<Scorers...>`: several eviction rules kept over one live tree, one of
// them followed at a time. The adaptive selector (compose/adaptive_scorer.hpp) makes the
// live cache follow whichever rule its shadows rank first; this class is the live half of
// it, and is usable on its own by a runtime that wants to choose the rule itself
// (`switch_to`).
//
// Every part is a complete `utility_scorer` and sees every call the cache makes. Parts
// refresh different nodes on a hit (SGLang+'s LRU the whole matched path, Marconi's
// FLOP-aware rule and GDSF only the deepest node whose checkpoint is used), so each part
// reads and writes last-access times of its own: the part is handed a `detail::stamp_view`
// of the tree instead of the tree, whose `touch` and `last_access` go to the part's own
// table (a node a part never stamped reads the tree's time, which is its creation time; a
// merge keeps the later time, as radix_tree::merge_into_child does). The tree's own times
// are left as created.
//
// Index upkeep (`index_upkeep`):
// - `followed` (the default): only the followed part keeps its eviction index current. A
//   part that can rebuild its index (`rebuildable_scorer`: lru_scorer, flop_aware_scorer)
//   is suspended while another part is followed: it still sees every hook but only stamps
//   its own times, and its index is rebuilt from the tree at the first hook after a switch
//   makes it the followed part again. Its victims are then exactly those of an index kept
//   current throughout (its index is a function of the candidates and the times its stamps
//   kept; tests/prefix/test_adaptive.cpp compares both modes on random streams with
//   switches, victim for victim). A part that cannot (gdsf_scorer: its clock L advances on
//   other parts' victims to its lowest priority, which needs its index) stays current.
// - `every_part`: every part keeps its index current on every hook; a switch rebuilds
//   nothing.
//
// - select_victim / action / alpha / protects_branches: the followed part's answer. The
//   other parts are told the victim (`observe_victim`, for parts that keep a clock of
//   their own: GDSF's inflation value).
// - evicts_inner_nodes: a runtime property here (`takes_inner_nodes()`): the followed part's.
// - switch_to(rule, alpha): follow part `rule` from the next eviction on; a part with
//   `set_alpha` takes `alpha` (flop_aware_scorer: any alpha, the indexes do not depend on it).
//
// Costs, worst case, n = live nodes, N = node ids the tree has used (id_bound):
// - a hook (on_match, on_insert_path, on_update, on_erase), `followed` upkeep: the followed
//   part's cost (O(log n) per node it touches for the library's scorers), plus for each
//   suspended part only its stamps (on_match O(|path|), on_insert_path O(|path|) for LRU,
//   on_update / on_erase O(1)), plus the full cost of each part that is not rebuildable
//   (GDSF: O(log n)), plus O(1) per part for the stamp tables. `every_part`: the sum of all
//   parts' costs.
// - select_victim: the followed part's (LRU O(1); FLOP-aware O(walk_limit log n + C);
//   GDSF O(1)) plus O(1) per other part (observe_victim).
// - switch_to: O(1). The first hook after it pays the switch, `followed` upkeep only: the
//   newly followed part's resume_index, O(N + n log n) (LRU n heap pushes, FLOP-aware 2-3
//   set inserts per candidate), and O(1) to suspend the part left. Switching back before any
//   hook rebuilds nothing. `index_rebuilds()` counts the rebuilds.
// Memory: the parts' own (a suspended part keeps its stale index until its rebuild) plus 9
// bytes per node id per part. Allocation only in reserve() (and index nodes drawn from a
// part's pool, as in its own hooks). Not thread-safe (the cache's lock serialises calls).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "hybridcache/concepts/state_store.hpp"
#include "hybridcache/concepts/utility_scorer.hpp"
#include "hybridcache/core/error.hpp"
#include "hybridcache/prefix/detail/memory_bytes.hpp"
#include "hybridcache/prefix/flop_aware_scorer.hpp"
#include "hybridcache/prefix/gdsf_scorer.hpp"
#include "hybridcache/prefix/lru_scorer.hpp"
#include "hybridcache/prefix/radix_tree.hpp"
#include "hybridcache/prefix/types.hpp"

namespace hybridcache::prefix {

namespace detail {

/// Last-access times of one part of a composite scorer, kept apart from the tree's.
class stamp_table {
 public:
  void reserve(std::size_t ids) {
    if (time_.size() < ids) grow_all(ids, time_, set_);
  }
  [[nodiscard]] std::int64_t memory_bytes() const noexcept { return heap_bytes(time_) + heap_bytes(set_); }
  /// The part's time of `n`: its own stamp, else the tree's (the node's creation time).
  template <class Tree>
  [[nodiscard]] time_point get(const Tree& tree, node_id n) const noexcept {
    return n < set_.size() && set_[n] != 0 ? time_[n] : tree.last_access(n);
  }
  /// Precondition: reserve() covered n (the cache reserves before it creates nodes).
  void set(node_id n, time_point t) noexcept {
    time_[n] = t;
    set_[n] = 1;
  }
  /// `n` is about to be freed. A node with one child is being merged into it: the child
  /// keeps the later of the two times (radix_tree::merge_into_child's rule).
  template <class Tree>
  void forget(const Tree& tree, node_id n) noexcept {
    const auto& nd = tree.at(n);
    if (nd.children == 1) set(nd.first_child, std::max(get(tree, nd.first_child), get(tree, n)));
    if (n < set_.size()) set_[n] = 0;
  }

 private:
  std::vector<time_point> time_;
  std::vector<unsigned char> set_;
};

/// The tree as one part of a composite scorer sees it: every read goes to the tree, except
/// last-access times, which `touch` writes to and `last_access` reads from the part's own
/// table. Holds pointers; cheap to make per call.
template <class Tree>
class stamp_view {
 public:
  using node = typename Tree::node;
  stamp_view(const Tree& tree, stamp_table& stamps) noexcept : tree_(&tree), stamps_(&stamps) {}

  [[nodiscard]] static constexpr node_id root() noexcept { return Tree::root(); }
  [[nodiscard]] const node& at(node_id n) const noexcept { return tree_->at(n); }
  [[nodiscard]] bool live(node_id n) const noexcept { return tree_->live(n); }
  [[nodiscard]] std::size_t size() const noexcept { return tree_->size(); }
  [[nodiscard]] std::size_t id_bound() const noexcept { return tree_->id_bound(); }
  [[nodiscard]] time_point last_access(node_id n) const noexcept { return stamps_->get(*tree_, n); }
  void touch(node_id n, time_point now) const noexcept { stamps_->set(n, now); }
  [[nodiscard]] bool dfs_before(node_id a, node_id b) const noexcept { return tree_->dfs_before(a, b); }
  [[nodiscard]] std::size_t depth(node_id n) const noexcept { return tree_->depth(n); }
  template <class F>
  void preorder(F&& f) const {
    tree_->preorder(std::forward<F>(f));
  }

 private:
  const Tree* tree_;
  stamp_table* stamps_;
};

}  // namespace detail

/// Which parts of a `switching_scorer` keep their eviction index current (see its file
/// comment).
enum class index_upkeep : unsigned char {
  followed,    ///< the followed part only; a rebuildable part rebuilds its index when followed again
  every_part,  ///< every part on every hook; a switch rebuilds nothing
};

/// Several eviction rules over one live tree, one followed at a time. See the file comment.
template <class... Scorers>
  requires(sizeof...(Scorers) >= 1)
class switching_scorer {
  static constexpr std::size_t parts_count = sizeof...(Scorers);

 public:
  using parts_type = std::tuple<Scorers...>;

  /// Follows part `initial` (0 by default) with the given upkeep. @throws invalid_argument
  /// for a part out of range.
  explicit switching_scorer(Scorers... parts, std::size_t initial = 0, index_upkeep upkeep = index_upkeep::followed)
      : parts_(std::move(parts)...), upkeep_(upkeep) {
    HYBRIDCACHE_EXPECTS(initial < parts_count, invalid_argument, "switching_scorer: initial rule out of range");
    active_ = initial;
    settle_pending_ = upkeep_ == index_upkeep::followed;  // the first hook suspends the other parts
  }
  switching_scorer(switching_scorer&&) noexcept = default;
  switching_scorer& operator=(switching_scorer&&) = delete;

  // --- switchable_scorer -----------------------------------------------------------------

  [[nodiscard]] std::size_t rules() const noexcept { return parts_count; }
  [[nodiscard]] std::size_t active_rule() const noexcept { return active_; }
  [[nodiscard]] index_upkeep upkeep() const noexcept { return upkeep_; }
  /// Follow part `rule` from the next eviction on, at FLOP weight `alpha` when the part has
  /// one (ignored otherwise). False, nothing changed, for a rule out of range or an alpha
  /// that is negative or not finite. O(1); with `index_upkeep::followed` the next hook
  /// rebuilds the part's index if it was suspended (see the file comment).
  bool switch_to(std::size_t rule, double alpha) noexcept {
    if (rule >= parts_count || !(std::isfinite(alpha) && alpha >= 0.0)) return false;
    visit(rule, [&](auto& part, detail::stamp_table&) noexcept {
      if constexpr (alpha_settable_scorer<std::remove_cvref_t<decltype(part)>>) part.set_alpha(alpha);  // cannot throw: checked
    });
    if (rule != active_ && upkeep_ == index_upkeep::followed) settle_pending_ = true;
    active_ = rule;
    return true;
  }
  /// Indexes rebuilt so far (a suspended part followed again; `index_upkeep::followed`).
  [[nodiscard]] std::uint64_t index_rebuilds() const noexcept { return rebuilds_; }
  /// True while part `rule` is suspended (its index not kept current).
  [[nodiscard]] bool suspended(std::size_t rule) const noexcept { return rule < parts_count && suspended_[rule]; }
  /// Part `I` (its options, counters).
  template <std::size_t I>
  [[nodiscard]] const auto& part() const noexcept {
    return std::get<I>(parts_);
  }
  template <std::size_t I>
  [[nodiscard]] auto& part() noexcept {
    return std::get<I>(parts_);
  }

  /// Heap bytes of every part's index (suspended ones keep theirs) and the stamp tables. O(1).
  [[nodiscard]] std::int64_t memory_bytes() const noexcept {
    std::int64_t b = 0;
    for (const auto& s : stamps_) b += s.memory_bytes();
    std::apply([&](const auto&... p) { ((b += part_memory(p)), ...); }, parts_);
    return b;
  }

  // --- utility_scorer ---------------------------------------------------------------------

  void reserve(std::size_t ids) {
    for (auto& s : stamps_) s.reserve(ids);
    std::apply([&](auto&... p) { (reserve_part(p, ids), ...); }, parts_);
  }

  template <class Tree>
  void on_match(Tree& tree, std::span<const node_id> path, node_id partial, time_point now) noexcept {
    settle(tree);
    each(tree, [&](auto& part, const auto& view) noexcept { part.on_match(view, path, partial, now); });
  }
  template <class Tree>
  void on_insert_path(Tree& tree, std::span<const node_id> path, time_point now) noexcept {
    settle(tree);
    each(tree, [&](auto& part, const auto& view) noexcept { part.on_insert_path(view, path, now); });
  }
  template <class Tree>
  void on_update(const Tree& tree, node_id n) noexcept {
    settle(tree);
    each(tree, [&](auto& part, const auto& view) noexcept { part.on_update(view, n); });
  }
  template <class Tree>
  void on_erase(const Tree& tree, node_id n) noexcept {
    settle(tree);
    std::size_t i = 0;
    std::apply(
        [&](auto&... p) {
          ((p.on_erase(detail::stamp_view<Tree>(tree, stamps_[i]), n), stamps_[i].forget(tree, n), ++i), ...);
        },
        parts_);
  }
  template <class Tree>
  [[nodiscard]] node_id select_victim(const Tree& tree, time_point now) noexcept {
    settle(tree);
    node_id v = no_node;
    visit(active_, [&](auto& part, detail::stamp_table& st) noexcept {
      v = part.select_victim(detail::stamp_view<Tree>(tree, st), now);
    });
    if (v == no_node) return v;
    std::size_t i = 0;
    std::apply(
        [&](auto&... p) {
          ((i != active_ ? tell_victim(p, detail::stamp_view<Tree>(tree, stamps_[i]), v) : void(), ++i), ...);
        },
        parts_);
    return v;
  }
  template <class Tree>
  [[nodiscard]] evict_action action(const Tree& tree, node_id n) const noexcept {
    evict_action a = evict_action::remove_leaf;
    visit(active_, [&](const auto& part, detail::stamp_table& st) noexcept {
      a = part.action(detail::stamp_view<Tree>(tree, st), n);
    });
    return a;
  }
  [[nodiscard]] double alpha() const noexcept {
    double a = 0.0;
    visit(active_, [&](const auto& part, detail::stamp_table&) noexcept { a = static_cast<double>(part.alpha()); });
    return a;
  }

  /// True when the followed part takes single-child nodes (the cache's fit check).
  [[nodiscard]] bool takes_inner_nodes() const noexcept {
    bool inner = false;
    visit(active_, [&](const auto& part, detail::stamp_table&) noexcept {
      inner = inner_node_evicting_scorer<std::remove_cvref_t<decltype(part)>>;
    });
    return inner;
  }
  /// True when the followed part protects branch points (the cache's fit check).
  [[nodiscard]] bool protects_branches() const noexcept {
    bool b = false;
    visit(active_, [&](const auto& part, detail::stamp_table&) noexcept {
      if constexpr (branch_protecting_scorer<std::remove_cvref_t<decltype(part)>>) b = part.protects_branches();
    });
    return b;
  }

 private:
  template <class P>
  static void reserve_part(P& p, std::size_t ids) {
    if constexpr (reservable_scorer<P>) p.reserve(ids);
  }
  template <class P, class View>
  static void tell_victim(P& p, const View& view, node_id v) noexcept {
    if constexpr (victim_observer<P, View>) p.observe_victim(view, v);
  }
  /// After a switch (or before the first hook), `followed` upkeep: suspends the rebuildable
  /// parts not followed and rebuilds the followed one's index if it was suspended. O(1)
  /// when nothing is pending.
  template <class Tree>
  void settle(const Tree& tree) noexcept {
    if (!settle_pending_) return;
    settle_pending_ = false;
    std::size_t i = 0;
    std::apply(
        [&](auto&... p) {
          ((settle_part(p, detail::stamp_view<Tree>(tree, stamps_[i]), i), ++i), ...);
        },
        parts_);
  }
  template <class P, class View>
  void settle_part(P& p, const View& view, std::size_t i) noexcept {
    if constexpr (rebuildable_scorer<P, View>) {
      if (i != active_ && !suspended_[i]) {
        p.suspend_index();
        suspended_[i] = true;
      } else if (i == active_ && suspended_[i]) {
        p.resume_index(view);
        suspended_[i] = false;
        ++rebuilds_;
      }
    }
  }
  /// Calls f(part, view) for every part, each with its own stamp view.
  template <class Tree, class F>
  void each(const Tree& tree, F&& f) noexcept {
    std::size_t i = 0;
    std::apply(
        [&](auto&... p) {
          ((f(p, detail::stamp_view<Tree>(tree, stamps_[i])), ++i), ...);
        },
        parts_);
  }
  /// Calls f(part, stamps) for part `rule` (a runtime index into the tuple).
  template <class F>
  void visit(std::size_t rule, F&& f) noexcept {
    visit_in(*this, rule, f);
  }
  template <class F>
  void visit(std::size_t rule, F&& f) const noexcept {
    visit_in(*this, rule, f);
  }
  template <class Self, class F>
  static void visit_in(Self& self, std::size_t rule, F& f) noexcept {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((rule == I ? f(std::get<I>(self.parts_), self.stamps_[I]) : void()), ...);
    }(std::make_index_sequence<parts_count>{});
  }

  template <class P>
  [[nodiscard]] static std::int64_t part_memory(const P& p) noexcept {
    if constexpr (memory_reporting_scorer<P>) return p.memory_bytes();
    else return 0;
  }

  std::tuple<Scorers...> parts_;
  mutable std::array<detail::stamp_table, parts_count> stamps_{};  // const calls read through views
  std::size_t active_ = 0;
  index_upkeep upkeep_ = index_upkeep::followed;
  bool settle_pending_ = false;                // a switch (or the start) not yet settled at a hook
  std::array<bool, parts_count> suspended_{};  // part i's index suspended (rebuildable parts only)
  std::uint64_t rebuilds_ = 0;
};

/// The library's rule set: SGLang+'s leaf LRU, Marconi's FLOP-aware rule (any alpha), GDSF.
using lru_flop_gdsf_scorer = switching_scorer<lru_scorer, flop_aware_scorer, gdsf_scorer>;

static_assert(switchable_scorer<lru_flop_gdsf_scorer, radix_tree<state_store_archetype>>);
static_assert(inner_node_reporting_scorer<lru_flop_gdsf_scorer> && branch_protecting_scorer<lru_flop_gdsf_scorer> &&
              reservable_scorer<lru_flop_gdsf_scorer>);

}  // namespace hybridcache::prefix
