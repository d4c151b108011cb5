// hybridcache/prefix/flop_aware_scorer.hpp
//
// `flop_aware_scorer`: Marconi's FLOP-aware eviction (paper §4.3; anchors/marconi.md 1(c)).
//
// - Candidates: unpinned non-root nodes with no child, or with one child and a checkpoint
//   (a single-child node without a checkpoint frees nothing when merged). With
//   `flop_candidates::protect_branches` (the library's Marconi composition) a single-child
//   node that has been a branch point (two children or more: a shared prefix, e.g. a system
//   prompt, split by a later request) is not a candidate while it has a child: only the
//   deepest matched node is refreshed on a hit, so such a node ages on its own timestamp
//   while the conversations below it are hot, and merging it loses the shared prefix for
//   every later session (docs/prefix-cache.md, "The branch-protecting rule, measured"). A
//   single-child node that never branched (a previous turn's end, extended by the next
//   turn) stays a candidate, as in the paper.
// - Utility U(n) = alpha·eff'(n) + rec'(n), each term min-max normalised over the current
//   candidates (x' = (x - min)/(max - min); all 1 when there is one candidate or all values
//   are equal), computed in that order without FMA contraction so results equal the
//   reference's Python floats. rec(n) = 1/(now - last_access(n)).
//   eff(n) = cost_model::saved_flops(p, L) / (checkpoint bytes + KV bytes of the node's own
//   L - p tokens): the correct marginal FLOPs and the node's own bytes, not the reference's
//   defects (MLP term subtracting attention FLOPs; KV of the whole root-to-node prefix).
// - Victim: the first argmin of U in DFS preorder (children in insertion order).
// - Refresh: a hit stamps only the deepest matched node that holds a checkpoint; a commit
//   stamps nothing but the nodes it creates.
// - Action: a leaf is deleted; a single-child node drops its checkpoint and merges its KV
//   into its child (or, with `intermediate_eviction::tombstone`, keeps its KV as a
//   KV-only node, as SGLang does).
//
// Eviction without rescanning every node. The reference recomputes every candidate's
// score for every single eviction (O(n) each). Here candidates sit in two ordered indexes,
// by last access (= by rec, ascending) and by eff (ascending), and a victim is found by
// Fagin's threshold algorithm: walk both indexes from their minimum, score each node seen,
// and stop as soon as alpha·eff'(frontier) + rec'(frontier) exceeds the best score seen.
// Every unseen node has rec and eff at least the frontier's, and the float operations
// used are monotone, so none can score lower: the victim (ties included, by DFS order) is
// exactly the naive argmin (tests/prefix check this against `reference_flop_scorer` on
// random trees). The normalisation bounds are the indexes' ends, read in O(1).
// Costs: on_update / on_erase O(log n); select_victim O((k + 1) log n) where k is the
// number of nodes the threshold walk visits — in practice a handful, since low-rec and
// low-eff nodes come first; worst case O(n) (bench: bm_evict_adversarial_100k, recency and
// efficiency anti-correlated). Index nodes come from a pooled resource, so steady state
// allocates nothing. `memory_bytes()` O(1): what the pool took, the per-node arrays, the
// class table (2 B per class) and a set per class used so far.
//
// `flop_index::efficiency_classes` bounds the worst case: candidates also sit in one of
// 2,048 efficiency classes (8 per octave of eff, log-spaced), each ordered by last access;
// the victim is the lowest-scoring class head (the least recently used node of each
// non-empty class), scored exactly. O(C + log n) per victim with C the non-empty classes
// (at most 2,048, a few dozen in practice), whatever the data. It may differ from the exact
// argmin when a node slightly more recent than its class head has a lower eff within the
// same 9 % band; docs/prefix-cache.md measures what that costs in FLOPs saved.
//
// `flop_index::bounded_walk` (the default) keeps both: the threshold walk runs for at most
// `walk_limit` steps (64 by default; how long walks run on the traces: docs/results/
// prefix-cache.md), so its victim is the exact argmin whenever the walk ends in time; when it
// does not (anti-correlated recency and efficiency), the victim is the best of the nodes it
// scored and the class heads.
// O(walk_limit · log n + C) worst case; `walks_cut()` counts the victims chosen that way.
//
// Suspended index (`rebuildable_scorer`: a switching scorer's part while another part is
// followed): suspend_index() stops the upkeep of every index above; the hooks then only
// stamp (on_match O(|path|) to find the deepest checkpoint, on_update / on_erase O(1)), and
// resume_index(tree) rebuilds the indexes from the tree: O(id_bound + n log n) (2 or 3 set
// inserts per candidate). The indexes are functions of the candidates' times and
// efficiencies, so the victims after a resume are those of indexes kept current throughout.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <memory_resource>
#include <set>
#include <span>
#include <utility>
#include <vector>

