// hybridcache/tiered/scheduler.hpp
//
// CaR's cache-aware request queue (papers/003 §III-B1) and the scheduling dry run.
//
// Priority groups, best first:
//   reuse_in_hbm      the request reuses KV already in HBM
//   no_history        nothing cached anywhere: no transfer needed, compute only
//   reuse_from_lower  reuse only from a slower tier: a transfer must happen first
// (CaR puts partial lower-tier reuse below no history on purpose: it leaves the link time
// to fetch while cache-less requests compute.)
//
// A plain priority queue starves the last group and reorders constantly, which confuses a
// prefetcher. So the head of the queue is a fixed-size *shuffled window*: when it empties,
// the next `window` requests (by group, then arrival) enter it together and are shuffled
// with a seeded generator (deterministic); requests leave the window only by dispatch. A
// request therefore waits at most `window` dispatches once in the window, and the
// prefetcher sees a stable set. The backlog has an anti-starvation rule too: when the
// oldest waiting request has been overtaken by `max_bypass` admissions of younger requests,
// it is admitted next regardless of group. Together: nothing starves, and a deep backlog
// still follows the groups (counting admissions of older requests as overtakes would turn
// any backlog deeper than `max_bypass` into FCFS).
//
// `dry_run` answers "would this request fit in HBM now / after evictions / never?"
// without changing any cache state (TensorRT-LLM's scheduling dry run).
//
// Costs: push O(log n), pop amortized O(log n + window), regroup O(log n). Allocation
// only when the backlog or window grows.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "hybridcache/core/error.hpp"
#include "hybridcache/tiered/tiered_store.hpp"

namespace hybridcache::tiered {

/// CaR's three priority groups (smaller is served first).
enum class request_group : std::uint8_t { reuse_in_hbm = 0, no_history = 1, reuse_from_lower = 2 };

/// Group of a request from its hits: any HBM hit -> reuse_in_hbm; no hit at all ->
/// no_history; hits only below HBM -> reuse_from_lower.
[[nodiscard]] constexpr request_group classify(std::int64_t hbm_hit_tokens, std::int64_t lower_hit_tokens) noexcept {
  if (hbm_hit_tokens > 0) return request_group::reuse_in_hbm;
  return lower_hit_tokens > 0 ? request_group::reuse_from_lower : request_group::no_history;
}

/// Options of the CaR queue. Aggregate with defaults.
struct car_queue_options {
  std::size_t window = 8;          ///< shuffled-window size (> 0)
  std::uint64_t seed = 0x5eedcafe; ///< shuffle seed: same inputs, same order
  std::size_t max_bypass = 64;     ///< admissions that may overtake the oldest request (> 0)
};

/// CaR's cache-aware request queue: priority groups + a shuffled window at the head.
class car_request_queue {
 public:
  using request_id = std::uint64_t;

  /// @throws invalid_argument for window == 0 or max_bypass == 0.
  explicit car_request_queue(car_queue_options options = {}) : opt_(options), rng_(options.seed) {
    HYBRIDCACHE_EXPECTS(opt_.window > 0, invalid_argument, "car_request_queue: window must be > 0");
    HYBRIDCACHE_EXPECTS(opt_.max_bypass > 0, invalid_argument, "car_request_queue: max_bypass must be > 0");
  }

  /// Enqueues a request. `invalid_argument` if the id is already queued.
  [[nodiscard]] expected<void> push(request_id id, request_group group) {
    if (where_.count(id)) return unexpected(errc::invalid_argument);
    const std::uint64_t seq = ++arrivals_;
    by_priority_.insert({group, seq});
    // Every request older than this one still in the backlog is admitted before this one
    // becomes the oldest; those admissions do not overtake it.
    by_arrival_.emplace(seq, backlog_item{id, group, admitted_ + by_arrival_.size()});
    where_[id] = seq;
    return {};
  }

  /// Changes the group of a request still in the backlog (its cache state changed, e.g. a
  /// prefetch completed). Requests in the window keep their place. `not_found` otherwise.
  [[nodiscard]] expected<void> regroup(request_id id, request_group group) {
    const auto w = where_.find(id);
    if (w == where_.end() || w->second == 0) return unexpected(errc::not_found);
    auto& item = by_arrival_.at(w->second);
    by_priority_.erase({item.group, w->second});
    item.group = group;
    by_priority_.insert({group, w->second});
    return {};
  }

