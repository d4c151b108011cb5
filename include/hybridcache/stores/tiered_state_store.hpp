// hybridcache/stores/tiered_state_store.hpp
//
// `tiered_state_store`: a `state_store` over an N-tier `tiered_store` (HBM, then
// host, CXL, ...), so that `prefix_cache<Model, Admission, Scorer, tiered_state_store<...>>`
// is the library's one multi-tier cache: the prefix cache keeps KV extents and SSM
// checkpoints in HBM, and what its scorer evicts *demotes* to the tiers below instead of
// being dropped, from where a later request loads it back.
//
// The seam. The prefix cache owns the radix tree and decides what leaves HBM; it frees the
// victim's handles through the store. The store cannot read tokens, so a freed handle is
// findable later only if it carries a content key: `settle` names the entries of every
// committed path by the chained hash of their token prefix (core/hash.hpp `content_key`,
// seeded by the model id and the request's cache salt). A runtime drives it through the
// request lifecycle (prefix/lifecycle.hpp), which makes these calls:
//
//   begin:  h = lookup(prompt, hbm_match)   // hit below HBM: pins what it reads
//           load(h)                         // submits the copies into HBM staging (async)
//   ...     wait_loaded(h)                  // (runtime) before reading `staged(h)`
//   finish: settle(tree, sequence, h)       // adopts the staged pages, names the path
//
// Entries. An entry is one extent's KV (layer-major: one segment per attention layer) or one
// checkpoint (SSM + conv state, one segment per recurrent layer) and may have a copy in
// several tiers (tiered/tiered_store.hpp). Its role: the tree's (an HBM copy the tree
// holds, perhaps with clean replicas below), staged (loaded for outstanding hits), or free
// (evicted by the tree, findable by key in the tiers below; its HBM copy may still be
// draining).
//
// Asynchronous copies, off the request path where they can be. Every copy is submitted to
// the engine and completed later by `poll()` (a runtime's offload thread, or any store
// call). A store call waits for copies (it runs the engine's `wait`, under the caller's lock)
// only where it cannot go on without them: an allocation that needs the HBM pages a
// write-back still holds; making room in a lower tier by moving an entry one tier down
// (the cascade's copy); a split or join of an entry that has copies in flight (they finish
// first); `wait_loaded`/`settle` for a hit's own loads; and the destructor (`drain`).
// - Write policy (`write_policy`): write_back copies an entry down when the tree evicts it
//   (its HBM pages are freed when the copy lands; an allocation that needs them waits);
//   write_through copies every named entry down as soon as its request finishes, and
//   write_through_selective once it has been hit N times; eviction of an entry with a
//   clean copy below drops the HBM copy without a copy.
// - `offload()` (the watermark cleaner, CaR's asynchronous offload at 90 %): at or above
//   the high watermark, clean replicas of the coldest dirty entries are made, down to the
//   low watermark, so that the evictions to come cost no copy.
// - A free entry stays readable while its write-back is in flight (a hit reads the HBM
//   copy); two hits that need the same bytes share one load (the second joins the copy in
//   flight); pins are taken in the tier that is read (`pin_in`), never by locate-then-pin.
// - Lower tiers make room by dropping clean copies, moving entries one tier down
//   (cascades), and dropping from the last tier.
//
// Loads are exact: `load` copies, for each lower-tier KV entry, only the tokens the hit
// reuses that HBM lacks, and one checkpoint (`tiered_hit::bytes_to_load`), each as a new
// staged entry (`staged`) that belongs to that hit alone; `settle` hands its pages to the
// nodes this commit created without a copy. A node another request inserted meanwhile
// keeps its own pages (requests in flight may be reading them) and the staged copy goes.
// A lookup also finds a demoted entry the input follows only part of the way (by the
// content keys of the positions inside it) and loads just that part; a sparsified entry
// is found only whole. Over an engine that takes groups (`grouped_copy_engine`) a hit's
// copies are submitted as one group, layer-major across its entries, so layer 0 of the
// whole hit lands first (`layer_loaded`, `wait_layer`).
//
// Costs (d = path nodes, |s| = sequence length, r = page runs of an entry, c = copies in
// flight, e = entries a hit uses): allocate/free/split/join O(r + log n) plus a poll (O(c))
// and the copies they submit; lookup O(|s|) hashing + O(|s|) probes (none while nothing
// is below HBM), allocation-free after warm-up; load O(e (r + log n)); settle O(|s| + d (r
// + log n)); poll O(c); offload O(k log n) for the k coldest entries it visits.
// Thread safety: none of its own beyond the table's lock; call it under the prefix cache's
// lock (`prefix_cache::with_store`), from the request path and from an offload thread.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "hybridcache/concepts/state_store.hpp"
#include "hybridcache/concepts/tier_store.hpp"
#include "hybridcache/core/error.hpp"
#include "hybridcache/core/expected.hpp"
#include "hybridcache/core/hash.hpp"
#include "hybridcache/model/model_spec.hpp"
#include "hybridcache/prefix/radix_tree.hpp"
#include "hybridcache/prefix/types.hpp"
#include "hybridcache/stores/detail/hit_table.hpp"
#include "hybridcache/stores/tiered_state_types.hpp"
#include "hybridcache/tiered/copy_plan.hpp"
#include "hybridcache/tiered/sparsify.hpp"
#include "hybridcache/tiered/tiered_store.hpp"

