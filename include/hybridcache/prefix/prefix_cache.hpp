// hybridcache/prefix/prefix_cache.hpp
//
// `prefix_cache<Model, Admission, Scorer, Store, Lock>`: the hybrid prefix cache of
// Marconi (Pan et al., MLSys 2025), as static policies over one radix tree.
//
// A request's life:
//   auto m = cache.match(input);              // joint-min hit; pins the checkpoint node
//   auto p = cache.plan(input, *m);           // where prefill must save SSM states
//   ... prefill from m->reusable_tokens, decode ...
//   cache.commit(input ++ output, input.size(), &*m);   // admit; releases the pin
// (or `release(m)` when the request is abandoned).
//
// Joint-min rule: a hit is usable only up to the end of a node that holds an SSM checkpoint
// and whose whole root path has KV (every node on the path does). Reusing KV past the last
// checkpoint would start the recurrent layers from a wrong state (vLLM PR #47491).
//
// Logical clock, ticking exactly like the reference simulator (anchors/marconi.md, checklist
// item 1): +1 per `match`; +2 per `commit` (the reference's `insert` and the `match_prefix`
// inside it; the scorer's refresh rule runs at the second tick); +1 per eviction round.
//
// Commit: walk the sequence (the scorer refreshes what it refreshes on a lookup), ask the
// admission policy for checkpoint positions (speculative insertion: the branch point is where
// the sequence leaves an existing edge), add application-directed positions, estimate the
// bytes of new KV and new checkpoints, evict the deficit in one round (`used + needed -
// capacity`, the reference's rule), then walk again (eviction may have changed the path),
// allocate every new handle (on failure: free them, evict one more victim, retry), and only
// then mutate the tree: split edges at checkpoint positions and append the new tokens as a
// chain of nodes ending at the admitted positions.
//
// Costs (|s| = sequence length, d = nodes on its path, n = cached nodes):
//   match    O(|s| + d) token compares (a memcmp per edge) + scorer refresh (O(d log n) LRU,
//            O(log n) FLOP-aware); no allocation in steady state.
//   plan     O(|s| + d + positions).
//   commit   O(|s| + d + positions·log) + evictions; allocates only the new edges' token
//            storage (reused from freed nodes when possible) and index growth. When it
//            must evict, the fit check over the pinned paths (O(pin slots + nodes on those
//            paths)) runs first; for a two-sided store (side_placing_store: an asymmetric
//            pool) the same walk splits the protected bytes into KV and checkpoints and the
//            store checks each side in O(1), so a request whose bytes fit but whose pages
//            one side cannot place is refused before any eviction, at no extra cost.
//            commit and request_lifecycle::finish share one insert (insert_sequence).
//   evict    per victim: LRU O(log n); FLOP-aware O((k+1) log n), k = nodes the threshold
//            walk scores (flop_aware_scorer.hpp).
//   release  O(log n).
//   memory_bytes  O(id bound) (the heap bytes of the tree, the scorer's index, scratch).
//
// Thread safety: `Lock` (lock_policy.hpp); with `mutex_lock` every public call holds one
// mutex for its whole duration.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <limits>
#include <mutex>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "hybridcache/model/cost_model.hpp"
#include "hybridcache/core/error.hpp"
#include "hybridcache/core/expected.hpp"
#include "hybridcache/core/handle.hpp"
#include "hybridcache/core/logical_clock.hpp"
#include "hybridcache/prefix/admission.hpp"
#include "hybridcache/prefix/detail/memory_bytes.hpp"
#include "hybridcache/prefix/detail/tree_ops.hpp"
#include "hybridcache/concepts/admission.hpp"
#include "hybridcache/concepts/cost_model.hpp"
#include "hybridcache/concepts/lock.hpp"
#include "hybridcache/concepts/state_store.hpp"
#include "hybridcache/concepts/utility_scorer.hpp"
#include "hybridcache/prefix/lock_policy.hpp"
#include "hybridcache/prefix/lru_scorer.hpp"
#include "hybridcache/prefix/radix_tree.hpp"
#include "hybridcache/prefix/types.hpp"

namespace hybridcache::prefix {

template <class Cache>
class request_lifecycle;

/// Cache options (aggregate).
struct prefix_cache_config {
  /// Simulate the Marconi reference's commit, for a byte-counting replay only: a commit
  /// whose new state alone exceeds the store's capacity is inserted anyway (pair with a
  /// store that allows overflow), and the commit's evictions may take the very prefix it
  /// extends (the reference releases the match before evicting). Off (the default, and the
  /// only setting for a store that holds real bytes): a commit that cannot fit beside the
  /// pinned paths and the prefix it extends returns `errc::out_of_capacity` and changes
  /// nothing, and a commit never evicts the prefix it extends.
  bool admit_oversized = false;
};

/// The hybrid prefix cache. See the file comment.
///
/// @tparam Model      cost model (`prefix_cost_model`), normally `hybridcache::cost_model`
/// @tparam Admission  `judicious_admission`, `every_block_admission<B>`, `no_admission`
/// @tparam Scorer     `lru_scorer`, `flop_aware_scorer`, `reference_flop_scorer`
/// @tparam Store      a `state_store`: `stores::counting_store` (bytes only, for simulation)
///                    or a real store (`stores::pool_state_store`, `stores::tiered_state_store`)
/// @tparam Lock       `no_lock` (default) or `mutex_lock`
template <prefix_cost_model Model, admission_policy Admission, class Scorer, state_store Store, lock_policy Lock = no_lock>
  requires utility_scorer<Scorer, radix_tree<Store>>
class prefix_cache {
 public:
  using model_type = Model;
  using admission_type = Admission;
  using scorer_type = Scorer;
  using store_type = Store;
  using tree_type = radix_tree<Store>;
  using lock_type = Lock;

