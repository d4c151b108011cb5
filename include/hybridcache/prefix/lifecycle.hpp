// hybridcache/prefix/lifecycle.hpp
//
// `request_lifecycle<Cache>`: how a runtime that holds real KV and SSM bytes drives a
// `prefix_cache`, as SGLang, vLLM and TensorRT-LLM do: pages are reserved before prefill,
// the runtime writes KV and captured states straight into them, and the cache adopts
// exactly those pages when the request ends.
//
//   request_lifecycle<cache_t> requests(cache);
//   auto t = requests.begin(prompt, {.output_tokens = 256});  // match + pin, plan, reserve
//   if (!t) { /* t.message() says why; out_of_capacity: retry when a request ends */ }
//   const auto& r = **requests.state(*t);  // r.plan.prefill_start, r.kv_from, r.plan.sites, r.kv ...
//   ... prefill from r.plan.prefill_start, writing KV from r.kv_from into r.kv, capture
//       states into r.checkpoints ...
//   requests.grow(*t, 128);                // more KV during decode, if needed
//   auto f = requests.finish(*t, prompt ++ output, captured_positions);   // adopt
//   // or requests.abort(*t): everything goes back
//
// begin: matches the prompt (joint-min hit, pinned until finish/abort), plans the checkpoint
//   positions of the prefill (admission + `extra_checkpoints`), and reserves, all or nothing,
//   the KV of [kv_from, |prompt| + output_tokens) as one extent and one checkpoint slot per
//   planned position plus one for the state after the last token. Prefill starts at the
//   matched state (`reusable_tokens`); when the tree also holds KV beyond it (a KV-only tail,
//   `common_prefix` > `reusable_tokens`), that KV is reused, not reserved again: the deepest
//   node holding it is pinned too, `kv_from` is where the tree's KV ends, and the runtime
//   reads [0, kv_from) through the block table (read-only: those pages are shared) and writes
//   KV only from kv_from on.
//   Eviction makes room but never takes a pinned path (this request's match included).
//   Liveness: when the request does not fit beside the pinned paths with the reuse it
//   found, begin reuses less: the same state without the KV-only tail or the lower-tier
//   hit, then a shallower cached state on the path, down to none, at which point the path
//   it would have pinned is evictable like any other. So a request that fits an empty
//   cache of this size is refused only while other requests in flight hold the room, and
//   admitted once they end. A request that cannot fit beside them is refused before
//   anything is evicted, with the
//   cache, the store and every pin as they were (the lookup itself still counts: the clock
//   ticked and the matched path was refreshed, as for any match). With a two-sided store
//   (side_placing_store: an asymmetric pool's KV and SSM sides) the check is per side too:
//   bytes that fit but pages that cannot be placed on the KV side (or blocks on the SSM
//   side) are refused before any eviction; a short side may first borrow free chunks from
//   the other (the pool's rebalancer), then eviction runs until both sides can place their
//   part and the allocations run with the split held, so none fails after evicting.
// grow: reserves KV for n more tokens (a new segment), under the same rule.
// finish: inserts the sequence keeping checkpoints exactly at the captured positions (a
//   position the runtime did not capture is never kept); the KV of every new token is taken
//   from the reservation, in order, and the checkpoint at p from the slot reserved for p (or
//   the end slot, at |sequence|). What the tree already holds (another request committed the
//   same tokens meanwhile) and what was reserved but not used is given back. Evicts nothing:
//   the bytes were reserved. Bad arguments (a sequence that does not extend the prompt,
//   longer than the reservation, a position without a slot) are refused with the request
//   still in flight. A store failure during the insert (a split it refuses, two segments it
//   cannot join) aborts the request: every handle not yet in the tree goes back, the pin is
//   released, and the error is returned.
// abort: gives the reservation back and releases the pin.
//
// What the lifecycle does depends only on which named seams the store models (concepts/
// state_store.hpp, concepts/tier_store.hpp): `paged_state_store` (block tables, copy-on-write
// of a shared block), `side_placing_store` (per-side fit checks), `lower_tier_store` /
// `layered_tier_store` (below). It never probes a store's members.
//
// Lower tiers (a `lower_tier_store`: tiered_state_store, pool_state_store with a host tier),
// one path for every such store. begin also asks the store for a hit below HBM (`lookup`:
// pinned), lets the caller's `accept` filter decline or shorten it (a runtime that would
// recompute those tokens faster than it loads them), and `load`s it: a store with an HBM
// staging room (tiered_state_store) submits the copies into it, to run asynchronously. It
// then plans from where the loaded prefix ends (plan.prefill_start = loaded_at) and
// reserves as usual, with one more checkpoint slot for the loaded state, and `land`s the
// hit: a store whose hits land in the reservation (pool_state_store: the pool is its HBM)
// copies the hit's KV of [kv_from, loaded_at) into the reservation's pages and its state
// into that slot before begin returns (synchronously: wait_loaded returns at once; the
// block table names those pages like any others and resume_checkpoint returns the slot).
// A staged hit is read where it was staged (`store().staged(state.host_hit)`): before
// prefill reads it the runtime calls `wait_loaded(ticket)`, or, computing layer by layer
// while later layers are still being copied, `wait_layer_loaded(ticket, kind, layer)`
// before each layer (an engine that lands copies layer by layer: the host and CUDA
// engines). Many requests may hold hits at once; two that need the same bytes share one
// load. finish keeps the loaded state at loaded_at, inserts the sequence, then `settle`s:
// staged pages go to the new nodes without a copy, and the committed path is named so that
// its evicted nodes are demoted, not dropped (a `demoting_store` demotes them itself as the
// cache evicts them). A hit that cannot be loaded (declined, staging room full, a copy
// could not start, KV the tree no longer holds before it) is given up and the request goes
// on from its HBM hit; abort releases what the hit holds.
// Threads (Cache = prefix_cache<..., mutex_lock>): every call holds the cache's lock, so
// threads may begin/finish concurrently. The calls that allocate or free store memory
// (begin, grow, finish, abort, clear, the destructor) also hold the lifecycle's memory lock
// exclusively, taken before the cache's lock: an asymmetric pool moves live units when it
// rebalances or compacts, and unmaps chunks it frees. A thread that reads or writes pool
// bytes (resolving handles from block_table, resume_checkpoint or state) holds
// `memory_read_lock()` meanwhile, and releases it before it calls any of those six (they
// would wait for it). state, block_table, resume_checkpoint, in_flight and the waits take
// only the cache's lock, so they may be called while holding it. With no_lock both locks
// are empty.
// Errors carry a message naming the argument and its value (`expected::message()`).
// Tickets are generation-checked: a finished or aborted ticket reports double_free, a
// ticket of a request that `clear()` ended stale_handle, another lifecycle's foreign_handle.
//
// Costs: begin = match + plan + O(sites) allocations (+ evictions, and a fit check over the
// pinned paths, O(pin slots + nodes on those paths), when eviction is needed; + a host
// lookup and load for a lower-tier store); grow O(1) + allocation; finish = commit's walk
// and build, O(segments) splits/joins (+ settle); abort O(segments + sites). The ticket table allocates only when it grows
// (geometrically); reservations allocate their small handle lists.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <deque>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "hybridcache/core/error.hpp"
#include "hybridcache/core/expected.hpp"
#include "hybridcache/core/handle.hpp"
#include "hybridcache/core/hash.hpp"
#include "hybridcache/concepts/state_store.hpp"
#include "hybridcache/concepts/tier_store.hpp"
#include "hybridcache/model/model_spec.hpp"
#include "hybridcache/prefix/prefix_cache.hpp"
#include "hybridcache/prefix/lock_policy.hpp"
#include "hybridcache/prefix/types.hpp"