namespace hybridcache::stores {

namespace detail {
template <class Store, class Tree>
std::string check_tiered_invariants(const Store& st, const Tree& tree);
}  // namespace detail

/// A `state_store` over N tiers. See the file comment. `Engine` copies the bytes
/// of every move (its arenas laid out from `tiers_for(config)` and `page_bytes_for(config)`);
/// `Sizer` says how many bytes a demoted KV entry keeps (`keep_size`, or CaR's
/// sparsification: a simulation model, whose sparsified entries are loaded but never
/// adopted by the tree).
template <demotion_scorer HostScorer = tiered::lru_demotion, tier_copy_engine Engine = tiered::metadata_only_copies,
          demotion_sizer Sizer = tiered::keep_size>
class tiered_state_store {
 public:
  using kv_extent = tiered_kv_extent;
  using checkpoint_handle = tiered_checkpoint_handle;
  /// Whether `h` holds a checkpoint (`state_store::holds`; a model without recurrent layers
  /// holds one of 0 bytes, with no entry). O(1).
  [[nodiscard]] static bool holds(const checkpoint_handle& h) noexcept { return h.held; }
  using engine_type = Engine;
  using event_type = std::remove_cvref_t<decltype(*std::declval<Engine&>().submit(std::declval<const move_ticket&>()))>;

  static constexpr tier_id host_tier{1};

  /// A metadata-only store (simulation: nothing is copied).
  /// @throws invalid_argument for a bad configuration; capacity_error when one checkpoint
  /// does not fit in HBM.
  explicit tiered_state_store(const tiered_state_store_config& c, Sizer sizer = Sizer{}, HostScorer host = HostScorer{})
    requires std::same_as<Engine, tiered::metadata_only_copies>
      : tiered_state_store(c, no_copies(), std::move(sizer), std::move(host)) {}

  /// A store whose copies go through `engine` (which must outlive the store); `host` orders
  /// the victims of the tiers below HBM (and the cleaner's walk of HBM).
  /// @throws as above; invalid_argument when the engine's pages or arenas do not match.
  tiered_state_store(const tiered_state_store_config& c, Engine& engine, Sizer sizer = Sizer{},
                     HostScorer host = HostScorer{});

  /// The tiers of a store built from `c`: HBM (budget + staging room), then the lower tiers.
  /// @throws invalid_argument for a bad configuration.
  [[nodiscard]] static std::vector<tiered::tier_config> tiers_for(const tiered_state_store_config& c);
  /// The page size of a store built from `c`: gcd of one token's KV in one attention layer
  /// and one recurrent layer's state, so both are whole pages in every layer segment.
  [[nodiscard]] static std::int64_t page_bytes_for(const tiered_state_store_config& c);

  /// The metadata-only store of the same tier stack, demotion order and sizer: what a
  /// shadow of this cache runs on (the adaptive selector's tier-aware shadows,
  /// compose/adaptive_scorer.hpp). Its copies complete at once; nothing is copied.
  using metadata_replica_type = tiered_state_store<HostScorer, tiered::metadata_only_copies, Sizer>;
  /// An empty `metadata_replica_type` built from `c` (usually `config()`, perhaps with
  /// other tier sizes) with copies of this store's host scorer and sizer.
  /// @throws as the constructor, for a bad `c`; this store is not touched.
  [[nodiscard]] metadata_replica_type metadata_replica(const tiered_state_store_config& c) const {
    return metadata_replica_type(c, sizer_, store_->scorer());
  }
  /// The configuration the store was built from.
  [[nodiscard]] const tiered_state_store_config& config() const noexcept { return config_; }

