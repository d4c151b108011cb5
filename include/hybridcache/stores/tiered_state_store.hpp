// hybridcache/stores/tiered_state_store.hpp
//
// `tiered_state_store`: a `prefix::state_store` over a two-tier `tiered_store` (HBM +
// host), so that `prefix_cache<Model, Admission, Scorer, tiered_state_store<>>` keeps KV
// extents and SSM checkpoints in HBM and, when its scorer (LRU or FLOP-aware) evicts a node,
// *demotes* the node's state to the host tier instead of dropping it.
//
// The seam. The prefix cache owns the radix tree and decides what leaves HBM (its own
// scorer picks the victim); it frees the victim's handles through the store. The store
// cannot read tokens, so a freed handle is findable later only if it carries a content key.
// The contract has three calls a runtime makes around each request:
//
//   auto m = cache.match(input);                    // HBM hit (the cache's own rule)
//   auto h = cache.store().lookup(input, m);        // + lower-tier hit: pins what it uses
//                                                   // (many hits may be outstanding at once)
//   ... load h.bytes_to_load host -> HBM, prefill from h.reusable_tokens, decode ...
//   cache.commit(input ++ output, input.size(), &m);
//   cache.store().settle(cache.tree(), input ++ output, h);   // names the path, unpins h
//
// - Content keys. `settle` walks the committed sequence's path in the tree and names each
//   node's KV extent and checkpoint by a 64-bit chained hash of the tokens [0, end) of the
//   node (vLLM/SGLang-style block hashing; a false match needs a 2^-64 collision). Keys
//   survive the tree's own edits: a split keeps the tail's end (its key) and the new head is
//   on the path, so `settle` names it; a join (merge into child) keeps the child's end.
// - Demotion. `free_kv` / `free_checkpoint` of a named handle moves its entry HBM -> host
//   through the copy engine (`prepare_move`, `submit`, `wait`, `complete_move`). With the
//   default `metadata_only_copies` nothing is copied (a simulator); with a
//   `host_copy_engine` or `cuda::copy_engine` the bytes move. When the host tier is full,
//   its own LRU victims are dropped first; what cannot fit, or whose copy fails, is dropped.
//   Unnamed handles (allocations the cache rolls back) are simply freed.
// - Lookup (host hit). After the HBM match (KV for [0, m.common_prefix), a checkpoint at
//   m.reusable_tokens), `lookup` extends the KV with host extents whose key equals the
//   input's prefix hash at their end and whose start is already covered, then takes the
//   deepest covered position that has a checkpoint (HBM or host): the joint-min rule over
//   both tiers. It pins the host entries it uses so that demotions during `commit` cannot
//   drop them before the runtime has loaded them.
// - Load (optional, before prefill). `load(hit)` copies the host entries the hit uses into
//   a staging room of the HBM tier (`staging_bytes`), so prefill reads them from HBM
//   (`staged()` gives their token spans; KV is token-major inside an entry).
// - Promotion. A loaded state re-enters the tree the ordinary way: `commit` inserts those
//   tokens again (new HBM extents). `settle` then hands the staged pages to those extents
//   without copying (`tiered_store::exchange_pages`), names the path, and erases any host
//   entry whose key is now held in HBM: a key lives in exactly one tier (checked by
//   `check_invariants`). Without `load`, the runtime fills the new extents itself.
// - Bytes. KV of an extent is token-major: token i of an extent is at bytes
//   [i * kv_bytes_per_token, (i + 1) * kv_bytes_per_token) of its pages, in page order.
//   Pages divide both a token's KV and a checkpoint, so splits and joins re-partition
//   page lists (`tiered_store::split` / `join`) and never copy.
//
// A cleaner seam, if the prefix cache ever offers it: a tree hook `on_node_span(handle,
// begin, end, prefix_hash)` called when a node is created/split/merged would let the store
// name handles itself, removing `settle`'s walk (see the report in docs/tiered.md).
//
// Costs (d = nodes on the path, |s| = sequence length, k = pages of an entry):
//   allocate/free/split/join   O(k + log n) (tiered_store insert/move/split/join), plus the
//                              demotion copy of a freed named entry; noexcept
//   load                       O(e (k + log n)) for e entries, plus their copies
//   lookup                     O(|s|) hashing + O(|s|) hash probes (none while the host tier is
//                              empty); allocation-free after warm-up
//   settle                     O(|s| + d (k + log n)) (+ the staged pages exchanged)
// Thread safety: none beyond the prefix cache's lock (call `lookup`/`settle` under the same
// serialisation as the cache's `match`/`commit`).
#pragma once