#include "hybridcache/model/cost_model.hpp"
#include "hybridcache/concepts/utility_scorer.hpp"
#include "hybridcache/concepts/state_store.hpp"
#include "hybridcache/prefix/detail/memory_bytes.hpp"
#include "hybridcache/prefix/detail/suspendable_index.hpp"
#include "hybridcache/prefix/radix_tree.hpp"

namespace hybridcache::prefix {

/// What eviction does with a single-child candidate.
enum class intermediate_eviction : unsigned char {
  merge,      ///< Marconi: drop the checkpoint, merge the node's KV into its child
  tombstone,  ///< SGLang: drop the checkpoint, keep the node and its KV
};

namespace detail {

/// alpha·e + r, rounded after the product and after the sum (never fused into an FMA,
/// whatever -ffp-contract says), as Python computes `eff_weight * eff + rec`.
#if defined(__clang__)
[[nodiscard]] inline double utility_no_fma(double alpha, double e, double r) noexcept {
#pragma clang fp contract(off)
  const double p = alpha * e;
  return p + r;
}
#elif defined(__GNUC__)
[[nodiscard]] __attribute__((optimize("fp-contract=off"))) inline double utility_no_fma(double alpha, double e,
                                                                                         double r) noexcept {
  const double p = alpha * e;
  return p + r;
}
#else
[[nodiscard]] inline double utility_no_fma(double alpha, double e, double r) noexcept {
  const volatile double p = alpha * e;
  return p + r;
}
#endif

/// Min-max normalisation of one value, as the reference's `_normalize` does.
[[nodiscard]] inline double normalise(double x, double lo, double hi, bool degenerate) noexcept {
  return (degenerate || lo == hi) ? 1.0 : (x - lo) / (hi - lo);
}

/// rec = 1 / (now - t) (Python int/int: exact operands, one rounding).
[[nodiscard]] inline double recency(time_point now, time_point t) noexcept {
  return 1.0 / static_cast<double>(now - t);
}

/// Correct node FLOP efficiency: marginal saved FLOPs over the node's own bytes.
template <class Tree>
[[nodiscard]] double node_efficiency(const cost_model& m, const Tree& tree, node_id n) noexcept {
  const auto& nd = tree.at(n);
  try {
    return m.node_flop_efficiency(nd.begin(), nd.end, nd.has_checkpoint);
  } catch (...) {  // overflow_error only for sequences far beyond 2^20 tokens
    return std::numeric_limits<double>::max();
  }
}

/// What evicting candidate `n` does: a leaf is removed; a single-child node merges into its
/// child or, with `intermediate_eviction::tombstone`, keeps its KV and drops its checkpoint.
template <class Tree>
[[nodiscard]] evict_action flop_action(const Tree& tree, node_id n, intermediate_eviction mode) noexcept {
  if (tree.at(n).children == 0) return evict_action::remove_leaf;
  return mode == intermediate_eviction::merge ? evict_action::merge_into_child : evict_action::drop_checkpoint;
}

/// The deepest node of a matched `path` that holds a checkpoint (the state a hit uses, the
/// node Marconi refreshes), or no_node.
template <class Tree>
[[nodiscard]] node_id deepest_checkpoint(const Tree& tree, std::span<const node_id> path) noexcept {
  for (auto it = path.rbegin(); it != path.rend(); ++it)
    if (tree.at(*it).has_checkpoint) return *it;
  return no_node;
}

/// Marconi's candidate rule generalised to nodes that may lack a checkpoint; with
/// `protect_branches`, a single-child node that has branched is not a candidate.
template <class Tree>
[[nodiscard]] bool flop_candidate(const Tree& tree, node_id n, bool protect_branches = false) noexcept {
  if (n == Tree::root()) return false;
  const auto& nd = tree.at(n);
  return nd.live && nd.pins == 0 &&
         (nd.children == 0 || (nd.children == 1 && nd.has_checkpoint && !(protect_branches && nd.branched)));
}

/// What a node's efficiency (node_efficiency) depends on: its end, edge length and
/// checkpoint. A scorer keeps the last one per slot beside the value computed from it, and
/// recomputes only when it changed (end -1: never computed).
struct extent_key {
  std::int64_t end = -1;
  std::int64_t edge = 0;
  bool checkpoint = false;
  friend bool operator==(const extent_key&, const extent_key&) = default;
};

/// Moves the entry `from` of an ordered index (a set) to key `to` in place of erasing and
/// inserting: its node is reused, so re-keying never allocates. `from` must be present.
template <class Index>
void rekey(Index& index, const typename Index::value_type& from, const typename Index::value_type& to) noexcept {
  auto node = index.extract(from);
  node.value() = to;
  index.insert(std::move(node));
}

}  // namespace detail

/// Which single-child nodes FLOP-aware eviction may take (see the file comment).
enum class flop_candidates : unsigned char {
  paper,             ///< Marconi as published: every single-child node with a checkpoint
  protect_branches,  ///< not one that has been a branch point, while it has a child
};

/// How `flop_aware_scorer` finds its victim (see the file comment).
enum class flop_index : unsigned char {
  threshold_walk,      ///< exact argmin; O(k log n), worst case O(n)
  efficiency_classes,  ///< best class head; O(C + log n) worst case, C <= 2,048
  /// the threshold walk for at most `walk_limit` steps (exact when it ends within them, as
  /// it does but in adversarial cases), else the best of what it scored and the class
  /// heads: O(walk_limit · log n + C) worst case. The default.
  bounded_walk,
};

/// Configuration of `flop_aware_scorer` (aggregate; designated initializers welcome).
struct flop_aware_config {
  double alpha = 0.0;  ///< weight of FLOP efficiency against recency (>= 0)
  intermediate_eviction intermediate = intermediate_eviction::merge;
  flop_candidates candidates = flop_candidates::protect_branches;  ///< paper: Marconi as published
  flop_index index = flop_index::bounded_walk;
  std::int64_t walk_limit = 64;  ///< bounded_walk: threshold-walk steps (2 nodes each) before the class heads
};

namespace detail {
/// The efficiency class of `eff`: 8 classes per octave (frexp's exponent, then the top 3
/// mantissa bits), octaves 2^-64 .. 2^191 (clamped), 0 and below in class 0. Monotone in eff.
[[nodiscard]] inline std::uint32_t efficiency_class(double eff) noexcept {
  if (!(eff > 0.0)) return 0;
  int e = 0;
  const double m = std::frexp(eff, &e);  // eff = m * 2^e, m in [0.5, 1)
  const int octave = std::clamp(e + 64, 0, 255);
  const int sub = std::clamp(static_cast<int>((m - 0.5) * 16.0), 0, 7);
  return static_cast<std::uint32_t>(octave * 8 + sub);
}
inline constexpr std::uint32_t efficiency_classes = 256 * 8;
}  // namespace detail

/// Marconi FLOP-aware scorer. See the file comment.
class flop_aware_scorer : public detail::suspendable_index<flop_aware_scorer> {
 public:
  /// Single-child nodes are candidates (merge or tombstone), so every unpinned checkpoint
  /// can eventually be dropped (prefix_cache's up-front fit check relies on it).
  static constexpr bool evicts_inner_nodes = true;
  /// @throws invalid_argument when alpha is negative or not finite.
  explicit flop_aware_scorer(cost_model model, flop_aware_config cfg = {})
      : model_(std::move(model)),
        cfg_(cfg),
        pool_(std::make_unique<pool_type>()),
        by_rec_(&pool_->pool),
        by_eff_(&pool_->pool) {
    set_alpha(cfg.alpha);
    HYBRIDCACHE_EXPECTS(cfg.walk_limit >= 1, invalid_argument, "flop_aware_scorer: walk_limit must be >= 1");
    if (cfg_.index != flop_index::threshold_walk) {
      slot_.assign(detail::efficiency_classes, 0);
      nonempty_.assign(detail::efficiency_classes / 64, 0);
    }
  }
  /// Movable (the index nodes stay in the moved pool); not copyable, not move-assignable.
  flop_aware_scorer(flop_aware_scorer&&) noexcept = default;
  flop_aware_scorer& operator=(flop_aware_scorer&&) = delete;

