// hybridcache/tiered/backend_index.hpp
//
// `backend_index<Scorer>`: what a storage backend knows it holds: one row per stored key
// (its meta, stored bytes, recency and score) and the byte count against the tier's
// capacity. Eviction order is a `demotion_scorer` (tiered/demotion_policy.hpp: LRU, CaR's
// score, FLOP-aware) applied to a `cache_entry` view of the row, the same scorers the
// in-memory tiers use, so a disk or Redis tier evicts by the same rule as the tier above it.
//
// Not thread-safe: the owning backend serialises calls with its own mutex.
//
// Costs (n rows): find O(1) expected; insert, erase, touch, set_score, pop_victim O(log n)
// (one hash-map and one ordered-map operation each; a new row allocates its nodes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <unordered_map>
#include <utility>

#include "hybridcache/concepts/demotion.hpp"
#include "hybridcache/concepts/storage_backend.hpp"
#include "hybridcache/core/hash.hpp"

namespace hybridcache::tiered {

/// Hash of a storage key for unordered containers (all fields, through the library's mixer).
struct storage_key_hash {
  [[nodiscard]] std::size_t operator()(const storage_key& k) const noexcept {
    std::uint64_t h = splitmix64_mix(k.model ^ splitmix64_gamma);
    h = splitmix64_mix(h ^ k.prefix);
    h = splitmix64_mix(h ^ static_cast<std::uint64_t>(k.tokens) ^ (static_cast<std::uint64_t>(k.kind) << 56));
    return static_cast<std::size_t>(h);
  }
};

template <demotion_scorer Scorer>
class backend_index {
 public:
  struct row {
    value_meta meta{};
    std::int64_t stored_bytes = 0;  ///< header + payload (what counts against capacity)
    std::uint64_t last_access = 0;
    double score = 0.0;
    std::pair<demotion_key, std::uint64_t> order{};  ///< its place in the eviction order
  };

  backend_index(std::int64_t capacity_bytes, Scorer scorer) : capacity_(capacity_bytes), scorer_(std::move(scorer)) {}

  [[nodiscard]] const row* find(const storage_key& k) const noexcept {
    const auto it = rows_.find(k);
    return it == rows_.end() ? nullptr : &it->second;
  }
  [[nodiscard]] bool contains(const storage_key& k) const noexcept { return rows_.contains(k); }
  [[nodiscard]] std::size_t size() const noexcept { return rows_.size(); }
  [[nodiscard]] std::int64_t used_bytes() const noexcept { return used_; }
  [[nodiscard]] std::int64_t capacity_bytes() const noexcept { return capacity_; }
  void set_capacity(std::int64_t c) noexcept { capacity_ = c; }
  /// Bytes free under the capacity (negative when over).
  [[nodiscard]] std::int64_t free_bytes() const noexcept { return capacity_ - used_; }

  /// Adds `k` (or replaces its row) with `stored_bytes`, most recently used. @throws bad_alloc
  /// with nothing changed.
  void insert(const storage_key& k, const value_meta& meta, std::int64_t stored_bytes) {
    const auto [it, fresh] = rows_.try_emplace(k);
    if (!fresh) {
      used_ -= it->second.stored_bytes;
      order_.erase(it->second.order);
    }
    row& r = it->second;
    r.meta = meta;
    r.stored_bytes = stored_bytes;
    r.last_access = ++clock_;
    if (fresh) r.score = 0.0;
    try {
      reindex(k, r);
    } catch (...) {
      rows_.erase(it);
      throw;
    }
    used_ += stored_bytes;
  }
  /// Removes `k`; the bytes it held, or nullopt when absent.
  std::optional<std::int64_t> erase(const storage_key& k) noexcept {
    const auto it = rows_.find(k);
    if (it == rows_.end()) return std::nullopt;
    const std::int64_t b = it->second.stored_bytes;
    order_.erase(it->second.order);
    rows_.erase(it);
    used_ -= b;
    return b;
  }
  /// Marks `k` used now (LRU recency). No-op when absent.
  void touch(const storage_key& k) noexcept { update(k, [&](row& r) { r.last_access = ++clock_; }); }
  /// Sets `k`'s score (CaR's score, read by car_score_demotion). No-op when absent.
  void set_score(const storage_key& k, double score) noexcept { update(k, [&](row& r) { r.score = score; }); }

  /// The row the scorer evicts first, removed from the index (nullopt when empty).
  std::optional<std::pair<storage_key, row>> pop_victim() noexcept {
    if (order_.empty()) return std::nullopt;
    const storage_key k = order_.begin()->second;
    const auto it = rows_.find(k);
    std::pair<storage_key, row> out{k, it->second};
    (void)erase(k);
    return out;
  }

  /// Visits every row (key, row) in eviction order.
  template <class F>
  void for_each(F&& f) const {
    for (const auto& [order, k] : order_) f(k, rows_.at(k));
  }

 private:
  template <class F>
  void update(const storage_key& k, F&& f) noexcept {
    const auto it = rows_.find(k);
    if (it == rows_.end()) return;
    // Re-keying reuses the ordered map's node (extract + insert), so it cannot fail.
    auto node = order_.extract(it->second.order);
    f(it->second);
    it->second.order = {scorer_key(k, it->second), ++serial_};
    node.key() = it->second.order;
    order_.insert(std::move(node));
  }
  void reindex(const storage_key& k, row& r) {
    r.order = {scorer_key(k, r), ++serial_};
    order_.emplace(r.order, k);
  }
  [[nodiscard]] demotion_key scorer_key(const storage_key& k, const row& r) const {
    cache_entry view;
    view.score = r.score;
    view.last_access = r.last_access;
    view.info = {r.meta.span_begin, k.tokens, k.kind == value_kind::checkpoint};
    return scorer_.key(view);
  }

  std::int64_t capacity_;
  Scorer scorer_;
  std::int64_t used_ = 0;
  std::uint64_t clock_ = 0, serial_ = 0;
  std::unordered_map<storage_key, row, storage_key_hash> rows_;
  std::map<std::pair<demotion_key, std::uint64_t>, storage_key> order_;
};

}  // namespace hybridcache::tiered