  /// @throws capacity_error when the store cannot hold one SSM checkpoint.
  prefix_cache(Model model, Store store, Scorer scorer, Admission admission = {}, prefix_cache_config cfg = {})
      : model_(std::move(model)),
        store_(std::move(store)),
        scorer_(std::move(scorer)),
        admission_(std::move(admission)),
        cfg_(cfg),
        pins_(next_pin_tag(), initial_ids) {
    if constexpr (model_checked_store<Store, Model>) store_.check_model(model_);
    if (store_.capacity_bytes() < store_.checkpoint_bytes())
      throw capacity_error("prefix_cache: store capacity " + std::to_string(store_.capacity_bytes()) +
                           " B is smaller than one SSM checkpoint (" + std::to_string(store_.checkpoint_bytes()) +
                           " B)");
    pin_node_.assign(initial_ids, no_node);
    pinned_scratch_.reserve(initial_ids);
    tree_.set_byte_measure(
        &store_, [](const void* st, std::int64_t tokens) noexcept { return static_cast<const Store*>(st)->kv_bytes(tokens); },
        store_.checkpoint_bytes());
    reserve_indexes(initial_ids);
    // A scorer that runs shadow caches (compose/adaptive_scorer.hpp) sizes them like the store.
    if constexpr (store_aware_scorer<Scorer, Store, prefix_cache_config>) scorer_.attach_store(store_, cfg_);
  }

  prefix_cache(const prefix_cache&) = delete;
  prefix_cache& operator=(const prefix_cache&) = delete;

  /// Gives every handle the tree holds back to the store (a cache whose store holds real
  /// pages must not leak them when it goes away).
  ~prefix_cache() { drop_all_nodes(); }

  /// Empties the cache: every node's KV and checkpoint go back to the store, the tree keeps
  /// only its root, and every outstanding match becomes stale (its release or commit
  /// reports `errc::stale_handle`). Requests in flight in a `request_lifecycle` over this
  /// cache end too: their reservations go back to the store and every call on their tickets
  /// reports `errc::stale_handle` (a runtime computing on another thread calls
  /// `request_lifecycle::clear()` instead, which also takes the memory lock). Counters and
  /// the clock keep running. O(n + requests in flight), no allocation.
  void clear() {
    std::lock_guard<Lock> guard(lock_);
    clear_locked();
  }

  // --- runtime API ---------------------------------------------------------------------

  /// Longest usable prefix of `input` under the joint-min rule, in `salt`'s namespace (none:
  /// the shared one; a request never sees another namespace's nodes); pins its checkpoint
  /// node (call `release` or pass the result to `commit`). Ticks the clock once; the scorer
  /// refreshes per its rule. Empty input: `errc::invalid_argument`, nothing changes.
  [[nodiscard]] expected<match_result> match(std::span<const token_id> input, const cache_salt& salt = std::nullopt);

  /// What `match` would find, as a pure query: no pin (`pin` is null), no tick, no refresh,
  /// no counters. For a scheduler that orders requests by their reuse. O(|input|).
  [[nodiscard]] match_result peek(std::span<const token_id> input, const cache_salt& salt = std::nullopt) {
    std::lock_guard<Lock> guard(lock_);
    match_result r;
    if (input.empty()) return r;
    salt_ = salt;
    const walk_result w = walk(input);
    r.salt = salt;
    r.input_tokens = static_cast<std::int64_t>(input.size());
    r.common_prefix = w.common_prefix;
    r.at = clock_.now();
    if (const node_id use = deepest_usable(path_, r.input_tokens); use != no_node) {
      r.node = use;
      r.reusable_tokens = tree_.at(use).end;
      r.flops_saved = saturating_flops(r.reusable_tokens);
    }
    return r;
  }

  /// Speculative insertion for the prefill of `input` after `m`: the positions where
  /// prefill must save SSM states (admission + `extra` application-directed positions),
  /// each with the chunk boundary at or before it and the roll-forward distance for the
  /// model's scan chunk C. Pure query: no tick, no refresh. Positions outside [1, |input|]
  /// in `extra`: `errc::invalid_argument`.
  [[nodiscard]] expected<checkpoint_plan> plan(std::span<const token_id> input, const match_result& m,
                                               std::span<const std::int64_t> extra = {}) {
    std::lock_guard<Lock> guard(lock_);
    checkpoint_plan out;
    salt_ = m.salt;
    if (const errc e = plan_into(input, m, extra, out); e != errc::ok) return unexpected(e);
    return out;
  }