  tiered_state_store(tiered_state_store&&) noexcept = default;
  tiered_state_store& operator=(tiered_state_store&&) noexcept = default;
  /// Waits for the copies in flight (their engine must not outlive their tickets).
  ~tiered_state_store() { drain(); }

  // --- state_store -------------------------------------------------------------

  [[nodiscard]] expected<kv_extent> allocate_kv(std::int64_t tokens) noexcept {
    if (tokens <= 0) return unexpected(errc::invalid_argument);
    if (kv_per_token_ > 0 && tokens > (std::int64_t{1} << 62) / kv_per_token_) return unexpected(errc::out_of_capacity);
    auto id = allocate(tokens * kv_per_token_, kind::kv, tokens);
    if (!id) return unexpected(id.error());
    return kv_extent{*id, tokens};
  }
  void free_kv(kv_extent&& e) noexcept {
    const kv_extent h = std::move(e);
    if (h.id != no_entry) release_from_tree(h.id);
  }
  /// Detaches the first `n` tokens. The tail keeps its entry (and its key: same end); the
  /// head is a fresh, unnamed entry (the first n tokens' pages of every layer segment, no
  /// copy) that `settle` names. A clean replica below splits with it.
  [[nodiscard]] expected<kv_extent> split_kv(kv_extent& whole, std::int64_t n) noexcept;
  /// `front` becomes front ++ back (per layer segment: its pages, then back's; no copy) and
  /// takes back's key (the joined span ends where back did).
  [[nodiscard]] expected<void> join_kv(kv_extent& front, kv_extent&& back) noexcept;
  [[nodiscard]] expected<checkpoint_handle> allocate_checkpoint() noexcept {
    auto id = allocate(checkpoint_, kind::checkpoint, 0);
    if (!id) return unexpected(id.error());
    return checkpoint_handle{*id};
  }
  void free_checkpoint(checkpoint_handle&& c) noexcept {
    const checkpoint_handle h = std::move(c);
    if (h.id != no_entry) release_from_tree(h.id);
  }
  [[nodiscard]] std::int64_t kv_bytes(std::int64_t tokens) const noexcept { return tokens * kv_per_token_; }
  [[nodiscard]] std::int64_t checkpoint_bytes() const noexcept { return checkpoint_; }
  /// HBM bytes the tree holds (the prefix cache's budget).
  [[nodiscard]] std::int64_t used_bytes() const noexcept { return used_; }
  [[nodiscard]] std::int64_t capacity_bytes() const noexcept { return capacity_; }

  // --- lower tiers ---------------------------------------------------------------------

  /// The hit of `input` below HBM, given the cache's HBM match `m` of the same input: KV
  /// extents of free entries (any tier) that continue HBM's KV, then the deepest covered
  /// position with a checkpoint (the joint-min rule over all tiers). Pins what it uses in
  /// the tier it will be read from (hand the hit to `load`, `settle` or `release_hit`).
  [[nodiscard]] tiered_hit lookup(std::span<const token_id> input, const match_result& m);

  /// What `lookup` would find, without pinning or counting anything: the position a hit
  /// below HBM would resume at (m.reusable_tokens when none). For a scheduler that sorts
  /// requests by where their reuse is (CaR's groups). O(|input|).
  [[nodiscard]] std::int64_t probe(std::span<const token_id> input, const match_result& m) {
    entry_id ckpt = no_entry;
    return scan(input, m, ckpt);
  }
  /// `probe`, and where the bytes would come from: the tier `lookup` would read each entry
  /// from (its fastest valid copy) and the slowest of those (`tiered_hit::source_tier`), so a
  /// prefetcher prices the load with the right link. O(|input| + entries).
  [[nodiscard]] tiered_probe probe_hit(std::span<const token_id> input, const match_result& m);

  /// Resumes `hit` at `tokens` instead (hbm_tokens < tokens <= reusable_tokens), before
  /// `load`: the KV of [tokens, reusable_tokens) is then recomputed instead of loaded. What a
  /// runtime does when loading the whole hit would take longer than computing the tokens
  /// after it (the load cannot hide behind that compute layer by layer): it loads part and
  /// recomputes the rest. Only a model without recurrent layers resumes anywhere its KV
  /// reaches; a hybrid one resumes only at its checkpoint, so `tokens` must be
  /// `reusable_tokens` there. Entries no longer read are unpinned; `bytes_to_load`,
  /// `host_tokens`, `kv_entries` and `source_tier` are updated, and so are the counters.
  /// Errors (nothing changed): stale_handle when not outstanding; invalid_argument for a
  /// position outside (hbm_tokens, reusable_tokens], one a hybrid model cannot resume at,
  /// or a hit already loaded. O(entries of the hit).
  [[nodiscard]] expected<void> shorten_hit(tiered_hit& hit, std::int64_t tokens);