  /// @throws invalid_argument when alpha is negative or not finite.
  void set_alpha(double a) {
    HYBRIDCACHE_EXPECTS(std::isfinite(a) && a >= 0.0, invalid_argument, "flop_aware_scorer: alpha must be >= 0");
    cfg_.alpha = a;
  }
  [[nodiscard]] double alpha() const noexcept { return cfg_.alpha; }
  [[nodiscard]] const cost_model& model() const noexcept { return model_; }
  [[nodiscard]] const flop_aware_config& config() const noexcept { return cfg_; }
  /// A fresh scorer (empty index) with the same model and options at alpha `a` (tuning replays).
  [[nodiscard]] flop_aware_scorer with_alpha(double a) const {
    flop_aware_config c = cfg_;
    c.alpha = a;
    return flop_aware_scorer(model_, c);
  }

  /// A fresh scorer (empty index) with the same model and options (the adaptive selector's
  /// shadows).
  [[nodiscard]] flop_aware_scorer replica() const { return with_alpha(cfg_.alpha); }

  /// Heap bytes: the index's pool and what it took (it keeps its chunks: the most entries ever
  /// indexed, not the entries now), the per-node arrays, the class sets and the model's spec.
  /// O(1).
  [[nodiscard]] std::int64_t memory_bytes() const noexcept {
    using detail::heap_bytes;
    return static_cast<std::int64_t>(sizeof(pool_type)) + pool_->counted.bytes() + heap_bytes(eff_) + heap_bytes(ts_) +
           heap_bytes(in_) + heap_bytes(class_) + heap_bytes(key_) + heap_bytes(slot_) + heap_bytes(classes_) +
           heap_bytes(nonempty_) + heap_bytes(model_);
  }
  void reserve(std::size_t ids) {
    if (eff_.size() < ids) detail::grow_all(ids, eff_, ts_, in_, class_, key_);
  }