  /// Inserts `sequence` (= input ++ output; `input_tokens` = |input|) after decode. When
  /// `m` is given, its pin is released first (the request hands its state over; eviction
  /// may then take the matched nodes, exactly like the reference). `extra` names
  /// application-directed checkpoint positions (vLLM RFC #55697), kept in addition to the
  /// admission policy's. The sequence goes into `m`'s namespace (its cache salt), or into
  /// `salt`'s when there is no `m`; both given and different -> invalid_argument.
  ///
  /// Errors (tree and store unchanged): empty sequence, input_tokens outside [0, |seq|],
  /// a position outside [1, |seq|] -> invalid_argument; with a pinned `m` (and not
  /// admit_oversized), a position in `extra` at or before `m.reusable_tokens` that holds no
  /// state -> invalid_argument (the request resumed after it and never computed it; the
  /// admission's own positions there are dropped for the same reason, and
  /// `committed_checkpoints()` says which positions were kept); `m` not a live pin -> stale_handle /
  /// double_free / foreign_handle; `sequence` does not extend `m`'s reused prefix ->
  /// invalid_argument; new state larger than the whole capacity (unless admit_oversized) ->
  /// out_of_capacity; new state that cannot fit beside the pinned paths even with every
  /// evictable node gone -> out_of_capacity before anything is evicted. With a two-sided
  /// store (side_placing_store) that check is per side: KV that the KV side cannot place is
  /// refused up front even when the bytes fit (a side short now may first borrow free chunks
  /// from the other), eviction then runs until both sides can place their part, and the
  /// allocations run with the split held. If a one-sided store still refuses an allocation
  /// after every evictable node is gone -> out_of_capacity with the tree as the evictions
  /// left it and nothing inserted.
  [[nodiscard]] expected<commit_result> commit(std::span<const token_id> sequence, std::int64_t input_tokens,
                                               const match_result* m = nullptr,
                                               std::span<const std::int64_t> extra = {},
                                               const cache_salt& salt = std::nullopt);

  /// The argument and size checks of `commit`, without changing the tree, the store or any
  /// pin: `errc::ok` when `commit` with the same arguments would get past them (it may
  /// still fail later for lack of evictable room). A wrapper that must act between the
  /// checks and the insert (`alpha_tuned_cache` records the request and may re-tune) calls
  /// this first. Cost: one walk of `sequence` and one admission call.
  [[nodiscard]] errc check_commit(std::span<const token_id> sequence, std::int64_t input_tokens,
                                  const match_result* m = nullptr, std::span<const std::int64_t> extra = {},
                                  const cache_salt& salt = std::nullopt) {
    std::lock_guard<Lock> guard(lock_);
    if (const errc e = select_salt(m, salt); e != errc::ok) return e;
    std::int64_t reusable = -1;
    return validate_commit(sequence, input_tokens, m, extra, reusable, placement_step::check_only);
  }

  /// Sets the scorer's FLOP-efficiency weight (scorers with `set_alpha` only; the next
  /// eviction uses it). @throws invalid_argument from the scorer on a bad alpha.
  void set_alpha(double a)
    requires requires(Scorer& s) { s.set_alpha(a); }
  {
    std::lock_guard<Lock> guard(lock_);
    scorer_.set_alpha(a);
  }

  /// Follows rule `rule` of a switchable scorer (switching_scorer.hpp) at FLOP weight
  /// `alpha` from the next eviction on; false (nothing changes) for a rule out of range or
  /// a bad alpha. O(1).
  bool switch_rule(std::size_t rule, double alpha)
    requires requires(Scorer& s) { s.switch_to(rule, alpha); }
  {
    std::lock_guard<Lock> guard(lock_);
    return scorer_.switch_to(rule, alpha);
  }

  /// Unpins a match that will not be committed. Releasing twice: `errc::double_free`; a
  /// result of another cache: `errc::foreign_handle` or `stale_handle`; a miss: ok (no-op).
  expected<void> release(const match_result& m) {
    std::lock_guard<Lock> guard(lock_);
    if (m.pin.is_null()) return {};
    const errc e = pins_.validate(m.pin);
    if (e != errc::ok) return unexpected(e);
    unpin(m.pin);
    return {};
  }

  // --- observers -----------------------------------------------------------------------

  [[nodiscard]] const tree_type& tree() const noexcept { return tree_; }
  [[nodiscard]] const Store& store() const noexcept { return store_; }
  [[nodiscard]] Store& store() noexcept { return store_; }
  /// Runs `f(store())` under the cache's lock: how another thread (an offload thread that
  /// completes the store's copies and starts its write-backs) reaches the store while
  /// requests go through the cache. `f` must not call back into the cache.
  template <class F>
  decltype(auto) with_store(F&& f) {
    std::lock_guard<Lock> guard(lock_);
    return std::forward<F>(f)(store_);
  }
  /// A request the runtime gave up on at begin (computed uncached; call it once, when it stops
  /// retrying) reaches a scorer that takes it (the selector's tier-aware shadows). The cache
  /// itself does not change.
  void observe_refused(std::span<const token_id> sequence, std::int64_t input_tokens, const cache_salt& salt = {}) {
    std::lock_guard<Lock> guard(lock_);
    if constexpr (refusal_observer<Scorer>)
      scorer_.observe_refused(sequence, input_tokens, salt);
  }
  [[nodiscard]] const Scorer& scorer() const noexcept { return scorer_; }
  [[nodiscard]] const Model& model() const noexcept { return model_; }
  [[nodiscard]] const cache_counters& counters() const noexcept { return counters_; }
  /// The positions at which the last successful `commit` holds a checkpoint on its sequence
  /// because that commit asked for them (admission + `extra`), ascending; valid until the
  /// next call into the cache. Lets a runtime see exactly which captured states were kept.
  [[nodiscard]] std::span<const std::int64_t> committed_checkpoints() const noexcept { return committed_; }