  /// Submits the copies of `hit` into the HBM staging room (`staged(hit)`): for each KV
  /// entry the tokens it adds, and the checkpoint. Asynchronous: call `wait_loaded` before
  /// reading them. A copy another hit already started for the same bytes is joined, not
  /// repeated. Calling it again for the same hit does nothing. Errors (the hit released,
  /// nothing staged for it): stale_handle when `hit` is not outstanding; out_of_capacity
  /// when the staging room cannot hold it; busy when a copy could not be submitted.
  [[nodiscard]] expected<void> load(const tiered_hit& hit);

  /// Where a loaded hit lands: in the staging room (`load`), handed to the new nodes at
  /// `settle`; the runtime reads it through `staged(hit)`.
  static constexpr bool lands_in_reservation = false;
  /// Nothing: the hit was staged by `load` and is adopted at `settle` (`lower_tier_store`'s
  /// step for stores that land a hit in the request's reservation). O(1).
  void land(const tiered_hit&, const kv_extent&, std::int64_t, const checkpoint_handle&) noexcept {}

  /// Blocks until the copies of `hit` landed. busy when one failed: the hit is released
  /// (the runtime aborts the request and begins it again). stale_handle when not outstanding.
  [[nodiscard]] expected<void> wait_loaded(const tiered_hit& hit);
  /// Non-blocking `wait_loaded`: completes the copies that landed (`poll`), then true when
  /// every copy of `hit` has landed, false while one is still running; errors as
  /// `wait_loaded`. Lets a runtime that shares the store between threads wait without
  /// holding the store's lock (request_lifecycle::wait_loaded over a mutex_lock cache).
  [[nodiscard]] expected<bool> loaded(const tiered_hit& hit);

  /// Layer-wise loading, over an engine that lands a copy layer by layer
  /// (`layered_copy_engine`): true once layer `layer` of kind `k` (and every earlier layer
  /// of that kind; attention layer l is segment l of every staged KV entry, recurrent layer
  /// r segment r of the staged checkpoint, numbered within their kind as the config counts
  /// them) of every entry `load` staged for `hit` is in HBM, so prefill may compute
  /// that layer while later ones are still being copied; false while it is not. Completes
  /// the copies that landed first (`poll`). A join of another hit's copy counts once its own
  /// copy inside HBM has started. Errors, with nothing else changed: stale_handle when `hit`
  /// is not outstanding; invalid_argument for a layer outside [0, attention_layers) or
  /// [0, recurrent_layers) and for `layer_kind::mlp`; busy when a copy of the hit failed
  /// before that layer landed, and for every layer once the store has seen the failure (the
  /// hit is lost: `wait_loaded` reports it and releases the hit).
  /// O(staged entries x copies in flight).
  [[nodiscard]] expected<bool> layer_loaded(const tiered_hit& hit, layer_kind k, std::int32_t layer)
    requires layered_copy_engine<Engine>;
  /// Blocking `layer_loaded`: returns once that layer of every staged entry is in HBM.
  [[nodiscard]] expected<void> wait_layer(const tiered_hit& hit, layer_kind k, std::int32_t layer)
    requires layered_copy_engine<Engine>;

  /// What `load` staged for `hit` (empty before `load`, or for a hit not outstanding).
  [[nodiscard]] std::span<const staged_entry> staged(const tiered_hit& hit) const noexcept {
    const outstanding_hit* slot = find_hit(hit.ticket);
    return slot == nullptr ? std::span<const staged_entry>{} : std::span<const staged_entry>(slot->staged);
  }
  /// Calls `f(const staged_entry&, const event_type* copy)` for each staged entry of `hit`:
  /// `copy` is the engine event of the copy filling it, or nullptr once it has landed
  /// (a timed engine reads per-layer arrival times from it).
  template <class F>
  void for_each_load(const tiered_hit& hit, F&& f) const {
    const outstanding_hit* slot = find_hit(hit.ticket);
    if (slot == nullptr) return;
    for (const staged_entry& s : slot->staged) {
      entry_id copied = s.id;  // a join not started waits for its source's copy
      if (const auto m = meta_.find(s.id); m != meta_.end() && m->second.pending_src != no_entry)
        copied = m->second.pending_src;
      const event_type* ev = nullptr;
      for (const auto& c : inflight_)
        if (c.t.id == copied) ev = &c.ev;
      f(s, ev);
    }
  }
  /// Hits outstanding (looked up, not yet settled or released). O(1).
  [[nodiscard]] std::size_t outstanding_hits() const noexcept { return hits_.outstanding(); }

