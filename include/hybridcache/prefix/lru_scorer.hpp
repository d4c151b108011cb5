// hybridcache/prefix/lru_scorer.hpp
//
// `lru_scorer`: SGLang+ eviction as in the Marconi reference's policy V1
// (anchors/marconi.md 1(c), 1(f)).
//
// - Candidates: unpinned leaves. A parent whose last child goes becomes a candidate.
// - Victim: the least recently accessed candidate. Ties do happen under the reference's
//   rules (an insert that splits an edge stamps the old tail leaf and creates the new leaf at
//   the same tick), so the tie order matters for exact parity:
//     lru_ties::by_node_id     (default) the lower node id (deterministic, not the
//                              reference's order); persistent heap, O(log n) per victim.
//     lru_ties::python_heapq   exactly what the reference does: each eviction round collects
//                              the leaves in DFS preorder, runs CPython's heapify, heappop and
//                              heappush (comparing only last-access times). O(n) per round,
//                              O(log n) per victim within a round. Use it to reproduce the
//                              reference's SGLang+ rows bit for bit.
// - Refresh: a lookup stamps every node it enters (the whole matched path and a partially
//   matched child); a commit stamps every existing node on its path.
// - Action: delete the leaf (its KV and checkpoint).
//
// Index: an indexed binary min-heap over (last access, id) with a position per node
// (detail::node_heap, prefix/node_heap.hpp).
// Costs: select_victim O(1); on_update / on_erase O(log n); on_match O(|path| log n).
// Allocation only when the per-node arrays grow (reserve()).
//
// Suspended index (`rebuildable_scorer`: a switching scorer's part while another part is
// followed): suspend_index() stops the heap's upkeep; the hooks then only stamp (on_match
// O(|path|), on_update / on_erase O(1), nothing else), and resume_index(tree) rebuilds the
// heap from the tree: O(id_bound + n log n). The victims after a resume are the ones an
// index kept current throughout would give: the heap is a function of the candidates and
// their times, which the stamps kept.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "hybridcache/concepts/utility_scorer.hpp"
#include "hybridcache/concepts/state_store.hpp"
#include "hybridcache/core/python_heapq.hpp"
#include "hybridcache/prefix/detail/suspendable_index.hpp"
#include "hybridcache/prefix/node_heap.hpp"
#include "hybridcache/prefix/radix_tree.hpp"

namespace hybridcache::prefix {

/// How `lru_scorer` orders leaves with equal last-access times.
enum class lru_ties : unsigned char {
  by_node_id,    ///< lower node id first (persistent heap, O(log n))
  python_heapq,  ///< the reference's per-round heapify/heappop order (O(n) per round)
};

/// Options of `lru_scorer`.
struct lru_config {
  lru_ties ties = lru_ties::by_node_id;
};

/// SGLang+ (Marconi reference V1) leaf LRU. See the file comment.
class lru_scorer : public detail::suspendable_index<lru_scorer> {
 public:
  lru_scorer() = default;
  explicit lru_scorer(lru_config cfg) : cfg_(cfg) {}

  /// Grows the per-node index to cover node ids < `ids` (the cache calls it before it
  /// creates nodes, so the noexcept hooks never allocate).
  /// Heap bytes of the index and the heapq round's buffer. O(1).
  [[nodiscard]] std::int64_t memory_bytes() const noexcept { return heap_.memory_bytes() + detail::heap_bytes(round_); }
  void reserve(std::size_t ids) {
    heap_.reserve(ids);
    if (cfg_.ties == lru_ties::python_heapq) detail::reserve_geometric(round_, ids);
  }
  [[nodiscard]] const lru_config& config() const noexcept { return cfg_; }
  /// A fresh scorer (empty index) with the same options (the adaptive selector's shadows).
  [[nodiscard]] lru_scorer replica() const { return lru_scorer(cfg_); }