  template <class Tree>
  void on_match(Tree& tree, std::span<const node_id> path, node_id, time_point now) noexcept {
    const node_id n = detail::deepest_checkpoint(tree, path);
    if (n == no_node) return;
    tree.touch(n, now);
    on_update(tree, n);
  }
  template <class Tree>
  void on_insert_path(Tree&, std::span<const node_id>, time_point) noexcept {}

  /// Re-indexes `n`. Most calls change nothing (a pin, an unpin, a parent that stays a
  /// branch): a candidate whose keys (last access, eff, bit for bit) are the indexed ones
  /// is left alone, and a changed key moves its index node instead of freeing and
  /// allocating one; eff is recomputed only when the slot's extent or checkpoint changed.
  /// The indexes hold the same entries either way.
  template <class Tree>
  void on_update(const Tree& tree, node_id n) noexcept {
    if (suspended_ || n == Tree::root()) return;
    if (!detail::flop_candidate(tree, n, protects_branches())) {
      erase(n);
      return;
    }
    const auto& nd = tree.at(n);
    const extent_key k{nd.end, nd.edge(), nd.has_checkpoint};
    const bool indexed = n < in_.size() && in_[n];
    // eff is a function of the key alone, so the last value computed in this slot (for
    // this node or an earlier one) still holds when the key is the same.
    const double eff = key_[n] == k ? eff_[n] : detail::node_efficiency(model_, tree, n);
    const time_point ts = tree.last_access(n);
    key_[n] = k;
    if (indexed) {
      const bool same_eff = std::bit_cast<std::uint64_t>(eff) == std::bit_cast<std::uint64_t>(eff_[n]);
      if (same_eff && ts == ts_[n]) return;
      if (ts != ts_[n]) detail::rekey(by_rec_, {ts_[n], n}, {ts, n});
      if (!same_eff) detail::rekey(by_eff_, {eff_[n], n}, {eff, n});
      if (!slot_.empty()) {
        const std::uint32_t c = detail::efficiency_class(eff);
        if (c != class_[n] || ts != ts_[n]) {
          auto node = class_set(class_[n]).extract({ts_[n], n});
          if (class_set(class_[n]).empty()) nonempty_[class_[n] / 64] &= ~(std::uint64_t{1} << (class_[n] % 64));
          node.value() = {ts, n};
          class_set(c).insert(std::move(node));
          nonempty_[c / 64] |= std::uint64_t{1} << (c % 64);
          class_[n] = c;
        }
      }
      eff_[n] = eff;
      ts_[n] = ts;
      return;
    }
    eff_[n] = eff;
    ts_[n] = ts;
    in_[n] = 1;
    by_rec_.emplace(ts_[n], n);
    by_eff_.emplace(eff_[n], n);
    if (!slot_.empty()) {
      const std::uint32_t c = detail::efficiency_class(eff_[n]);
      class_[n] = c;
      class_set(c).emplace(ts_[n], n);
      nonempty_[c / 64] |= std::uint64_t{1} << (c % 64);
    }
  }
  template <class Tree>
  void on_erase(const Tree&, node_id n) noexcept {
    if (!suspended_) erase(n);
  }

