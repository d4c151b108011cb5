// hybridcache/stores/detail/pool_lower_tier.hpp
//
// The lower-tier protocol of `pool_state_store` (concepts/tier_store.hpp `lower_tier_store`,
// the one the request lifecycle drives for every store with tiers below HBM) over its host
// tiers' storage (pool_host_tier.hpp: a host tier, and storage tiers below it, in one
// `tiered::tiered_store`):
//
//   demote(tree, v)          the prefix cache evicts leaf v: its KV pages and checkpoint are
//                            copied to host slots, keyed by the content of its path
//   lookup(prompt, m)        the longest chain of entries continuing HBM's match m up to a
//                            checkpoint, brought up to the host tier where a storage tier
//                            holds them, CRC-checked and pinned: a hit (a ticket)
//   shorten_hit(hit, n)      keeps the chain up to the entry whose checkpoint is at n
//   load / loaded / wait     nothing to stage: the pool is the HBM, the bytes are copied
//                            straight into the request's reservation by `land`
//   land(hit, kv, first, s)  after the reservation: copies the chain's KV of [first,
//                            reusable) into the reserved extent and its checkpoint into the
//                            reserved slot, and lets the chain go
//   settle / release_hit     let the chain go (nothing to adopt: the tree takes the
//                            reservation's pages)
//
// A hit is a small value (its numbers and a ticket); the pinned chain lives in a slot of a
// `hit_table` (hit_table.hpp, shared with tiered_state_store), so the chain's list keeps its
// capacity from one request to the next and a stale ticket does nothing.
//
// Costs: demote O(path + pages + blocks) (+ a CRC of the entry's bytes, + the table insert
// and whatever it moves down: pool_host_tier.hpp); lookup O(|prompt| + Σ chain entries) hash
// probes and token compares + O(chain bytes) for the CRC check + one storage read per entry
// brought up; land O(tokens copied · layers + blocks); shorten / release O(chain entries).
// The walk and the chain lists grow to their largest once; the table allocates a row per
// demotion.
// Not thread-safe: the prefix cache calls it under its lock.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "hybridcache/concepts/ids.hpp"
#include "hybridcache/concepts/match_result.hpp"
#include "hybridcache/concepts/pool.hpp"
#include "hybridcache/core/error.hpp"
#include "hybridcache/core/expected.hpp"
#include "hybridcache/core/hash.hpp"
#include "hybridcache/stores/detail/hit_table.hpp"
#include "hybridcache/stores/detail/pool_host_tier.hpp"

namespace hybridcache::stores {

/// A hit in a `pool_state_store`'s host tier, from `lookup` to `land` (or `release_hit`):
/// the chain of host entries that continues the HBM match up to a checkpoint.
/// host_tokens 0: no hit (ticket 0: nothing pinned).
struct pool_host_hit {
  std::int64_t reusable_tokens = 0;  ///< prefill starts here (the chain's checkpoint)
  std::int64_t hbm_tokens = 0;       ///< of which reusable from HBM alone (= match_result::reusable_tokens)
  std::int64_t host_tokens = 0;      ///< reusable_tokens - hbm_tokens: loaded from the host tier
  /// The first token whose KV the hit brings: the tree must hold the KV before it (the
  /// chain may start anywhere up to the match's common prefix).
  std::int64_t kv_first = 0;
  /// How far the input's KV is found in HBM or the host tier (at an entry boundary: host
  /// entries are found whole): the branch point admission sees.
  std::int64_t kv_reach = 0;
  std::uint64_t ticket = 0;          ///< the pinned chain (0 = nothing pinned)
  cache_salt salt = std::nullopt;    ///< the match's namespace
};

namespace detail {

/// The host entries a hit pinned (a `hit_table` slot).
struct pool_host_hold {
  std::uint64_t ticket = 0;
  std::vector<std::uint64_t> entries;  ///< the chain's keys, in token order
  void reserve(std::size_t n) { entries.reserve(n); }
  void clear() noexcept { entries.clear(); }
};
static_assert(hit_hold<pool_host_hold>);

/// See the file comment. The pool, its copier and the layout (tokens per page, attention
/// layers) are passed to each call: the store that owns this may move.
class pool_lower_tier {
 public:
  pool_lower_tier() = default;
  /// @throws invalid_argument for negative sizes; bad_alloc.
  pool_lower_tier(host_tier_config cfg, std::size_t page_bytes, std::size_t block_bytes)
      : host_(std::move(cfg), page_bytes, block_bytes) {}