#include <algorithm>
#include <array>
#include <concepts>
#include <cstdint>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "hybridcache/core/error.hpp"
#include "hybridcache/core/expected.hpp"
#include "hybridcache/concepts/state_store.hpp"
#include "hybridcache/core/hash.hpp"
#include "hybridcache/stores/detail/hit_table.hpp"
#include "hybridcache/stores/tiered_state_types.hpp"
#include "hybridcache/prefix/radix_tree.hpp"
#include "hybridcache/prefix/types.hpp"
#include "hybridcache/tiered/copy_plan.hpp"
#include "hybridcache/tiered/tiered_store.hpp"

namespace hybridcache::tiered {

namespace detail {
/// The body of `tiered_state_store::check_invariants` (stores/detail/tiered_state_invariants.hpp).
template <class Store, class Tree>
std::string check_tiered_invariants(const Store& st, const Tree& tree);
}  // namespace detail

/// A `prefix::state_store` whose frees demote to a host tier. See the file comment for the
/// contract (`lookup` before prefill, `settle` after `commit`). `Engine` copies the bytes
/// of every move; its arenas must be laid out from `tiers_for(config)` and
/// `page_bytes_for(config)` (e.g. `host_copy_engine(tiers_for(c), page_bytes_for(c))`).
template <demotion_scorer HostScorer = lru_demotion, tier_copy_engine Engine = metadata_only_copies>
class tiered_state_store {
 public:
  using kv_extent = tiered_kv_extent;
  using checkpoint_handle = tiered_checkpoint_handle;

  static constexpr tier_id host_tier{1};

  /// A metadata-only store (simulation: nothing is copied).
  /// @throws invalid_argument for non-positive sizes / link or negative staging;
  /// capacity_error when one checkpoint does not fit in HBM.
  explicit tiered_state_store(const tiered_state_store_config& c)
    requires std::same_as<Engine, metadata_only_copies>
      : tiered_state_store(c, no_copies()) {}

  /// A store whose moves copy bytes through `engine` (which must outlive the store).
  /// @throws as above.
  tiered_state_store(const tiered_state_store_config& c, Engine& engine)
      : kv_per_token_(c.kv_bytes_per_token),
        checkpoint_(c.checkpoint_bytes),
        capacity_(c.hbm_bytes),
        staging_capacity_(c.staging_bytes > 0 ? c.staging_bytes / page_bytes_for(c) * page_bytes_for(c) : 0),
        store_(std::make_unique<tiered_store<HostScorer>>(tiers_for(c), page_bytes_for(c))),
        engine_(&engine) {
    if (checkpoint_ > capacity_)
      throw capacity_error("tiered_state_store: HBM capacity " + std::to_string(capacity_) +
                           " B is smaller than one SSM checkpoint (" + std::to_string(checkpoint_) + " B)");
    // An engine laid out for other tiers or pages would refuse or misplace every copy.
    if constexpr (requires(const Engine& e) { e.page_bytes(); }) {
      if (engine.page_bytes() != store_->page_bytes())
        throw invalid_argument("tiered_state_store: the copy engine's page (" + std::to_string(engine.page_bytes()) +
                               " B) is not the store's (" + std::to_string(store_->page_bytes()) +
                               " B): build it from tiers_for(config) and page_bytes_for(config)");
    }
    if constexpr (requires(const Engine& e) { e.arena_bytes(hbm_tier); }) {
      for (std::size_t t = 0; t < store_->tier_count(); ++t) {
        const tier_id id{static_cast<std::uint8_t>(t)};
        if (engine.arena_bytes(id) < store_->config(id).capacity_bytes)
          throw invalid_argument("tiered_state_store: the copy engine's arena of tier " + std::to_string(t) + " (" +
                                 std::to_string(engine.arena_bytes(id)) + " B) is smaller than the tier (" +
                                 std::to_string(store_->config(id).capacity_bytes) +
                                 " B): build it from tiers_for(config) and page_bytes_for(config)");
      }
    }
  }

