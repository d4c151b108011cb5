// hybridcache/core/prefill_time.hpp
//
// Prefill-time (TTFT) models: how long prefilling L uncached tokens takes. A policy: any
// type with `double prefill_ms(std::int64_t tokens) const` models `prefill_time_model`.
//
// The default reproduces the Marconi reference's TTFT model (plotting/ttft.py,
// anchors/marconi.md 1(g)): an OLS line through the profiled TTFT of Jamba-1.5-Mini on
// 4xA100 (639 points, 50..31,950 tokens), y(x) = 1.781358 + 0.00529644·x in units of
// 10 ms, evaluated at the next profiled length above L (50·floor(L/50) + 50) and capped
// at 31,950 — about 17.8 ms + 0.053 ms per token.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>

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

}  // namespace hybridcache