  /// Refills the window if it is empty; returns the ids that entered it now (the caller
  /// applies `car_score::enter_window` to their nodes and may start prefetching).
  std::span<const request_id> refill() {
    entered_.clear();
    if (head_ < window_.size()) return {};
    window_.clear();
    head_ = 0;
    while (window_.size() < opt_.window && !by_arrival_.empty()) {
      auto oldest = by_arrival_.begin();
      std::uint64_t seq;
      const std::uint64_t not_overtaking = oldest->second.admissions_not_overtaking;
      if (admitted_ >= not_overtaking && admitted_ - not_overtaking >= opt_.max_bypass) {
        seq = oldest->first;  // overtaken too often: admit it now
      } else {
        seq = by_priority_.begin()->second;
      }
      auto it = by_arrival_.find(seq);
      by_priority_.erase({it->second.group, seq});
      window_.push_back(it->second.id);
      where_[it->second.id] = 0;  // 0 = in the window
      by_arrival_.erase(it);
      ++admitted_;
    }
    std::shuffle(window_.begin(), window_.end(), rng_);
    entered_.assign(window_.begin(), window_.end());
    return entered_;
  }

  /// Dispatches the next request: the window's head (refilling an empty window first).
  [[nodiscard]] std::optional<request_id> pop() {
    if (head_ >= window_.size()) (void)refill();
    if (head_ >= window_.size()) return std::nullopt;
    const request_id id = window_[head_++];
    where_.erase(id);
    return id;
  }

  /// The requests in the window not yet dispatched, in dispatch order.
  [[nodiscard]] std::span<const request_id> window() const noexcept {
    return std::span<const request_id>(window_).subspan(head_);
  }

  [[nodiscard]] std::size_t size() const noexcept { return where_.size(); }
  [[nodiscard]] bool empty() const noexcept { return where_.empty(); }

 private:
  struct backlog_item {
    request_id id;
    request_group group;
    std::uint64_t admissions_not_overtaking;  // admitted_ at push + older requests then waiting
  };
  car_queue_options opt_;
  std::mt19937_64 rng_;
  std::set<std::pair<request_group, std::uint64_t>> by_priority_;
  std::map<std::uint64_t, backlog_item> by_arrival_;
  std::map<request_id, std::uint64_t> where_;  // id -> arrival seq, 0 when in the window
  std::vector<request_id> window_, entered_;
  std::size_t head_ = 0;
  std::uint64_t arrivals_ = 0, admitted_ = 0;
};

/// Outcome of a scheduling dry run.
enum class fit_result : std::uint8_t {
  fits_now,             ///< free HBM pages suffice
  fits_after_eviction,  ///< fits once evictable entries leave HBM
  does_not_fit_now,     ///< pinned/moving entries hold too much: retry later
  never_fits,           ///< larger than HBM even with everything evicted
};

/// What a request needs in HBM: `new_bytes` it will compute, plus every hit outside HBM
/// (promoted). Hits already in HBM are pinned by the request, so they are not counted as
/// evictable. Changes nothing. O(hits · log n). @throws invalid_argument for new_bytes < 0.
template <class Store>
[[nodiscard]] fit_result dry_run(const Store& store, std::int64_t new_bytes, std::span<const entry_id> hits) {
  HYBRIDCACHE_EXPECTS(new_bytes >= 0, invalid_argument, "dry_run: new_bytes must be >= 0");
  std::int64_t need_pages = store.pages_for(new_bytes), own_evictable_pages = 0;
  for (const entry_id id : hits) {
    const auto row = store.find(id);
    if (!row) continue;
    const tier_copy* in_hbm = row->in(hbm_tier);  // valid, or arriving (reserved in HBM already)
    if (in_hbm == nullptr) need_pages += store.pages_for(row->bytes());
    else if (in_hbm->idle()) own_evictable_pages += in_hbm->pages.size();
  }
  const auto u = store.usage(hbm_tier);
  const std::int64_t pb = store.page_bytes();
  const std::int64_t free_pages = (u.capacity_bytes - u.used_bytes) / pb;
  const std::int64_t evictable_pages = u.evictable_bytes / pb - own_evictable_pages;
  if (need_pages <= free_pages) return fit_result::fits_now;
  if (need_pages <= free_pages + evictable_pages) return fit_result::fits_after_eviction;
  // Upper bound on what HBM can ever give this request: everything but its own HBM hits.
  std::int64_t own_hbm_pages = 0;
  for (const entry_id id : hits)
    if (const auto row = store.find(id); row && row->valid_in_gpu()) own_hbm_pages += row->in(hbm_tier)->pages.size();
  if (need_pages > u.capacity_bytes / pb - own_hbm_pages) return fit_result::never_fits;
  return fit_result::does_not_fit_now;
}

/// Throwing form for admission: capacity_error when the request can never fit.
template <class Store>
void require_fits(const Store& store, std::int64_t new_bytes, std::span<const entry_id> hits) {
  if (dry_run(store, new_bytes, hits) == fit_result::never_fits)
    throw capacity_error("request needs more HBM than the tier holds even with everything evicted (" +
                         std::to_string(new_bytes) + " new bytes, capacity " +
                         std::to_string(store.usage(hbm_tier).capacity_bytes) + ")");
}

}  // namespace hybridcache::tiered