  /// Registers the eviction listener (replaces the previous one; `{}` removes it).
  void set_eviction_listener(eviction_listener l) noexcept {
    std::lock_guard<Lock> guard(lock_);
    listener_ = l;
  }
  [[nodiscard]] time_point now() const noexcept { return clock_.now(); }
  [[nodiscard]] double alpha() const noexcept { return scorer_.alpha(); }
  [[nodiscard]] const Admission& admission() const noexcept { return admission_; }
  [[nodiscard]] const prefix_cache_config& config() const noexcept { return cfg_; }
  /// The result of the most recent `match` (a wrapper reports the lookup of a request it
  /// then refused from it; meaningful only while no other thread matches).
  [[nodiscard]] const match_result& last_match() const noexcept { return last_match_; }
  /// Requests seen when eviction first ran (-1 before).
  [[nodiscard]] std::int64_t requests_before_first_eviction() const noexcept { return first_evict_at_; }
  /// Checkpoints held by the tree. O(n).
  [[nodiscard]] std::int64_t checkpoints_cached() const {
    std::int64_t k = 0;
    tree_.preorder([&](node_id n) { k += tree_.at(n).has_checkpoint ? 1 : 0; });
    return k;
  }
  /// Tokens with KV in the tree. O(n).
  [[nodiscard]] std::int64_t tokens_cached() const {
    std::int64_t k = 0;
    tree_.preorder([&](node_id n) { k += tree_.at(n).edge(); });
    return k;
  }
  /// The cache's metadata on the heap: the tree (radix_tree::memory_bytes), the scorer's
  /// index (if it reports one: memory_reporting_scorer), the pin table and the scratch
  /// buffers, the model's spec. Not the store's (KV, states, its own tables) and not the
  /// cache object itself. O(id bound): every node slot's token buffer is counted.
  [[nodiscard]] std::int64_t memory_bytes() const {
    std::int64_t b = tree_.memory_bytes() + pins_.memory_bytes();
    if constexpr (std::is_same_v<Model, cost_model>) b += detail::heap_bytes(model_);
    if constexpr (memory_reporting_scorer<Scorer>) b += scorer_.memory_bytes();
    using detail::heap_bytes;
    for (const std::int64_t v :
         {heap_bytes(pin_node_), heap_bytes(path_), heap_bytes(positions_), heap_bytes(pending_kv_),
          heap_bytes(pending_ckpt_), heap_bytes(marked_), heap_bytes(protect_.mark), heap_bytes(protect_.children),
          heap_bytes(protect_.marked), heap_bytes(pinned_scratch_), heap_bytes(committed_)})
      b += v;
    return b;
  }

 private:
  template <class>
  friend class request_lifecycle;

  /// `match`'s body, under the lock the caller holds: the lifecycle's `begin` matches, looks
  /// below HBM and pins the KV-only tail in one critical section, so that no other thread's
  /// eviction or insert runs between the match and the calls that use its `common_prefix`.
  expected<match_result> match_locked(std::span<const token_id> input, const cache_salt& salt);

  /// `plan` into `out`, reusing its capacity (the lifecycle plans into a request's state
  /// without allocating in steady state).
  /// `lower_branch`: insertion_view::lower_branch_point (0: none). `as_empty`: plan as an
  /// empty cache would (a miss that sees no cached branch point): the lifecycle's last
  /// fallback, so that what the cache holds never adds a site an empty cache would not.
  errc plan_into(std::span<const token_id> input, const match_result& m, std::span<const std::int64_t> extra,
                 checkpoint_plan& out, std::int64_t lower_branch = 0, bool as_empty = false);

  void drop_all_nodes() noexcept { detail::drop_all_nodes(tree_, store_, scorer_); }

  /// `clear`'s body, under the lock: the lifecycles over this cache give their requests
  /// back first (their reservations are not the tree's), then the tree and the pins go.
  void clear_locked() noexcept {
    for (clear_listener* l = clear_listeners_; l != nullptr; l = l->next) l->fn(l->context);
    drop_all_nodes();
    pins_.release_all();
    std::fill(pin_node_.begin(), pin_node_.end(), no_node);
  }

