// hybridcache/prefix/detail/tree_ops.hpp
//
// Steps of `prefix_cache` that act on its tree, store and scorer together and need nothing
// else of the cache: applying one eviction, emptying the tree, the byte bound of the commit
// contract, and the memo of a commit's walks. Kept apart so that prefix_cache.hpp stays
// readable; internal (the cache's lock is held by the caller).
//
// Costs: apply_eviction O(edge) + the scorer's re-index (O(log n)); drop_all_nodes O(n);
// count_tree_bytes O(n) (the reference model of protected_bytes, checked against it in
// assertion builds); protected_bytes O(pins + nodes on the pinned paths). None allocates
// once the scratch vectors have grown.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "hybridcache/concepts/ids.hpp"
#include "hybridcache/concepts/tier_store.hpp"
#include "hybridcache/concepts/utility_scorer.hpp"
#include "hybridcache/core/expected.hpp"
#include "hybridcache/prefix/radix_tree.hpp"
#include "hybridcache/prefix/types.hpp"

namespace hybridcache::prefix::detail {

/// The last walk within one commit (prefix_cache::walk): a commit walks its sequence 3-4
/// times, and its tokens cannot change during it, so a walk of the same span in the same
/// namespace with no tree edit since (`radix_tree::edits`) is this one.
struct walk_memo {
  bool active = false, valid = false;
  const token_id* data = nullptr;
  std::size_t size = 0;
  namespace_id ns = 0;
  std::uint64_t edits = 0;
  walk_result result{};
};

/// Enables walk reuse for one commit (and forgets the memo when it ends).
struct walk_memo_scope {
  walk_memo& m;
  explicit walk_memo_scope(walk_memo& memo) noexcept : m(memo) { m = walk_memo{true}; }
  ~walk_memo_scope() { m = walk_memo{}; }
  walk_memo_scope(const walk_memo_scope&) = delete;
  walk_memo_scope& operator=(const walk_memo_scope&) = delete;
};

/// Evicts victim `v` by `act`: tells the listener first, frees its checkpoint, then removes
/// the leaf, merges it into its only child, or (otherwise, or when the join fails) keeps
/// its KV as a tombstone. Returns the bytes freed.
template <class Tree, class Store, class Scorer>
std::int64_t apply_eviction(Tree& tree, Store& store, Scorer& scorer, const eviction_listener& listener, node_id v,
                            evict_action act, commit_result& res, cache_counters& counters) noexcept {
  const auto& nd = tree.at(v);
  if (listener.fn != nullptr) {
    eviction_event ev;
    ev.node = v;
    ev.begin = nd.begin();
    ev.end = nd.end;
    ev.checkpoint_freed = nd.has_checkpoint;
    ev.kv_freed = act == evict_action::remove_leaf && nd.children == 0;
    ev.kv_moved_to_child = act == evict_action::merge_into_child && nd.children == 1;
    listener.fn(listener.context, ev);
  }
  std::int64_t freed = 0;
  // A store with a lower tier copies a leaf it is about to lose there (its KV and its
  // checkpoint) before the units are freed (pool_state_store's host tier).
  if constexpr (demoting_store<Store, Tree>)
    if (act == evict_action::remove_leaf && nd.children == 0) store.demote(tree, v);
  if (nd.has_checkpoint) {
    freed += store.checkpoint_bytes();
    store.free_checkpoint(tree.take_checkpoint(v));
    ++res.checkpoints_evicted;
    ++counters.checkpoints_evicted;
  }
  if (act == evict_action::remove_leaf && nd.children == 0) {
    const node_id parent = nd.parent;
    freed += store.kv_bytes(nd.edge());
    scorer.on_erase(tree, v);
    store.free_kv(tree.remove_leaf(v));
    ++res.nodes_removed;
    scorer.on_update(tree, parent);
    return freed;
  }
  if (act == evict_action::merge_into_child && nd.children == 1) {
    const node_id c = nd.first_child;
    if (store.join_kv(tree.kv(v), std::move(tree.kv(c)))) {
      scorer.on_erase(tree, v);
      try {
        tree.merge_into_child(v, std::move(tree.kv(v)));
      } catch (...) {  // merge only shrinks the child table; bad_alloc cannot happen
      }
      ++res.nodes_removed;
      scorer.on_update(tree, c);
      return freed;
    }
  }
  scorer.on_update(tree, v);  // tombstone (or a failed join): the node keeps its KV
  return freed;
}

/// Removes every node bottom-up (children before parents), freeing its handles, without
/// allocating: descend along first children to a leaf, remove it, continue at its parent.
/// Pins are dropped with the nodes (the caller invalidates its pin tickets).
template <class Tree, class Store, class Scorer>
void drop_all_nodes(Tree& tree, Store& store, Scorer& scorer) noexcept {
  node_id n = tree.at(Tree::root()).first_child;
  while (n != no_node) {
    const auto& nd = tree.at(n);
    if (nd.children > 0) {
      n = nd.first_child;
      continue;
    }
    const node_id parent = nd.parent;
    if (nd.has_checkpoint) store.free_checkpoint(tree.take_checkpoint(n));
    scorer.on_erase(tree, n);
    while (tree.at(n).pins > 0) tree.unpin(n);
    store.free_kv(tree.remove_leaf(n));
    n = parent == Tree::root() ? tree.at(parent).first_child : parent;
  }
  if (tree.at(Tree::root()).has_checkpoint) store.free_checkpoint(tree.take_checkpoint(Tree::root()));
}

/// The handles a commit needs, taken from `src` (the store, or a request's reservation) in
/// the order `build` consumes them: first a checkpoint for every position at or before the
/// common prefix `cp` that has none yet (`has_checkpoint_at`), then the new segments after
/// `cp`, bounded by the positions after it and `len`: the KV of each
/// (`src.take_kv(begin, end)`) and, at each position, its checkpoint
/// (`src.take_checkpoint(position)`). Appends to `kv` and `ckpt`; on failure returns the
/// error and leaves what it took there for the caller to free. O(positions).
template <class HasCheckpoint, class Source, class KvVec, class CkVec>
errc take_handles(const std::vector<std::int64_t>& positions, std::int64_t cp, std::int64_t len,
                  HasCheckpoint has_checkpoint_at, Source& src, KvVec& kv, CkVec& ckpt) noexcept {
  for (std::int64_t p : positions) {
    if (p > cp) break;
    if (has_checkpoint_at(p)) continue;
    auto h = src.take_checkpoint(p);
    if (!h) return h.error();
    ckpt.push_back(std::move(*h));
  }
  auto it = std::upper_bound(positions.begin(), positions.end(), cp);
  for (std::int64_t prev = cp; prev < len;) {
    const std::int64_t end = it != positions.end() ? *it : len;
    auto k = src.take_kv(prev, end);
    if (!k) return k.error();
    kv.push_back(std::move(*k));
    if (it != positions.end()) {
      auto h = src.take_checkpoint(end);
      if (!h) return h.error();
      ckpt.push_back(std::move(*h));
      ++it;
    }
    prev = end;
  }
  return errc::ok;
}

/// Bytes of the tree, and the part of them no eviction can free while the tree's pins are
/// held and a commit guards `guarded_end` (the deepest node its walk matched) and
/// `guarded_partial` (the edge it entered in part).
struct tree_bytes {
  std::int64_t total = 0;      ///< KV and checkpoints of every node
  std::int64_t protected_ = 0; ///< of which eviction can never free
  /// What eviction can free.
  [[nodiscard]] std::int64_t freeable() const noexcept { return total - protected_; }
};

/// Protected: the KV of every node on the root path of a pinned or guarded node, and the
/// checkpoints of those nodes that stay. A pinned or guarded node keeps its checkpoint; an
/// inner node on those paths keeps it with a leaves-only scorer (`InnerNodes` false: LRU
/// never takes an inner node), and with a scorer that takes single-child nodes (FLOP-aware)
/// only where two protected paths branch (it never gets down to one child). Exact, byte-
/// wise: everything else eviction can free. `marked` is scratch.
template <bool InnerNodes, class Tree, class Store>
tree_bytes count_tree_bytes(const Tree& tree, const Store& store, node_id guarded_end, node_id guarded_partial,
                            std::vector<char>& marked, bool protect_branches = false) {
  reserve_geometric(marked, tree.id_bound());
  marked.assign(tree.id_bound(), 0);
  auto mark = [&](node_id n) {
    for (; n != no_node && n != Tree::root() && marked[n] == 0; n = tree.at(n).parent) marked[n] = 1;
  };
  mark(guarded_end);
  mark(guarded_partial);
  for (node_id n = 1; n < tree.id_bound(); ++n)
    if (tree.live(n) && tree.at(n).pins > 0) mark(n);
  tree_bytes out;
  for (node_id n = 1; n < tree.id_bound(); ++n) {
    if (!tree.live(n)) continue;
    const auto& nd = tree.at(n);
    const std::int64_t kv = store.kv_bytes(nd.edge());
    const std::int64_t ck = nd.has_checkpoint ? store.checkpoint_bytes() : 0;
    out.total += kv + ck;
    if (marked[n] == 0) continue;
    out.protected_ += kv;
    if (ck == 0) continue;
    // A branch point the scorer protects keeps its state while it has a child, and a node on
    // a protected path (not its end) always has one.
    bool keeps = !InnerNodes || nd.pins > 0 || n == guarded_end || n == guarded_partial || (protect_branches && nd.branched);
    if (!keeps) {
      int protected_children = 0;
      for (node_id ch = nd.first_child; ch != no_node; ch = tree.at(ch).next_sibling) protected_children += marked[ch];
      keeps = protected_children >= 2;
    }
    if (keeps) out.protected_ += ck;
  }
  return out;
}

/// Scratch of `protected_bytes`: epoch-stamped marks, so a call never clears O(n) state.
struct protect_scratch {
  std::vector<std::uint32_t> mark;      ///< node -> the epoch it was last marked in
  std::vector<std::uint32_t> children;  ///< node -> its marked children (valid when marked)
  std::vector<node_id> marked;          ///< the nodes marked in this epoch
  std::uint32_t epoch = 0;
};

/// `count_tree_bytes(...).protected_`, visiting only the protected paths: the root paths of
/// the nodes in `pinned` (no_node entries are skipped) and of the two guarded nodes. Each
/// node is marked once, so the cost is O(|pinned| + nodes on those paths), not O(n); the
/// scratch grows only with the tree (amortised, geometric). `checkpoint_part`, when given,
/// receives the checkpoints' share of the result (the rest is KV).
template <bool InnerNodes, class Tree, class Store, class Pinned>
std::int64_t protected_bytes(const Tree& tree, const Store& store, node_id guarded_end, node_id guarded_partial,
                             const Pinned& pinned, protect_scratch& s, bool protect_branches = false,
                             std::int64_t* checkpoint_part = nullptr) {
  if (s.mark.size() < tree.id_bound()) {
    reserve_geometric(s.mark, tree.id_bound());
    reserve_geometric(s.children, tree.id_bound());
    reserve_geometric(s.marked, tree.id_bound());
    s.mark.resize(tree.id_bound(), 0);
    s.children.resize(tree.id_bound(), 0);
  }
  if (++s.epoch == 0) {  // wrapped: old stamps could alias the new epoch
    std::fill(s.mark.begin(), s.mark.end(), 0u);
    s.epoch = 1;
  }
  s.marked.clear();
  // Climbs from n to the root; each newly marked node adds one to its parent's count of
  // marked children, and the climb stops at the first node already marked.
  auto mark = [&](node_id n) {
    if (n == no_node || n == Tree::root() || !tree.live(n)) return;
    node_id from = no_node;
    for (; n != Tree::root(); n = tree.at(n).parent) {
      const bool already = s.mark[n] == s.epoch;
      if (!already) {
        s.mark[n] = s.epoch;
        s.children[n] = 0;
        s.marked.push_back(n);
      }
      if (from != no_node) ++s.children[n];
      if (already) return;
      from = n;
    }
  };
  mark(guarded_end);
  mark(guarded_partial);
  for (const node_id n : pinned) mark(n);
  std::int64_t out = 0, checkpoints = 0;
  for (const node_id n : s.marked) {
    const auto& nd = tree.at(n);
    out += store.kv_bytes(nd.edge());
    if (!nd.has_checkpoint) continue;
    const bool keeps = !InnerNodes || nd.pins > 0 || n == guarded_end || n == guarded_partial || s.children[n] >= 2 ||
                       (protect_branches && nd.branched);
    if (keeps) checkpoints += store.checkpoint_bytes();
  }
  if (checkpoint_part != nullptr) *checkpoint_part = checkpoints;
  return out + checkpoints;
}

}  // namespace hybridcache::prefix::detail