  /// After the cache inserted `sequence` (finish/commit): hands staged pages to the tree's
  /// nodes covering the same tokens, names every node on `sequence`'s path by its content
  /// key, releases `hit`, erases lower-tier entries HBM now holds again, and starts the
  /// write-through copies the policy asks for.
  template <class Tree>
  void settle(const Tree& tree, std::span<const token_id> sequence, const tiered_hit& hit = {});

  /// Releases `hit` without a commit (request abandoned): pins go, what it staged goes
  /// (once its copies landed).
  void release_hit(const tiered_hit& hit) noexcept {
    if (outstanding_hit* slot = find_hit(hit.ticket); slot != nullptr) release_holds(*slot);
  }
  /// Releases a prefetch's `hit` but keeps what it loaded in the staging room, for the
  /// request it was for: that request's `load` claims those entries instead of copying
  /// again. Unclaimed ones go when the room is needed.
  void release_hit_keep_loaded(const tiered_hit& hit) noexcept {
    if (outstanding_hit* slot = find_hit(hit.ticket); slot != nullptr) release_holds(*slot, true);
  }

  // --- asynchronous work ---------------------------------------------------------------

  /// Completes the copies that landed (write-backs free their HBM pages, loads become
  /// readable). Returns how many. O(copies in flight).
  std::int64_t poll() noexcept;
  /// The watermark cleaner: see `tiered_state_store_config::offload`. Returns the bytes
  /// whose copies it started. Call it off the request path (an offload thread).
  std::int64_t offload() noexcept;
  /// Waits for every copy in flight and completes it.
  void drain() noexcept {
    while (!inflight_.empty()) finish_copy(0);
  }
  /// Copies in flight.
  [[nodiscard]] std::size_t inflight_copies() const noexcept { return inflight_.size(); }

  // --- CaR's score -------------------------------------------------------------------

  /// CaR's Score of an entry the tree holds (a KV extent's or checkpoint's `id`), which the
  /// host scorer may read (`car_score_demotion`: the tiers below HBM and the cleaner's walk
  /// of HBM, smallest score first). `set_score` sets it (a mirror of `car_score_board`'s
  /// column: `tiered::mirror_score` copies a node's score onto its KV and checkpoint
  /// entries), `add_score` adds to it. The score belongs to the tree's use of the entry, as
  /// the board's belongs to the node: an entry the tree frees (evicted) goes back to 0, the
  /// head `split_kv` detaches starts at 0 (a new node), and `join_kv`'s result keeps back's
  /// (the node that stays). Errors (nothing changes): not_found for an id the tree does not
  /// hold (no_entry, a free or staged entry, or none); invalid_argument for a value that is
  /// not finite. O(1) lookup + O(c log n) re-sort (c copies), no allocation.
  [[nodiscard]] expected<void> set_score(entry_id id, double score) noexcept {
    return on_tree_entry(id, [&] { return store_->set_score(id, score); });
  }
  [[nodiscard]] expected<void> add_score(entry_id id, double delta) noexcept {
    return on_tree_entry(id, [&] { return store_->add_score(id, delta); });
  }

  // --- introspection -------------------------------------------------------------------

