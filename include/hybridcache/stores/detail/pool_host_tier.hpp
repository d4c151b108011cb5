// hybridcache/stores/detail/pool_host_tier.hpp
//
// The storage of `pool_state_store`'s lower tiers: a host tier and, below it, any storage
// tiers (disk, Redis), kept by the library's one tiered implementation: a
// `tiered::tiered_store` (the cache table: which tier holds each entry, its pages, pins and
// the LRU order) over a `tiered::host_copy_engine` (the host arena; the storage tiers' bytes
// through their `storage_backend`s). When the prefix cache evicts a leaf from the pool, its
// KV pages and its checkpoint are demoted here; a later request whose prompt continues past
// the HBM match into demoted entries loads them back into its reserved pages and a reserved
// checkpoint slot. The protocol the request lifecycle drives (lookup, land, ...) is
// pool_lower_tier.hpp.
//
//   entry   one demoted node: its tokens [begin, end), its KV pages (the pool extent's
//           layout: block-major, `offset` tokens into the first block) and, if it had one,
//           the checkpoint after `end`; in the table its bytes are the KV pages then the
//           checkpoint's blocks, in pages of gcd(KV page, SSM block) bytes
//   key     content_key of the path through the entry's first token (salt-seeded), so an
//           entry is found from the prompt alone and two tenants never share one; it is
//           also the entry's id in the table
//   chain   entries that continue each other ([b, e), then the one starting at e, ...): what
//           one lookup can bring back
//
// Room. The host tier has room for `kv_pages` KV pages and `checkpoint_blocks` SSM blocks
// (two budgets, so KV cannot crowd checkpoints out; the table's host tier is their sum). A
// demotion that finds no room takes the table's least recently used idle host entry: with a
// storage tier below it moves down (a copy through the engine: the entry stays findable and
// is brought back up when a lookup needs it), otherwise, or when that move fails, it is
// dropped. A storage tier that is full does the same with its own victims (the last tier
// drops them). An entry that cannot fit beside the pinned ones is dropped. Entries a lookup
// found are pinned in the host tier until the load (or release), so the demotions the
// request's own reservation causes cannot take them.
//
// Integrity: an entry carries the CRC-32C of its bytes, taken when it is published; a chain
// a lookup found is checked against it (in host memory, after any entry was brought up)
// before it is loaded, and an entry whose bytes changed at rest is dropped (counted) and
// never loaded: the request recomputes those tokens. Bytes in a storage tier are also
// checked by the engine when they are read back (a missing, short or altered value fails
// the move up; the entry is dropped and counted the same way).
//
// Costs (P pages, B blocks of the entry; n entries in a tier): make_entry O(|tokens| +
// log n) plus one table insert (it allocates the row and its run list) and, per entry it
// moves down or drops, O(log n) + that entry's copy; find O(1) expected; bring_to_host one
// move (the storage read) plus the room it makes; byte access O(runs) to position, then
// sequential. Not thread-safe: the prefix cache calls it under its lock (the table and the
// engine are thread-safe themselves; the engine's workers do the storage copies).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <numeric>
#include <span>
#include <unordered_map>
#include <vector>

#include "hybridcache/core/config.hpp"
#include "hybridcache/core/crc32c.hpp"
#include "hybridcache/core/error.hpp"
#include "hybridcache/tiered/host_copy_engine.hpp"
#include "hybridcache/tiered/storage_tier_io.hpp"
#include "hybridcache/tiered/tier.hpp"
#include "hybridcache/tiered/tiered_store.hpp"