  template <class Tree>
  void on_match(Tree& tree, std::span<const node_id> path, node_id partial, time_point now) noexcept {
    in_round_ = false;
    for (node_id n : path) stamp(tree, n, now);
    if (partial != no_node) stamp(tree, partial, now);
  }
  template <class Tree>
  void on_insert_path(Tree& tree, std::span<const node_id> path, time_point now) noexcept {
    in_round_ = false;
    for (node_id n : path) stamp(tree, n, now);
  }
  template <class Tree>
  void on_update(const Tree& tree, node_id n) noexcept {
    if (suspended_ || n == Tree::root()) return;
    const auto& nd = tree.at(n);
    const bool candidate = nd.live && nd.children == 0 && nd.pins == 0;
    if (cfg_.ties == lru_ties::python_heapq) {
      // Within an eviction round the reference pushes a parent that has just lost its
      // last child; everything else waits for the next round's heapify.
      if (in_round_ && candidate) heappush(tree, n);
      return;
    }
    if (candidate) heap_.set(n, key(tree, n));
    else heap_.erase(n);
  }
  template <class Tree>
  void on_erase(const Tree&, node_id n) noexcept {
    if (!suspended_) heap_.erase(n);
  }

  // suspend_index / resume_index / index_suspended: detail::suspendable_index (resume
  // O(id_bound + n log n); no allocation, reserve() covered the ids).

  template <class Tree>
  [[nodiscard]] node_id select_victim(const Tree& tree, time_point now) noexcept {
    if (cfg_.ties == lru_ties::by_node_id) return heap_.top();
    if (!in_round_ || now != round_now_) start_round(tree, now);
    while (!round_.empty()) {
      const node_id x = heappop(tree);
      const auto& nd = tree.at(x);
      if (nd.live && nd.children == 0 && nd.pins == 0) return x;
    }
    return no_node;
  }
  template <class Tree>
  [[nodiscard]] evict_action action(const Tree&, node_id) const noexcept {
    return evict_action::remove_leaf;
  }
  [[nodiscard]] double alpha() const noexcept { return 0.0; }
  /// Candidates currently indexed (by_node_id mode). O(1).
  [[nodiscard]] std::size_t candidates() const noexcept { return heap_.size(); }

 private:
  friend class detail::suspendable_index<lru_scorer>;
  void clear_index() noexcept {
    heap_.clear();
    in_round_ = false;  // python_heapq: the next victim starts a round (as after any hook)
  }
  template <class Tree>
  void stamp(Tree& tree, node_id n, time_point now) noexcept {
    tree.touch(n, now);
    on_update(tree, n);
  }

  /// Heap key: the last-access time (node_heap breaks ties by node id).
  template <class Tree>
  static std::uint64_t key(const Tree& tree, node_id n) noexcept {
    return tree.last_access(n);
  }

  // --- python_heapq mode: CPython's heapq on last-access times ---------------------------
  template <class Tree>
  void start_round(const Tree& tree, time_point now) noexcept {
    round_.clear();
    tree.preorder([&](node_id n) {
      const auto& nd = tree.at(n);
      if (nd.children == 0 && nd.pins == 0) round_.push_back(n);  // capacity reserved
    });
    python_heapq::heapify(round_, earlier(tree));
    round_now_ = now;
    in_round_ = true;
  }
  /// CPython's `<` on the heap items: last-access times only.
  template <class Tree>
  static auto earlier(const Tree& tree) noexcept {
    return [&tree](node_id a, node_id b) noexcept { return tree.last_access(a) < tree.last_access(b); };
  }
  template <class Tree>
  node_id heappop(const Tree& tree) noexcept {
    return python_heapq::heappop(round_, earlier(tree));
  }
  template <class Tree>
  void heappush(const Tree& tree, node_id n) noexcept {
    python_heapq::heappush(round_, n, earlier(tree));  // capacity reserved
  }

  lru_config cfg_{};
  detail::node_heap heap_;
  std::vector<node_id> round_;
  time_point round_now_ = 0;
  bool in_round_ = false;
};

static_assert(utility_scorer<lru_scorer, radix_tree<state_store_archetype>>);
static_assert(reservable_scorer<lru_scorer> && !inner_node_evicting_scorer<lru_scorer> && !alpha_settable_scorer<lru_scorer> &&
              rebuildable_scorer<lru_scorer, radix_tree<state_store_archetype>>);

}  // namespace hybridcache::prefix