  // suspend_index / resume_index / index_suspended: detail::suspendable_index (resume
  // O(id_bound + n log n); index nodes come from the pool the old entries return to).

  template <class Tree>
  [[nodiscard]] node_id select_victim(const Tree& tree, time_point now) noexcept {
    if (by_rec_.empty()) return no_node;
    const bool single = by_rec_.size() == 1;
    const double rmin = detail::recency(now, by_rec_.begin()->first);
    const double rmax = detail::recency(now, by_rec_.rbegin()->first);
    const double emin = by_eff_.begin()->first;
    const double emax = by_eff_.rbegin()->first;
    const double a = cfg_.alpha;
    auto score = [&](double e, double r) noexcept {
      return detail::utility_no_fma(a, detail::normalise(e, emin, emax, single), detail::normalise(r, rmin, rmax, single));
    };
    node_id best = no_node;
    double best_u = std::numeric_limits<double>::infinity();
    auto consider = [&](node_id n) noexcept {
      ++visits_;
      const double u = score(eff_[n], detail::recency(now, ts_[n]));
      if (best == no_node || u < best_u || (u == best_u && tree.dfs_before(n, best))) {
        best = n;
        best_u = u;
      }
    };
    auto class_heads = [&]() noexcept {  // the least recently used node of every non-empty class
      for (std::size_t w = 0; w < nonempty_.size(); ++w)
        for (std::uint64_t bits = nonempty_[w]; bits != 0; bits &= bits - 1)
          consider(used_class(w * 64 + static_cast<std::size_t>(std::countr_zero(bits))).begin()->second);
    };
    if (cfg_.index == flop_index::efficiency_classes) {
      class_heads();
      return best;
    }
    const std::int64_t limit =
        cfg_.index == flop_index::bounded_walk ? cfg_.walk_limit : std::numeric_limits<std::int64_t>::max();
    std::int64_t steps = 0;
    auto ir = by_rec_.begin();
    auto ie = by_eff_.begin();
    while (ir != by_rec_.end() && ie != by_eff_.end()) {
      if (steps++ == limit) {  // adversarial data: bound the walk, finish with the class heads
        ++walks_cut_;
        class_heads();
        return best;
      }
      const double fr = detail::recency(now, ir->first);
      const double fe = ie->first;
      consider(ir->second);
      consider(ie->second);
      ++ir;
      ++ie;
      // Unseen nodes have rec >= fr and eff >= fe, hence U >= score(fe, fr).
      if (score(fe, fr) > best_u) break;
    }
    return best;
  }

  template <class Tree>
  [[nodiscard]] evict_action action(const Tree& tree, node_id n) const noexcept {
    return detail::flop_action(tree, n, cfg_.intermediate);
  }