namespace hybridcache::stores {

/// Size of a `pool_state_store`'s lower tiers (aggregate; kv_pages 0 = no host tier).
struct host_tier_config {
  std::int64_t kv_pages = 0;           ///< host room for KV pages (one pool KV unit each)
  std::int64_t checkpoint_blocks = 0;  ///< host room for SSM blocks (one pool SSM unit each)
  /// Storage tiers below the host tier (`tiered::tier_kind::disk` / `redis`, fastest first,
  /// each with its `capacity_bytes` and `location`): an entry the host tier evicts moves
  /// down instead of being dropped. Empty: the host tier is the last one.
  std::vector<tiered::tier_config> storage_tiers{};
  /// One set of calls per storage tier, in the same order (`tiered::storage_io_of(backend)`;
  /// the backends must outlive the store).
  std::vector<tiered::storage_tier_io> storage_io{};
};

/// What the lower tiers did since construction.
struct host_tier_counters {
  std::int64_t demotions = 0;          ///< evicted leaves copied to the host tier
  std::int64_t demotions_dropped = 0;  ///< evicted leaves that did not fit (dropped)
  std::int64_t host_evictions = 0;     ///< host entries that left the host tier to make room (moved down or dropped)
  std::int64_t loads = 0;              ///< hits loaded into a request's reservation
  std::int64_t tokens_loaded = 0;      ///< KV tokens copied back into the pool by those loads
  std::int64_t checkpoints_loaded = 0; ///< checkpoints copied back (one per load)
  std::int64_t corrupt_dropped = 0;    ///< entries whose bytes no longer matched their CRC or could not be read back (dropped, never loaded)
  std::int64_t moved_down = 0;         ///< entries moved from a tier to the storage tier below it
  std::int64_t storage_dropped = 0;    ///< entries dropped from a storage tier (full, or a failed move down)
  std::int64_t brought_up = 0;         ///< entries a lookup brought from a storage tier back to the host tier
};

namespace detail {

/// The lower tiers' entries, table and bytes (see the file comment).
class pool_host_tier {
 public:
  static constexpr tier_id host{1};

  /// One demoted entry (its pages live in the table, under `id()`).
  struct entry {
    std::uint64_t key = 0;
    std::int64_t begin = 0, offset = 0;
    std::vector<std::int32_t> tokens;
    std::size_t pages = 0;   ///< KV pages, block-major like the pool extent
    std::size_t blocks = 0;  ///< SSM blocks of the checkpoint after end (0: none)
    std::uint32_t pins = 0;
    std::uint32_t crc = 0;   ///< CRC-32C of the page bytes, then the block bytes
    bool published = false;
    [[nodiscard]] std::int64_t end() const noexcept { return begin + static_cast<std::int64_t>(tokens.size()); }
  };

  /// Why `bring_to_host` did not bring an entry up.
  enum class bring : std::uint8_t { ready, no_room, dropped };

  pool_host_tier() = default;
  /// @param page_bytes   bytes of one KV page (pool KV unit)
  /// @param block_bytes  bytes of one SSM block (pool SSM unit)
  /// @throws invalid_argument for negative sizes, storage tiers without a host tier, a
  ///         storage list the tier rules refuse (tiered/tier.hpp) or one whose calls do not
  ///         match it; bad_alloc.
  pool_host_tier(host_tier_config cfg, std::size_t page_bytes, std::size_t block_bytes)
      : page_bytes_(static_cast<std::int64_t>(page_bytes)), block_bytes_(static_cast<std::int64_t>(block_bytes)) {
    HYBRIDCACHE_EXPECTS(cfg.kv_pages >= 0 && cfg.checkpoint_blocks >= 0, invalid_argument,
                        "host_tier_config: kv_pages and checkpoint_blocks must be >= 0");
    HYBRIDCACHE_EXPECTS(cfg.kv_pages > 0 || (cfg.storage_tiers.empty() && cfg.storage_io.empty()), invalid_argument,
                        "host_tier_config: storage tiers need a host tier above them (kv_pages > 0)");
    if (cfg.kv_pages == 0) return;  // no host tier
    HYBRIDCACHE_EXPECTS(page_bytes > 0, invalid_argument, "host_tier_config: the pool's KV page has no bytes");
    kv_slots_ = cfg.kv_pages;
    ssm_slots_ = block_bytes > 0 ? cfg.checkpoint_blocks : 0;
    unit_ = std::gcd(page_bytes_, block_bytes_);
    std::vector<tiered::tier_config> tiers{{.kind = tiered::tier_kind::hbm, .capacity_bytes = unit_},
                                           {.kind = tiered::tier_kind::host,
                                            .capacity_bytes = kv_slots_ * page_bytes_ + ssm_slots_ * block_bytes_}};
    for (auto& t : cfg.storage_tiers) {
      HYBRIDCACHE_EXPECTS(tiered::is_storage(t.kind), invalid_argument,
                          "host_tier_config: storage_tiers takes disk and redis tiers only");
      tiers.push_back(std::move(t));
    }
    // Both validate the list (tier order, sizes, locations) and the storage calls.
    table_ = std::make_unique<tiered::tiered_store<>>(tiers, unit_);
    engine_ = std::make_unique<tiered::host_copy_engine>(tiers, unit_, tiered::host_copy_engine_options{.measure_bandwidth = false},
                                                         std::move(cfg.storage_io));
    tiers_ = tiers.size();
  }

