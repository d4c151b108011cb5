// hybridcache/memory/fixed_dual_pool.hpp
//
// `fixed_dual_pool<Backing>`: the SGLang-style static split (HybridReqToTokenPool +
// MambaPool sized by --mamba-full-memory-ratio), as the AVMP reference builds it:
// ssm_bytes = int(budget x ssm_ratio), kv_bytes = budget - ssm_bytes, each pool one
// contiguous allocation ("cudaMalloc once per pool" on a device backing) of
// floor(bytes / unit) units. Nothing ever moves between the pools: when one is full
// allocation fails while the other may sit empty (anchor avmp.md 1.7; SGLang issues
// #25993, #33004). Ratio 0.9 is SGLang's default, 0.5 the reference's neutral split.
//
// Costs: allocate, free, resolve O(1); allocation-free after construction.
#pragma once

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

/// Construction parameters of a `fixed_dual_pool`.
struct fixed_dual_pool_config {
  byte_count capacity_bytes = 0;   ///< physical memory of both pools together (the budget)
  byte_count kv_page_bytes = 0;
  byte_count ssm_block_bytes = 0;
  double ssm_ratio = 0.9;          ///< share of the capacity given to SSM state (SGLang default)
  std::uint32_t pool_tag = 0;      ///< even tag of the KV table (SSM: tag + 1); 0 = automatic
};

/// Two statically sized pools, no capacity movement.
template <memory_backing Backing = counting_backing>
class fixed_dual_pool {
 public:
  using arena_type = typename Backing::arena;

  /// @throws invalid_argument for bad sizes/ratio/tag; capacity_error if either share of
  ///         the budget is smaller than one unit of its pool.
  explicit fixed_dual_pool(const fixed_dual_pool_config& cfg)
      : cfg_(validated(cfg)),
        tag_(cfg_.pool_tag ? cfg_.pool_tag : detail::next_pool_tag()),
        kv_arena_(std::make_unique<arena_type>(1, share_bytes(pool_kind::kv))),
        ssm_arena_(std::make_unique<arena_type>(1, share_bytes(pool_kind::ssm))),
        kv_(*kv_arena_, cfg_.kv_page_bytes, 1),
        ssm_(*ssm_arena_, cfg_.ssm_block_bytes, 1),
        kv_table_(tag_, kv_.region().units_per_chunk()),
        ssm_table_(tag_ + 1, ssm_.region().units_per_chunk()) {
    kv_.map_chunk(0);
    ssm_.map_chunk(0);
  }

  fixed_dual_pool(const fixed_dual_pool&) = delete;
  fixed_dual_pool& operator=(const fixed_dual_pool&) = delete;

  /// One unit of `kind`, or errc::out_of_capacity. O(1).
  [[nodiscard]] expected<packed_handle> allocate(pool_kind kind) noexcept {
    auto u = kind == pool_kind::kv ? kv_.acquire() : ssm_.acquire();
    if (!u) return unexpected(u.error());
    return table(kind).insert(*u);
  }

  /// `out.size()` units of `kind`, all or nothing. O(n). (`allow_rebalance` is ignored.)
  [[nodiscard]] expected<void> allocate_n(pool_kind kind, std::span<packed_handle> out, bool = true) noexcept {
    if (out.empty()) return unexpected(errc::invalid_argument);
    if (region(kind).free_units() < out.size()) return unexpected(errc::out_of_capacity);
    for (auto& h : out) h = *allocate(kind);
    return {};
  }

  /// Frees `h`; stale, double-freed or foreign handles change nothing. O(1).
  [[nodiscard]] expected<void> free(packed_handle h) noexcept {
    auto k = tag_kind(h);
    if (!k) return unexpected(k.error());
    auto u = table(*k).erase(h);
    if (!u) return unexpected(u.error());
    if (*k == pool_kind::kv) kv_.release(*u);
    else ssm_.release(*u);
    return {};
  }

  [[nodiscard]] expected<pool_kind> kind_of(packed_handle h) const noexcept {
    auto k = tag_kind(h);
    if (!k) return k;
    const errc e = table(*k).validate(h);
    if (e != errc::ok) return unexpected(e);
    return k;
  }

  [[nodiscard]] expected<std::byte*> resolve(packed_handle h) const noexcept {
    auto k = kind_of(h);
    if (!k) return unexpected(k.error());
    const std::uint32_t u = *table(*k).resolve(h);
    return *k == pool_kind::kv ? kv_.address(u) : ssm_.address(u);
  }