  [[nodiscard]] const tiered_state_counters& counters() const noexcept { return counters_; }
  [[nodiscard]] const tiered::tiered_store<HostScorer>& table() const noexcept { return *store_; }
  [[nodiscard]] std::int64_t page_bytes() const noexcept { return page_; }
  [[nodiscard]] std::size_t tier_count() const noexcept { return store_->tier_count(); }
  /// Bytes (page granular) held in tier `t`, copies in flight included.
  [[nodiscard]] std::int64_t tier_used_bytes(tier_id t) const { return store_->usage(t).used_bytes; }
  /// Bytes held in the first tier below HBM.
  [[nodiscard]] std::int64_t host_used_bytes() const { return tier_used_bytes(host_tier); }
  /// HBM staging bytes in use (entries `load` brought back, until `settle`).
  [[nodiscard]] std::int64_t staged_bytes() const noexcept { return staged_used_; }
  /// HBM bytes of evicted entries whose write-back is still in flight.
  [[nodiscard]] std::int64_t draining_bytes() const noexcept { return draining_; }
  /// Free KV entries whose span lies within the first `upto` tokens of `sequence` (0 after
  /// `settle(tree, sequence)` for upto = the tree's common prefix with it: no KV is held
  /// both in the tree and below). Diagnostic, O(|sequence|).
  [[nodiscard]] std::int64_t host_kv_within(std::span<const token_id> sequence, std::int64_t upto,
                                            const cache_salt& salt = std::nullopt) {
    hash_prefixes(sequence, salt);
    std::int64_t n = 0;
    for (std::int64_t p = 1; p <= std::min<std::int64_t>(upto, static_cast<std::int64_t>(sequence.size())); ++p)
      if (const auto it = kv_keys_.find(prefix_hash_[static_cast<std::size_t>(p)]); it != kv_keys_.end())
        n += meta_.at(it->second).superseded ? 0 : 1;
    return n;
  }
  /// Free (evicted, findable) entries.
  [[nodiscard]] std::int64_t host_entries() const noexcept {
    return static_cast<std::int64_t>(kv_keys_.size() + ckpt_keys_.size());
  }
  [[nodiscard]] write_policy writes() const noexcept { return write_; }

  /// Checks the table, the roles and byte counts, that the tree's handles are exactly the
  /// tree-role entries, and that each key names at most one free entry. Empty = OK.
  template <class Tree>
  [[nodiscard]] std::string check_invariants(const Tree& tree) const {
    return detail::check_tiered_invariants(*this, tree);
  }

 private:
  template <class Store, class Tree>
  friend std::string detail::check_tiered_invariants(const Store& st, const Tree& tree);
  using outstanding_hit = detail::outstanding_hit;
  enum class kind : unsigned char { kv, checkpoint };
  enum class role : unsigned char { tree, staged, free };
  enum class purpose : unsigned char { write_back, replica, load, cascade };
  struct meta {
    kind k = kind::kv;
    role r = role::tree;
    std::int64_t tokens = 0;  // kv only
    std::uint64_t key = 0;
    std::int64_t end = 0;     // token position where the span ends (named and staged entries)
    bool named = false;
    bool superseded = false;  // a free entry the tree named again, kept while a hit holds it
    bool replicating = false; // a copy down is in flight
    bool failed = false;      // staged: its copy failed (kept until its hits let go)
    std::uint32_t holds = 0;  // hits pinning it (free) or staged for (staged)
    entry_id pending_src = no_entry;   // staged (a join): the staged entry it is copied from once that lands
    std::int64_t pending_bytes = 0;    // the room that copy takes (reserved meanwhile)
    std::int64_t transferred = 0;      // staged: bytes its copy moved over a link
    bool claimable = false;            // staged, no hit holds it: the next hit on the same bytes takes it
    /// KV, named: the content keys of the positions inside the span (begin, end), so that a
    /// request sharing only part of it finds it once it is free (`kv_inside_`).
    std::vector<std::uint64_t> interior{};
    std::uint32_t visits = 0; // settles that named it (selective write-through)
    entry_id src = no_entry;  // staged: the entry it was extracted from, and what (join key)
    tiered::segment_range range{};
  };
  struct inflight {
    move_ticket t;
    event_type ev;
    purpose p;
  };
  struct extract_key {
    entry_id src;
    std::int64_t first, pages;
    friend bool operator==(const extract_key&, const extract_key&) = default;
  };
  struct extract_hash {
    std::size_t operator()(const extract_key& k) const noexcept {
      return static_cast<std::size_t>(splitmix64_mix(to_underlying(k.src) ^ splitmix64_mix(
                                          static_cast<std::uint64_t>(k.first) * 31 + static_cast<std::uint64_t>(k.pages))));
    }
  };
  struct planned_load {
    detail::pinned_source src;
    tiered::segment_range range;
    std::int64_t begin, end;
    entry_id join;
  };