  [[nodiscard]] bool enabled() const noexcept { return table_ != nullptr; }
  [[nodiscard]] const host_tier_counters& counters() const noexcept { return counters_; }
  host_tier_counters& counters_mut() noexcept { return counters_; }
  /// Entries in every lower tier.
  [[nodiscard]] std::int64_t live_entries() const noexcept { return static_cast<std::int64_t>(entries_.size()); }
  /// Entries in the host tier.
  [[nodiscard]] std::int64_t host_entries() const { return enabled() ? table_->usage(host).entries : 0; }
  /// Host room left, in KV pages and SSM blocks.
  [[nodiscard]] std::int64_t free_pages() const noexcept { return kv_slots_ - kv_used_; }
  [[nodiscard]] std::int64_t free_blocks() const noexcept { return ssm_slots_ - ssm_used_; }
  /// Tiers of the table: 0 stands in for the pool (one page, never used), 1 is the host
  /// tier, then the storage tiers.
  [[nodiscard]] std::size_t tier_count() const noexcept { return tiers_; }
  [[nodiscard]] const tiered::tiered_store<>& table() const { return *table_; }

  /// The entry whose key is `key`, or nullptr. O(1) expected.
  [[nodiscard]] const entry* find(std::uint64_t key) const noexcept {
    const auto it = entries_.find(key);
    return it == entries_.end() || !it->second.published ? nullptr : &it->second;
  }
  /// Entry `key`, published or not. It must exist.
  [[nodiscard]] const entry& at(std::uint64_t key) const { return entries_.at(key); }
  /// The tier that holds `key` (its home copy). The entry must exist.
  [[nodiscard]] tier_id tier_of(std::uint64_t key) const { return table_->locate(make_entry_id(key))->first; }

  /// Makes an entry for `tokens` at [begin, ...) with `pages` KV pages and `blocks` SSM
  /// blocks in the host tier, making room (see the file comment); an entry with the same
  /// key is replaced. False, with nothing dropped, when it cannot fit beside the pinned
  /// entries (or the same key is pinned). The caller fills its bytes (`for_each_piece`)
  /// and then `publish`es it.
  bool make_entry(std::uint64_t key, std::int64_t begin, std::int64_t offset, std::span<const std::int32_t> tokens,
                  std::size_t pages, std::size_t blocks) noexcept {
    const auto p = static_cast<std::int64_t>(pages), b = static_cast<std::int64_t>(blocks);
    const auto old = entries_.find(key);
    // Decided before anything is dropped: what pinned entries hold cannot be freed.
    if (!enabled() || pages == 0 || p > kv_slots_ - pinned_pages_ || b > ssm_slots_ - pinned_blocks_ ||
        (old != entries_.end() && old->second.pins > 0)) {
      ++counters_.demotions_dropped;
      return false;
    }
    try {
      if (old != entries_.end()) drop(key);  // the same start: the newer copy wins
      make_host_room(p, b);
      entry e{key, begin, offset, {tokens.begin(), tokens.end()}, pages, blocks};
      auto [it, fresh] = entries_.emplace(key, std::move(e));
      (void)fresh;
      const auto inserted = table_->insert(make_entry_id(key), p * page_bytes_ + b * block_bytes_, host, {}, true);
      if (!inserted) {
        entries_.erase(it);
        ++counters_.demotions_dropped;
        return false;
      }
    } catch (...) {  // no memory for the row: the leaf is dropped, not demoted
      if (auto it = entries_.find(key); it != entries_.end() && !table_->contains(make_entry_id(key))) entries_.erase(it);
      ++counters_.demotions_dropped;
      return false;
    }
    kv_used_ += p;
    ssm_used_ += b;
    return true;
  }

  /// Makes a filled entry findable (most recently used), recording the CRC of its bytes.
  void publish(std::uint64_t key) noexcept {
    entry& e = entries_.at(key);
    e.crc = checksum(e);
    e.published = true;
    (void)table_->publish(make_entry_id(key));
    ++counters_.demotions;
  }