  [[nodiscard]] pool_stats stats(pool_kind kind) const noexcept {
    return region_stats(region(kind));
  }
  /// Both pools' allocations.
  [[nodiscard]] byte_count reserved_bytes() const noexcept {
    return static_cast<byte_count>(kv_arena_->reserved_bytes() + ssm_arena_->reserved_bytes());
  }
  [[nodiscard]] const rebalance_counters& counters() const noexcept { return counters_; }
  [[nodiscard]] const chunk_region& region(pool_kind k) const noexcept {
    return k == pool_kind::kv ? kv_.region() : ssm_.region();
  }
  [[nodiscard]] const fixed_dual_pool_config& config() const noexcept { return cfg_; }

 private:
  static fixed_dual_pool_config validated(fixed_dual_pool_config c) {
    HYBRIDCACHE_EXPECTS(c.kv_page_bytes > 0 && c.ssm_block_bytes > 0 && c.kv_page_bytes % unit_alignment == 0 &&
                            c.ssm_block_bytes % unit_alignment == 0,
                        invalid_argument, "fixed_dual_pool: unit sizes must be positive multiples of 128 B");
    HYBRIDCACHE_EXPECTS(c.ssm_ratio > 0 && c.ssm_ratio < 1, invalid_argument,
                        "fixed_dual_pool: ssm_ratio must be in (0, 1), got " + std::to_string(c.ssm_ratio));
    HYBRIDCACHE_EXPECTS(c.pool_tag % 2 == 0 && c.pool_tag <= 254, invalid_argument,
                        "fixed_dual_pool: pool_tag must be even and <= 254");
    const byte_count ssm = ssm_share(c);
    HYBRIDCACHE_EXPECTS(ssm >= c.ssm_block_bytes && c.capacity_bytes - ssm >= c.kv_page_bytes, capacity_error,
                        "fixed_dual_pool: capacity of " + std::to_string(c.capacity_bytes) +
                            " B leaves a pool smaller than one unit (KV " + std::to_string(c.capacity_bytes - ssm) +
                            " B for " + std::to_string(c.kv_page_bytes) + " B pages, SSM " + std::to_string(ssm) +
                            " B for " + std::to_string(c.ssm_block_bytes) + " B blocks)");
    return c;
  }
  // The reference's split: ssm = int(total * ratio), kv = total - ssm; whole units only.
  static byte_count ssm_share(const fixed_dual_pool_config& c) noexcept {
    return static_cast<byte_count>(static_cast<double>(std::max<byte_count>(c.capacity_bytes, 0)) * c.ssm_ratio);
  }
  [[nodiscard]] std::uint64_t share_bytes(pool_kind k) const noexcept {
    const byte_count ssm = ssm_share(cfg_);
    const byte_count bytes = k == pool_kind::kv ? cfg_.capacity_bytes - ssm : ssm;
    const byte_count unit = k == pool_kind::kv ? cfg_.kv_page_bytes : cfg_.ssm_block_bytes;
    return static_cast<std::uint64_t>(bytes / unit * unit);
  }
  [[nodiscard]] expected<pool_kind> tag_kind(packed_handle h) const noexcept {
    if (h.pool_tag() == tag_) return pool_kind::kv;
    if (h.pool_tag() == tag_ + 1) return pool_kind::ssm;
    return unexpected(errc::foreign_handle);
  }
  unit_handle_table& table(pool_kind k) noexcept { return k == pool_kind::kv ? kv_table_ : ssm_table_; }
  const unit_handle_table& table(pool_kind k) const noexcept { return k == pool_kind::kv ? kv_table_ : ssm_table_; }

  fixed_dual_pool_config cfg_;
  std::uint32_t tag_;
  std::unique_ptr<arena_type> kv_arena_;
  std::unique_ptr<arena_type> ssm_arena_;
  kv_pages_store<Backing> kv_;
  ssm_blocks_store<Backing> ssm_;
  unit_handle_table kv_table_;
  unit_handle_table ssm_table_;
  rebalance_counters counters_;
};

static_assert(kv_ssm_pool<fixed_dual_pool<counting_backing>>);
static_assert(kv_ssm_pool<fixed_dual_pool<host_backing>>);

}  // namespace hybridcache::memory