  [[nodiscard]] bool enabled() const noexcept { return host_.enabled(); }
  [[nodiscard]] pool_host_tier& storage() noexcept { return host_; }
  [[nodiscard]] const pool_host_tier& storage() const noexcept { return host_; }
  [[nodiscard]] std::size_t outstanding_hits() const noexcept { return hits_.outstanding(); }

  /// Copies leaf `v` of `tree` (its KV and its checkpoint, if any) into the host tier, keyed
  /// by the content of its path (salt-seeded). Dropped when the host tier is off or the leaf
  /// does not fit beside pinned entries.
  template <class Tree, class Pool, class Copier>
  void demote(const Tree& tree, node_id v, Pool& pool, Copier& copy) noexcept {
    if (!enabled()) return;
    const auto& nd = tree.at(v);
    if (nd.tokens.empty() || nd.kv.pages.empty()) return;
    // The content key of the path through the leaf's first token, hashed from the root.
    path_.clear();
    try {  // grows with the deepest path once
      for (node_id n = nd.parent; n != Tree::root(); n = tree.at(n).parent) path_.push_back(n);
    } catch (...) {
      return;  // no memory for the walk: the leaf is dropped, not demoted
    }
    std::uint64_t h = content_key::seed(0, tree.salt_of(nd.ns));
    for (auto it = path_.rbegin(); it != path_.rend(); ++it)
      for (const auto t : tree.at(*it).tokens) h = content_key::next(h, t);
    const std::uint64_t key = content_key::next(h, nd.tokens.front());
    const std::size_t blocks = nd.has_checkpoint ? nd.checkpoint.blocks.size() : 0;
    if (!host_.make_entry(key, nd.begin(), nd.kv.offset, std::span<const token_id>(nd.tokens), nd.kv.pages.size(), blocks))
      return;
    const auto& e = host_.at(key);
    const std::int64_t page_bytes = pool.stats(pool_kind::kv).unit_bytes, block_bytes = pool.stats(pool_kind::ssm).unit_bytes;
    for (std::size_t i = 0; i < e.pages; ++i)
      if (auto src = pool.resolve(nd.kv.pages[i]); src && *src != nullptr) write_entry(key, host_.page_offset(i), page_bytes, *src, copy);
    for (std::size_t i = 0; i < e.blocks; ++i)
      if (auto src = pool.resolve(nd.checkpoint.blocks[i]); src && *src != nullptr)
        write_entry(key, host_.block_offset(e, i), block_bytes, *src, copy);
    host_.publish(key);
  }

  /// The longest chain of entries that continues `prompt`'s HBM match `m` (in m's
  /// namespace) and ends in a checkpoint after m.reusable_tokens and before |prompt| (a
  /// request computes at least its last prompt token), brought to the host tier and pinned
  /// there. Each entry is checked against its CRC-32C first: a changed entry, or one whose
  /// bytes a storage tier cannot give back intact, is dropped (counted in
  /// `counters().corrupt_dropped`) and never loaded, and the search runs again without it.
  /// Where the host tier cannot hold the whole chain beside the pinned entries, the hit
  /// ends at the deepest checkpoint of the part it holds.
  /// @throws bad_alloc (a new hit slot) with nothing pinned.
  pool_host_hit lookup(std::span<const token_id> prompt, const match_result& m) {
    pool_host_hit hit;
    hit.reusable_tokens = hit.hbm_tokens = m.reusable_tokens;
    hit.kv_first = hit.kv_reach = m.common_prefix;
    hit.salt = m.salt;
    if (!enabled() || host_.live_entries() == 0) return hit;
    // Each retry drops one entry, so this ends.
    for (;;) {
      const chain c = longest_chain(prompt, m);
      hit.kv_reach = std::max(m.common_prefix, c.reach);
      if (c.entries == 0) return hit;
      pool_host_hold& hold = hits_.acquire(static_cast<std::size_t>(c.entries));  // may throw: nothing pinned yet
      if (!gather(prompt, m, c, hold)) {
        release_hold(hold);
        continue;
      }
      // The deepest usable checkpoint of what the host tier holds now.
      const auto n = static_cast<std::int64_t>(prompt.size());
      std::size_t keep = hold.entries.size();
      while (keep > 0) {
        const auto& e = host_.at(hold.entries[keep - 1]);
        if (e.blocks > 0 && e.end() > m.reusable_tokens && e.end() < n) break;
        --keep;
      }
      if (keep == 0) {
        release_hold(hold);
        return hit;
      }
      for (std::size_t i = keep; i < hold.entries.size(); ++i) host_.unpin(hold.entries[i]);
      hold.entries.resize(keep);
      hit.kv_first = c.start;
      hit.reusable_tokens = host_.at(hold.entries.back()).end();
      hit.host_tokens = hit.reusable_tokens - m.reusable_tokens;
      hit.ticket = hold.ticket;
      return hit;
    }
  }