  /// True when a branch point's checkpoint is never taken while it has a child (the
  /// prefix cache's fit check counts such checkpoints on pinned paths as kept).
  [[nodiscard]] bool protects_branches() const noexcept { return cfg_.candidates == flop_candidates::protect_branches; }

  /// Candidates currently indexed. O(1).
  [[nodiscard]] std::size_t candidates() const noexcept { return by_rec_.size(); }
  /// Nodes scored by all select_victim calls so far (measures the threshold walk).
  [[nodiscard]] std::uint64_t nodes_scored() const noexcept { return visits_; }
  /// bounded_walk: victims chosen after the walk reached its limit (possibly not the exact
  /// argmin); 0 means every victim so far was the exact one.
  [[nodiscard]] std::uint64_t walks_cut() const noexcept { return walks_cut_; }

 private:
  friend class detail::suspendable_index<flop_aware_scorer>;
  void clear_index() noexcept {
    by_rec_.clear();
    by_eff_.clear();
    for (std::size_t w = 0; w < nonempty_.size(); ++w) {
      for (std::uint64_t bits = nonempty_[w]; bits != 0; bits &= bits - 1)
        class_set(static_cast<std::uint32_t>(w * 64 + static_cast<std::size_t>(std::countr_zero(bits)))).clear();
      nonempty_[w] = 0;
    }
    std::fill(in_.begin(), in_.end(), static_cast<unsigned char>(0));
  }
  using extent_key = detail::extent_key;

  using class_index = std::pmr::set<std::pair<time_point, node_id>>;
  /// The set of efficiency class `c`, made the first time the class is used: most of the
  /// 2,048 classes never are, and an empty set per class would cost ~115 kB per scorer.
  class_index& class_set(std::uint32_t c) noexcept {
    if (slot_[c] == 0) {
      classes_.emplace_back(&pool_->pool);  // grows geometrically, as the per-node arrays
      slot_[c] = static_cast<std::uint16_t>(classes_.size());
    }
    return classes_[slot_[c] - 1u];
  }
  /// Precondition: class `c` is in use (its bit in nonempty_ is set).
  [[nodiscard]] const class_index& used_class(std::size_t c) const noexcept { return classes_[slot_[c] - 1u]; }

  void erase(node_id n) noexcept {
    if (n >= in_.size() || !in_[n]) return;
    by_rec_.erase({ts_[n], n});
    by_eff_.erase({eff_[n], n});
    if (!slot_.empty()) {
      auto& cls = class_set(class_[n]);
      cls.erase({ts_[n], n});
      if (cls.empty()) nonempty_[class_[n] / 64] &= ~(std::uint64_t{1} << (class_[n] % 64));
    }
    in_[n] = 0;
  }

  cost_model model_;
  flop_aware_config cfg_;
  struct pool_type {  // the index's pool over an upstream that counts its chunks (memory_bytes)
    detail::counting_resource counted;
    std::pmr::unsynchronized_pool_resource pool{&counted};
  };
  std::unique_ptr<pool_type> pool_;
  std::pmr::set<std::pair<time_point, node_id>> by_rec_;
  std::pmr::set<std::pair<double, node_id>> by_eff_;
  std::vector<double> eff_;
  std::vector<time_point> ts_;
  std::vector<unsigned char> in_;
  std::vector<std::uint32_t> class_;  // efficiency class of each indexed node (classes mode)
  std::vector<extent_key> key_;       // what eff_[n] was last computed from (end -1: never)
  std::vector<std::uint16_t> slot_;      // class -> 1 + its set's index in classes_ (0: not used yet)
  std::vector<class_index> classes_;     // by last access, per class used so far
  std::vector<std::uint64_t> nonempty_;  // bitmap of non-empty classes
  std::uint64_t visits_ = 0;
  std::uint64_t walks_cut_ = 0;
};

static_assert(utility_scorer<flop_aware_scorer, radix_tree<state_store_archetype>>);
static_assert(inner_node_evicting_scorer<flop_aware_scorer> && branch_protecting_scorer<flop_aware_scorer> &&
              alpha_settable_scorer<flop_aware_scorer> && reservable_scorer<flop_aware_scorer> &&
              rebuildable_scorer<flop_aware_scorer, radix_tree<state_store_archetype>>);

}  // namespace hybridcache::prefix