  /// The tiers of a store built from `c`: HBM (budget + staging room) and host.
  /// @throws invalid_argument as the constructor.
  [[nodiscard]] static std::vector<tier_config> tiers_for(const tiered_state_store_config& c) {
    HYBRIDCACHE_EXPECTS(c.hbm_bytes > 0 && c.host_bytes > 0, invalid_argument,
                        "tiered_state_store: hbm_bytes and host_bytes must be > 0");
    HYBRIDCACHE_EXPECTS(c.staging_bytes >= 0, invalid_argument, "tiered_state_store: staging_bytes must be >= 0");
    const std::int64_t page = page_bytes_for(c);
    return {tier_config{tier_kind::hbm, (c.hbm_bytes / page + c.staging_bytes / page) * page, 0.0, -1},
            tier_config{tier_kind::host, std::max(c.host_bytes / page, std::int64_t{1}) * page, c.link_gbps, -1}};
  }
  /// The page size of a store built from `c`: gcd(KV bytes per token, checkpoint bytes),
  /// so a token's KV and a checkpoint are whole pages.
  [[nodiscard]] static std::int64_t page_bytes_for(const tiered_state_store_config& c) {
    HYBRIDCACHE_EXPECTS(c.kv_bytes_per_token >= 0 && c.checkpoint_bytes >= 0 &&
                            (c.kv_bytes_per_token > 0 || c.checkpoint_bytes > 0),
                        invalid_argument, "tiered_state_store: bytes per token / checkpoint must be >= 0, not both 0");
    return std::gcd(c.kv_bytes_per_token, c.checkpoint_bytes);
  }

  tiered_state_store(tiered_state_store&&) noexcept = default;
  tiered_state_store& operator=(tiered_state_store&&) noexcept = default;

  // --- prefix::state_store -------------------------------------------------------------

  [[nodiscard]] expected<kv_extent> allocate_kv(std::int64_t tokens) noexcept {
    if (tokens <= 0) return unexpected(errc::invalid_argument);
    if (kv_per_token_ > 0 && tokens > (std::int64_t{1} << 62) / kv_per_token_) return unexpected(errc::out_of_capacity);
    auto id = allocate(tokens * kv_per_token_, kind::kv, tokens);
    if (!id) return unexpected(id.error());
    return kv_extent{*id, tokens};
  }
  void free_kv(kv_extent&& e) noexcept {
    if (e.id != no_entry) release_to_host(e.id);
    e = kv_extent{};
  }
  /// Detaches the first `head` tokens. The tail keeps its entry (and its key: same end);
  /// the head is a fresh, unnamed entry (the extent's first pages) that `settle` names.
  [[nodiscard]] expected<kv_extent> split_kv(kv_extent& whole, std::int64_t head) noexcept {
    if (head <= 0 || head >= whole.tokens) return unexpected(errc::invalid_argument);
    if (whole.id == no_entry) {  // zero-byte KV (a model without attention layers)
      whole.tokens -= head;
      return kv_extent{no_entry, head};
    }
    // Pages divide a token's KV: the head takes the extent's first pages, no copy.
    try {
      const entry_id id = make_entry_id(next_id_ + 1);
      meta_.emplace(id, meta{kind::kv, head, 0, 0, false, place::hbm});  // may throw: nothing changed
      if (auto r = store_->split(whole.id, id, head * kv_per_token_); !r) {
        meta_.erase(id);
        return unexpected(r.error());
      }
      next_id_ = to_underlying(id);
      meta_.at(whole.id).tokens -= head;
      whole.tokens -= head;
      return kv_extent{id, head};
    } catch (...) {
      return unexpected(errc::out_of_capacity);
    }
  }
  /// `front` becomes front ++ back (its pages, then back's: no copy) and takes back's key
  /// (the joined span ends where back did).
  [[nodiscard]] expected<void> join_kv(kv_extent& front, kv_extent&& back) noexcept {
    if (front.id == no_entry || back.id == no_entry) {  // zero-byte KV: only lengths
      if (front.id != back.id) return unexpected(errc::invalid_argument);
      front.tokens += std::exchange(back.tokens, 0);
      return {};
    }
    try {
      if (auto r = store_->join(front.id, back.id); !r) return unexpected(r.error());
    } catch (...) {
      return unexpected(errc::out_of_capacity);
    }
    const auto bi = meta_.find(back.id);
    meta& fm = meta_.at(front.id);
    fm.tokens += bi->second.tokens;
    fm.key = bi->second.key;
    fm.end = bi->second.end;
    fm.named = bi->second.named;
    meta_.erase(bi);
    front.tokens += back.tokens;
    back = kv_extent{};
    return {};
  }
  [[nodiscard]] expected<checkpoint_handle> allocate_checkpoint() noexcept {
    auto id = allocate(checkpoint_, kind::checkpoint, 0);
    if (!id) return unexpected(id.error());
    return checkpoint_handle{*id};
  }
  void free_checkpoint(checkpoint_handle&& h) noexcept {
    if (h.id != no_entry) release_to_host(h.id);
    h = checkpoint_handle{};
  }