  /// Keeps only the chain up to the entry whose checkpoint is at `tokens` (the rest is let
  /// go). invalid_argument where no entry of the chain ends in a checkpoint at `tokens`;
  /// stale_handle for a hit not outstanding. O(chain entries).
  expected<void> shorten_hit(pool_host_hit& hit, std::int64_t tokens) {
    pool_host_hold* hold = hits_.find(hit.ticket);
    if (hold == nullptr) return unexpected(errc::stale_handle, "shorten_hit: the hit is not outstanding");
    if (tokens == hit.reusable_tokens) return {};
    std::size_t keep = 0;
    while (keep < hold->entries.size() && host_.at(hold->entries[keep]).end() < tokens) ++keep;
    if (tokens <= hit.hbm_tokens || keep == hold->entries.size() || host_.at(hold->entries[keep]).end() != tokens ||
        host_.at(hold->entries[keep]).blocks == 0)
      return unexpected(errc::invalid_argument, "shorten_hit: no host checkpoint at this position", tokens);
    for (std::size_t i = keep + 1; i < hold->entries.size(); ++i) host_.unpin(hold->entries[i]);
    hold->entries.resize(keep + 1);
    hit.reusable_tokens = tokens;
    hit.host_tokens = tokens - hit.hbm_tokens;
    return {};
  }

  /// Whether `hit` is outstanding (stale_handle otherwise): the load itself is `land`'s.
  [[nodiscard]] expected<void> check(const pool_host_hit& hit) const {
    if (hit.ticket != 0 && hits_.find(hit.ticket) == nullptr)
      return unexpected(errc::stale_handle, "the host hit is not outstanding");
    return {};
  }

  /// Copies the KV of positions [dst_first, hit.reusable_tokens) of the chain into `dst` (an
  /// extent laid out at absolute positions whose tokens start at `dst_first`; the chain must
  /// start at or before dst_first) and the chain's checkpoint into `slot`, then lets the
  /// chain go. A stale hit copies nothing.
  template <class Pool, class Copier, class Extent, class Checkpoint>
  void land(const pool_host_hit& hit, const Extent& dst, std::int64_t dst_first, const Checkpoint& slot, Pool& pool,
            Copier& copy, std::int64_t tokens_per_page, std::int64_t attention_layers) noexcept {
    pool_host_hold* hold = hits_.find(hit.ticket);
    if (hold == nullptr || hold->entries.empty()) return;
    const std::int64_t tpp = tokens_per_page, from = dst_first, to = hit.reusable_tokens;
    const auto L = static_cast<std::size_t>(attention_layers);
    const byte_count per_token = pool.stats(pool_kind::kv).unit_bytes / tpp;
    for (const std::uint64_t key : hold->entries) {
      const auto& e = host_.at(key);
      for (std::int64_t p = std::max(from, e.begin); p < std::min(to, e.end());) {
        const std::int64_t stop = std::min({to, e.end(), (p / tpp + 1) * tpp});  // to the end of p's block
        const auto sb = static_cast<std::size_t>((e.offset + p - e.begin) / tpp);
        const auto db = static_cast<std::size_t>((dst.offset + p - dst_first) / tpp);
        for (std::size_t l = 0; l < L; ++l) {
          auto d = pool.resolve(dst.pages[db * L + l]);
          if (!d || *d == nullptr) continue;
          const byte_count at = p % tpp * per_token;
          read_entry(key, host_.page_offset(sb * L + l) + at, (stop - p) * per_token, *d + at, copy);
        }
        p = stop;
      }
      host_.touch(key);
    }
    const std::uint64_t last = hold->entries.back();
    const auto& le = host_.at(last);
    const std::int64_t block_bytes = pool.stats(pool_kind::ssm).unit_bytes;
    for (std::size_t i = 0; i < le.blocks && i < slot.blocks.size(); ++i)
      if (auto d = pool.resolve(slot.blocks[i]); d && *d != nullptr) read_entry(last, host_.block_offset(le, i), block_bytes, *d, copy);
    auto& c = host_.counters_mut();
    ++c.loads;
    c.tokens_loaded += std::max<std::int64_t>(0, to - from);
    ++c.checkpoints_loaded;
    release(hit);
  }

  /// Lets `hit`'s chain go (unpins it); a stale or empty hit is a no-op. O(chain entries).
  void release(const pool_host_hit& hit) noexcept {
    pool_host_hold* hold = hits_.find(hit.ticket);
    if (hold != nullptr) release_hold(*hold);
  }

