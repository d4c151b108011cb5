// hybridcache/model/prefill_time.hpp
//
// Prefill-time (TTFT) models: how long prefilling L uncached tokens takes. A policy: any
// type with `double prefill_ms(std::int64_t tokens) const` models `prefill_time_model`.
//
// The default reproduces the Marconi reference's TTFT model (plotting/ttft.py,
// anchors/marconi.md 1(g)): an OLS line through the profiled TTFT of Jamba-1.5-Mini on
// 4xA100 (639 points, 50..31,950 tokens), y(x) = 1.781358 + 0.00529644·x in units of
// 10 ms, evaluated at the next profiled length above L (50·floor(L/50) + 50) and capped
// at 31,950 — about 17.8 ms + 0.053 ms per token.
//
// `flop_prefill_time` derives prefill time from the cost model instead: a fixed overhead
// plus the FLOPs of the new tokens (cost_model::saved_flops: attention over the cached
// prefix included) over an effective throughput. Its default throughput is the one that
// makes Jamba-1.5-Mini's FLOPs fit that same 4xA100 line, so other models get the time the
// same hardware would take for their FLOPs. It is prefix-aware: `prefill_ms(prefix, n)`.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <utility>

#include "hybridcache/model/cost_model.hpp"
#include "hybridcache/core/error.hpp"

namespace hybridcache {

/// Anything that predicts prefill time in milliseconds from a token count.
template <class T>
concept prefill_time_model = requires(const T& t, std::int64_t tokens) {
  { t.prefill_ms(tokens) } -> std::convertible_to<double>;
};

/// A straight line: intercept + slope · tokens (ms). Zero tokens cost nothing.
struct linear_prefill_time {
  double intercept_ms = 17.81358;
  double per_token_ms = 0.0529644;
  [[nodiscard]] constexpr double prefill_ms(std::int64_t tokens) const noexcept {
    return tokens <= 0 ? 0.0 : intercept_ms + per_token_ms * static_cast<double>(tokens);
  }
};
static_assert(prefill_time_model<linear_prefill_time>);

/// The Marconi reference's model, bit for bit: 10·y(min(50·floor(L/50) + 50, 31950)).
/// Note that L = 0 still costs the intercept (the reference charges a full-hit request
/// the TTFT of a 50-token prefill).
struct marconi_reference_ttft {
  double intercept = 1.781358;
  double slope = 0.00529644;
  [[nodiscard]] constexpr double prefill_ms(std::int64_t tokens) const noexcept {
    const std::int64_t x = std::min<std::int64_t>(50 * (std::max<std::int64_t>(tokens, 0) / 50) + 50, 31950);
    return 10.0 * (intercept + slope * static_cast<double>(x));
  }
};
static_assert(prefill_time_model<marconi_reference_ttft>);

/// A prefill-time model that also knows what a cached prefix costs the new tokens:
/// `prefill_ms(prefix, tokens)` for `tokens` new tokens after `prefix` cached ones.
template <class T>
concept prefix_aware_prefill_time_model =
    prefill_time_model<T> && requires(const T& t, std::int64_t prefix, std::int64_t tokens) {
      { t.prefill_ms(prefix, tokens) } -> std::convertible_to<double>;
    };

/// Prefill time of `tokens` new tokens after `prefix` cached ones, for any model (a model
/// that is not prefix-aware ignores the prefix).
template <prefill_time_model T>
[[nodiscard]] double prefill_ms_after(const T& t, std::int64_t prefix, std::int64_t tokens) {
  if constexpr (prefix_aware_prefill_time_model<T>)
    return static_cast<double>(t.prefill_ms(prefix, tokens));
  else
    return static_cast<double>(t.prefill_ms(tokens));
}

/// Prefill time from the cost model: intercept + saved_flops(prefix, prefix + tokens) /
/// throughput. Zero new tokens cost nothing. O(1), allocation-free after construction.
class flop_prefill_time {
 public:
  /// Least-squares fit of Jamba-1.5-Mini's prefill FLOPs (cost_model, Marconi's formulas)
  /// to the 4xA100 TTFT line above over its profiled lengths 50..31,950: 309.19 TFLOP/s
  /// effective (about 25 % of the four GPUs' dense bf16 peak). Within 10 % of the line there.
  static constexpr double jamba_4xa100_tflops = 309.1917;

  /// @throws invalid_argument if `effective_tflops` <= 0 or `intercept_ms` < 0.
  explicit flop_prefill_time(cost_model model, double effective_tflops = jamba_4xa100_tflops,
                             double intercept_ms = linear_prefill_time{}.intercept_ms)
      : model_(std::move(model)), flops_per_ms_(effective_tflops * 1e9), intercept_ms_(intercept_ms) {
    HYBRIDCACHE_EXPECTS(effective_tflops > 0, invalid_argument, "flop_prefill_time: effective_tflops must be > 0");
    HYBRIDCACHE_EXPECTS(intercept_ms >= 0, invalid_argument, "flop_prefill_time: intercept_ms must be >= 0");
  }
  /// `tokens` tokens with nothing cached.
  [[nodiscard]] double prefill_ms(std::int64_t tokens) const { return prefill_ms(0, tokens); }
  /// `tokens` new tokens after `prefix` cached ones (attention attends over the prefix).
  [[nodiscard]] double prefill_ms(std::int64_t prefix, std::int64_t tokens) const {
    if (tokens <= 0) return 0.0;
    const std::int64_t p = std::max<std::int64_t>(prefix, 0);
    return intercept_ms_ + static_cast<double>(model_.saved_flops(p, p + tokens)) / flops_per_ms_;
  }
  [[nodiscard]] const cost_model& model() const noexcept { return model_; }

 private:
  cost_model model_;
  double flops_per_ms_;
  double intercept_ms_;
};
static_assert(prefix_aware_prefill_time_model<flop_prefill_time>);
static_assert(!prefix_aware_prefill_time_model<linear_prefill_time>);

}  // namespace hybridcache