  /// Byte offset, in the entry, of KV page `i` and of SSM block `j`.
  [[nodiscard]] std::int64_t page_offset(std::size_t i) const noexcept { return static_cast<std::int64_t>(i) * page_bytes_; }
  [[nodiscard]] std::int64_t block_offset(const entry& e, std::size_t j) const noexcept {
    return static_cast<std::int64_t>(e.pages) * page_bytes_ + static_cast<std::int64_t>(j) * block_bytes_;
  }

  /// Calls `f(std::byte* host, std::int64_t n, std::int64_t done)` for each piece of bytes
  /// [first, first + len) of host entry `key` that is contiguous in host memory (`done`:
  /// bytes of the range before this piece). The entry must be in the host tier.
  /// O(runs of the entry + pieces).
  template <class F>
  void for_each_piece(std::uint64_t key, std::int64_t first, std::int64_t len, F&& f) {
    std::byte* base = engine_->base(host);
    (void)table_->visit_copy(make_entry_id(key), host, [&](const tier_copy& c) {
      std::int64_t logical = 0, done = 0;  // logical: bytes of the runs before this one
      for (const page_run& r : c.pages.runs()) {
        const std::int64_t run_bytes = static_cast<std::int64_t>(r.count) * unit_;
        const std::int64_t from = std::max(first + done, logical), to = std::min(first + len, logical + run_bytes);
        if (from < to) {
          f(base + static_cast<std::int64_t>(r.first) * unit_ + (from - logical), to - from, done);
          done += to - from;
        }
        logical += run_bytes;
        if (done == len) break;
      }
    });
  }

  /// Pins a host entry (it is no victim while pinned).
  void pin(std::uint64_t key) noexcept {
    entry& e = entries_.at(key);
    if (!table_->pin_in(make_entry_id(key), host)) return;
    if (e.pins++ == 0) {
      pinned_pages_ += static_cast<std::int64_t>(e.pages);
      pinned_blocks_ += static_cast<std::int64_t>(e.blocks);
    }
  }
  void unpin(std::uint64_t key) noexcept {
    const auto it = entries_.find(key);
    if (it == entries_.end() || it->second.pins == 0) return;
    entry& e = it->second;
    (void)table_->unpin_in(make_entry_id(key), host);
    if (--e.pins == 0) {
      pinned_pages_ -= static_cast<std::int64_t>(e.pages);
      pinned_blocks_ -= static_cast<std::int64_t>(e.blocks);
    }
  }
  /// Marks an entry used now (the host tier's LRU order).
  void touch(std::uint64_t key) noexcept { (void)table_->touch(make_entry_id(key)); }

  /// Brings entry `key` to the host tier if a storage tier holds it: makes host room
  /// (never taking a pinned entry), reads its bytes back through the engine and drops
  /// the storage copy. `no_room`: it cannot fit beside the pinned entries (nothing
  /// changed); `dropped`: its bytes could not be read back intact (dropped, counted).
  bring bring_to_host(std::uint64_t key) noexcept {
    const entry& e = entries_.at(key);
    const tier_id at = tier_of(key);
    if (at == host) return bring::ready;
    const auto p = static_cast<std::int64_t>(e.pages), b = static_cast<std::int64_t>(e.blocks);
    if (p > kv_slots_ - pinned_pages_ || b > ssm_slots_ - pinned_blocks_) return bring::no_room;
    const entry_id id = make_entry_id(key);
    try {
      // Pinned where it is, so the room made above cannot push it out of its own tier.
      if (!table_->pin_in(id, at)) return bring::no_room;
      make_host_room(p, b);
      (void)table_->unpin_in(id, at);
      if (tiered::move_entry(*table_, *engine_, id, host)) {
        kv_used_ += p;
        ssm_used_ += b;
        ++counters_.brought_up;
        return bring::ready;
      }
    } catch (...) {
      (void)table_->unpin_in(id, at);
    }
    // The read failed (missing, short or altered value; no memory): move_entry left the
    // entry where it was, and it goes.
    drop(key);
    ++counters_.corrupt_dropped;
    return bring::dropped;
  }

  /// Whether host entry `key`'s bytes still match the CRC taken when it was published; if
  /// not, the (unpinned) entry is dropped and counted. O(entry bytes).
  [[nodiscard]] bool verify_or_drop(std::uint64_t key) noexcept {
    entry& e = entries_.at(key);
    if (checksum(e) == e.crc) return true;
    drop(key);
    ++counters_.corrupt_dropped;
    return false;
  }