  /// A request_lifecycle over this cache, told (under the lock) when `clear` empties it.
  /// Intrusive: the lifecycle owns the node and links it while it lives. O(1) to add,
  /// O(lifecycles) to remove.
  struct clear_listener {
    void (*fn)(void* context) noexcept = nullptr;
    void* context = nullptr;
    clear_listener* next = nullptr;
  };
  void add_clear_listener(clear_listener& l) noexcept {
    l.next = clear_listeners_;
    clear_listeners_ = &l;
  }
  void remove_clear_listener(clear_listener& l) noexcept {
    for (clear_listener** p = &clear_listeners_; *p != nullptr; p = &(*p)->next)
      if (*p == &l) {
        *p = l.next;
        return;
      }
  }

  /// Moves a live match's pin to `use` (a usable node on its path, or no_node for none),
  /// so that a request reuses less than `match` found: the lifecycle's fallback when the
  /// longer reuse cannot fit. The counters `match` added for the hit are corrected to what
  /// is reused now. O(1).
  void repin_match(match_result& m, node_id use) noexcept {
    if (m.node == use) return;
    count_hit(m, -1);
    if (!m.pin.is_null()) unpin(m.pin);
    m.pin = packed_handle{};
    m.node = no_node;
    m.reusable_tokens = 0;
    m.flops_saved = 0;
    if (use == no_node) return;
    m.node = use;
    m.reusable_tokens = tree_.at(use).end;
    m.flops_saved = saturating_flops(m.reusable_tokens);
    const packed_handle h = *pins_.acquire();  // the slot unpin just freed
    pin_node_[h.index()] = use;
    m.pin = h;
    tree_.pin(use);
    scorer_.on_update(tree_, use);
    count_hit(m, +1);
  }

  /// Adds (+1) or takes back (-1) what a hit counts: hits, tokens skipped, FLOPs saved
  /// (saturating), checkpoints reused. Nothing for a miss. O(1).
  void count_hit(const match_result& m, int sign) noexcept {
    if (!m.hit()) return;
    counters_.hits += sign;
    counters_.tokens_skipped += sign * m.reusable_tokens;
    counters_.flops_saved = sign > 0 ? sat_add(counters_.flops_saved, m.flops_saved)
                                     : counters_.flops_saved - std::min(counters_.flops_saved, m.flops_saved);
    counters_.checkpoints_reused += sign;
  }

  /// Shows a request about to be inserted to a scorer that watches the stream
  /// (`request_observer`: the adaptive selector's shadows), with the ids this cache's own
  /// prefill skipped (`live_hit_observer`). Nothing of the cache changes.
  void observe(std::span<const token_id> sequence, std::int64_t input_tokens, std::int64_t live_reused) {
    if constexpr (live_hit_observer<Scorer>)
      scorer_.observe_request(sequence, input_tokens, salt_, live_reused);
    else if constexpr (request_observer<Scorer>)
      scorer_.observe_request(sequence, input_tokens, salt_);
  }

  /// Follows `seq` in the current operation's namespace; the path goes to `path_`. Within
  /// one commit (`walk_memo_scope`) a walk of the same tokens (same span, unchanged
  /// namespace) with no tree edit since (`radix_tree::edits`) is the last one: its result
  /// is returned and path_ still holds its path. A commit walks its sequence 3-4 times.
  walk_result walk(std::span<const token_id> seq) const noexcept {
    const namespace_id ns = tree_.namespace_of(salt_);
    walk_memo& m = walk_memo_;
    if (m.active && m.valid && m.data == seq.data() && m.size == seq.size() && m.ns == ns && m.edits == tree_.edits())
      return m.result;
    const walk_result r = tree_.walk(seq, path_, ns);
    if (m.active) m = walk_memo{true, true, seq.data(), seq.size(), ns, tree_.edits(), r};
    return r;
  }
  using walk_memo = detail::walk_memo;
  using walk_memo_scope = detail::walk_memo_scope;

  /// The namespace of a commit: `m`'s, or `salt` without `m`.
  errc select_salt(const match_result* m, const cache_salt& salt) noexcept {
    if (m != nullptr && salt && m->salt != salt) return errc::invalid_argument;
    salt_ = m != nullptr ? m->salt : salt;
    return errc::ok;
  }

  /// Each cache issues pin tickets under its own 8-bit tag, so a result passed to another
  /// cache is reported as foreign (unless 256 caches apart).
  static std::uint32_t next_pin_tag() noexcept {
    static std::atomic<std::uint32_t> counter{0};
    return counter.fetch_add(1, std::memory_order_relaxed) & 0xffu;
  }

  static std::int64_t sat_add(std::int64_t a, std::int64_t b) noexcept {
    return a > std::numeric_limits<std::int64_t>::max() - b ? std::numeric_limits<std::int64_t>::max() : a + b;
  }
  std::int64_t saturating_flops(std::int64_t s) const noexcept {
    try {
      return static_cast<std::int64_t>(model_.hit_flops(s));
    } catch (...) {
      return std::numeric_limits<std::int64_t>::max();
    }
  }

