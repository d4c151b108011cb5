// hybridcache/stores/detail/pool_host_tier.hpp
//
// The storage of `pool_state_store`'s host tier: entries, their slots, an index by content
// key and the LRU order. When the prefix cache evicts a leaf from the pool, its KV pages and
// its checkpoint are demoted here (copied into host page and block slots); a later request
// whose prompt continues past the HBM match into demoted entries loads them back into its
// reserved pages and a reserved checkpoint slot. The protocol the request lifecycle drives
// (lookup, land, ...) is pool_lower_tier.hpp.
//
//   entry   one demoted node: its tokens [begin, end), its KV pages (the pool extent's
//           layout: block-major, `offset` tokens into the first block) and, if it had one,
//           the checkpoint after `end`
//   key     content_key of the path through the entry's first token (salt-seeded), so an
//           entry is found from the prompt alone and two tenants never share one
//   chain   entries that continue each other ([b, e), then the one starting at e, ...): what
//           one lookup can bring back
//
// Integrity: an entry carries the CRC-32C of its page and block bytes, taken when it is
// published; the chain a lookup found is checked against it before it is loaded, and an entry
// whose bytes changed at rest is dropped (counted) and never loaded: the request recomputes
// those tokens instead.
//
// Host memory is two fixed arrays of slots (KV pages and SSM blocks) allocated at
// construction. A demotion that finds no room evicts the least recently used unpinned
// entries (dropped: this is the last tier); an entry that cannot fit at all is dropped.
// Entries a lookup found are pinned until the load (or release) so that the demotions the
// request's own reservation causes cannot drop them.
//
// Costs: demote O(path + pages + blocks) (the content key of the entry's start is hashed
// from the root) plus O(1) per entry it evicts; lookup O(|prompt| + Σ chain entries) hash
// probes and token compares; load O(tokens loaded · layers) slot copies + O(blocks). The
// index is an open-addressing table sized at construction; an entry's token and slot lists
// keep their capacity when the entry is reused, so steady state allocates nothing.
// Not thread-safe: the prefix cache calls it under its lock.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <vector>

#include "hybridcache/core/config.hpp"
#include "hybridcache/core/crc32c.hpp"
#include "hybridcache/core/error.hpp"
#include "hybridcache/core/hash.hpp"

namespace hybridcache::stores {

/// Size of a `pool_state_store`'s host tier (aggregate; both 0 = no host tier).
struct host_tier_config {
  std::int64_t kv_pages = 0;           ///< host slots for KV pages (one pool KV unit each)
  std::int64_t checkpoint_blocks = 0;  ///< host slots for SSM blocks (one pool SSM unit each)
};

/// What the host tier did since construction.
struct host_tier_counters {
  std::int64_t demotions = 0;          ///< evicted leaves copied to the host tier
  std::int64_t demotions_dropped = 0;  ///< evicted leaves that did not fit (dropped)
  std::int64_t host_evictions = 0;     ///< host entries dropped to make room
  std::int64_t loads = 0;              ///< host hits loaded into a request's reservation
  std::int64_t tokens_loaded = 0;      ///< KV tokens copied back into the pool by those loads
  std::int64_t checkpoints_loaded = 0; ///< checkpoints copied back (one per load)
  std::int64_t corrupt_dropped = 0;    ///< entries whose bytes no longer matched their CRC (dropped, never loaded)
};

namespace detail {

/// The host tier's storage, index and LRU order (see the file comment).
class pool_host_tier {
 public:
  static constexpr std::uint32_t none = ~std::uint32_t{0};

  pool_host_tier() = default;
  /// @param page_bytes   bytes of one KV page (pool KV unit)
  /// @param block_bytes  bytes of one SSM block (pool SSM unit)
  /// @throws invalid_argument for negative sizes; bad_alloc.
  pool_host_tier(const host_tier_config& cfg, std::size_t page_bytes, std::size_t block_bytes)
      : page_bytes_(page_bytes), block_bytes_(block_bytes) {
    HYBRIDCACHE_EXPECTS(cfg.kv_pages >= 0 && cfg.checkpoint_blocks >= 0, invalid_argument,
                        "host_tier_config: kv_pages and checkpoint_blocks must be >= 0");
    if (cfg.kv_pages == 0) return;  // no host tier
    kv_.resize(static_cast<std::size_t>(cfg.kv_pages) * page_bytes);
    ssm_.resize(static_cast<std::size_t>(cfg.checkpoint_blocks) * block_bytes);
    for (auto i = static_cast<std::uint32_t>(cfg.kv_pages); i-- > 0;) free_pages_.push_back(i);
    for (auto i = static_cast<std::uint32_t>(cfg.checkpoint_blocks); i-- > 0;) free_blocks_.push_back(i);
    entries_.resize(static_cast<std::size_t>(cfg.kv_pages));  // an entry holds at least one page
    for (auto i = static_cast<std::uint32_t>(entries_.size()); i-- > 0;) free_entries_.push_back(i);
    std::size_t cap = 16;
    while (cap < 2 * entries_.size()) cap *= 2;
    index_.assign(cap, slot{});
  }

