// hybridcache/prefix/gdsf_scorer.hpp
//
// `gdsf_scorer`: GreedyDual-Size-Frequency eviction over the hybrid prefix cache, with the
// cost of a node = the prefill FLOPs its state saves and its size = its own bytes, so the
// "value per byte" is the same FLOP efficiency Marconi's scorer uses
// (cost_model::node_flop_efficiency: marginal saved FLOPs over checkpoint + own KV bytes).
//
//   priority H(n) = L_n + freq(n) · eff(n)
//
// - L is the inflation value: the priority of the last victim. A node's L_n is L at its
//   last access (insertion or hit), so a node not used for a while falls behind nodes used
//   since, whatever its efficiency: recency without timestamps (Cao & Irani's GreedyDual;
//   Cherkasova's GDSF adds the frequency).
// - freq(n) starts at 1 when the node appears and grows by 1 on every hit that uses its
//   state: the deepest matched node that holds a checkpoint, as Marconi refreshes.
// - Candidates and actions are flop_aware_scorer's (flop_aware_config): unpinned leaves,
//   and single-child nodes with a checkpoint (not a protected branch point); a leaf is
//   removed, a single-child node merged into its child (or tombstoned).
// - Victim: the lowest H, ties by lowest node id. Evicting it sets L = H(victim).
//
// Why it is here: it is strong where the cache is small and recency alone misleads, weak
// where it is large (docs/prefix-cache.md, "GDSF, measured"), so it is one of the
// candidates an adaptive selector picks among.
//
// Index: an indexed binary min-heap over (priority, id) (detail::basic_node_heap,
// prefix/node_heap.hpp): the order a std::set of (priority, id) pairs keeps, so the same
// victims, with no node per entry. Costs: on_match O(path) to find the node + O(log n);
// on_update / on_erase O(log n) (the efficiency is recomputed only when the node's extent
// or checkpoint changed); select_victim and observe_victim O(1) (the heap's top).
// Memory: 64 bytes per node id (frequency, L_n, the efficiency and what it was computed
// from, the heap's key, position and slot).
// Allocation only when the per-node arrays grow (reserve()). Not thread-safe
// (the cache's lock serialises calls).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "hybridcache/concepts/state_store.hpp"
#include "hybridcache/concepts/utility_scorer.hpp"
#include "hybridcache/model/cost_model.hpp"
#include "hybridcache/prefix/flop_aware_scorer.hpp"
#include "hybridcache/prefix/node_heap.hpp"
#include "hybridcache/prefix/radix_tree.hpp"

namespace hybridcache::prefix {

/// Configuration of `gdsf_scorer` (aggregate).
struct gdsf_config {
  intermediate_eviction intermediate = intermediate_eviction::merge;
  flop_candidates candidates = flop_candidates::protect_branches;
};

/// GreedyDual-Size-Frequency over FLOPs saved per byte. See the file comment.
class gdsf_scorer {
 public:
  /// Single-child nodes are candidates (as for flop_aware_scorer).
  static constexpr bool evicts_inner_nodes = true;

  explicit gdsf_scorer(cost_model model, gdsf_config cfg = {})
      : model_(std::move(model)), cfg_(cfg) {}
  gdsf_scorer(gdsf_scorer&&) noexcept = default;
  gdsf_scorer& operator=(gdsf_scorer&&) = delete;

  /// GDSF has no FLOP weight to tune (recency and efficiency are one priority): 0, as LRU.
  [[nodiscard]] double alpha() const noexcept { return 0.0; }
  [[nodiscard]] const gdsf_config& config() const noexcept { return cfg_; }
  [[nodiscard]] bool protects_branches() const noexcept { return cfg_.candidates == flop_candidates::protect_branches; }
  /// The inflation value L (the last victim's priority).
  [[nodiscard]] double inflation() const noexcept { return inflation_; }
  /// The priority of candidate `n` (NaN when it is not one). O(1).
  [[nodiscard]] double priority(node_id n) const noexcept {
    return by_priority_.contains(n) ? by_priority_.key(n) : std::numeric_limits<double>::quiet_NaN();
  }
  /// Hits counted for `n` (0 for a slot not in use). O(1).
  [[nodiscard]] std::uint64_t frequency(node_id n) const noexcept { return n < freq_.size() ? freq_[n] : 0; }

  /// A fresh scorer (empty index, L = 0) with the same model and options (the adaptive
  /// selector's shadows).
  [[nodiscard]] gdsf_scorer replica() const { return gdsf_scorer(model_, cfg_); }