namespace hybridcache::prefix {

/// Options of `request_lifecycle::begin` (aggregate).
struct begin_options {
  /// Decode tokens to reserve KV for now, beyond the prompt (`grow` adds more later); >= 0.
  std::int64_t output_tokens = 0;
  /// Application-directed checkpoint positions in the prompt, each in [1, |prompt|] (else
  /// invalid_argument). A position at or before where prefill starts (the reused prefix)
  /// cannot be captured by this request: it is not planned, and counted in
  /// `request_state::extra_skipped`.
  std::span<const std::int64_t> extra_checkpoints = {};
  /// The tenant's namespace (types.hpp): the request matches and inserts only there.
  cache_salt salt = std::nullopt;
};

namespace detail {
/// The memory lock of a lifecycle used from one thread: nothing to lock.
struct no_shared_mutex {
  void lock() noexcept {}
  void unlock() noexcept {}
  void lock_shared() noexcept {}
  void unlock_shared() noexcept {}
};

/// What a request keeps of its lower-tier hit (nothing for a one-tier store).
template <class Store, class Tree>
struct host_hit_of {
  struct type {
    std::int64_t host_tokens = 0;
  };
};
template <class Store, class Tree>
  requires lower_tier_store<Store, Tree>
struct host_hit_of<Store, Tree> {
  using type = lower_tier_hit_t<Store>;
};
}  // namespace detail

/// The default of `request_lifecycle::begin`'s hit filter: every hit below HBM is loaded.
struct accept_every_hit {
  template <class Hit>
  constexpr bool operator()(const Hit&) const noexcept {
    return true;
  }
};

/// A request in flight (generation-checked).
struct request_ticket {
  packed_handle handle;
};

/// What `request_lifecycle::finish` did.
struct finish_result {
  commit_result commit;                  ///< the insert (evictions are always 0)
  std::int64_t checkpoints_kept = 0;     ///< captured states now in the tree
  std::int64_t checkpoints_returned = 0; ///< reserved slots given back (not captured, or already cached)
  std::int64_t tokens_returned = 0;      ///< reserved KV given back (already cached, or not used)
};

/// The request lifecycle over a `prefix_cache`. See the file comment.
template <class Cache>
class request_lifecycle {
 public:
  using store_type = typename Cache::store_type;
  using kv_extent = typename store_type::kv_extent;
  using checkpoint_handle = typename store_type::checkpoint_handle;