  [[nodiscard]] std::int64_t kv_bytes(std::int64_t tokens) const noexcept { return tokens * kv_per_token_; }
  [[nodiscard]] std::int64_t checkpoint_bytes() const noexcept { return checkpoint_; }
  /// HBM bytes in use (the prefix cache's budget).
  [[nodiscard]] std::int64_t used_bytes() const noexcept { return used_; }
  [[nodiscard]] std::int64_t capacity_bytes() const noexcept { return capacity_; }

  // --- lower tier ----------------------------------------------------------------------

  /// The hit of `input` over both tiers, given the cache's HBM match `m` of the same input.
  /// Pins the host entries it uses (hand the hit to `load`, `settle` or `release_hit`).
  /// Many hits may be outstanding (a batch of requests in flight), each with its own pins
  /// and staged entries; an entry pinned by several hits stays until the last lets go.
  [[nodiscard]] tiered_hit lookup(std::span<const prefix::token_id> input, const prefix::match_result& m) {
    tiered_hit h;
    h.hbm_tokens = h.reusable_tokens = m.reusable_tokens;
    h.salt = m.salt;
    if (host_kv_.empty() && host_ckpt_.empty()) return h;  // nothing demoted: no hashing
    const auto n = static_cast<std::int64_t>(input.size());
    hash_prefixes(input, m.salt);
    // KV reach: [0, common_prefix) is in HBM; extend with host extents that start inside it.
    std::int64_t reach = std::min(m.common_prefix, n);
    chain_.clear();
    for (std::int64_t p = reach + 1; p <= n; ++p) {
      const auto it = host_kv_.find(prefix_hash_[static_cast<std::size_t>(p)]);
      if (it == host_kv_.end()) continue;
      const meta& e = meta_.at(it->second);
      if (p - e.tokens > reach) continue;  // starts past what is covered
      reach = p;
      chain_.push_back(it->second);
    }
    // Deepest covered position with a checkpoint in either tier (joint-min over tiers).
    entry_id ckpt = no_entry;
    std::int64_t best = m.reusable_tokens;
    for (std::int64_t p = std::min(reach, n); p > m.reusable_tokens; --p) {
      const auto it = host_ckpt_.find(prefix_hash_[static_cast<std::size_t>(p)]);
      if (it == host_ckpt_.end()) continue;
      best = p;
      ckpt = it->second;
      break;
    }
    if (best == m.reusable_tokens) return h;
    outstanding_hit& slot = acquire_hit();  // may throw: nothing pinned yet
    h.reusable_tokens = best;
    h.host_tokens = best - m.reusable_tokens;
    h.host_checkpoint = true;
    h.bytes_to_load = checkpoint_;
    pin(slot, ckpt);
    std::int64_t covered = std::min(m.common_prefix, n);
    for (entry_id id : chain_) {
      const meta& e = meta_.at(id);
      const std::int64_t end = e.end;
      if (end - e.tokens >= best) break;  // chain is ordered by end
      const std::int64_t upto = std::min(end, best);
      if (upto > covered) h.bytes_to_load += (upto - covered) * kv_per_token_;
      covered = std::max(covered, upto);
      h.kv_entries += 1;
      pin(slot, id);
    }
    h.ticket = slot.ticket;
    ++counters_.host_hits;
    counters_.host_hit_tokens += h.host_tokens;
    counters_.loaded_bytes += h.bytes_to_load;
    return h;
  }