  bool usable(node_id n) const noexcept {
    return tree_.at(n).has_checkpoint || model_.ssm_checkpoint_bytes() == 0;
  }
  /// Deepest node on `path` that is usable and ends within `limit` tokens.
  node_id deepest_usable(const std::vector<node_id>& path, std::int64_t limit) const noexcept {
    for (auto it = path.rbegin(); it != path.rend(); ++it)
      if (tree_.at(*it).end <= limit && usable(*it)) return *it;
    return no_node;
  }
  std::int64_t reusable_in(const std::vector<node_id>& path, std::int64_t limit) const noexcept {
    const node_id n = deepest_usable(path, limit);
    return n == no_node ? 0 : tree_.at(n).end;
  }

  /// True when `n` is a live node whose root path spells the first tokens of `seq`.
  bool on_path(std::span<const token_id> seq, node_id n) const noexcept {
    if (!tree_.live(n) || n == tree_type::root()) return false;
    walk(seq);
    return std::find(path_.begin(), path_.end(), n) != path_.end();
  }

  insertion_view make_view(const walk_result& w, std::int64_t input, std::int64_t total,
                           std::int64_t reusable) const noexcept {
    insertion_view v;
    v.input_tokens = input;
    v.total_tokens = total;
    v.reusable_tokens = reusable;
    v.common_prefix = w.common_prefix;
    if (w.partial != no_node) {
      v.branch_point = w.common_prefix;
    } else if (w.common_prefix > 0 && w.common_prefix < total && !path_.empty() && !usable(path_.back())) {
      v.branch_point = w.common_prefix;  // the sequence leaves the tree at a node end without a state
    }
    return v;
  }

  /// positions_ = admission ∪ extra, sorted, unique, within [1, total].
  /// The admission's positions and `extra`, sorted, unique, in (floor, total].
  void select_positions(const insertion_view& v, std::span<const std::int64_t> extra, std::int64_t floor = 0) {
    positions_.clear();
    std::int64_t most = v.total_tokens;  // one per token unless the policy says less (bounded_admission)
    if constexpr (bounded_admission<Admission>) most = std::min<std::int64_t>(most, admission_.max_positions(v));
    detail::reserve_geometric(positions_, static_cast<std::size_t>(std::max<std::int64_t>(most, 0)) + extra.size() + 2);
    admission_.select(v, positions_);
    positions_.insert(positions_.end(), extra.begin(), extra.end());
    std::sort(positions_.begin(), positions_.end());
    positions_.erase(std::unique(positions_.begin(), positions_.end()), positions_.end());
    std::erase_if(positions_, [&](std::int64_t p) { return p < std::max<std::int64_t>(1, floor + 1) || p > v.total_tokens; });
  }

  /// Where the states a commit may keep start. A request that resumed from its match's
  /// checkpoint at `reusable` never computed a state at or before it, so a commit with a
  /// pinned match keeps none there: an admission position inside the
  /// reused prefix (a block boundary of every_block_admission, say) is dropped, not filled
  /// with a state nobody computed. The reference simulation mode (admit_oversized) keeps
  /// the reference's behaviour. -1 (no pinned match): 0.
  [[nodiscard]] std::int64_t computed_from(std::int64_t reusable) const noexcept {
    return !cfg_.admit_oversized && reusable > 0 ? reusable : 0;
  }

  /// Does a node on the current path_ end at p with a usable state?
  bool has_checkpoint_at(std::int64_t p) const noexcept {
    for (node_id n : path_)
      if (tree_.at(n).end == p) return tree_.at(n).has_checkpoint;
    return false;
  }

  /// Bytes of the new KV and new checkpoints the current positions_ need.
  std::int64_t needed_bytes(const walk_result& w, std::int64_t len) const noexcept {
    std::int64_t ckpts = 0;
    for (std::int64_t p : positions_)
      if (p > w.common_prefix || !has_checkpoint_at(p)) ++ckpts;
    return store_.kv_bytes(len - w.common_prefix) + ckpts * store_.checkpoint_bytes();
  }

  void begin_eviction_round() {
    clock_.tick();
    if (first_evict_at_ < 0) first_evict_at_ = counters_.matches;
  }

  /// Bytes per side of the new KV and new checkpoints the current positions_ need, as a
  /// store with two sides takes them: each new segment's extent at its absolute position,
  /// and one page set per split a page may be copied in (an upper bound: a split at a block
  /// boundary copies nothing). Only for side_placing_store.
  side_bytes needed_sides(const walk_result& w, std::int64_t len) const noexcept;

  /// Whether a fit check may let the store move free capacity between its sides first.
  enum class placement_step : std::uint8_t { check_only, prepare };

  /// Argument, pin and oversize checks of `commit` (nothing changes but scratch buffers,
  /// and, with placement_step::prepare, free chunks the store moves between its sides).
  /// Sets `reusable` to the matched prefix `m` reuses, or -1 without a pinned match.
  errc validate_commit(std::span<const token_id> sequence, std::int64_t input_tokens, const match_result* m,
                       std::span<const std::int64_t> extra, std::int64_t& reusable, placement_step step);

  /// Lets a store with two sides move free capacity to a side that cannot place its part of
  /// `need` now (its rebalancer decides), before anything is evicted. No-op otherwise.
  void prepare_placement(const side_bytes& need) noexcept {
    if constexpr (side_placing_store<Store>) {
      if (!store_.placement_fits(need, side_bytes{})) store_.prepare_placement(need);
    } else {
      (void)need;
    }
  }

