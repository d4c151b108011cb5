// hybridcache/concepts/utility_scorer.hpp
//
// `utility_scorer`: which node eviction takes next and how (`evict_action`). Models:
// prefix/lru_scorer.hpp, prefix/flop_aware_scorer.hpp, prefix/gdsf_scorer.hpp,
// prefix/switching_scorer.hpp, compose/adaptive_scorer.hpp (and the reference simulator's
// scorer in the harness, sim/reference/reference_scorer.hpp).
//
// Three refinements the adaptive selector (compose/adaptive_scorer.hpp) is built from:
// - `replicable_scorer`: makes a fresh, empty scorer with its own options (a shadow's);
// - `switchable_scorer`: several eviction rules kept over one live tree, one of them
//   followed at a time (a rule's index rebuilt, where it was suspended, when it is followed
//   again);
// - `request_observer`: sees every request the cache commits (the shadows' input).
//
// And the optional capabilities the cache (and the switching scorer, for its parts) uses
// where a scorer has them, each a named concept here rather than an unnamed probe at the
// call site: `inner_node_evicting_scorer`, `inner_node_reporting_scorer`,
// `branch_protecting_scorer`, `alpha_settable_scorer`, `reservable_scorer`,
// `rebuildable_scorer`, `store_aware_scorer`, `refusal_observer`, `victim_observer`,
// `byte_accounting_scorer`.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>

#include "hybridcache/concepts/ids.hpp"

