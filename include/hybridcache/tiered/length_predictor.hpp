// hybridcache/tiered/length_predictor.hpp
//
// Output-length predictors for CaR's deadline prefetch (tiered/prefetch.hpp), models of
// `output_length_predictor` (concepts/output_length_predictor.hpp):
//
//   running_mean_predictor     the mean output length of every request finished so far
//                              (`prior` before the first). One number for every request.
//   bucketed_length_predictor  the same mean kept per prompt-length bucket (powers of two:
//                              bucket b holds prompts of [2^b, 2^(b+1)) tokens), used once the
//                              bucket has `min_samples` observations, the global mean before.
//                              Online, O(1), a fixed 64-slot table.
//
// Why buckets by prompt length: it is the one request feature a queue knows before the
// request runs, and output length depends on it in chat and agent traces (a long prompt is
// often a long document to summarise, or a late turn of a long conversation). CaR predicts
// with a model-based predictor ([40] in the paper); this is a cheap online stand-in that needs
// no model, measured against the running mean in docs/results/tiered.md.
#pragma once

#include <array>
#include <bit>
#include <cstdint>

#include "hybridcache/concepts/output_length_predictor.hpp"
#include "hybridcache/core/error.hpp"

namespace hybridcache::tiered {

/// The running mean of observed output lengths (`prior` until the first observation).
struct running_mean_predictor {
  double prior = 256.0;
  double sum = 0.0;
  std::int64_t count = 0;
  [[nodiscard]] double predict(std::int64_t /*prompt_tokens*/) const noexcept {
    return count > 0 ? sum / static_cast<double>(count) : prior;
  }
  void observe(std::int64_t /*prompt_tokens*/, std::int64_t output_tokens) noexcept {
    sum += static_cast<double>(output_tokens < 0 ? 0 : output_tokens);
    count += 1;
  }
};
static_assert(output_length_predictor<running_mean_predictor>);

/// Options of `bucketed_length_predictor`.
struct bucketed_predictor_options {
  double prior = 256.0;           ///< before any observation (>= 0)
  std::int64_t min_samples = 8;   ///< a bucket's own mean is used from this many observations (>= 1)
};

/// The mean output length per power-of-two prompt-length bucket, falling back to the global
/// mean (then `prior`) while a bucket has fewer than `min_samples` observations.
class bucketed_length_predictor {
 public:
  /// @throws invalid_argument for prior < 0 or min_samples < 1.
  explicit bucketed_length_predictor(bucketed_predictor_options o = {}) : o_(o) {
    HYBRIDCACHE_EXPECTS(o.prior >= 0, invalid_argument, "bucketed_length_predictor: prior must be >= 0");
    HYBRIDCACHE_EXPECTS(o.min_samples >= 1, invalid_argument, "bucketed_length_predictor: min_samples must be >= 1");
  }

  /// Bucket of a prompt of `prompt_tokens` tokens: floor(log2(max(1, tokens))).
  [[nodiscard]] static constexpr std::size_t bucket_of(std::int64_t prompt_tokens) noexcept {
    const auto t = static_cast<std::uint64_t>(prompt_tokens < 1 ? 1 : prompt_tokens);
    return static_cast<std::size_t>(std::bit_width(t) - 1);
  }

  [[nodiscard]] double predict(std::int64_t prompt_tokens) const noexcept {
    const slot& b = buckets_[bucket_of(prompt_tokens)];
    if (b.count >= o_.min_samples) return b.sum / static_cast<double>(b.count);
    return all_.count > 0 ? all_.sum / static_cast<double>(all_.count) : o_.prior;
  }

  void observe(std::int64_t prompt_tokens, std::int64_t output_tokens) noexcept {
    const double out = static_cast<double>(output_tokens < 0 ? 0 : output_tokens);
    slot& b = buckets_[bucket_of(prompt_tokens)];
    b.sum += out;
    b.count += 1;
    all_.sum += out;
    all_.count += 1;
  }

 private:
  struct slot {
    double sum = 0.0;
    std::int64_t count = 0;
  };
  bucketed_predictor_options o_;
  std::array<slot, 64> buckets_{};
  slot all_{};
};
static_assert(output_length_predictor<bucketed_length_predictor>);

}  // namespace hybridcache::tiered
