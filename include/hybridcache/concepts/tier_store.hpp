// hybridcache/concepts/tier_store.hpp
//
// The seams of a `state_store` with a tier below HBM, as the request lifecycle
// (prefix/lifecycle.hpp) and the prefix cache's eviction drive it. Each is a named concept
// the runtime dispatches on with `if constexpr`, so no runtime code probes a store's members:
//
//   lower_tier_store<S, Tree>    hits below HBM: lookup, load, wait, land, settle, release,
//                                one protocol for every store with tiers below HBM
//                                (tiered_state_store stages a hit in its own HBM room;
//                                pool_state_store lands it in the request's reservation)
//   layered_tier_store<S, Tree>  ... whose loads land layer by layer (over a
//                                layered_copy_engine): layer_loaded, wait_layer
//   demoting_store<S, Tree>      copies a leaf the cache evicts to its lower tier first
//                                (pool_state_store's host tier)
//   replicable_tier_store<S>     makes an empty metadata-only replica of itself (the
//                                adaptive selector's tier-aware shadows)
//
// `Tree` is the prefix cache's radix tree (prefix::radix_tree<S>), a parameter so that
// concepts/ does not depend on prefix/ above it, as `utility_scorer<S, Tree>` does. The
// typed conformance suites are in tests/conformance/test_tier_store.cpp.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

#include "hybridcache/concepts/ids.hpp"
#include "hybridcache/concepts/match_result.hpp"
#include "hybridcache/concepts/state_store.hpp"
#include "hybridcache/core/expected.hpp"
#include "hybridcache/model/model_spec.hpp"

namespace hybridcache {

/// The hit `S::lookup(input, match)` returns (well-formed only for a store that has one).
template <class S>
using lower_tier_hit_t =
    decltype(std::declval<S&>().lookup(std::declval<std::span<const token_id>>(), std::declval<const match_result&>()));

/// A store whose lower tiers hold what HBM evicted, and from which a request loads a hit
/// below HBM. Calls, in the order the request lifecycle makes them (its file comment tells
/// the whole protocol):
/// - `lookup(input, m)` -> hit: what continues HBM's match `m` below HBM, pinned. The hit
///   says where prefill may start (`reusable_tokens`), how much of that HBM holds
///   (`hbm_tokens`), what comes from below (`host_tokens`, 0: no hit), the first token whose
///   KV it brings (`kv_first`: the tree must hold the KV before it), how far the input's KV
///   is found in any tier (`kv_reach`, the branch point admission sees) and the namespace
///   (`salt`).
/// - `shorten_hit(hit, n)`: keeps only what resumes at `n` (`expected<void>`; refused where
///   no state can be resumed at `n`).
/// - `load(hit)`: submits the copies into the store's HBM staging room, if it has one;
///   `loaded(hit)` (without blocking) and `wait_loaded(hit)` say when they landed (busy: a
///   copy failed, the hit is gone).
/// - `land(hit, kv, kv_first, slot)` (noexcept), once the request's reservation is made: a
///   store whose hits land in the reservation (`S::lands_in_reservation`) copies the hit's
///   KV of [kv_first, reusable_tokens) into the reserved extent `kv` and its state into the
///   reserved `slot`; a store that staged the hit does nothing here.
/// - `settle(tree, sequence, hit)`: after the commit, names the committed path (so its
///   evicted nodes demote) and hands staged pages to the new nodes without a copy.
/// - `release_hit(hit)` (noexcept): gives a hit up (a declined or aborted one).
template <class S, class Tree>
concept lower_tier_store =
    state_store<S> && requires(S& st, std::span<const token_id> in, const match_result& m) { st.lookup(in, m); } &&
    std::default_initializable<lower_tier_hit_t<S>> && std::copyable<lower_tier_hit_t<S>> &&
    requires(S& st, const Tree& tree, std::span<const token_id> seq, lower_tier_hit_t<S>& hit,
             const lower_tier_hit_t<S>& chit, std::int64_t n, const typename S::kv_extent& kv,
             const typename S::checkpoint_handle& slot) {
      { S::lands_in_reservation } -> std::convertible_to<bool>;
      { st.shorten_hit(hit, n) } -> std::same_as<expected<void>>;
      { st.load(chit) } -> std::same_as<expected<void>>;
      { st.loaded(chit) } -> std::same_as<expected<bool>>;
      { st.wait_loaded(chit) } -> std::same_as<expected<void>>;
      { st.land(chit, kv, n, slot) } noexcept;
      st.settle(tree, seq, chit);
      { st.release_hit(chit) } noexcept;
      { chit.reusable_tokens } -> std::convertible_to<std::int64_t>;
      { chit.hbm_tokens } -> std::convertible_to<std::int64_t>;
      { chit.host_tokens } -> std::convertible_to<std::int64_t>;
      { chit.kv_first } -> std::convertible_to<std::int64_t>;
      { chit.kv_reach } -> std::convertible_to<std::int64_t>;
      { chit.salt } -> std::convertible_to<cache_salt>;
    };

/// A `lower_tier_store` whose loads land layer by layer, so prefill can compute layer l
/// while later layers are still being copied: `layer_loaded(hit, kind, layer)` says
/// (without blocking) whether that layer of every staged entry is in HBM, `wait_layer`
/// blocks until it is (tiered_state_store over a `layered_copy_engine`).
template <class S, class Tree>
concept layered_tier_store =
    lower_tier_store<S, Tree> && requires(S& st, const lower_tier_hit_t<S>& hit, layer_kind k, std::int32_t layer) {
      { st.layer_loaded(hit, k, layer) } -> std::same_as<expected<bool>>;
      { st.wait_layer(hit, k, layer) } -> std::same_as<expected<void>>;
    };

/// A store that keeps what the cache evicts: `demote(tree, v)` (noexcept) copies leaf `v`'s
/// KV and checkpoint to the store's lower tier; the cache calls it just before it frees a
/// leaf's handles (pool_state_store: its host tier, when it has one).
template <class S, class Tree>
concept demoting_store = state_store<S> && requires(S& st, const Tree& tree, node_id v) {
  { st.demote(tree, v) } noexcept;
};

/// A store with tiers that can make an empty, metadata-only replica of itself (same tiers,
/// capacities and policies; no bytes): `config()` is what it was built from,
/// `metadata_replica(config)` a `state_store` built from a (perhaps edited) copy of it, and
/// `tier_count()` its tiers, HBM included. The adaptive selector replays its candidate rules
/// on such replicas (compose/adaptive_scorer.hpp).
template <class S>
concept replicable_tier_store = state_store<S> && requires(const S& cs) {
  { cs.metadata_replica(cs.config()) } -> state_store;
  { cs.tier_count() } -> std::convertible_to<std::size_t>;
};

}  // namespace hybridcache