  using tree_type = typename Cache::tree_type;
  /// The store lays KV out at absolute token positions (pages form block tables).
  static constexpr bool pages_by_position = paged_state_store<store_type>;
  /// The store has tiers below HBM that hits are loaded from (tiered_state_store, and
  /// pool_state_store's host tier).
  static constexpr bool lower_tier = lower_tier_store<store_type, tree_type>;
  /// ... and its hits land in the request's reservation (pool_state_store), not in a
  /// staging room of the store's (tiered_state_store).
  static constexpr bool lands_in_reservation = [] {
    if constexpr (lower_tier) return static_cast<bool>(store_type::lands_in_reservation);
    else return false;
  }();
  using lock_type = typename Cache::lock_type;
  /// The memory lock (see the file comment): a reader-writer mutex when the cache is shared
  /// between threads, empty otherwise.
  using memory_mutex = std::conditional_t<std::is_same_v<lock_type, no_lock>, detail::no_shared_mutex, std::shared_mutex>;


  /// A reserved checkpoint slot: the state after token `position` goes here (`position` 0
  /// is the end slot: the state after the sequence's last token, known at finish).
  struct checkpoint_slot {
    std::int64_t position = 0;
    checkpoint_handle handle{};
  };

  /// What the runtime reads of a request in flight.
  struct request_state {
    match_result match;                  ///< pinned until finish/abort
    checkpoint_plan plan;                ///< where prefill saves states
    std::int64_t prompt_tokens = 0;
    std::uint64_t prompt_hash = 0;       ///< finish checks that the sequence extends the prompt
    std::int64_t kv_from = 0;            ///< the tree holds KV for [0, kv_from); the runtime writes from here
    std::int64_t reserved_tokens = 0;    ///< KV reserved for [kv_from, kv_from + this)
    std::vector<kv_extent> kv;           ///< the reservation's segments, in token order
    std::vector<std::int64_t> kv_tokens; ///< tokens of each segment
    std::vector<checkpoint_slot> checkpoints;  ///< one per plan site, then the end slot
    /// Positions of begin_options::extra_checkpoints at or before plan.prefill_start: this
    /// request resumes after them and cannot capture them, so they are not planned.
    std::int64_t extra_skipped = 0;
    /// Room for the splits `finish` makes (one token's KV each: a paged store copies the
    /// block a split falls inside into a fresh one); freed just before the insert.
    std::vector<kv_extent> split_room;
    /// A lower-tier store's hit beyond the HBM match, loaded at begin (host_hit.host_tokens
    /// > 0): prefill starts at plan.prefill_start = host_hit.reusable_tokens. A store that
    /// stages hits (tiered_state_store) holds the loaded KV and the state to resume from in
    /// `store().staged(host_hit)`, and finish gives the staged pages to the new nodes without
    /// a copy (`settle`); a store whose hits land in the reservation (pool_state_store,
    /// `lands_in_reservation`) copied them into this request's reservation and the slot at
    /// loaded_at during begin. host_tokens 0: no host hit (or it could not be loaded: the
    /// request goes on from its HBM hit).
    typename detail::host_hit_of<store_type, tree_type>::type host_hit{};
    /// Where the loaded state sits (0: no host hit).
    std::int64_t loaded_at = 0;
    /// The KV of [match.reusable_tokens, kv_from) that HBM holds beyond the matched
    /// checkpoint (a KV-only tail of the path) is read from the tree, so the deepest node
    /// holding it is pinned too (null: none).
    packed_handle kv_pin{};
  };

  /// @param cache  the cache the requests go through; must outlive this object
  explicit request_lifecycle(Cache& cache) : cache_(&cache), tickets_(next_tag(), 16), states_(16) {
    clear_link_.fn = [](void* self) noexcept { static_cast<request_lifecycle*>(self)->end_all_requests(); };
    clear_link_.context = this;
    std::lock_guard<lock_type> guard(cache_->lock_);
    cache_->add_clear_listener(clear_link_);
  }
  request_lifecycle(const request_lifecycle&) = delete;
  request_lifecycle& operator=(const request_lifecycle&) = delete;
  /// Aborts every request still in flight.
  ~request_lifecycle() {
    const std::unique_lock<memory_mutex> memory(memory_);
    std::lock_guard<lock_type> guard(cache_->lock_);
    for (std::uint32_t i = 0; i < states_.size(); ++i)
      if (tickets_.is_live(i)) give_back(states_[i], /*release_pin=*/true);
    cache_->remove_clear_listener(clear_link_);
  }

  /// Held (shared) by a thread while it reads or writes the bytes of pool units it resolved
  /// from this lifecycle's block tables, checkpoints or states: the calls that allocate or
  /// free (begin, grow, finish, abort, clear) wait for it. Release it before calling one of
  /// those. Costs one shared lock (nothing with no_lock).
  [[nodiscard]] std::shared_lock<memory_mutex> memory_read_lock() const { return std::shared_lock<memory_mutex>(memory_); }

  /// Empties the cache (`prefix_cache::clear`) under the memory lock: every request in
  /// flight ends, its reservation goes back, and every call on its ticket reports
  /// stale_handle. O(n + requests in flight).
  void clear() {
    const std::unique_lock<memory_mutex> memory(memory_);
    std::lock_guard<lock_type> guard(cache_->lock_);
    cache_->clear_locked();
  }