  /// The host tier's memory, for inspection (and fault-injection tests that flip a stored
  /// byte). Empty without a host tier.
  [[nodiscard]] std::span<std::byte> host_memory() noexcept {
    if (!enabled()) return {};
    return {engine_->base(host), static_cast<std::size_t>(engine_->arena_bytes(host))};
  }

 private:
  [[nodiscard]] std::uint32_t checksum(const entry& e) noexcept {
    std::uint32_t c = 0;
    const std::int64_t total = block_offset(e, e.blocks);
    for_each_piece(e.key, 0, total, [&](std::byte* p, std::int64_t n, std::int64_t) {
      c = crc32c(std::span<const std::byte>(p, static_cast<std::size_t>(n)), c);
    });
    return c;
  }

  /// Frees host room for `p` pages and `b` blocks by moving the least recently used idle
  /// host entries down (or dropping them). The caller checked that the pinned entries
  /// leave that room. May throw bad_alloc (a move's job list).
  void make_host_room(std::int64_t p, std::int64_t b) {
    while (kv_used_ + p > kv_slots_ || ssm_used_ + b > ssm_slots_) {
      const auto v = table_->victim(host);
      HYBRIDCACHE_ASSERT(v.has_value());  // the room check: the unpinned entries suffice
      const entry& e = entries_.at(to_underlying(*v));
      const auto vp = static_cast<std::int64_t>(e.pages), vb = static_cast<std::int64_t>(e.blocks);
      if (!move_down(*v, host)) drop_row(*v);  // either way it left the host tier
      kv_used_ -= vp;
      ssm_used_ -= vb;
      ++counters_.host_evictions;
    }
  }

  /// Moves entry `id` from tier `from` to the storage tier below it, making room there
  /// the same way. False (the entry untouched) when there is no tier below, it does not
  /// fit there, or the copy failed.
  bool move_down(entry_id id, tier_id from) {
    const tier_id to{static_cast<std::uint8_t>(from.value + 1)};
    if (to.value >= tiers_) return false;
    const entry& e = entries_.at(to_underlying(id));
    const std::int64_t need = table_->pages_for(static_cast<std::int64_t>(e.pages) * page_bytes_ +
                                                static_cast<std::int64_t>(e.blocks) * block_bytes_);
    if (need > table_->config(to).capacity_bytes / unit_) return false;  // larger than the whole tier
    const auto free_pages = [&] {
      const auto u = table_->usage(to);
      return (u.capacity_bytes - u.used_bytes) / unit_;
    };
    while (free_pages() < need) {
      const auto v = table_->victim(to);
      if (!v) return false;
      if (!move_down(*v, to)) {
        drop_row(*v);
        ++counters_.storage_dropped;
      }
    }
    if (!tiered::move_entry(*table_, *engine_, id, to)) {
      return false;
    }
    ++counters_.moved_down;
    return true;
  }

  /// Drops entry `key` wherever it is, with its pins.
  void drop(std::uint64_t key) noexcept {
    const entry_id id = make_entry_id(key);
    entry& e = entries_.at(key);
    while (e.pins > 0) unpin(key);
    if (const auto at = table_->locate(id); at && at->first == host) {
      kv_used_ -= static_cast<std::int64_t>(e.pages);
      ssm_used_ -= static_cast<std::int64_t>(e.blocks);
    }
    drop_row(id);
  }
  /// Removes the row and the entry (host room already accounted by the caller).
  void drop_row(entry_id id) noexcept {
    (void)table_->erase(id);
    entries_.erase(to_underlying(id));
  }

  std::int64_t page_bytes_ = 0, block_bytes_ = 0, unit_ = 0;
  std::int64_t kv_slots_ = 0, ssm_slots_ = 0;    // host room, in pages and blocks
  std::int64_t kv_used_ = 0, ssm_used_ = 0;      // held by host entries
  std::int64_t pinned_pages_ = 0, pinned_blocks_ = 0;  // held by host entries with pins > 0
  std::size_t tiers_ = 0;
  std::unordered_map<std::uint64_t, entry> entries_;
  // The engine reads the table's tiers; declared after it so it stops (and drops its
  // storage values) before the table goes.
  std::unique_ptr<tiered::tiered_store<>> table_;
  std::unique_ptr<tiered::host_copy_engine> engine_;
  host_tier_counters counters_;
};

}  // namespace detail
}  // namespace hybridcache::stores