  /// Copies the host entries `hit` uses into the HBM staging room through the engine, so
  /// that prefill reads them from HBM (`staged()`: their token spans and entries; the
  /// entries' pages are in `table()`). `settle` then gives the staged pages to the tree's
  /// new nodes without copying. Calling it again for the same hit does nothing.
  /// Errors: stale_handle when `hit` is not outstanding; out_of_capacity when the staging
  /// room cannot hold the hit's entries, or busy when another outstanding hit has staged or
  /// also pinned one of them (nothing moved in either case: the hit stays usable, the runtime
  /// loads on its own or after that hit settles); busy when a copy failed (or the engine
  /// threw). After a failed copy the hit is released (as by `release_hit`): what was staged
  /// returns to the host tier, and the runtime goes on with the HBM hit alone.
  [[nodiscard]] expected<void> load(const tiered_hit& hit) {
    outstanding_hit* slot = find_hit(hit.ticket);
    if (slot == nullptr) return unexpected(errc::stale_handle);
    if (!slot->staged.empty()) return {};
    std::int64_t need = 0;
    for (entry_id id : slot->pinned) {
      // Staged by another hit, or pinned by one too (a pinned entry cannot move, and that
      // hit reads it where it is): busy, before anything moves.
      const meta& e = meta_.at(id);
      if (e.where == place::staged || e.hit_pins > 1) return unexpected(errc::busy);
      need += bytes_of(e);
    }
    if (need > staging_capacity_ - staged_used_) return unexpected(errc::out_of_capacity);
    slot->staged.reserve(slot->pinned.size());  // may throw: nothing moved yet
    for (entry_id id : slot->pinned) {
      meta& e = meta_.at(id);
      (void)store_->unpin(id);
      if (!copy_to(id, hbm_tier)) {  // the entry stays in the host tier
        (void)store_->pin(id);
        release_pins(*slot);
        return unexpected(errc::busy);
      }
      (void)store_->pin(id);
      (e.k == kind::kv ? host_kv_ : host_ckpt_).erase(e.key);
      const std::int64_t b = bytes_of(e);
      host_used_ -= b;
      staged_used_ += b;
      e.where = place::staged;
      slot->staged.push_back({id, e.end - (e.k == kind::kv ? e.tokens : 0), e.end, e.k == kind::checkpoint});
      counters_.staged_entries += 1;
      counters_.staged_bytes += b;
    }
    return {};
  }

  /// What `load` brought into HBM for `hit` (empty before `load`, or for a hit not outstanding).
  [[nodiscard]] std::span<const staged_entry> staged(const tiered_hit& hit) const noexcept {
    const outstanding_hit* slot = find_hit(hit.ticket);
    return slot == nullptr ? std::span<const staged_entry>{} : std::span<const staged_entry>(slot->staged);
  }
  /// Hits outstanding (looked up, not yet settled or released). O(1).
  [[nodiscard]] std::size_t outstanding_hits() const noexcept { return hits_.outstanding(); }

  /// After `commit(sequence, ...)`: hands staged pages to the tree's nodes that cover the
  /// same tokens (zero copy), names every node on `sequence`'s path by its content key,
  /// releases `hit`'s pins, and erases host entries now held again in HBM (promotion).
  /// Staged entries no tree node covers return to the host tier.
  template <class Tree>
  void settle(const Tree& tree, std::span<const prefix::token_id> sequence, const tiered_hit& hit = {}) {
    hash_prefixes(sequence, hit.salt);
    const auto w = tree.walk(sequence, path_, tree.namespace_of(hit.salt));
    if (outstanding_hit* slot = find_hit(hit.ticket); slot != nullptr) {
      adopt_staged(tree, *slot);
      release_pins(*slot);
    }
    for (prefix::node_id n : path_) {
      const auto& nd = tree.at(n);
      const std::uint64_t key = prefix_hash_[static_cast<std::size_t>(nd.end)];
      name(nd.kv.id, key, nd.end);
      if (nd.has_checkpoint) name(nd.checkpoint.id, key, nd.end);
    }
    // Host KV extents whose whole span HBM now holds (under other node boundaries) are
    // redundant: promoted. Host checkpoints stay unless HBM has the same one (`name`).
    if (!host_kv_.empty())
      for (std::int64_t p = 1; p <= w.common_prefix; ++p)
        if (const auto it = host_kv_.find(prefix_hash_[static_cast<std::size_t>(p)]); it != host_kv_.end())
          promote(it);
  }

  /// Host KV entries whose span lies within the first `upto` tokens of `sequence` (0 after
  /// `settle(tree, sequence)` for upto = the tree's common prefix with it: no KV is held in
  /// both tiers). Diagnostic, O(|sequence|).
  [[nodiscard]] std::int64_t host_kv_within(std::span<const prefix::token_id> sequence, std::int64_t upto,
                                            const prefix::cache_salt& salt = std::nullopt) {
    hash_prefixes(sequence, salt);
    std::int64_t n = 0;
    for (std::int64_t p = 1; p <= std::min<std::int64_t>(upto, static_cast<std::int64_t>(sequence.size())); ++p)
      n += host_kv_.count(prefix_hash_[static_cast<std::size_t>(p)]) != 0;
    return n;
  }

