// hybridcache/concepts/utility_scorer.hpp
//
// `utility_scorer`: which node eviction takes next and how (`evict_action`). Models:
// prefix/lru_scorer.hpp, prefix/flop_aware_scorer.hpp (and the reference simulator's
// scorer in the harness, sim/reference/reference_scorer.hpp).
#pragma once

#include <concepts>
#include <span>

#include "hybridcache/concepts/ids.hpp"

namespace hybridcache::prefix {

/// How eviction takes a victim node.
enum class evict_action : unsigned char {
  remove_leaf,       ///< delete the leaf: its KV and checkpoint are freed
  merge_into_child,  ///< drop a single-child node's checkpoint; its KV moves into the child
  drop_checkpoint,   ///< tombstone: free the checkpoint, keep the node and its KV
};

/// Chooses eviction victims and decides which nodes a hit refreshes.
///
/// `Tree` is `radix_tree<Store>`; a scorer reads nodes through it and stamps last-access
/// times with `tree.touch(n, now)`. Calls the cache makes (all `noexcept`, no allocation
/// beyond the scorer's own amortised index growth):
/// - `on_match(tree, path, partial, now)`: a lookup walked `path` (fully matched nodes,
///   root first; the root is not in it) and maybe entered `partial` (the child matched
///   only in part, or `no_node`); the scorer stamps what its rule refreshes (LRU: the whole
///   path; FLOP-aware: only the deepest node with a checkpoint).
/// - `on_insert_path(tree, path, now)`: `commit` walked these existing nodes.
/// - `on_update(tree, n)`: node `n` was created, stamped, pinned/unpinned, gained or lost a
///   child, a checkpoint or edge tokens: re-index it.
/// - `on_erase(tree, n)`: node `n` is about to be freed: forget it.
/// - `select_victim(tree, now)`: the next victim among unpinned candidates, or `no_node`.
/// - `action(tree, n)`: how to evict the victim `n`.
/// - `alpha()`: the current FLOP-efficiency weight (0 for recency-only scorers).
template <class S, class Tree>
concept utility_scorer = requires(S& s, const S& cs, Tree& tree, const Tree& ctree, std::span<const node_id> path,
                                  node_id n, time_point now) {
  { s.on_match(tree, path, n, now) } noexcept -> std::same_as<void>;
  { s.on_insert_path(tree, path, now) } noexcept -> std::same_as<void>;
  { s.on_update(ctree, n) } noexcept -> std::same_as<void>;
  { s.on_erase(ctree, n) } noexcept -> std::same_as<void>;
  { s.select_victim(ctree, now) } noexcept -> std::same_as<node_id>;
  { cs.action(ctree, n) } noexcept -> std::same_as<evict_action>;
  { cs.alpha() } noexcept -> std::convertible_to<double>;
};

}  // namespace hybridcache::prefix