  /// Evicts (in the current round, or a new one) until a store with two sides can place
  /// `need` now. No-op for other stores, whose allocations fail only for lack of bytes.
  void evict_until_placeable(const side_bytes& need, bool& round, commit_result& res) noexcept;

  /// Holds a two-sided store's split between its sides for a scope (store.hold_split).
  struct split_hold {
    prefix_cache* cache;
    bool held;
    split_hold(prefix_cache& c, bool hold) noexcept : cache(&c), held(hold) {
      if constexpr (side_placing_store<Store>)
        if (held) cache->store_.hold_split(true);
    }
    split_hold(const split_hold&) = delete;
    split_hold& operator=(const split_hold&) = delete;
    ~split_hold() {
      if constexpr (side_placing_store<Store>)
        if (held) cache->store_.hold_split(false);
    }
  };

  /// True when `bytes` more fit in the store once eviction has freed everything it may:
  /// not the root paths of pinned nodes, nor the commit's own path when `w` is given (the
  /// deepest node of its walk in path_ and the edge it entered in part), nor anything held
  /// outside the tree (requests' reservations). The tree's bytes are a counter the tree
  /// keeps; what eviction may not free is counted on the pinned paths only
  /// (detail::protected_bytes): O(pin slots + nodes on the pinned paths), run only when
  /// eviction is needed; allocation-free after warm-up. Assertion builds check it against
  /// the O(n) scan of every node (detail::count_tree_bytes).
  ///
  /// A store with two sides (side_placing_store: KV pages and SSM blocks in an asymmetric
  /// pool) must also place each side's part: the tree's bytes are split into KV and
  /// checkpoints the same way (radix_tree::checkpoint_bytes, protected_bytes'
  /// checkpoint part), and the store checks that each side's free units plus what eviction
  /// frees there cover its need, with the current split. The freed bytes are the tree's
  /// measure (whole pages per edge), never more than what the store gets back, so a
  /// request this passes can always be placed once every evictable node is gone; one it
  /// refuses may have fit after a migration the rebalancer would not promise. Same cost.
  bool fits_after_eviction(const side_bytes& need, const walk_result* w);

  /// Pins the deepest node of the commit's walk and the edge it entered in part, so that
  /// the commit's own evictions cannot take the tokens it extends. O(1).
  void guard_path(const walk_result& w) noexcept {
    if (cfg_.admit_oversized) return;  // the reference's order: its own prefix may go
    guard_[0] = path_.empty() ? no_node : path_.back();
    guard_[1] = w.partial;
    for (node_id g : guard_)
      if (g != no_node) {
        tree_.pin(g);
        scorer_.on_update(tree_, g);
      }
  }
  void unguard_path() noexcept {
    for (node_id& g : guard_) {
      if (g == no_node) continue;
      tree_.unpin(g);
      scorer_.on_update(tree_, g);
      g = no_node;
    }
  }

  /// One eviction round of at least `bytes` (as the scorer accounts them).
  void evict_bytes(std::int64_t bytes, commit_result& res) {
    begin_eviction_round();
    std::int64_t freed = 0;
    while (freed < bytes) {
      const std::int64_t got = evict_one(res);
      if (got < 0) break;
      freed += got;
    }
  }

  /// Evicts the scorer's next victim. Returns the bytes accounted (>= 0), or -1 when there
  /// is no victim. (Returns 0 for a victim that freed nothing, so callers make progress.)
  std::int64_t evict_one(commit_result& res) noexcept;

  std::int64_t apply(node_id v, evict_action act, commit_result& res) noexcept {
    return detail::apply_eviction(tree_, store_, scorer_, listener_, v, act, res, counters_);
  }

  /// The one insert of `commit` and `request_lifecycle::finish`: ticks the clock as the
  /// reference's insert() and its inner match_prefix() do, walks `seq` and tells the scorer,
  /// then `place(w)` chooses positions_ and takes every new handle into pending_* (commit:
  /// the admission's positions, evictions and the store; finish: the captured positions and
  /// the request's reservation; it may walk again and update `w`). Then builds the nodes,
  /// records the committed positions and counts the commit. Pins and guards are the
  /// callers'. Errors: what `place` or the build returns (the tree as the build left it:
  /// a refused split aborts the build with the pending handles freed). O(|seq| + d +
  /// positions) plus what `place` costs.
  template <class Place>
  errc insert_sequence(std::span<const token_id> seq, commit_result& res, Place&& place);

  /// Where a commit's new handles come from: the store (`commit`), or the reservation of a
  /// request in flight (`request_lifecycle::finish`, which hands over what the runtime wrote).
  struct store_source {
    Store* store;
    expected<typename Store::kv_extent> take_kv(std::int64_t begin, std::int64_t end) noexcept {
      // A store that lays KV out at absolute positions (pages usable as a block table).
      if constexpr (paged_state_store<Store>)
        return store->allocate_kv_at(begin, end - begin);
      else
        return store->allocate_kv(end - begin);
    }
    expected<typename Store::checkpoint_handle> take_checkpoint(std::int64_t) noexcept {
      return store->allocate_checkpoint();
    }
  };