  /// Drops `hit`'s pins without a commit (request abandoned); staged entries return to the
  /// host tier.
  void release_hit(const tiered_hit& hit) {
    if (outstanding_hit* slot = find_hit(hit.ticket); slot != nullptr) release_pins(*slot);
  }

  [[nodiscard]] const tiered_state_counters& counters() const noexcept { return counters_; }
  [[nodiscard]] const tiered_store<HostScorer>& table() const noexcept { return *store_; }
  /// Host-tier bytes in use (logical, not page rounded).
  [[nodiscard]] std::int64_t host_used_bytes() const noexcept { return host_used_; }
  /// HBM staging bytes in use (entries `load` brought back, until `settle`).
  [[nodiscard]] std::int64_t staged_bytes() const noexcept { return staged_used_; }
  /// Named entries in the host tier.
  [[nodiscard]] std::int64_t host_entries() const noexcept {
    return static_cast<std::int64_t>(host_kv_.size() + host_ckpt_.size());
  }

  /// Checks that the cache table is consistent, that HBM holds exactly the handles the
  /// tree holds (`tree` given) plus the staged entries, that every named key lives in one
  /// tier only and that every demoted entry is accounted for (in host, staged, dropped or
  /// promoted). Empty string = OK.
  template <class Tree>
  [[nodiscard]] std::string check_invariants(const Tree& tree) const {
    return detail::check_tiered_invariants(*this, tree);
  }

 private:
  template <class Store, class Tree>
  friend std::string detail::check_tiered_invariants(const Store& st, const Tree& tree);
  enum class kind : unsigned char { kv, checkpoint };
  enum class place : unsigned char { hbm, staged, host };  // staged: in HBM, loaded back, not the tree's
  using outstanding_hit = detail::outstanding_hit;
  struct meta {
    kind k = kind::kv;
    std::int64_t tokens = 0;  // kv only
    std::uint64_t key = 0;
    std::int64_t end = 0;     // token position where the span ends (named entries)
    bool named = false;
    place where = place::hbm;
    std::uint32_t hit_pins = 0;  // outstanding hits that pinned it
    bool superseded = false;     // a host entry HBM names again while a hit pinned it
  };

  static Engine& no_copies() noexcept {
    static metadata_only_copies none;  // stateless
    return none;
  }

  std::int64_t bytes_of(const meta& e) const noexcept {
    return e.k == kind::kv ? e.tokens * kv_per_token_ : checkpoint_;
  }
  std::int64_t& bytes_at(place p) noexcept {
    return p == place::hbm ? used_ : p == place::staged ? staged_used_ : host_used_;
  }

  expected<entry_id> allocate(std::int64_t bytes, kind k, std::int64_t tokens) noexcept {
    if (bytes > capacity_ - used_) return unexpected(errc::out_of_capacity);
    if (bytes == 0) return no_entry;  // nothing to hold (empty handle)
    try {
      const entry_id id = make_entry_id(++next_id_);
      auto r = store_->insert(id, bytes, hbm_tier);
      if (!r) return unexpected(r.error());
      meta_.emplace(id, meta{k, tokens, 0, 0, false, place::hbm});
      used_ += bytes;
      return id;
    } catch (...) {
      return unexpected(errc::out_of_capacity);
    }
  }

  /// Removes an entry (not pinned, not moving) from the table, its byte count and, for a
  /// host entry, its key index.
  void forget(entry_id id) noexcept {
    const auto it = meta_.find(id);
    if (it == meta_.end()) return;
    const meta& e = it->second;
    if (e.where == place::host) {
      auto& map = e.k == kind::kv ? host_kv_ : host_ckpt_;
      if (const auto m = map.find(e.key); m != map.end() && m->second == id) map.erase(m);
    }
    (void)store_->erase(id);
    bytes_at(e.where) -= bytes_of(e);
    meta_.erase(it);
  }

  /// One move through the engine: prepare, submit, wait, complete. When the host tier is
  /// full, its LRU victims are dropped until the entry fits, but only if it can fit at all
  /// (free + evictable pages): an entry larger than the tier, or a tier held by pinned
  /// entries, must not empty it for nothing. False (entry where it was) when it cannot fit
  /// or the copy failed.
  bool copy_to(entry_id id, tier_id dst) noexcept {
    try {
      if (dst == host_tier && !store_->would_fit(dst, bytes_of(meta_.at(id)))) return false;
      while (true) {
        auto t = store_->prepare_move(id, dst);
        if (!t) {
          if (t.error() != errc::out_of_capacity || dst != host_tier) return false;
          const auto v = store_->victim(host_tier);
          if (!v) return false;
          drop(*v);
          continue;
        }
        bool ok = false;
        try {
          if (auto ev = engine_->submit(*t); ev) ok = engine_->wait(*ev).has_value();
        } catch (...) {
          ok = false;
        }
        (void)store_->complete_move(*t, ok);
        if (!ok) counters_.copy_failures += 1;
        return ok;
      }
    } catch (...) {
      return false;
    }
  }