  // unordered_map::reserve(n) rehashes to the size asked for, shrinking a table that once
  // held more: reserving "one more" on every allocation rehashed the whole table each time
  // (10 % of a Mooncake replay). Grow only.
  template <class Map>
  static void reserve_for(Map& m, std::size_t n) {
    if (static_cast<double>(n) > static_cast<double>(m.bucket_count()) * static_cast<double>(m.max_load_factor()))
      m.reserve(n);
  }
  static Engine& no_copies() noexcept {
    static tiered::metadata_only_copies none;  // stateless
    return none;
  }
  [[nodiscard]] std::int64_t bytes_of(const meta& e) const noexcept {
    return e.k == kind::kv ? e.tokens * kv_per_token_ : checkpoint_;
  }
  [[nodiscard]] std::int32_t segments(kind k) const noexcept { return k == kind::kv ? kv_segments_ : ckpt_segments_; }
  [[nodiscard]] std::unordered_map<std::uint64_t, entry_id>& keys_of(kind k) noexcept {
    return k == kind::kv ? kv_keys_ : ckpt_keys_;
  }
  [[nodiscard]] bool has_lower() const noexcept { return store_->tier_count() > 1; }
  [[nodiscard]] std::int64_t free_pages(tier_id t) const {
    const auto u = store_->usage(t);
    return (u.capacity_bytes - u.used_bytes) / page_;
  }

  enum class layer_wait : unsigned char { query, block };
  expected<bool> layer_pass(const tiered_hit& hit, layer_kind k, std::int32_t layer, layer_wait how)
    requires layered_copy_engine<Engine>;
  expected<entry_id> allocate(std::int64_t bytes, kind k, std::int64_t tokens) noexcept;
  void release_from_tree(entry_id id) noexcept;
  void settle_free(entry_id id) noexcept;
  void forget(entry_id id) noexcept;
  void drop(entry_id id) noexcept;
  // set_score / add_score: `f()` on an entry the tree holds, else not_found. The table's
  // re-sort allocates nothing; only its lock could throw (busy then, nothing changed).
  template <class F>
  expected<void> on_tree_entry(entry_id id, F&& f) noexcept {
    const auto it = meta_.find(id);
    if (it == meta_.end() || it->second.r != role::tree) return unexpected(errc::not_found);
    try {
      return f();
    } catch (...) {
      return unexpected(errc::busy);
    }
  }
  bool submit(move_ticket&& t, purpose p) noexcept;
  bool submit_group_loads(outstanding_hit& slot) noexcept;
  std::int64_t plan_load(const outstanding_hit& slot);
  void let_go(outstanding_hit& slot, const detail::pinned_source& src) noexcept;
  expected<void> stage_planned(outstanding_hit& slot, planned_load p);
  void join_planned(outstanding_hit& slot, const planned_load& p);
  void read_from_below(outstanding_hit& slot, detail::pinned_source& src);
  void unstage(outstanding_hit& slot, const move_ticket& t, bool completed) noexcept;
  void finish_copy(std::size_t i) noexcept;
  void after_copy(const inflight& f, bool ok) noexcept;
  bool wait_for_hbm_pages(std::int64_t pages) noexcept;
  void quiesce(entry_id id) noexcept;
  bool make_room(tier_id t, std::int64_t bytes) noexcept;
  void replicate(entry_id id) noexcept;
  void name(entry_id id, std::uint64_t key, std::int64_t begin, std::int64_t end);
  std::int64_t scan(std::span<const token_id> input, const match_result& m, entry_id& ckpt);
  template <class ReadFrom, class Use>
  bool for_each_chain_source(std::int64_t best, std::int64_t covered, ReadFrom&& read_from, Use&& use);
  void promote(std::unordered_map<std::uint64_t, entry_id>::iterator it) noexcept;
  template <class Tree>
  void adopt_staged(const Tree& tree, outstanding_hit& hit) noexcept;
  void release_holds(outstanding_hit& hit, bool keep_loaded = false) noexcept;
  void unhold_staged(entry_id id, bool keep = false) noexcept;
  void start_join(entry_id id) noexcept;
  [[nodiscard]] bool joinable(entry_id id) const;
  bool drop_one_orphan() noexcept;
  // The table row of a staged entry loading `p` (kind k), held by the hit that loads it.
  [[nodiscard]] static meta staged_meta(kind k, const planned_load& p) noexcept {
    meta m;
    m.k = k;
    m.r = role::staged;
    m.tokens = k == kind::checkpoint ? 0 : p.end - p.begin;
    m.end = p.end;
    m.holds = 1;
    return m;
  }
  // Staging bytes a planned load takes: the stored copy (whole), or its pages' range.
  [[nodiscard]] std::int64_t planned_bytes(const planned_load& p) const {
    return p.range.pages < 0 ? stored_of(p.src) : p.range.pages * segments(meta_.at(p.src.id).k) * page_;
  }
  [[nodiscard]] std::int64_t stored_of(const detail::pinned_source& src) const {
    const auto row = store_->find(src.id);
    const tier_copy* c = row ? row->in(src.tier) : nullptr;
    return c == nullptr ? 0 : c->bytes;
  }
  /// Bytes a hit reads from KV entry `src` for the tokens [covered, upto): their KV, or the
  /// whole stored copy when it is sparsified (its tokens cannot be sliced).
  [[nodiscard]] std::int64_t kv_read_bytes(const detail::pinned_source& src, std::int64_t covered, std::int64_t upto) const {
    const std::int64_t kept = stored_of(src);
    return kept < bytes_of(meta_.at(src.id)) ? kept : (upto - covered) * kv_per_token_;
  }
  outstanding_hit& acquire_hit() { return hits_.acquire(chain_.size() + 1); }
  outstanding_hit* find_hit(std::uint64_t ticket) noexcept { return hits_.find(ticket); }
  const outstanding_hit* find_hit(std::uint64_t ticket) const noexcept { return hits_.find(ticket); }
  /// Content keys of every prefix of `s` (core/hash.hpp), in the model's and salt's seed.
  void hash_prefixes(std::span<const token_id> s, const cache_salt& salt) {
    prefix_hash_.resize(s.size() + 1);
    std::uint64_t h = content_key::seed(model_id_, salt);
    prefix_hash_[0] = h;
    for (std::size_t i = 0; i < s.size(); ++i) prefix_hash_[i + 1] = h = content_key::next(h, s[i]);
  }