  /// Allocates the handles the current plan (path_, positions_) needs into pending_*.
  errc allocate_all(const walk_result& w, std::int64_t len) noexcept {
    store_source s{&store_};
    return allocate_all_from(w, len, s);
  }
  template <class Source>
  errc allocate_all_from(const walk_result& w, std::int64_t len, Source& src) noexcept {
    free_pending();
    const errc e = detail::take_handles(positions_, w.common_prefix, len,
                                        [this](std::int64_t p) { return has_checkpoint_at(p); }, src, pending_kv_,
                                        pending_ckpt_);
    if (e != errc::ok) free_pending();
    return e;
  }

  void free_pending() noexcept {
    for (auto& k : pending_kv_) store_.free_kv(std::move(k));
    for (auto& c : pending_ckpt_) store_.free_checkpoint(std::move(c));
    pending_kv_.clear();
    pending_ckpt_.clear();
  }

  /// Mutates the tree with the handles in pending_* (allocate_all succeeded for `w`).
  errc build(std::span<const token_id> seq, walk_result w, std::int64_t len, time_point now, commit_result& res);

  errc finish_build(std::size_t ck, std::size_t kvi) noexcept {
    HYBRIDCACHE_ASSERT(ck == pending_ckpt_.size() && kvi == pending_kv_.size());
    (void)ck;
    (void)kvi;
    pending_ckpt_.clear();
    pending_kv_.clear();
    return errc::ok;
  }
  errc abort_build(std::size_t ck, std::size_t kvi) noexcept {
    for (std::size_t i = ck; i < pending_ckpt_.size(); ++i) store_.free_checkpoint(std::move(pending_ckpt_[i]));
    for (std::size_t i = kvi; i < pending_kv_.size(); ++i) store_.free_kv(std::move(pending_kv_[i]));
    pending_ckpt_.clear();
    pending_kv_.clear();
    return errc::out_of_capacity;
  }

  /// The node on path_ (or the partial child) ending exactly at p, else no_node.
  node_id node_ending_at(std::int64_t p) const noexcept {
    for (node_id n : path_)
      if (tree_.at(n).end == p) return n;
    return no_node;
  }

  /// Splits the edge of `seq`'s path that strictly contains position p; returns the new
  /// head node (ending at p), or no_node when the store could not split the KV.
  node_id split_at(std::span<const token_id> seq, std::int64_t p, time_point now);

  void unpin(packed_handle h) noexcept {
    const node_id n = pin_node_[h.index()];
    (void)pins_.release(h);
    tree_.unpin(n);
    scorer_.on_update(tree_, n);
  }

  void grow_pins() {
    const auto cap = pins_.capacity() * 2;
    pin_node_.resize(cap, no_node);
    pinned_scratch_.reserve(cap);
    pins_.reserve(cap);
  }

  // Node ids and pins an empty cache has room for; every table grows geometrically from here,
  // before a call changes anything. Small: the adaptive selector's shadows are six
  // metadata-only caches per live one, and an empty one's tables were most of a small
  // shadow's memory (docs/prefix-cache.md, "Memory, counted").
  static constexpr std::size_t initial_ids = 8;

  void reserve_indexes(std::size_t ids) {
    tree_.reserve(ids);
    if constexpr (reservable_scorer<Scorer>) scorer_.reserve(ids * 2);
    detail::reserve_geometric(pending_ckpt_, positions_.capacity() + 2);
    detail::reserve_geometric(pending_kv_, positions_.capacity() + 2);
    detail::reserve_geometric(committed_, positions_.capacity());
  }

  Model model_;
  Store store_;
  Scorer scorer_;
  Admission admission_;
  prefix_cache_config cfg_;
  tree_type tree_;
  logical_clock clock_;
  Lock lock_;
  generation_table pins_;
  std::vector<node_id> pin_node_;
  mutable std::vector<node_id> path_;
  mutable walk_memo walk_memo_;  // walk(): reuse within one commit
  cache_salt salt_;  // the namespace of the operation in progress (set under the lock)
  std::vector<std::int64_t> positions_;
  std::vector<typename Store::kv_extent> pending_kv_;
  std::vector<typename Store::checkpoint_handle> pending_ckpt_;
  cache_counters counters_;
  match_result last_match_;
  std::int64_t first_evict_at_ = -1;
  std::array<node_id, 2> guard_{no_node, no_node};  // nodes a commit in progress protects
  std::vector<char> marked_;                        // scratch of count_tree_bytes (assertion builds)
  detail::protect_scratch protect_;                 // scratch of fits_after_eviction
  std::vector<node_id> pinned_scratch_;             // the nodes of live pins, for protect_
  std::vector<std::int64_t> committed_;             // committed_checkpoints()
  eviction_listener listener_{};
  clear_listener* clear_listeners_ = nullptr;       // the lifecycles over this cache
};

}  // namespace hybridcache::prefix

#include "hybridcache/prefix/detail/prefix_cache_commit.hpp"  // IWYU pragma: keep
#include "hybridcache/prefix/detail/prefix_cache_insert.hpp"  // IWYU pragma: keep
