// hybridcache/memory/padded_unified_pool.hpp
//
// `padded_unified_pool<Backing>`: the vLLM hybrid-KV-cache-manager layout, as the AVMP
// reference mirrors it: one pool whose page is the larger of the two units (128 B
// aligned), every KV page and SSM block padded to it. Any page serves either kind (no
// split to get wrong) but a KV page wastes page - kv_page_bytes: 4x for jamba_1_5_mini,
// 32x for mamba2_1b3 (anchor avmp.md 1.7-1.8; vLLM issues #54458, #37124).
//
// Costs: allocate, free, resolve O(1); allocation-free after construction.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "hybridcache/core/error.hpp"
#include "hybridcache/core/expected.hpp"
#include "hybridcache/memory/handle_table.hpp"
#include "hybridcache/memory/pool.hpp"
#include "hybridcache/memory/stores.hpp"

namespace hybridcache::memory {

/// Construction parameters of a `padded_unified_pool`.
struct padded_unified_pool_config {
  byte_count capacity_bytes = 0;  ///< physical memory of the one pool (the budget)
  byte_count kv_page_bytes = 0;
  byte_count ssm_block_bytes = 0;
  std::uint32_t pool_tag = 0;  ///< tag of the handle table; 0 = automatic
};

/// One pool of max(kv, ssm)-sized pages.
template <memory_backing Backing = counting_backing>
class padded_unified_pool {
 public:
  using arena_type = typename Backing::arena;

  /// @throws invalid_argument for bad sizes or tag; capacity_error if the budget is
  ///         smaller than one padded page.
  explicit padded_unified_pool(const padded_unified_pool_config& cfg)
      : cfg_(validated(cfg)),
        page_(std::max(cfg_.kv_page_bytes, cfg_.ssm_block_bytes)),
        arena_(std::make_unique<arena_type>(1, static_cast<std::uint64_t>(cfg_.capacity_bytes / page_ * page_))),
        store_(*arena_, page_, 1),
        table_(cfg_.pool_tag ? cfg_.pool_tag : detail::next_pool_tag(), store_.region().units_per_chunk()),
        kind_(store_.region().units_per_chunk(), pool_kind::kv) {
    store_.map_chunk(0);
  }

  padded_unified_pool(const padded_unified_pool&) = delete;
  padded_unified_pool& operator=(const padded_unified_pool&) = delete;

  /// One padded page holding a unit of `kind`, or errc::out_of_capacity. O(1).
  [[nodiscard]] expected<packed_handle> allocate(pool_kind kind) noexcept {
    auto u = store_.acquire();
    if (!u) return unexpected(u.error());
    kind_[*u] = kind;
    ++used_[static_cast<int>(kind)];
    padding_ += page_ - logical_bytes(kind);
    return table_.insert(*u);
  }

  /// `out.size()` pages, all or nothing. O(n).
  [[nodiscard]] expected<void> allocate_n(pool_kind kind, std::span<packed_handle> out, bool = true) noexcept {
    if (out.empty()) return unexpected(errc::invalid_argument);
    if (store_.free_units() < out.size()) return unexpected(errc::out_of_capacity);
    for (auto& h : out) h = *allocate(kind);
    return {};
  }

  /// Frees `h`; stale, double-freed or foreign handles change nothing. O(1).
  [[nodiscard]] expected<void> free(packed_handle h) noexcept {
    auto u = table_.erase(h);
    if (!u) return unexpected(u.error());
    const pool_kind k = kind_[*u];
    --used_[static_cast<int>(k)];
    padding_ -= page_ - logical_bytes(k);
    store_.release(*u);
    return {};
  }

  [[nodiscard]] expected<pool_kind> kind_of(packed_handle h) const noexcept {
    auto u = table_.resolve(h);
    if (!u) return unexpected(u.error());
    return kind_[*u];
  }
  /// The page `h` names. O(1).
  [[nodiscard]] expected<std::uint32_t> unit_of(packed_handle h) const noexcept { return table_.resolve(h); }
  [[nodiscard]] expected<std::byte*> resolve(packed_handle h) const noexcept {
    auto u = table_.resolve(h);
    if (!u) return unexpected(u.error());
    return store_.address(*u);
  }

  /// Shared capacity; used_units counts the pages holding units of `kind`.
  [[nodiscard]] pool_stats stats(pool_kind kind) const noexcept {
    pool_stats s;
    s.unit_bytes = page_;
    s.total_units = static_cast<std::int64_t>(store_.capacity_units());
    s.used_units = used_[static_cast<int>(kind)];
    s.free_units = static_cast<std::int64_t>(store_.free_units());
    s.mapped_chunks = 1;
    s.free_fraction = s.total_units ? static_cast<double>(s.free_units) / static_cast<double>(s.total_units) : 0.0;
    return s;
  }
  [[nodiscard]] byte_count reserved_bytes() const noexcept { return static_cast<byte_count>(arena_->reserved_bytes()); }
  [[nodiscard]] const rebalance_counters& counters() const noexcept { return counters_; }
  /// Bytes of live pages that hold padding, not data.
  [[nodiscard]] byte_count padding_waste_bytes() const noexcept { return padding_; }
  [[nodiscard]] byte_count page_bytes() const noexcept { return page_; }
  [[nodiscard]] const chunk_region& region() const noexcept { return store_.region(); }

 private:
  static padded_unified_pool_config validated(padded_unified_pool_config c) {
    HYBRIDCACHE_EXPECTS(c.kv_page_bytes > 0 && c.ssm_block_bytes > 0 && c.kv_page_bytes % unit_alignment == 0 &&
                            c.ssm_block_bytes % unit_alignment == 0,
                        invalid_argument, "padded_unified_pool: unit sizes must be positive multiples of 128 B");
    HYBRIDCACHE_EXPECTS(c.pool_tag <= 255, invalid_argument, "padded_unified_pool: pool_tag must be <= 255");
    const byte_count page = std::max(c.kv_page_bytes, c.ssm_block_bytes);
    HYBRIDCACHE_EXPECTS(c.capacity_bytes >= page, capacity_error,
                        "padded_unified_pool: capacity of " + std::to_string(c.capacity_bytes) +
                            " B is smaller than one padded page of " + std::to_string(page) + " B");
    return c;
  }
  [[nodiscard]] byte_count logical_bytes(pool_kind k) const noexcept {
    return k == pool_kind::kv ? cfg_.kv_page_bytes : cfg_.ssm_block_bytes;
  }

  padded_unified_pool_config cfg_;
  byte_count page_;
  std::unique_ptr<arena_type> arena_;
  paged_store<pool_kind::kv, Backing> store_;
  unit_handle_table table_;
  std::vector<pool_kind> kind_;
  std::int64_t used_[2] = {0, 0};
  byte_count padding_ = 0;
  rebalance_counters counters_;
};

static_assert(kv_ssm_pool<padded_unified_pool<counting_backing>>);
static_assert(kv_ssm_pool<padded_unified_pool<host_backing>>);

}  // namespace hybridcache::memory