namespace hybridcache {

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

/// A scorer that can make a fresh copy of itself: same options, empty index (the
/// adaptive selector runs one per candidate rule in a metadata-only shadow cache).
template <class S>
concept replicable_scorer = requires(const S& cs) {
  { cs.replica() } -> std::same_as<S>;
};

/// A scorer holding several eviction rules over one live tree, following one at a time
/// (prefix/switching_scorer.hpp):
/// - `rules()`: how many rules it holds; `active_rule()`: the one eviction follows now;
/// - `switch_to(rule, alpha)`: follow `rule` from the next eviction on, with FLOP weight
///   `alpha` where the rule has one; false (nothing changes) for a rule out of range or a
///   bad alpha. O(1) itself; a rule whose index was not kept current while another was
///   followed rebuilds it at the next hook (the model's cost block says what that costs).
template <class S, class Tree>
concept switchable_scorer = utility_scorer<S, Tree> && requires(S& s, const S& cs, std::size_t i, double a) {
  { cs.rules() } noexcept -> std::same_as<std::size_t>;
  { cs.active_rule() } noexcept -> std::same_as<std::size_t>;
  { s.switch_to(i, a) } noexcept -> std::same_as<bool>;
};

/// A scorer that watches the request stream. The prefix cache calls
/// `observe_request(sequence, input_tokens, salt)` once per request it inserts (`commit`,
/// `request_lifecycle::finish`), after the call's argument checks and before it changes
/// anything (so a throw leaves the cache unchanged), with the sequence (input ++ output),
/// the input's length and the namespace.
template <class S>
concept request_observer = requires(S& s, std::span<const token_id> seq, std::int64_t n, const cache_salt& salt) {
  s.observe_request(seq, n, salt);
};

// --- Optional capabilities. A scorer without one gets the default the comment names. ---

/// A `request_observer` that also takes the live cache's own hit on the request:
/// `observe_request(sequence, input_tokens, salt, live_reused)`, `live_reused` the ids before
/// which the live cache's prefill resumed (its HBM match, or a lower tier's hit it loaded;
/// 0 for a miss). The cache calls this form when the scorer has it (the adaptive selector's
/// baseline guard compares the live cache with its baseline shadow). A negative
/// `live_reused` (`live_hit_not_comparable`) says the hit cannot be compared with a
/// shadow's: another request was in flight between the live cache's match and this insert
/// (a shadow replays each request whole, one at a time), so from then on the live cache's
/// hits and contents differ from a shadow's for reasons that are not its rule.
inline constexpr std::int64_t live_hit_not_comparable = -1;

template <class S>
concept live_hit_observer =
    request_observer<S> &&
    requires(S& s, std::span<const token_id> seq, std::int64_t n, const cache_salt& salt, std::int64_t live_reused) {
      s.observe_request(seq, n, salt, live_reused);
    };

/// `S::evicts_inner_nodes` is true: single-child nodes are victims too (merged into their
/// child or tombstoned), so the cache's fit check may count every unpinned checkpoint as
/// freeable. Default: leaves only.
template <class S>
concept inner_node_evicting_scorer = requires { requires S::evicts_inner_nodes; };

/// Says at run time whether the rule it follows now takes inner nodes
/// (`takes_inner_nodes()`, a switching scorer's followed part). Overrides
/// `inner_node_evicting_scorer` where both hold.
template <class S>
concept inner_node_reporting_scorer = requires(const S& cs) {
  { cs.takes_inner_nodes() } noexcept -> std::convertible_to<bool>;
};

/// `protects_branches()`: branch points are never candidates, so the fit check keeps them.
/// Default: no protection.
template <class S>
concept branch_protecting_scorer = requires(const S& cs) {
  { cs.protects_branches() } noexcept -> std::convertible_to<bool>;
};

/// A FLOP weight that can be set: `set_alpha(a)` (Marconi's tuner, the switching and
/// adaptive scorers). Default: the weight is fixed.
template <class S>
concept alpha_settable_scorer = requires(S& s, double a) { s.set_alpha(a); };

/// Sizes its index ahead of time: `reserve(ids)` with the node ids the tree may reach, so
/// the hooks do not allocate in steady state. Default: the index grows as it goes.
template <class S>
concept reservable_scorer = requires(S& s, std::size_t ids) { s.reserve(ids); };

/// Reports the heap bytes its index holds: `memory_bytes()` (prefix_cache::memory_bytes adds
/// it to the tree's). Default: counted as 0, so a scorer that holds memory should report it.
template <class S>
concept memory_reporting_scorer = requires(const S& s) {
  { s.memory_bytes() } -> std::convertible_to<std::int64_t>;
};

/// Can stop keeping its eviction index current and rebuild it later from the tree:
/// `suspend_index()` (from then on the hooks record only what the rule needs besides its
/// index, e.g. last-access stamps, and `select_victim` is not called) and
/// `resume_index(tree)` (the index rebuilt from the live nodes; the victims from then on are
/// those of an index kept current throughout). A switching scorer suspends the parts it does
/// not follow. Default: the index is kept current on every hook.
template <class S, class Tree>
concept rebuildable_scorer = requires(S& s, const Tree& ctree) {
  { s.suspend_index() } noexcept -> std::same_as<void>;
  { s.resume_index(ctree) } noexcept -> std::same_as<void>;
};

/// Learns the cache's store and configuration once, when the cache is built:
/// `attach_store(store, config)` (the adaptive selector builds its shadows from them).
template <class S, class Store, class Config>
concept store_aware_scorer = requires(S& s, const Store& store, const Config& cfg) { s.attach_store(store, cfg); };

/// Sees the requests the lifecycle refused at begin (computed uncached):
/// `observe_refused(sequence, input_tokens, salt)`, as `request_observer` sees the others.
template <class S>
concept refusal_observer = requires(S& s, std::span<const token_id> seq, std::int64_t n, const cache_salt& salt) {
  s.observe_refused(seq, n, salt);
};

/// A switching scorer's part told each victim another part chose:
/// `observe_victim(view, victim)` (GDSF advances its clock by it).
template <class S, class View>
concept victim_observer = requires(S& s, const View& view, node_id v) { s.observe_victim(view, v); };

/// Counts an eviction's freed bytes its own way: `accounted_bytes(tree, victim, action,
/// actual)` is what the cache subtracts from the bytes it still has to free (the
/// reference simulator's accounting). Default: the bytes actually freed.
template <class S, class Tree>
concept byte_accounting_scorer = requires(S& s, const Tree& tree, node_id v, evict_action act, std::int64_t actual) {
  { s.accounted_bytes(tree, v, act, actual) } -> std::convertible_to<std::int64_t>;
};

}  // namespace hybridcache