  [[nodiscard]] bool enabled() const noexcept { return !entries_.empty(); }
  [[nodiscard]] const host_tier_counters& counters() const noexcept { return counters_; }
  [[nodiscard]] std::int64_t live_entries() const noexcept {
    return static_cast<std::int64_t>(entries_.size() - free_entries_.size());
  }
  [[nodiscard]] std::int64_t free_pages() const noexcept { return static_cast<std::int64_t>(free_pages_.size()); }
  [[nodiscard]] std::int64_t free_blocks() const noexcept { return static_cast<std::int64_t>(free_blocks_.size()); }

  /// One demoted entry.
  struct entry {
    std::uint64_t key = 0;
    std::int64_t begin = 0, offset = 0;
    std::vector<std::int32_t> tokens;
    std::vector<std::uint32_t> pages;   ///< host page slots, block-major like the pool extent
    std::vector<std::uint32_t> blocks;  ///< host block slots of the checkpoint after end (empty: none)
    std::uint32_t pins = 0;
    std::uint32_t crc = 0;                   ///< CRC-32C of the page bytes, then the block bytes
    std::uint32_t prev = none, next = none;  ///< LRU list (head = least recent)
    [[nodiscard]] std::int64_t end() const noexcept { return begin + static_cast<std::int64_t>(tokens.size()); }
  };

  /// Makes an entry for `tokens` at [begin, ...) with `pages` page slots and `blocks` block
  /// slots, evicting unpinned entries (least recently used first) as needed; an entry with
  /// the same key is replaced. none, with nothing dropped, when it cannot fit beside the
  /// pinned entries (or the same key is pinned). The caller fills the slots (`page`,
  /// `block`) and then `publish`es it.
  std::uint32_t make_entry(std::uint64_t key, std::int64_t begin, std::int64_t offset, std::span<const std::int32_t> tokens,
                           std::size_t pages, std::size_t blocks) noexcept {
    if (!enabled() || pages == 0 || pages > kv_slots() || blocks > ssm_slots()) {
      ++counters_.demotions_dropped;
      return none;
    }
    const std::uint32_t old = find(key);  // the same start: the newer copy wins
    // Decided before anything is dropped: what pinned entries hold cannot be freed. (Every
    // entry holds a page and there is an entry slot per page, so a slot is free when pages are.)
    if ((old != none && entries_[old].pins > 0) || pages > kv_slots() - pinned_pages_ ||
        blocks > ssm_slots() - pinned_blocks_) {
      ++counters_.demotions_dropped;
      return none;
    }
    if (old != none) drop(old);
    while (free_pages_.size() < pages || free_blocks_.size() < blocks || free_entries_.empty()) {
      std::uint32_t victim = lru_head_;
      while (victim != none && entries_[victim].pins > 0) victim = entries_[victim].next;
      HYBRIDCACHE_ASSERT(victim != none);  // the room check above
      drop(victim);
      ++counters_.host_evictions;
    }
    const std::uint32_t id = free_entries_.back();
    free_entries_.pop_back();
    entry& e = entries_[id];
    e.key = key;
    e.begin = begin;
    e.offset = offset;
    e.pins = 0;
    try {  // the lists keep their capacity across reuses; the first use of a slot may allocate
      e.tokens.assign(tokens.begin(), tokens.end());
      e.pages.resize(pages);
      e.blocks.resize(blocks);
    } catch (...) {
      free_entries_.push_back(id);
      ++counters_.demotions_dropped;
      return none;
    }
    for (auto& p : e.pages) {
      p = free_pages_.back();
      free_pages_.pop_back();
    }
    for (auto& b : e.blocks) {
      b = free_blocks_.back();
      free_blocks_.pop_back();
    }
    return id;
  }
  /// Makes a filled entry findable (most recently used), recording the CRC of its bytes.
  void publish(std::uint32_t id) noexcept {
    entries_[id].crc = checksum(entries_[id]);
    put(entries_[id].key, id);
    link_tail(id);
    ++counters_.demotions;
  }

  [[nodiscard]] std::byte* page(std::uint32_t slot) noexcept { return kv_.data() + slot * page_bytes_; }
  [[nodiscard]] std::byte* block(std::uint32_t slot) noexcept { return ssm_.data() + slot * block_bytes_; }
  [[nodiscard]] const entry& at(std::uint32_t id) const noexcept { return entries_[id]; }

  /// The entry whose key is `key` (none if absent). O(1) expected.
  [[nodiscard]] std::uint32_t find(std::uint64_t key) const noexcept {
    if (index_.empty()) return none;
    for (std::size_t i = home(key);; i = (i + 1) & (index_.size() - 1)) {
      if (index_[i].id == none) return none;
      if (index_[i].key == key) return index_[i].id;
    }
  }

