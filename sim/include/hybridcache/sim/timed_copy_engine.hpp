// hybridcache/sim/timed_copy_engine.hpp
//
// `timed_copy_engine`: the copy engine of the timed replay. It models the time of every
// copy the tiered store submits, so the replay drives the store's real code paths (submit,
// poll, wait, join) and reads when each copy lands, while no byte moves.
//
// Links. Each prefill engine has one link to every tier below HBM (PCIe to host memory, a
// CXL link, the path to a disk, the network to a Redis server), full duplex: copies towards
// HBM (onboard) and away from it (offload) queue separately, each in FIFO order. A copy
// between two lower tiers (a cascade: host -> disk -> redis) queues on the slower tier's
// link (the higher index; offload side). A copy inside HBM (handing staged bytes to a
// request) takes the engine's device queue at `hbm_copy_gbps`. The replay picks the link
// with `use_link` before the calls of a request (its engine), or the least busy one for
// background copies.
//
// Time of a copy between tiers a and b: start = max(now, the queue's free time); it takes
//   bytes / min(link_gbps of a, link_gbps of b)      (HBM's own side is not the bottleneck)
//   + latency_us of a + latency_us of b              (one request to each storage end: a
//                                                     copy is one object put/get; HBM 0)
//   + per_copy_us x the coalesced runs of pages in every layer segment
// (the copy calls a real engine makes: anchors/multitier.md, 5-7 us each). `query` says
// whether it landed by `now`; `wait` returns at once but records that the caller waited
// until it landed (`waited_until`), which the replay reads as a stall.
//
// Costs: submit O(runs x segments); query/wait O(1). Records one entry per copy.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <vector>

#include "hybridcache/concepts/copy_engine.hpp"
#include "hybridcache/core/error.hpp"
#include "hybridcache/core/expected.hpp"
#include "hybridcache/tiered/copy_plan.hpp"
#include "hybridcache/tiered/tier.hpp"

namespace hybridcache::sim {

/// Options of the timed engine. Aggregate with defaults.
struct timed_copy_options {
  std::size_t links = 1;          ///< prefill engines, each with its own links
  double per_copy_us = 6.0;       ///< fixed cost of one copy call (anchors: 5-7 us)
  double hbm_copy_gbps = 1000.0;  ///< copies inside HBM
};

/// Counters of a timed engine.
struct timed_copy_stats {
  std::int64_t onboard_bytes = 0, offload_bytes = 0, hbm_bytes = 0;
  std::int64_t copies = 0;         ///< modelled copy calls (runs x segments)
  double onboard_busy_ms = 0.0, offload_busy_ms = 0.0;
};

class timed_copy_engine {
 public:
  struct event {
    std::uint32_t index = 0;
  };
  /// One modelled copy: when it starts and lands, its bytes and its layer segments.
  struct job {
    double start_ms = 0.0;
    double done_ms = 0.0;
    std::int64_t bytes = 0;
    std::int32_t segments = 1;
    bool onboard = false;
    bool failed = false;
  };

  /// @param tiers  the store's tiers (HBM first), with each lower tier's link bandwidth
  /// @throws invalid_argument for a bad tier list, no link or a non-positive overhead or
  ///         bandwidth.
  timed_copy_engine(std::vector<tiered::tier_config> tiers, std::int64_t page_bytes, timed_copy_options o = {})
      : tiers_(std::move(tiers)), page_(page_bytes), o_(o) {
    tiered::validate_tiers(tiers_, page_);
    HYBRIDCACHE_EXPECTS(o_.links >= 1, invalid_argument, "timed_copy_engine: needs at least one link");
    HYBRIDCACHE_EXPECTS(o_.per_copy_us >= 0 && o_.hbm_copy_gbps > 0, invalid_argument,
                        "timed_copy_engine: per_copy_us must be >= 0 and hbm_copy_gbps > 0");
    queues_.assign(o_.links * tiers_.size(), {0.0, 0.0});
  }

  [[nodiscard]] std::int64_t page_bytes() const noexcept { return page_; }
  [[nodiscard]] std::size_t links() const noexcept { return o_.links; }