  /// The cache freed a handle: demote it if it is named, else drop it.
  void release_to_host(entry_id id) noexcept {
    const auto it = meta_.find(id);
    if (it == meta_.end()) return;
    if (!it->second.named || bytes_of(it->second) == 0) {
      forget(id);
      return;
    }
    counters_.demoted_entries += 1;
    counters_.demoted_bytes += bytes_of(it->second);
    to_host(id);
  }

  /// Moves a named HBM or staged entry to the host tier and indexes it; drops it when the
  /// host tier cannot take it (full of pinned entries, copy failed, key already there).
  void to_host(entry_id id) noexcept {
    meta& e = meta_.at(id);
    const std::int64_t b = bytes_of(e);
    auto& map = e.k == kind::kv ? host_kv_ : host_ckpt_;
    if (!map.contains(e.key) && copy_to(id, host_tier)) {
      bytes_at(e.where) -= b;
      host_used_ += b;
      e.where = place::host;
      try {
        map.emplace(e.key, id);
        (void)store_->touch(id);  // host LRU: recency of demotion
        return;
      } catch (...) {  // no room for the index entry: drop it below
      }
    }
    counters_.dropped_entries += 1;
    counters_.dropped_bytes += b;
    forget(id);
  }

  void drop(entry_id id) {
    const auto it = meta_.find(id);
    counters_.dropped_entries += 1;
    counters_.dropped_bytes += bytes_of(it->second);
    forget(id);
  }

  /// Gives an HBM entry its content key; a host entry with the same key is now redundant.
  void name(entry_id id, std::uint64_t key, std::int64_t end) {
    if (id == no_entry) return;
    meta& e = meta_.at(id);
    e.key = key;
    e.named = true;
    auto& map = e.k == kind::kv ? host_kv_ : host_ckpt_;
    e.end = end;
    if (const auto it = map.find(key); it != map.end()) promote(it);
  }

  /// Erases a host entry that HBM now holds again (found through its index iterator).
  void promote(std::unordered_map<std::uint64_t, entry_id>::iterator it) {
    const entry_id old = it->second;
    const auto mit = meta_.find(old);
    auto& map = mit->second.k == kind::kv ? host_kv_ : host_ckpt_;
    if (!store_->erase(old)) {  // pinned by an outstanding hit: erased when the last one lets go
      mit->second.superseded = true;
      return;
    }
    const std::int64_t b = bytes_of(mit->second);
    map.erase(it);
    host_used_ -= b;
    meta_.erase(mit);
    counters_.promoted_entries += 1;
    counters_.promoted_bytes += b;
  }

  /// Gives each staged entry's pages to the path nodes covering the same tokens (the path
  /// of the committed sequence is in path_), all or nothing: an entry the path covers
  /// entirely is exchanged and erased (promoted: the tree now holds its bytes); any other
  /// is left intact and returns to the host tier in release_pins.
  template <class Tree>
  void adopt_staged(const Tree& tree, outstanding_hit& hit) {
    const std::int64_t page = store_->page_bytes();
    const std::int64_t per = kv_per_token_ / page;  // pages per token (kv_per_token_ > 0 when KV is staged)
    for (staged_entry& s : hit.staged) {
      if (s.checkpoint) {
        for (prefix::node_id n : path_) {
          const auto& nd = tree.at(n);
          if (nd.end != s.end) continue;
          if (nd.has_checkpoint && nd.checkpoint.id != no_entry &&
              store_->exchange_pages(nd.checkpoint.id, 0, s.id, 0, checkpoint_ / page))
            adopted(s);
          break;
        }
        continue;
      }
      // The path's extents are contiguous from token 0: covered iff the path reaches s.end.
      if (path_.empty() || tree.at(path_.back()).end < s.end) continue;
      bool ok = true, any = false;
      for (prefix::node_id n : path_) {
        const auto& nd = tree.at(n);
        const std::int64_t nb = nd.end - nd.edge();
        const std::int64_t lo = std::max(nb, s.begin), hi = std::min(nd.end, s.end);
        if (lo >= hi || !ok) continue;
        ok = nd.kv.id != no_entry &&
             store_->exchange_pages(nd.kv.id, (lo - nb) * per, s.id, (lo - s.begin) * per, (hi - lo) * per);
        any = any || ok;
      }
      if (ok) {
        adopted(s);
      } else if (any) {  // not expected (same tier, ranges inside both, nothing moving), but
        (void)store_->unpin(s.id);  // a half-exchanged entry must not go back to the host
        drop(s.id);
        s.id = no_entry;
      }
    }
  }
  void adopted(staged_entry& s) noexcept {
    (void)store_->unpin(s.id);
    const std::int64_t b = bytes_of(meta_.at(s.id));
    forget(s.id);
    counters_.adopted_entries += 1;
    counters_.promoted_entries += 1;
    counters_.promoted_bytes += b;
    s.id = no_entry;  // release_pins skips it
  }