  /// Heap bytes of the index and the per-node arrays, and of the model's spec. O(1).
  [[nodiscard]] std::int64_t memory_bytes() const noexcept {
    using detail::heap_bytes;
    return by_priority_.memory_bytes() + heap_bytes(freq_) + heap_bytes(base_) + heap_bytes(eff_) + heap_bytes(key_) +
           heap_bytes(model_);
  }
  void reserve(std::size_t ids) {
    if (freq_.size() < ids) detail::grow_all(ids, freq_, base_, eff_, key_);
    by_priority_.reserve(ids);
  }

  /// A hit uses the state of the deepest matched node that holds one: its frequency grows
  /// and its L_n becomes the current L.
  template <class Tree>
  void on_match(Tree& tree, std::span<const node_id> path, node_id, time_point now) noexcept {
    const node_id n = detail::deepest_checkpoint(tree, path);
    if (n == no_node) return;
    tree.touch(n, now);
    if (n < freq_.size()) {
      freq_[n] = freq_[n] == 0 ? 1 : freq_[n] + 1;
      base_[n] = inflation_;
    }
    on_update(tree, n);
  }
  template <class Tree>
  void on_insert_path(Tree&, std::span<const node_id>, time_point) noexcept {}

  /// Re-indexes `n`: an unchanged priority (bit for bit) leaves the index alone, a changed
  /// one moves `n` in the heap (no allocation); the index holds the same entries either way.
  template <class Tree>
  void on_update(const Tree& tree, node_id n) noexcept {
    if (n == Tree::root() || n >= freq_.size()) return;
    if (freq_[n] == 0) {  // a node the scorer has not seen: it appears now
      freq_[n] = 1;
      base_[n] = inflation_;
    }
    if (!detail::flop_candidate(tree, n, protects_branches())) {
      erase(n);
      return;
    }
    // eff is a function of the extent key alone: the last value computed in this slot (for
    // this node or an earlier one) still holds when the key is the same.
    const auto& nd = tree.at(n);
    const detail::extent_key k{nd.end, nd.edge(), nd.has_checkpoint};
    if (!(key_[n] == k)) {
      eff_[n] = detail::node_efficiency(model_, tree, n);
      key_[n] = k;
    }
    const double p = base_[n] + static_cast<double>(freq_[n]) * eff_[n];
    if (by_priority_.contains(n) &&
        std::bit_cast<std::uint64_t>(p) == std::bit_cast<std::uint64_t>(by_priority_.key(n)))
      return;
    by_priority_.set(n, p);
  }
  template <class Tree>
  void on_erase(const Tree&, node_id n) noexcept {
    erase(n);
    if (n < freq_.size()) freq_[n] = 0;  // the slot may be reused by a new node
  }

  /// The lowest priority (ties: lowest node id); L becomes its priority.
  template <class Tree>
  [[nodiscard]] node_id select_victim(const Tree&, time_point) noexcept {
    const node_id n = by_priority_.top();
    if (n != no_node) inflation_ = std::max(inflation_, by_priority_.key(n));
    return n;
  }

  /// Another rule evicted `victim` (the live cache of the adaptive selector follows a
  /// different scorer): GDSF's clock still advances, to the lowest priority indexed, as if
  /// it had evicted that node itself; otherwise nodes touched meanwhile would all share one
  /// stale L and recency would be lost when GDSF leads again. O(1).
  template <class Tree>
  void observe_victim(const Tree&, node_id) noexcept {
    if (const node_id n = by_priority_.top(); n != no_node) inflation_ = std::max(inflation_, by_priority_.key(n));
  }

  template <class Tree>
  [[nodiscard]] evict_action action(const Tree& tree, node_id n) const noexcept {
    return detail::flop_action(tree, n, cfg_.intermediate);
  }

  /// Candidates currently indexed. O(1).
  [[nodiscard]] std::size_t candidates() const noexcept { return by_priority_.size(); }

 private:
  void erase(node_id n) noexcept { by_priority_.erase(n); }

  cost_model model_;
  gdsf_config cfg_;
  detail::basic_node_heap<double> by_priority_;  // candidates by (priority, id)
  std::vector<std::uint64_t> freq_;
  std::vector<double> base_;
  std::vector<double> eff_;                // efficiency last computed in each slot
  std::vector<detail::extent_key> key_;    // what eff_[n] was computed from (end -1: never)
  double inflation_ = 0.0;
};

static_assert(utility_scorer<gdsf_scorer, radix_tree<state_store_archetype>>);
static_assert(inner_node_evicting_scorer<gdsf_scorer> && branch_protecting_scorer<gdsf_scorer> && reservable_scorer<gdsf_scorer> &&
              victim_observer<gdsf_scorer, radix_tree<state_store_archetype>> && !alpha_settable_scorer<gdsf_scorer>);

}  // namespace hybridcache::prefix