  /// The modelled present (ms). Copies submitted from now start no earlier.
  void set_now(double ms) noexcept { now_ = ms; }
  [[nodiscard]] double now() const noexcept { return now_; }
  /// The engine whose links the next copies take.
  void use_link(std::size_t engine) noexcept { link_ = std::min(engine, o_.links - 1); }
  [[nodiscard]] std::size_t link_in_use() const noexcept { return link_; }
  /// The engine whose offload queues free first (for background copies).
  [[nodiscard]] std::size_t least_busy_offload() const noexcept {
    std::size_t best = 0;
    double t = -1.0;
    for (std::size_t e = 0; e < o_.links; ++e) {
      double busy = 0.0;
      for (std::size_t k = 1; k < tiers_.size(); ++k) busy = std::max(busy, queues_[e * tiers_.size() + k][1]);
      if (t < 0 || busy < t) best = e, t = busy;
    }
    return best;
  }
  /// When the onboard queue of `engine`'s link to tier `t` frees.
  [[nodiscard]] double onboard_free_at(std::size_t engine, tier_id t) const {
    return queues_.at(std::min(engine, o_.links - 1) * tiers_.size() + t.value)[0];
  }
  [[nodiscard]] double link_gbps(tier_id t) const { return tiers_.at(t.value).link_gbps; }
  [[nodiscard]] double per_copy_ms() const noexcept { return o_.per_copy_us / 1000.0; }
  /// Fixed time of one request to tier `t` (its `latency_us`), ms; 0 for HBM.
  [[nodiscard]] double latency_ms(tier_id t) const {
    return t.value == 0 ? 0.0 : tiers_.at(t.value).latency_us / 1000.0;
  }
  /// Bandwidth of a copy between two tiers, GB/s: the slower of their links (HBM's side is
  /// not the bottleneck).
  [[nodiscard]] double copy_gbps(tier_id a, tier_id b) const {
    if (a.value == 0) return tiers_.at(b.value).link_gbps;
    if (b.value == 0) return tiers_.at(a.value).link_gbps;
    return std::min(tiers_.at(a.value).link_gbps, tiers_.at(b.value).link_gbps);
  }
  /// Modelled time of copying `bytes` from tier `from` to HBM in one object (no queue, no
  /// per-call overhead), ms: what a reload-or-recompute decision needs.
  [[nodiscard]] double onboard_ms(tier_id from, double bytes) const {
    return bytes / (copy_gbps(from, tier_id{0}) * 1e6) + latency_ms(from);
  }

  /// Fails the copies for which `f(ticket)` returns true (tests).
  void set_fault(std::function<bool(const move_ticket&)> f) { fault_ = std::move(f); }

  /// Books the copy on its link. invalid_argument for an unknown tier.
  [[nodiscard]] expected<event> submit(const move_ticket& t) {
    if (t.src.value >= tiers_.size() || t.dst.value >= tiers_.size()) return unexpected(errc::invalid_argument);
    const std::uint8_t lower = std::max(t.src.value, t.dst.value);
    const bool onboard = t.dst.value < t.src.value;
    const std::int64_t bytes = std::min(t.src_bytes, t.dst_bytes);
    std::int64_t calls = 0;
    for (std::int32_t s = 0; s < std::max(t.segments, 1); ++s)
      calls += static_cast<std::int64_t>(tiered::plan_segment_copies(t, page_, s).size());
    const double gbps = lower == 0 ? o_.hbm_copy_gbps : copy_gbps(t.src, t.dst);
    double& free_at = queues_[link_ * tiers_.size() + lower][onboard || lower == 0 ? 0 : 1];
    job j;
    j.start_ms = std::max(now_, free_at);
    j.done_ms = j.start_ms + static_cast<double>(bytes) / (gbps * 1e6) + latency_ms(t.src) + latency_ms(t.dst) +
                per_copy_ms() * static_cast<double>(calls);
    j.bytes = bytes;
    j.segments = std::max(t.segments, 1);
    j.onboard = onboard;
    j.failed = fault_ && fault_(t);
    free_at = j.done_ms;
    stats_.copies += calls;
    if (lower == 0) {
      stats_.hbm_bytes += bytes;
    } else if (onboard) {
      stats_.onboard_bytes += bytes;
      stats_.onboard_busy_ms += j.done_ms - j.start_ms;
    } else {
      stats_.offload_bytes += bytes;
      stats_.offload_busy_ms += j.done_ms - j.start_ms;
    }
    jobs_.push_back(j);
    return event{static_cast<std::uint32_t>(jobs_.size() - 1)};
  }
  /// True when the copy has landed by `now`.
  [[nodiscard]] bool query(event e) const noexcept { return jobs_[e.index].done_ms <= now_; }
  /// Returns at once; the caller is taken to have waited until the copy landed.
  [[nodiscard]] expected<void> wait(event e) noexcept {
    const job& j = jobs_[e.index];
    waited_until_ = std::max(waited_until_, j.done_ms);
    if (j.failed) return unexpected(errc::busy);
    return {};
  }

  [[nodiscard]] const job& at(event e) const { return jobs_.at(e.index); }
  /// The latest landing time a `wait` since `clear_wait` stood for (0: none).
  [[nodiscard]] double waited_until() const noexcept { return waited_until_; }
  void clear_wait() noexcept { waited_until_ = 0.0; }
  [[nodiscard]] const timed_copy_stats& stats() const noexcept { return stats_; }

 private:
  std::vector<tiered::tier_config> tiers_;
  std::int64_t page_;
  timed_copy_options o_;
  std::vector<std::array<double, 2>> queues_;  // per (link, tier): {onboard, offload} free time
  std::vector<job> jobs_;
  std::function<bool(const move_ticket&)> fault_;
  double now_ = 0.0;
  double waited_until_ = 0.0;
  std::size_t link_ = 0;
  timed_copy_stats stats_;
};

static_assert(paged_copy_engine<timed_copy_engine> && !arena_copy_engine<timed_copy_engine>);

}  // namespace hybridcache::sim