  tiered_state_store_config config_;
  std::int64_t kv_per_token_;
  std::int64_t checkpoint_;
  std::int64_t capacity_;
  std::int64_t staging_capacity_ = 0;
  std::int64_t page_;
  std::int64_t pages_per_layer_token_;  // KV pages of one token in one attention layer
  std::int32_t kv_segments_, ckpt_segments_;
  write_policy write_;
  std::int32_t write_through_hits_;
  tiered::watermarks marks_;
  std::uint64_t model_id_;
  std::int64_t used_ = 0;         // the tree's HBM bytes
  std::int64_t staged_used_ = 0;  // staging room in use
  std::int64_t draining_ = 0;     // HBM bytes of free entries waiting for their copy down
  std::unique_ptr<tiered::tiered_store<HostScorer>> store_;  // heap: the table holds a mutex, the store must move
  Engine* engine_;
  Sizer sizer_;
  std::unordered_map<entry_id, meta> meta_;
  std::unordered_map<std::uint64_t, entry_id> kv_keys_;    // key -> free KV entry
  std::unordered_map<std::uint64_t, entry_id> ckpt_keys_;  // key -> free checkpoint entry
  std::unordered_map<std::uint64_t, entry_id> kv_inside_;  // key of a position inside a free KV entry -> it
  std::unordered_map<extract_key, entry_id, extract_hash> extracts_;  // staged entries by what they hold
  std::vector<inflight> inflight_;
  std::vector<move_ticket> group_;         // a load's copies, submitted together (as one group where the engine takes groups)
  std::vector<event_type> group_events_;  // their events (scratch)
  std::vector<entry_id> pending_;  // joins waiting for their source's copy to land
  std::vector<std::uint64_t> prefix_hash_;
  std::int64_t kv_reach_ = 0;  // scan's KV reach (lookup reports it)
  std::vector<node_id> path_;
  struct chain_link {  // scan's chain: a free KV entry and how far the input follows it
    entry_id id;
    std::int64_t reach;
  };
  std::vector<chain_link> chain_;
  std::vector<entry_id> candidates_;
  std::vector<planned_load> plan_;
  std::vector<std::vector<entry_id>> stuck_;  // per tier: victims make_room could not move
  detail::hit_table<detail::outstanding_hit> hits_;
  std::uint64_t next_id_ = 0;
  tiered_state_counters counters_;
};

static_assert(state_store<tiered_state_store<>>);
static_assert(layered_tier_store<tiered_state_store<>, prefix::radix_tree<tiered_state_store<>>>);
static_assert(replicable_tier_store<tiered_state_store<>>);
static_assert(!paged_state_store<tiered_state_store<>> && !demoting_store<tiered_state_store<>, prefix::radix_tree<tiered_state_store<>>>);

}  // namespace hybridcache::stores

#include "hybridcache/stores/detail/tiered_state_store_impl.hpp"  // IWYU pragma: keep
#include "hybridcache/stores/detail/tiered_state_invariants.hpp"  // IWYU pragma: keep