  void pin(outstanding_hit& hit, entry_id id) {
    if (!store_->pin(id)) return;
    hit.pinned.push_back(id);  // capacity reserved by acquire_hit
    meta_.at(id).hit_pins += 1;
  }
  /// Unpins what `hit` pinned; its staged entries not adopted return to the host tier; the
  /// slot is free again (its ticket now stale).
  void release_pins(outstanding_hit& hit) noexcept {
    for (entry_id id : hit.pinned) {
      const auto it = meta_.find(id);
      if (it == meta_.end()) continue;  // adopted by the tree
      (void)store_->unpin(id);
      meta& e = it->second;
      e.hit_pins -= 1;
      if (e.hit_pins > 0) continue;
      if (e.where == place::staged) {
        to_host(id);
      } else if (e.where == place::host && e.superseded) {  // the deferred promotion
        auto& map = e.k == kind::kv ? host_kv_ : host_ckpt_;
        if (const auto h = map.find(e.key); h != map.end() && h->second == id) promote(h);
      }
    }
    hits_.release(hit);
  }

  /// A free slot for a new hit, its pin list sized for the longest chain a lookup pins.
  /// @throws bad_alloc, capacity_error with nothing changed.
  outstanding_hit& acquire_hit() { return hits_.acquire(chain_.size() + 1); }
  outstanding_hit* find_hit(std::uint64_t ticket) noexcept { return hits_.find(ticket); }
  const outstanding_hit* find_hit(std::uint64_t ticket) const noexcept { return hits_.find(ticket); }

  /// Content keys: a chain over the tokens, seeded by the cache salt (so two tenants' keys
  /// for the same tokens differ; the shared namespace keeps the unsalted seed).
  void hash_prefixes(std::span<const prefix::token_id> s, const prefix::cache_salt& salt = std::nullopt) {
    prefix_hash_.resize(s.size() + 1);
    std::uint64_t h = prefix_hash_seed(salt);  // core/hash.hpp: the storage backends' keys use the same chain
    prefix_hash_[0] = h;
    for (std::size_t i = 0; i < s.size(); ++i) {
      h = prefix_hash_step(h, s[i]);
      prefix_hash_[i + 1] = h;
    }
  }

  std::int64_t kv_per_token_;
  std::int64_t checkpoint_;
  std::int64_t capacity_;
  std::int64_t staging_capacity_;
  std::int64_t used_ = 0;
  std::int64_t host_used_ = 0;
  std::int64_t staged_used_ = 0;
  std::unique_ptr<tiered_store<HostScorer>> store_;  // heap: the table holds a mutex, the store must move
  Engine* engine_;
  std::unordered_map<entry_id, meta> meta_;
  std::unordered_map<std::uint64_t, entry_id> host_kv_;   // key -> host KV entry
  std::unordered_map<std::uint64_t, entry_id> host_ckpt_; // key -> host checkpoint entry
  std::vector<std::uint64_t> prefix_hash_;
  std::vector<prefix::node_id> path_;
  std::vector<entry_id> chain_;
  detail::hit_table hits_;     // outstanding hits (their pins and staged entries)
  std::uint64_t next_id_ = 0;  // the last id allocate/split_kv handed out (0: none yet)
  tiered_state_counters counters_;
};

static_assert(prefix::state_store<tiered_state_store<>>);

}  // namespace hybridcache::tiered

#include "hybridcache/stores/detail/tiered_state_invariants.hpp"  // IWYU pragma: keep
