// hybridcache/tiered/prefetch.hpp
//
// When to start loading a lower-tier hit into HBM.
//
// CaR's deadline rule (papers/003 §III-B2): with N requests running on the GPU, each with
// a timer started at `timer_i`, a predicted output length `len_i` and the current time
// per output token TPOT, the GPU frees up for the next request after
// min_i (TPOT·len_i − (t − timer_i)). Fetch as soon as that is no more than the transfer
// time SIZE / bandwidth, so the data lands just in time — not earlier (it would occupy
// HBM idly) and not later (the request would stall). With nothing running, the GPU is
// idle and the rule fires at once. `fire_time` gives the earliest firing instant in closed
// form for a simulator.
//
// HiCache's threshold rule (anchors/multitier.md §2.3): fetch when the lower-tier hit is
// at least `min_tokens` (256 by default), immediately.
//
// Room (`prefetch_has_room`): whichever rule fires, a prefetch stages its bytes into HBM
// and holds them until its request dispatches, so it starts only where those bytes and the
// request's own reservation fit below the cleaner's high watermark.
//
// Output lengths come from a pluggable predictor (`output_length_predictor`,
// tiered/length_predictor.hpp): the running mean of completed requests, or the mean per
// prompt-length bucket (CaR uses a model-based predictor [40]).
//
// Every function here is O(running requests), allocation-free.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <limits>
#include <span>

#include "hybridcache/concepts/output_length_predictor.hpp"
#include "hybridcache/tiered/length_predictor.hpp"

namespace hybridcache::tiered {

/// The predictor concept and its models live in concepts/output_length_predictor.hpp and
/// tiered/length_predictor.hpp; named here too, where the prefetcher's callers look for them.
using hybridcache::output_length_predictor;

/// A request running on the GPU, as the prefetcher sees it.
struct running_request {
  double timer_ms = 0.0;          ///< timer_i: when its service started
  double predicted_tokens = 0.0;  ///< len_i from the predictor
};

/// Everything a prefetch rule may look at for one candidate transfer.
struct prefetch_context {
  double now_ms = 0.0;
  double tpot_ms = 0.0;                          ///< current time per output token
  std::span<const running_request> running{};   ///< requests on the GPU now
  double bytes = 0.0;                            ///< SIZE: bytes to fetch
  double bandwidth_bytes_per_ms = 0.0;           ///< measured link bandwidth
  /// Fixed time of the fetch beyond its bytes: the source tier's latency per request it
  /// makes (a disk or a remote store; 0 for host memory).
  double latency_ms = 0.0;
  std::int64_t lower_hit_tokens = 0;             ///< tokens the fetch would bring in
};

/// A prefetch rule: fire now or not.
template <class R>
concept prefetch_rule = requires(const R& r, const prefetch_context& c) {
  { r.should_fetch(c) } -> std::same_as<bool>;
};

/// CaR's deadline rule.
struct deadline_prefetch {
  /// min_i (TPOT·len_i − (t − timer_i)); +inf with nothing running.
  [[nodiscard]] static double min_remaining_ms(const prefetch_context& c) noexcept {
    double m = std::numeric_limits<double>::infinity();
    for (const auto& r : c.running) m = std::min(m, c.tpot_ms * r.predicted_tokens - (c.now_ms - r.timer_ms));
    return m;
  }
  /// SIZE / bandwidth (+ the source's latency).
  [[nodiscard]] static double transfer_ms(const prefetch_context& c) noexcept {
    return c.bandwidth_bytes_per_ms > 0 ? c.bytes / c.bandwidth_bytes_per_ms + c.latency_ms
                                        : std::numeric_limits<double>::infinity();
  }
  [[nodiscard]] bool should_fetch(const prefetch_context& c) const noexcept {
    if (c.running.empty()) return true;  // GPU idle: fetch now
    return min_remaining_ms(c) <= transfer_ms(c);
  }
  /// Earliest time >= c.now_ms at which `should_fetch` holds (the timers and predictions
  /// held fixed): min_i (timer_i + TPOT·len_i) − SIZE/bandwidth, clamped to now.
  [[nodiscard]] static double fire_time(const prefetch_context& c) noexcept {
    if (c.running.empty()) return c.now_ms;
    double end = std::numeric_limits<double>::infinity();
    for (const auto& r : c.running) end = std::min(end, r.timer_ms + c.tpot_ms * r.predicted_tokens);
    return std::max(c.now_ms, end - transfer_ms(c));
  }
};
static_assert(prefetch_rule<deadline_prefetch>);

/// HiCache's rule: fetch immediately when the lower-tier hit has at least `min_tokens`.
struct threshold_prefetch {
  std::int64_t min_tokens = 256;
  [[nodiscard]] bool should_fetch(const prefetch_context& c) const noexcept { return c.lower_hit_tokens >= min_tokens; }
};
static_assert(prefetch_rule<threshold_prefetch>);

/// Never prefetch: load on dispatch.
struct no_prefetch {
  [[nodiscard]] bool should_fetch(const prefetch_context&) const noexcept { return false; }
};
static_assert(prefetch_rule<no_prefetch>);

/// True when a prefetch of `load_bytes`, beside the `reservation_bytes` its request will
/// take at dispatch, fits in HBM (`used_bytes` of `capacity_bytes` in use) at or below the
/// cleaner's `high_watermark` (1: the capacity). Above it the staged pages come out of the
/// headroom the cleaner keeps clean: the requests dispatched before the prefetched one then
/// evict dirty entries and wait for their write-backs over the link (on a slow link, longer
/// than the prefetch saves).
[[nodiscard]] constexpr bool prefetch_has_room(std::int64_t used_bytes, std::int64_t load_bytes, std::int64_t reservation_bytes,
                                               std::int64_t capacity_bytes, double high_watermark) noexcept {
  return static_cast<double>(used_bytes + load_bytes + reservation_bytes) <= high_watermark * static_cast<double>(capacity_bytes);
}

}  // namespace hybridcache::tiered
