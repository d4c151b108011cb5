// hybridcache/concepts/prefix.hpp
//
// The seams of `prefix_cache<Model, Admission, Scorer, Store, Lock>`, as C++20 concepts on
// the exact calls the cache makes. Each policy header puts `static_assert(concept<model>)`
// right under every model; tests/prefix holds negative cases.
//
//   prefix_cost_model  what the cache asks of the cost model (bytes, FLOPs, scan chunk)
//   state_store        where KV of cached tokens and SSM checkpoints live (bytes-only
//                      counting store for simulation; the asymmetric pool of
//                      hybridcache/memory hands back real page/checkpoint handles)
//   admission_policy   which token positions of a committed sequence keep an SSM state
//   utility_scorer     which node eviction takes next, and how it is taken
//   lock_policy        how concurrent match/commit/release are serialised
//
// These signatures are stable: later changes stay source compatible.
#pragma once

#include <concepts>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "hybridcache/core/expected.hpp"
#include "hybridcache/prefix/types.hpp"

namespace hybridcache::prefix {

// --- cost model ----------------------------------------------------------------------

/// What the cache reads from its cost model (`hybridcache::cost_model` models it).
///
/// - `kv_bytes_per_token()`, `ssm_checkpoint_bytes()`: the byte demand of a commit, used
///   to evict before allocating (one checkpoint must fit in the store, else the cache
///   constructor throws `capacity_error`).
/// - `hit_flops(s)`: FLOPs saved by a hit of `s` tokens (`match_result::flops_saved`).
/// - `saved_flops(p, L)`: marginal FLOPs of a node covering tokens (p, L] (FLOP-aware
///   eviction).
/// - `spec().scan_chunk`: the chunk size C of the chunked scan (`plan`).
template <class M>
concept prefix_cost_model = requires(const M& m, std::int64_t n) {
  { m.kv_bytes_per_token() } -> std::convertible_to<std::int64_t>;
  { m.ssm_checkpoint_bytes() } -> std::convertible_to<std::int64_t>;
  { m.hit_flops(n) } -> std::convertible_to<std::int64_t>;
  { m.saved_flops(n, n) } -> std::convertible_to<std::int64_t>;
  { m.spec().scan_chunk } -> std::convertible_to<std::int64_t>;
};

// --- state store ---------------------------------------------------------------------

/// Where the cached state lives. A node of the tree owns one `kv_extent` (the KV of its
/// edge's tokens, in every attention layer) and at most one `checkpoint_handle` (the SSM
/// and conv state of every recurrent layer after the edge's last token).
///
/// Calls the cache makes, all `noexcept` (hot path; failures are `errc` values):
/// - `allocate_kv(n)` -> `expected<kv_extent>`: KV room for `n >= 1` tokens, or
///   `errc::out_of_capacity`. On failure the cache evicts and retries; the store must be
///   unchanged by a failed call.
/// - `free_kv(kv_extent&&)`: gives an extent back (never fails).
/// - `split_kv(kv_extent& whole, n)` -> `expected<kv_extent>`: detaches the first `n`
///   tokens (0 < n < tokens of `whole`) into a new extent; `whole` keeps the rest. Used when
///   an insert splits an edge. May fail (e.g. a paged store that must copy a shared page);
///   then `whole` is unchanged and the commit is rolled back.
/// - `join_kv(kv_extent& front, kv_extent&& back)` -> `expected<void>`: `front` becomes
///   front ++ back (KV absorption when a single-child node is evicted into its child). On
///   failure both are unchanged and the cache drops only the checkpoint (tombstone).
/// - `allocate_checkpoint()` -> `expected<checkpoint_handle>`, `free_checkpoint(h&&)`.
/// - `kv_bytes(n)`, `checkpoint_bytes()`: bytes a future allocation will take, so the cache
///   can evict what is missing in one eviction round (the reference's rule) before it
///   allocates; `used_bytes()`, `capacity_bytes()`: current use and the budget.
///
/// A counting store (`counting_store`) makes both handle types empty structs and only
/// counts bytes. A real store returns page lists / pool slots; both handle types must be
/// default constructible (an empty handle) and movable.
template <class S>
concept state_store =
    std::default_initializable<typename S::kv_extent> && std::movable<typename S::kv_extent> &&
    std::default_initializable<typename S::checkpoint_handle> && std::movable<typename S::checkpoint_handle> &&
    requires(S& s, const S& cs, typename S::kv_extent& kv, typename S::checkpoint_handle& ck, std::int64_t n) {
      { s.allocate_kv(n) } noexcept -> std::same_as<expected<typename S::kv_extent>>;
      { s.free_kv(std::move(kv)) } noexcept -> std::same_as<void>;
      { s.split_kv(kv, n) } noexcept -> std::same_as<expected<typename S::kv_extent>>;
      { s.join_kv(kv, std::move(kv)) } noexcept -> std::same_as<expected<void>>;
      { s.allocate_checkpoint() } noexcept -> std::same_as<expected<typename S::checkpoint_handle>>;
      { s.free_checkpoint(std::move(ck)) } noexcept -> std::same_as<void>;
      { cs.kv_bytes(n) } noexcept -> std::same_as<std::int64_t>;
      { cs.checkpoint_bytes() } noexcept -> std::same_as<std::int64_t>;
      { cs.used_bytes() } noexcept -> std::same_as<std::int64_t>;
      { cs.capacity_bytes() } noexcept -> std::same_as<std::int64_t>;
    };

// --- admission -----------------------------------------------------------------------

/// What speculative insertion knows about a sequence before it is committed. Positions
/// count tokens from the start of the sequence (position p = the state after token p).
struct insertion_view {
  std::int64_t input_tokens = 0;     ///< length of the request's input (prompt)
  std::int64_t total_tokens = 0;     ///< input + output: what `commit` inserts
  std::int64_t reusable_tokens = 0;  ///< where prefill started (joint-min match of the input)
  std::int64_t common_prefix = 0;    ///< longest common prefix of the sequence with the tree
  /// The position where inserting the sequence splits an existing edge (the "branch
  /// point" of Marconi's speculative insertion), or 0 when the insert does not split an edge.
  std::int64_t branch_point = 0;
};

/// Chooses the positions whose SSM state a committed sequence keeps.
///
/// The cache calls `a.select(view, out)` once per `plan` and per `commit` with `out`
/// empty; the policy appends positions in (view.reusable_tokens, view.total_tokens]
/// (only states that this request's prefill or decode actually computed), in any order
/// (the cache sorts and de-duplicates). Application-directed positions are merged in by the
/// cache afterwards. `out` keeps its capacity across calls, so steady state allocates nothing.
/// A position the policy returns that lies inside an existing edge splits it; one at an
/// existing node end without a checkpoint gives that node one.
template <class A>
concept admission_policy = requires(const A& a, const insertion_view& v, std::vector<std::int64_t>& out) {
  { a.select(v, out) } noexcept -> std::same_as<void>;
};

// --- eviction scoring ----------------------------------------------------------------

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

// --- locking -------------------------------------------------------------------------

/// Serialises `match`, `plan`, `commit` and `release` when several threads share a cache.
/// The cache holds the lock for the whole call (`lock()` ... `unlock()`); `no_lock` makes
/// both empty so a single-threaded cache pays nothing.
template <class L>
concept lock_policy = std::default_initializable<L> && requires(L& l) {
  { l.lock() } -> std::same_as<void>;
  { l.unlock() } -> std::same_as<void>;
};

}  // namespace hybridcache::prefix
