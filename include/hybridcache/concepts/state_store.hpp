// hybridcache/concepts/state_store.hpp
//
// `state_store`: where the prefix cache's KV of cached tokens and SSM checkpoints live.
// Models (stores/): counting_store (bytes only, for simulation), pool_state_store (pages
// and checkpoint blocks of the asymmetric pool), tiered_state_store (HBM + lower tiers).
// What a store may offer beyond it, each a named concept the prefix cache and the request
// lifecycle dispatch on (never a probe of a member): `paged_state_store` (KV at absolute
// token positions: block tables), `side_placing_store` (two sides that cannot lend each
// other units), `model_checked_store`; the lower-tier seams are in concepts/tier_store.hpp.
// The typed conformance suite is tests/conformance.
#pragma once

#include <concepts>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "hybridcache/core/expected.hpp"
#include "hybridcache/core/handle.hpp"

namespace hybridcache {

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
/// - `S::holds(h)` (static): whether checkpoint handle `h` holds a state; false for the
///   empty (default-constructed, or moved-from) handle. The request lifecycle asks it of the
///   slots it reserved, to tell those still its own from those handed to the tree. O(1).
///
/// A counting store (`counting_store`) makes both handle types near-empty structs and only
/// counts bytes. A real store returns page lists / pool slots; both handle types must be
/// default constructible (an empty handle) and movable.
template <class S>
concept state_store =
    std::default_initializable<typename S::kv_extent> && std::movable<typename S::kv_extent> &&
    std::default_initializable<typename S::checkpoint_handle> && std::movable<typename S::checkpoint_handle> &&
    requires(S& s, const S& cs, typename S::kv_extent& kv, typename S::checkpoint_handle& ck,
             const typename S::checkpoint_handle& cck, std::int64_t n) {
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
      { S::holds(cck) } noexcept -> std::same_as<bool>;
    };

/// A `state_store` that lays KV out at absolute token positions, so that the pages of a
/// sequence's extents, block by block, form a kernel's block table (pool_state_store). The
/// prefix cache then allocates every extent at its position, and the request lifecycle hands
/// out block tables and copies a shared partial block on write.
/// - `allocate_kv_at(first, n)`: KV for tokens [first, first + n), token t in slot
///   t % tokens_per_page() of its block; `kv_bytes_at(first, n)` the bytes it takes.
/// - `copy_tokens(src, src_first, dst, dst_first, from, to)`: copies the KV of positions
///   [from, to) between two such extents (whose tokens start at src_first / dst_first).
/// - `append_pages(e, first, layer, from_block, out)`: appends attention layer `layer`'s
///   page of every block of `e` from absolute block `from_block` on.
/// - `tokens_per_page()`, `attention_layers()`.
template <class S>
concept paged_state_store =
    state_store<S> && requires(S& s, const S& cs, const typename S::kv_extent& e, std::int64_t n,
                               std::vector<packed_handle>& out) {
      { s.allocate_kv_at(n, n) } noexcept -> std::same_as<expected<typename S::kv_extent>>;
      { cs.kv_bytes_at(n, n) } noexcept -> std::same_as<std::int64_t>;
      s.copy_tokens(e, n, e, n, n, n);
      cs.append_pages(e, n, n, n, out);
      { cs.tokens_per_page() } noexcept -> std::same_as<std::int64_t>;
      { cs.attention_layers() } noexcept -> std::same_as<std::int64_t>;
    };

/// A request's bytes on each side of a store whose KV and checkpoints live in two pools that
/// cannot lend each other free units on demand (an asymmetric pool: KV pages and SSM blocks).
struct side_bytes {
  std::int64_t kv = 0;          ///< KV extents (whole pages, as the store lays them out)
  std::int64_t checkpoint = 0;  ///< checkpoints
  [[nodiscard]] constexpr std::int64_t total() const noexcept { return kv + checkpoint; }
};

/// A `state_store` that can tell whether a request fits on each side, not only in bytes:
/// a byte count that fits may still not be placeable (the KV side full while the SSM side
/// is free). The cache uses it to refuse such a request before evicting anything
/// (prefix_cache::fits_after_eviction), then evicts until the request can be placed and
/// allocates with the side split held still, so that no allocation can fail after evicting.
/// - `placement_fits(need, freed)`: true when `need` can be placed with the current split
///   once `freed` (per side) has been given back. O(1).
/// - `prepare_placement(need)`: lets the store move free capacity between the sides for a
///   side that is short now (a pool's rebalancer), before any eviction; it moves no live
///   unit and no handle. O(chunks moved).
/// - `hold_split(bool)`: while held, allocations never move capacity between the sides (a
///   migration there could take free units the other side was counted on). O(1).
/// - `placement_fits_when_empty(need)`: true when `need` could be placed in an empty store
///   (the sides re-split as units free up): the lifecycle's last resort, which evicts one
///   victim at a time until a request that nothing else holds room for fits. O(1).
/// - `kv_bytes_at(first, n)`: the bytes `allocate_kv_at(first, n)` takes (a run that starts
///   inside a block takes one more page set than `kv_bytes(n)`).
template <class S>
concept side_placing_store = state_store<S> && requires(S& s, const S& cs, side_bytes b, std::int64_t n, bool on) {
  { cs.placement_fits(b, b) } noexcept -> std::same_as<bool>;
  { cs.placement_fits_when_empty(b) } noexcept -> std::same_as<bool>;
  { s.prepare_placement(b) } noexcept -> std::same_as<void>;
  { s.hold_split(on) } noexcept -> std::same_as<void>;
  { cs.kv_bytes_at(n, n) } noexcept -> std::same_as<std::int64_t>;
};

/// A store that can check it lays out a model right (`check_model(model)` throws
/// invalid_argument naming what differs: layer counts, page and state block sizes). The
/// prefix cache calls it from its constructor, so that a store built for another model,
/// or with a page that holds the wrong number of tokens, is refused before it is used.
template <class S, class Model>
concept model_checked_store = state_store<S> && requires(const S& cs, const Model& m) { cs.check_model(m); };

/// The least a `state_store` may be: every call present with the required signature, no
/// behaviour. Policies that are written against `radix_tree<Store>` (the scorers) check
/// themselves against `radix_tree<state_store_archetype>` right under their definition, so
/// that prefix/ never needs a concrete store from stores/ above it. Never instantiate one
/// for real use.
struct state_store_archetype {
  struct kv_extent {};
  struct checkpoint_handle {};
  expected<kv_extent> allocate_kv(std::int64_t) noexcept { return kv_extent{}; }
  void free_kv(kv_extent&&) noexcept {}
  expected<kv_extent> split_kv(kv_extent&, std::int64_t) noexcept { return kv_extent{}; }
  expected<void> join_kv(kv_extent&, kv_extent&&) noexcept { return {}; }
  expected<checkpoint_handle> allocate_checkpoint() noexcept { return checkpoint_handle{}; }
  void free_checkpoint(checkpoint_handle&&) noexcept {}
  [[nodiscard]] std::int64_t kv_bytes(std::int64_t) const noexcept { return 0; }
  [[nodiscard]] std::int64_t checkpoint_bytes() const noexcept { return 0; }
  [[nodiscard]] std::int64_t used_bytes() const noexcept { return 0; }
  [[nodiscard]] std::int64_t capacity_bytes() const noexcept { return 0; }
  [[nodiscard]] static bool holds(const checkpoint_handle&) noexcept { return false; }
};
static_assert(state_store<state_store_archetype>);

}  // namespace hybridcache