 private:
  /// A chain of host entries continuing a match: where it starts, how many entries, the
  /// state it reaches; `reach`: how far any chain the prompt follows goes.
  struct chain {
    std::int64_t start = 0, entries = 0, reusable = 0, reach = 0;
  };

  /// The longest chain continuing `m` that ends in a checkpoint before the prompt's last token.
  chain longest_chain(std::span<const token_id> prompt, const match_result& m) const noexcept {
    const auto n = static_cast<std::int64_t>(prompt.size());
    const std::int64_t reach = std::min<std::int64_t>(m.common_prefix, n - 1);
    std::uint64_t h = content_key::seed(0, m.salt);
    chain best{0, 0, m.reusable_tokens, 0};
    for (std::int64_t s = 0; s <= reach; ++s) {
      const std::uint64_t through = content_key::next(h, prompt[static_cast<std::size_t>(s)]);
      if (host_.find(through) != nullptr) {
        // Follow the chain from s, remembering its deepest usable checkpoint.
        std::int64_t cur = s, len = 0;
        std::uint64_t hc = h;
        while (cur < n) {
          const auto* found = host_.find(content_key::next(hc, prompt[static_cast<std::size_t>(cur)]));
          if (found == nullptr) break;
          const auto& e = *found;
          if (e.begin != cur || e.end() > n ||
              !std::equal(e.tokens.begin(), e.tokens.end(), prompt.begin() + static_cast<std::ptrdiff_t>(cur)))
            break;
          for (const auto t : e.tokens) hc = content_key::next(hc, t);
          cur = e.end();
          ++len;
          if (e.blocks > 0 && cur > best.reusable && cur < n) {
            best.start = s;
            best.entries = len;
            best.reusable = cur;
          }
        }
        best.reach = std::max(best.reach, cur);
      }
      h = through;
    }
    return best;
  }

  /// Brings chain `c`'s entries to the host tier in order, checks and pins each into
  /// `hold`; stops early (true) where the host tier has no room for the next one beside the
  /// pinned entries or an entry went meanwhile (moved out of a full storage tier to make
  /// room for an earlier one). False when an entry was dropped (changed bytes, or a storage
  /// read that failed): the caller lets `hold` go and searches again.
  bool gather(std::span<const token_id> prompt, const match_result& m, const chain& c, pool_host_hold& hold) noexcept {
    std::uint64_t h = content_key::seed(0, m.salt);
    for (std::int64_t s = 0; s < c.start; ++s) h = content_key::next(h, prompt[static_cast<std::size_t>(s)]);
    std::int64_t cur = c.start;
    for (std::int64_t i = 0; i < c.entries; ++i) {
      const std::uint64_t key = content_key::next(h, prompt[static_cast<std::size_t>(cur)]);
      const auto* e = host_.find(key);
      if (e == nullptr || e->begin != cur) return true;
      const auto brought = host_.bring_to_host(key);
      if (brought == pool_host_tier::bring::no_room) return true;
      if (brought == pool_host_tier::bring::dropped || !host_.verify_or_drop(key)) return false;
      host_.pin(key);
      hold.entries.push_back(key);  // capacity reserved by acquire
      for (const auto t : host_.at(key).tokens) h = content_key::next(h, t);
      cur = host_.at(key).end();
    }
    return true;
  }

  // Bytes [at, at + n) of host entry `key` from `src` / into `dst`, piece by piece (an
  // entry's host pages need not be contiguous).
  template <class Copier>
  void write_entry(std::uint64_t key, std::int64_t at, std::int64_t n, const std::byte* src, Copier& copy) {
    host_.for_each_piece(key, at, n, [&](std::byte* piece, std::int64_t len, std::int64_t done) {
      copy(piece, src + done, static_cast<std::size_t>(len));
    });
  }
  template <class Copier>
  void read_entry(std::uint64_t key, std::int64_t at, std::int64_t n, std::byte* dst, Copier& copy) {
    host_.for_each_piece(key, at, n, [&](std::byte* piece, std::int64_t len, std::int64_t done) {
      copy(dst + done, piece, static_cast<std::size_t>(len));
    });
  }

  void release_hold(pool_host_hold& hold) noexcept {
    for (const std::uint64_t key : hold.entries) host_.unpin(key);
    hits_.release(hold);
  }

  pool_host_tier host_;
  hit_table<pool_host_hold> hits_;
  std::vector<node_id> path_;  // demote's root-ward walk
};

}  // namespace detail
}  // namespace hybridcache::stores