  void pin(std::uint32_t id) noexcept {
    entry& e = entries_[id];
    if (e.pins++ == 0) {
      pinned_pages_ += e.pages.size();
      pinned_blocks_ += e.blocks.size();
    }
  }
  void unpin(std::uint32_t id) noexcept {
    entry& e = entries_[id];
    if (e.pins == 0) return;
    if (--e.pins == 0) {
      pinned_pages_ -= e.pages.size();
      pinned_blocks_ -= e.blocks.size();
    }
  }
  /// Whether entry `id`'s bytes still match the CRC taken when it was published; if not, the
  /// entry is dropped and counted (its pins, if any, go with it). O(entry bytes).
  [[nodiscard]] bool verify_or_drop(std::uint32_t id) noexcept {
    entry& e = entries_[id];
    if (checksum(e) == e.crc) return true;
    if (e.pins > 0) {
      pinned_pages_ -= e.pages.size();
      pinned_blocks_ -= e.blocks.size();
      e.pins = 0;
    }
    drop(id);
    ++counters_.corrupt_dropped;
    return false;
  }

  /// The host memory of KV pages and of SSM blocks, for inspection (and fault-injection
  /// tests that flip a stored byte).
  [[nodiscard]] std::span<std::byte> kv_memory() noexcept { return kv_; }
  [[nodiscard]] std::span<std::byte> ssm_memory() noexcept { return ssm_; }

  /// Marks an entry used now (moves it to the LRU tail).
  void touch(std::uint32_t id) noexcept {
    unlink(id);
    link_tail(id);
  }
  host_tier_counters& counters_mut() noexcept { return counters_; }

 private:
  struct slot {
    std::uint64_t key = 0;
    std::uint32_t id = none;
  };
  [[nodiscard]] std::uint32_t checksum(const entry& e) const noexcept {
    std::uint32_t c = 0;
    for (const auto p : e.pages) c = crc32c(std::span<const std::byte>(kv_.data() + p * page_bytes_, page_bytes_), c);
    for (const auto b : e.blocks) c = crc32c(std::span<const std::byte>(ssm_.data() + b * block_bytes_, block_bytes_), c);
    return c;
  }
  [[nodiscard]] std::size_t kv_slots() const noexcept { return kv_.size() / std::max<std::size_t>(1, page_bytes_); }
  [[nodiscard]] std::size_t ssm_slots() const noexcept { return ssm_.size() / std::max<std::size_t>(1, block_bytes_); }
  [[nodiscard]] std::size_t home(std::uint64_t key) const noexcept {
    return static_cast<std::size_t>(splitmix64_mix(key)) & (index_.size() - 1);
  }
  void put(std::uint64_t key, std::uint32_t id) noexcept {
    std::size_t i = home(key);
    while (index_[i].id != none) i = (i + 1) & (index_.size() - 1);
    index_[i] = {key, id};
  }
  /// Linear probing with backward-shift deletion: no tombstones, so probes stay short.
  void erase(std::uint64_t key) noexcept {
    const std::size_t mask = index_.size() - 1;
    std::size_t i = home(key);
    while (index_[i].id != none && index_[i].key != key) i = (i + 1) & mask;
    if (index_[i].id == none) return;
    for (std::size_t j = (i + 1) & mask; index_[j].id != none; j = (j + 1) & mask) {
      const std::size_t h = home(index_[j].key);
      // index_[j] may move to the hole at i when its home is not in (i, j] cyclically.
      if (((j - h) & mask) >= ((j - i) & mask)) {
        index_[i] = index_[j];
        i = j;
      }
    }
    index_[i] = slot{};
  }
  void drop(std::uint32_t id) noexcept {
    entry& e = entries_[id];
    erase(e.key);
    unlink(id);
    for (auto p : e.pages) free_pages_.push_back(p);
    for (auto b : e.blocks) free_blocks_.push_back(b);
    e.pages.clear();
    e.blocks.clear();
    e.tokens.clear();
    free_entries_.push_back(id);
  }
  void link_tail(std::uint32_t id) noexcept {
    entry& e = entries_[id];
    e.prev = lru_tail_;
    e.next = none;
    if (lru_tail_ != none) entries_[lru_tail_].next = id;
    else lru_head_ = id;
    lru_tail_ = id;
  }
  void unlink(std::uint32_t id) noexcept {
    entry& e = entries_[id];
    if (e.prev != none) entries_[e.prev].next = e.next;
    else if (lru_head_ == id) lru_head_ = e.next;
    if (e.next != none) entries_[e.next].prev = e.prev;
    else if (lru_tail_ == id) lru_tail_ = e.prev;
    e.prev = e.next = none;
  }

  std::size_t page_bytes_ = 0, block_bytes_ = 0;
  std::vector<std::byte> kv_, ssm_;
  std::vector<std::uint32_t> free_pages_, free_blocks_, free_entries_;
  std::vector<entry> entries_;
  std::vector<slot> index_;
  std::uint32_t lru_head_ = none, lru_tail_ = none;
  std::size_t pinned_pages_ = 0, pinned_blocks_ = 0;  // held by entries with pins > 0
  host_tier_counters counters_;
};

}  // namespace detail
}  // namespace hybridcache::stores