  /// Starts a request. Errors (nothing changed but the lookup's tick): empty prompt, a bad
  /// extra position or output_tokens < 0 -> invalid_argument; no room beside the pinned
  /// paths -> out_of_capacity. With a lower-tier store, `accept(hit)` decides whether a hit
  /// below HBM is loaded (e.g. only when loading beats recomputing those tokens); it runs
  /// under the cache's lock and must not call back into the cache. It returns a bool (load
  /// the whole hit or none of it) or a resume position: at most `hit.hbm_tokens` declines,
  /// `hit.reusable_tokens` or more loads it whole, and a position between loads only the KV
  /// up to it and recomputes the rest (a store with `shorten_hit`; where the store refuses
  /// that position, e.g. a hybrid model between checkpoints, the hit is declined).
  template <class AcceptHit = accept_every_hit>
  [[nodiscard]] expected<request_ticket> begin(std::span<const token_id> prompt, const begin_options& o = {},
                                               AcceptHit&& accept = {});

  /// Blocks until the lower-tier hit loaded at begin has landed in HBM (a no-op without
  /// one): call it before prefill reads `store().staged(state.host_hit)`. busy when a copy
  /// failed: the hit is gone, so abort the request and begin it again (the failed entry is
  /// no longer found). stale_handle / double_free for a ticket not in flight.
  /// With a real lock (mutex_lock) it does not hold the cache's lock while the copies run:
  /// it polls the store under the lock and sleeps between polls, so other threads' calls
  /// go on meanwhile.
  [[nodiscard]] expected<void> wait_loaded(request_ticket t) {
    if constexpr (!std::is_same_v<lock_type, no_lock> && lower_tier) {
      for (;;) {
        {
          std::lock_guard<lock_type> guard(cache_->lock_);
          if (const errc e = tickets_.validate(t.handle); e != errc::ok) return ticket_error(e);
          request_state& s = states_[t.handle.index()];
          if (s.loaded_at == 0) return {};
          const auto r = cache_->store_.loaded(s.host_hit);
          if (!r) return unexpected(r.error());
          if (*r) return {};
        }
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    } else {
      std::lock_guard<lock_type> guard(cache_->lock_);
      if (const errc e = tickets_.validate(t.handle); e != errc::ok) return ticket_error(e);
      if constexpr (lower_tier) {
        request_state& s = states_[t.handle.index()];
        if (s.loaded_at > 0) return cache_->store_.wait_loaded(s.host_hit);
      }
      return {};
    }
  }

  /// Layer-wise loading: blocks until layer `layer` of kind `k` of the hit loaded at begin is
  /// in HBM (a no-op without one), so prefill computes that layer while later ones are still
  /// being copied: call it before each layer reads `store().staged(state.host_hit)`. Needs a
  /// store and engine that report layers (`tiered_state_store` over a
  /// `layered_copy_engine`); over any other store it is `wait_loaded`. Errors as
  /// `wait_loaded`, but nothing is released: busy (a copy of the hit failed; then
  /// `wait_loaded` reports it and releases the hit), invalid_argument for a layer the store
  /// does not have (or `layer_kind::mlp`, which holds no state). With a real lock it polls
  /// and sleeps between polls, as `wait_loaded` does.
  [[nodiscard]] expected<void> wait_layer_loaded(request_ticket t, layer_kind k, std::int32_t layer) {
    if constexpr (layered_tier_store<store_type, tree_type>) {
      for (;;) {
        {
          std::lock_guard<lock_type> guard(cache_->lock_);
          if (const errc e = tickets_.validate(t.handle); e != errc::ok) return ticket_error(e);
          request_state& s = states_[t.handle.index()];
          if (s.loaded_at == 0) return {};
          if constexpr (std::is_same_v<lock_type, no_lock>) return cache_->store_.wait_layer(s.host_hit, k, layer);
          const auto r = cache_->store_.layer_loaded(s.host_hit, k, layer);
          if (!r) return unexpected(r.error());
          if (*r) return {};
        }
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    } else {
      return wait_loaded(t);
    }
  }

  /// The state of a request in flight, or stale_handle / double_free / foreign_handle. The
  /// pointer stays valid until the request's finish/abort, whatever other requests begin
  /// meanwhile (the table grows without moving the states); `grow` of this request changes
  /// what it points to (reserved_tokens, kv), nothing else does.
  [[nodiscard]] expected<const request_state*> state(request_ticket t) const {
    std::lock_guard<lock_type> guard(cache_->lock_);
    if (const errc e = tickets_.validate(t.handle); e != errc::ok) return ticket_error(e);
    return &states_[t.handle.index()];
  }

  /// Reserves KV for `tokens` more tokens (a new segment). Errors, each leaving the request
  /// as it was: tokens <= 0, or a reservation end past int64 -> invalid_argument; no room
  /// beside the pinned paths and the other reservations -> out_of_capacity.
  [[nodiscard]] expected<void> grow(request_ticket t, std::int64_t tokens);

  /// Ends a request: adopts its pages for `sequence` (= prompt ++ output, at most the
  /// reserved tokens long) with checkpoints exactly at `captured` (ascending positions in
  /// (reusable, |sequence|], each a planned site or |sequence|). Bad arguments ->
  /// invalid_argument with the request still in flight; a store failure -> the request is
  /// aborted and the error returned.
  [[nodiscard]] expected<finish_result> finish(request_ticket t, std::span<const token_id> sequence,
                                               std::span<const std::int64_t> captured);

  /// Ends a request without inserting anything: the reservation goes back, the pin is
  /// released.
  expected<void> abort(request_ticket t) {
    const std::unique_lock<memory_mutex> memory(memory_);
    std::lock_guard<lock_type> guard(cache_->lock_);
    if (const errc e = tickets_.validate(t.handle); e != errc::ok) return ticket_error(e);
    give_back(states_[t.handle.index()], /*release_pin=*/true);
    (void)tickets_.release(t.handle);
    return {};
  }

  /// The block table of a request in flight, for attention layer `layer`: `out[b]` is the
  /// page that holds token positions [b * P, (b + 1) * P) (P = tokens per page) for every
  /// block of [0, reusable + reserved): the cached path's pages before the reservation, then
  /// the reservation's. A block the cached path shares with the reservation is the
  /// reservation's copy (it holds both the cached tokens and the request's: copy-on-write),
  /// so the kernel reads and writes one page per block (kv_buffer's `block_table` layout).
  /// Only for stores that lay KV out by position (`pool_state_store`), and for trees whose
  /// nodes were inserted through this lifecycle (the KV of a plain `commit` is never written
  /// by a runtime). O(path + blocks); `out` is cleared first and grows as needed.
  /// A layer outside [0, attention layers) -> invalid_argument, `out` unchanged.
  template <class Page>
  [[nodiscard]] expected<void> block_table(request_ticket t, std::int64_t layer, std::vector<Page>& out) const
    requires pages_by_position
  {
    std::lock_guard<lock_type> guard(cache_->lock_);
    if (const errc e = tickets_.validate(t.handle); e != errc::ok) return ticket_error(e);
    if (layer < 0 || layer >= cache_->store_.attention_layers())
      return unexpected(errc::invalid_argument, "block_table: layer must lie in [0, attention layers)", layer);
    const request_state& s = states_[t.handle.index()];
    const std::int64_t P = cache_->store_.tokens_per_page();
    out.clear();
    if (const node_id deepest = tail_node(s); deepest != no_node) {
      path_scratch_.clear();
      for (node_id n = deepest; n != Cache::tree_type::root(); n = cache_->tree_.at(n).parent) path_scratch_.push_back(n);
      for (auto it = path_scratch_.rbegin(); it != path_scratch_.rend(); ++it) {
        const auto& nd = cache_->tree_.at(*it);
        out.resize(static_cast<std::size_t>(nd.begin() / P));  // a deeper node's copy of a shared block wins
        cache_->store_.append_pages(nd.kv, nd.begin(), layer, nd.begin() / P, out);
      }
    }
    std::int64_t first = s.kv_from;
    for (std::size_t k = 0; k < s.kv.size(); ++k) {
      out.resize(static_cast<std::size_t>(first / P));
      cache_->store_.append_pages(s.kv[k], first, layer, first / P, out);
      first += s.kv_tokens[k];
    }
    return {};
  }

  /// The checkpoint a request resumes from (the state after `match.reusable_tokens`: for
  /// a pool store, one SSM + conv block per recurrent layer), or nullptr on a miss. The
  /// node is pinned, so the handle stays valid until finish/abort. After a loaded host hit
  /// the state is in the store's staging room (`store().staged(state->host_hit)`):
  /// not_found here. O(1).
  [[nodiscard]] expected<const checkpoint_handle*> resume_checkpoint(request_ticket t) const {
    std::lock_guard<lock_type> guard(cache_->lock_);
    if (const errc e = tickets_.validate(t.handle); e != errc::ok) return ticket_error(e);
    const request_state& s = states_[t.handle.index()];
    if constexpr (lands_in_reservation) {
      if (s.loaded_at > 0) {  // loaded from below HBM into the slot reserved for it
        if (const checkpoint_slot* c = slot_for(s, s.loaded_at); c != nullptr) return &c->handle;
        return unexpected(errc::not_found, "resume_checkpoint: no slot holds the loaded state", s.loaded_at);
      }
    }
    if (s.loaded_at > 0)  // in the staging room
      return unexpected(errc::not_found, "resume_checkpoint: the state was loaded below HBM: read store().staged(state.host_hit)");
    if (s.match.node == no_node || s.match.pin.is_null()) return static_cast<const checkpoint_handle*>(nullptr);
    return &cache_->tree_.at(s.match.node).checkpoint;
  }

  /// Requests in flight.
  [[nodiscard]] std::uint64_t in_flight() const {
    std::lock_guard<lock_type> guard(cache_->lock_);
    return tickets_.live_count();
  }

 private:
  // Whether `accept` takes `hit`: a bool as it is, or a resume position (see `begin`),
  // shortening the hit first when it is a position inside it.
  template <class AcceptHit, class Hit>
  bool take_hit(AcceptHit& accept, Hit& hit) {
    using answer = std::remove_cvref_t<decltype(accept(std::as_const(hit)))>;
    if constexpr (std::is_same_v<answer, bool>) {
      return accept(std::as_const(hit));
    } else {
      static_assert(std::is_integral_v<answer>, "accept(hit) returns a bool or a resume position");
      const auto at = static_cast<std::int64_t>(accept(std::as_const(hit)));
      if (at <= hit.hbm_tokens) return false;
      if (at >= hit.reusable_tokens) return true;
      if constexpr (lower_tier) return cache_->store_.shorten_hit(hit, at).has_value();
      else return false;
    }
  }
  static std::uint32_t next_tag() noexcept {
    static std::atomic<std::uint32_t> counter{0};
    return 128u + (counter.fetch_add(1, std::memory_order_relaxed) & 0x7fu);
  }

  /// A 64-bit hash of a token run (splitmix64 chained), to recognise the prompt at finish
  /// without keeping a copy of it. O(n).
  static std::uint64_t hash_tokens(std::span<const token_id> s) noexcept {
    std::uint64_t h = 0x6a09e667f3bcc908ull;
    for (token_id t : s) h = splitmix64_mix(h ^ static_cast<std::uint32_t>(t));
    return h;
  }

  /// Bytes `allocate_kv_at(first, tokens)` takes (0 for no tokens).
  std::int64_t kv_bytes_at(std::int64_t first, std::int64_t tokens) const noexcept {
    if (tokens <= 0) return 0;
    if constexpr (pages_by_position) return cache_->store_.kv_bytes_at(first, tokens);
    else return cache_->store_.kv_bytes(tokens);
  }

  expected<kv_extent> allocate_kv_at(std::int64_t first, std::int64_t tokens) noexcept {
    if constexpr (pages_by_position) return cache_->store_.allocate_kv_at(first, tokens);
    else return cache_->store_.allocate_kv(tokens);
  }

  /// Copy-on-write of the block the reservation shares with the cached prefix: the cached
  /// tokens [first - first % P, first) go into the reservation's first block, so that the
  /// block table names one complete page per block. O(P · layers).
  void copy_shared_block_from_path(request_state& s, std::int64_t first) noexcept {
    if constexpr (pages_by_position) {
      const std::int64_t P = cache_->store_.tokens_per_page();
      const node_id deepest = tail_node(s);
      if (first % P == 0 || deepest == no_node) return;
      const std::int64_t lo = first - first % P;
      for (node_id n = deepest; n != Cache::tree_type::root(); n = cache_->tree_.at(n).parent) {
        const auto& nd = cache_->tree_.at(n);
        const std::int64_t a = std::max(lo, nd.begin()), b = std::min(first, nd.end);
        if (a < b) cache_->store_.copy_tokens(nd.kv, nd.begin(), s.kv[0], first, a, b);
        if (nd.begin() <= lo) break;
      }
    } else {
      (void)s;
      (void)first;
    }
  }

  void grow_table() {
    const auto cap = tickets_.capacity() * 2;
    tickets_.reserve(cap);
    states_.resize(cap);
  }

  /// Runs `allocate` until it succeeds, evicting one victim (never a pinned path) per
  /// failure; out_of_capacity when nothing is left to evict.
  template <class Allocate>
  auto allocate_evicting(Allocate allocate) -> decltype(allocate()) {
    commit_result scratch;
    bool round = false;
    while (true) {
      auto r = allocate();
      if (r) return r;
      if (!round) {
        round = true;
        cache_->begin_eviction_round();
      }
      if (cache_->evict_one(scratch) < 0) return r;
    }
  }

  /// Reserves the KV extent and the checkpoint slots of `s` (all or nothing). `need` is
  /// every allocation below, per side. The fit check runs before anything is evicted; with
  /// a two-sided store (side_placing_store) it also checks each side's placement, the
  /// evictions go on until each side can place its part, and the allocations run with the
  /// split held: none can fail after evicting.
  errc reserve(request_state& s, const side_bytes& need, std::int64_t sites);

  /// Splits `finish` may make: one per captured position inside the reservation or inside a
  /// cached edge (at most the planned sites and the end), one to drop the tokens the tree
  /// already holds, one for the unused tail.
  static std::int64_t split_room_for(std::int64_t sites) noexcept { return sites + 3; }

  void free_split_room(request_state& s) noexcept {
    for (auto& r : s.split_room) cache_->store_.free_kv(std::move(r));
    s.split_room.clear();
  }

  /// Frees what `s` still holds (segments, slots, split room) and, if asked, releases its pin.
  void give_back(request_state& s, bool release_pin) noexcept {
    free_split_room(s);
    for (auto& k : s.kv) cache_->store_.free_kv(std::move(k));
    for (auto& c : s.checkpoints) cache_->store_.free_checkpoint(std::move(c.handle));
    s.kv.clear();
    s.kv_tokens.clear();
    s.checkpoints.clear();
    s.reserved_tokens = 0;
    // A pin made stale by `clear()` is not released again (its slot may be reused).
    if (release_pin && !s.match.pin.is_null() && cache_->pins_.validate(s.match.pin) == errc::ok)
      cache_->unpin(s.match.pin);
    s.match.pin = packed_handle{};
    if (release_pin) release_holds(s);
  }

  /// Pins the deepest node of `prompt`'s path holding KV before min(common prefix, loaded_at
  /// or |prompt|) beyond the matched node and sets kv_from there: prefill reads that KV from
  /// the tree instead of reserving it again (and, after a host hit, the host brought only
  /// what HBM lacked), so eviction must not take it before finish. begin has made room for
  /// the pin.
  void pin_kv_tail(request_state& s, std::span<const token_id> prompt) noexcept {
    Cache& c = *cache_;
    const auto n = static_cast<std::int64_t>(prompt.size());
    const std::int64_t upto = std::min(s.match.common_prefix, s.loaded_at > 0 ? s.loaded_at : n);
    if (upto <= s.match.reusable_tokens) return;  // nothing beyond the matched node
    HYBRIDCACHE_ASSERT(c.pins_.free_count() > 0);
    const walk_result w = c.walk(prompt);
    node_id deep = no_node;
    for (node_id id : c.path_)
      if (c.tree_.at(id).begin() < upto) deep = id;
    if (w.partial != no_node && c.tree_.at(w.partial).begin() < upto) deep = w.partial;
    if (deep == no_node || deep == s.match.node) return;
    const packed_handle h = *c.pins_.acquire();
    c.pin_node_[h.index()] = deep;
    c.tree_.pin(deep);
    c.scorer_.on_update(c.tree_, deep);
    s.kv_pin = h;
    s.kv_from = upto;
  }
  /// The deepest node whose KV a request reads from the tree (its KV-only tail's, or the
  /// matched node), or no_node (a miss, or a cache cleared under it).
  node_id tail_node(const request_state& s) const noexcept {
    if (!s.kv_pin.is_null() && cache_->pins_.validate(s.kv_pin) == errc::ok) return cache_->pin_node_[s.kv_pin.index()];
    if (s.match.node != no_node && !s.match.pin.is_null()) return s.match.node;
    return no_node;
  }
  void release_kv_pin(request_state& s) noexcept {
    if (!s.kv_pin.is_null() && cache_->pins_.validate(s.kv_pin) == errc::ok) cache_->unpin(s.kv_pin);
    s.kv_pin = packed_handle{};
  }

  /// Gives back what a request holds beyond its match's pin: the KV-only tail's pin and a
  /// lower-tier hit (its staged entries return to the host tier).
  void release_holds(request_state& s) noexcept {
    release_kv_pin(s);
    if constexpr (lower_tier) {
      cache_->store_.release_hit(s.host_hit);
      decltype(s.host_hit) none{};
      none.salt = s.host_hit.salt;          // settle names in it
      none.kv_reach = s.host_hit.kv_reach;  // the branch below stays known
      s.host_hit = none;
    }
    s.loaded_at = 0;
  }

  static const checkpoint_slot* slot_for(const request_state& s, std::int64_t p) noexcept {
    for (const auto& c : s.checkpoints)
      if (c.position == p && store_type::holds(c.handle)) return &c;
    return nullptr;
  }
  static checkpoint_slot* slot_for(request_state& s, std::int64_t p) noexcept {
    return const_cast<checkpoint_slot*>(slot_for(std::as_const(s), p));
  }

  /// Hands the reservation's KV over range by range: [cursor, a) goes back (the tree
  /// already holds it), then [a, b) is split off the front (joining segments if needed).
  struct reservation_source {
    request_lifecycle* self;
    request_state* s;
    std::int64_t cursor;  // first token still in s->kv
    std::int64_t len;

    errc drop_front(std::int64_t n) noexcept {
      while (n > 0 && !s->kv.empty()) {
        const std::int64_t first = s->kv_tokens.front();
        if (first <= n) {
          self->cache_->store_.free_kv(std::move(s->kv.front()));
          s->kv.erase(s->kv.begin());
          s->kv_tokens.erase(s->kv_tokens.begin());
          n -= first;
          cursor += first;
          continue;
        }
        auto head = self->cache_->store_.split_kv(s->kv.front(), n);
        if (!head) return head.error();
        self->cache_->store_.free_kv(std::move(*head));
        s->kv_tokens.front() -= n;
        cursor += n;
        n = 0;
      }
      return errc::ok;
    }
    expected<kv_extent> take_kv(std::int64_t a, std::int64_t b) noexcept {
      if (a < cursor) return unexpected(errc::invalid_argument);
      if (const errc e = drop_front(a - cursor); e != errc::ok) return unexpected(e);
      const std::int64_t n = b - a;
      while (!s->kv.empty() && s->kv_tokens.front() < n && s->kv.size() > 1) {  // join the next segment
        if constexpr (pages_by_position) {
          // The block table names the later segment's copy of the block the two share: it
          // is the one the runtime wrote last. Bring its earlier slots back first.
          const std::int64_t P = self->cache_->store_.tokens_per_page();
          const std::int64_t boundary = cursor + s->kv_tokens[0];
          const std::int64_t lo = std::max(cursor, boundary - boundary % P);
          if (boundary % P != 0) self->cache_->store_.copy_tokens(s->kv[1], boundary, s->kv[0], cursor, lo, boundary);
        }
        auto joined = self->cache_->store_.join_kv(s->kv[0], std::move(s->kv[1]));
        if (!joined) return unexpected(joined.error());
        s->kv_tokens[0] += s->kv_tokens[1];
        s->kv.erase(s->kv.begin() + 1);
        s->kv_tokens.erase(s->kv_tokens.begin() + 1);
      }
      if (s->kv.empty() || s->kv_tokens.front() < n) return unexpected(errc::invalid_argument);
      if (s->kv_tokens.front() == n) {
        kv_extent out = std::move(s->kv.front());
        s->kv.erase(s->kv.begin());
        s->kv_tokens.erase(s->kv_tokens.begin());
        cursor += n;
        return out;
      }
      auto head = self->cache_->store_.split_kv(s->kv.front(), n);
      if (!head) return unexpected(head.error());
      s->kv_tokens.front() -= n;
      cursor += n;
      return head;
    }
    expected<checkpoint_handle> take_checkpoint(std::int64_t p) noexcept {
      checkpoint_slot* c = slot_for(*s, p);
      if (c == nullptr && p == len) c = slot_for(*s, 0);  // the end slot
      if (c == nullptr) return unexpected(errc::invalid_argument);
      checkpoint_handle h = std::move(c->handle);
      c->handle = checkpoint_handle{};
      return h;
    }
  };

  /// The insert of `finish`: commit's walk and build with the reservation as the source of
  /// every handle and exactly the captured positions (no admission, no eviction).
  errc adopt(request_state& s, std::span<const token_id> seq, std::span<const std::int64_t> captured,
             finish_result& out);

  /// The error for a ticket that is not in flight, with what happened to it.
  static unexpected ticket_error(errc e) noexcept {
    switch (e) {
      case errc::double_free: return unexpected(e, "request_lifecycle: the ticket's request already ended (finish or abort)");
      case errc::stale_handle: return unexpected(e, "request_lifecycle: the ticket's request was ended by clear()");
      case errc::foreign_handle: return unexpected(e, "request_lifecycle: the ticket belongs to another lifecycle");
      default: return unexpected(e);
    }
  }

  /// The cache's clear() (under its lock): every request in flight gives back what it
  /// holds and its ticket is retired (calls on it report stale_handle).
  void end_all_requests() noexcept {
    for (std::uint32_t i = 0; i < states_.size(); ++i)
      if (tickets_.is_live(i)) give_back(states_[i], /*release_pin=*/true);
    tickets_.release_all();
  }

  /// The argument checks of begin, before anything is looked at.
  static error_info check_begin(std::span<const token_id> prompt, const begin_options& o) noexcept;
  /// The largest reservation (tokens of KV) the store could ever hold, so that sizes past
  /// it are refused before any byte count is computed (no overflow). Saturates.
  std::int64_t max_reservable_tokens() const noexcept;
  /// begin with the reuse the match found (the HBM state, its KV-only tail, a hit below
  /// HBM): plan and reserve.
  template <class AcceptHit>
  error_info reserve_with_hits(request_state& s, std::span<const token_id> prompt, const begin_options& o,
                               AcceptHit& accept);
  /// begin's fallback when that does not fit: the same state alone, then shallower cached
  /// states on the path (the deepest that fits, by bisection), then none.
  error_info reserve_reusing_less(request_state& s, std::span<const token_id> prompt, const begin_options& o,
                                  bool had_holds);
  /// Plans prefill from `resume` and computes what the reservation needs (s.plan,
  /// s.reserved_tokens, s.extra_skipped); out_of_capacity for a reservation past
  /// max_reservable_tokens. `as_empty`: the plan an empty cache would make.
  error_info plan_request(request_state& s, std::span<const token_id> prompt, const begin_options& o,
                          const match_result& resume, std::int64_t lower_branch, side_bytes& need,
                          bool as_empty = false);
  /// The last resort of a request alone in the cache (no other request, no pin): with a
  /// two-sided store whose current split cannot place `need` even once everything is
  /// evicted, but whose empty pool could, evict until the store has re-split its free
  /// chunks and `need` fits. False (nothing evicted) when an empty cache could not hold it.
  bool evict_until_fits_alone(const side_bytes& need);
  /// Whether `need` fits beside the pinned paths once eviction has run (nothing changes
  /// but free chunks the store may move between its sides).
  bool fits(const side_bytes& need) {
    cache_->prepare_placement(need);
    return cache_->fits_after_eviction(need, nullptr);
  }

  Cache* cache_;
  mutable memory_mutex memory_;
  typename Cache::clear_listener clear_link_;
  std::vector<node_id> candidates_;  // reserve_reusing_less's shallower states
  // Two requests were ever in flight together: the live hits finish reports to a scorer
  // that compares them with its shadows' are not comparable from then on.
  bool overlapped_ = false;
  generation_table tickets_;
  // A deque: growing it never moves a request's state, so the pointer `state()` hands out
  // stays valid while other threads begin requests.
  std::deque<request_state> states_;
  mutable std::vector<node_id> path_scratch_;  // block_table's root-ward walk
};

}  // namespace hybridcache::prefix

#include "hybridcache/prefix/detail/lifecycle_calls.hpp"  // IWYU pragma: keep
