// hybridcache/sim/bootstrap.hpp
//
// Percentile-bootstrap confidence interval of a mean, for summaries over a few seeds (the
// allocator sweep's 3 bundled seeds per workload). As the AVMP paper does (section 4.1:
// "resample ... 10,000 times", "pre-registered RNG seed 20260520 makes the CIs byte-stable"):
// draw `resamples` samples of the same size with replacement, take each one's mean, and
// report the (1 - confidence) / 2 and (1 + confidence) / 2 percentiles of those means
// (numpy's default linear interpolation). The paper resamples matched pairs of variants;
// here each summary row is one variant, so the resampled unit is one seed's value.
//
// Deterministic everywhere: std::mt19937_64's output sequence is fixed by the standard, and
// an index is drawn as `engine() % n` (not std::uniform_int_distribution, whose algorithm
// differs between standard libraries; the modulo bias is below n / 2^64).
// With few values the interval is coarse: 3 seeds have 10 distinct resamples, so the bounds
// are means of seed multisets (e.g. [min, max] when every resample mean is possible at the
// tails). Cost: O(resamples x n) time, O(resamples) memory.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "hybridcache/core/error.hpp"

namespace hybridcache::sim {

/// Settings of `bootstrap_mean_ci` (defaults: 1,000 resamples, 95 %, the paper's seed).
struct bootstrap_config {
  std::uint32_t resamples = 1000;
  double confidence = 0.95;
  std::uint64_t rng_seed = 20260520;
};

/// A mean with its bootstrap interval: low <= mean <= high for any input.
struct mean_interval {
  double mean = 0;
  double low = 0;
  double high = 0;
};

/// The mean of `values` and its percentile-bootstrap interval. An empty span gives zeros; a
/// single value (or equal values) gives [v, v].
/// @throws invalid_argument for 0 resamples or a confidence outside (0, 1).
[[nodiscard]] inline mean_interval bootstrap_mean_ci(std::span<const double> values, const bootstrap_config& cfg = {}) {
  HYBRIDCACHE_EXPECTS(cfg.resamples > 0, invalid_argument, "bootstrap: resamples must be > 0");
  HYBRIDCACHE_EXPECTS(cfg.confidence > 0 && cfg.confidence < 1, invalid_argument,
                      "bootstrap: confidence must be in (0, 1)");
  mean_interval out;
  if (values.empty()) return out;
  const std::size_t n = values.size();
  double sum = 0;
  for (double v : values) sum += v;
  out.mean = sum / static_cast<double>(n);

  std::mt19937_64 engine(cfg.rng_seed);
  std::vector<double> means(cfg.resamples);
  for (double& m : means) {
    double s = 0;
    for (std::size_t i = 0; i < n; ++i) s += values[static_cast<std::size_t>(engine() % n)];
    m = s / static_cast<double>(n);
  }
  std::sort(means.begin(), means.end());
  auto percentile = [&](double q) {  // numpy.percentile's linear interpolation, q in [0, 1]
    const double pos = q * static_cast<double>(means.size() - 1);
    const auto lo = static_cast<std::size_t>(pos);
    const std::size_t hi = std::min(lo + 1, means.size() - 1);
    return means[lo] + (pos - static_cast<double>(lo)) * (means[hi] - means[lo]);
  };
  const double tail = (1 - cfg.confidence) / 2;
  // The sample mean is inside by construction for symmetric data; clamp so it always is
  // (a skewed handful of seeds can put every resample mean on one side at the bounds' ranks).
  out.low = std::min(percentile(tail), out.mean);
  out.high = std::max(percentile(1 - tail), out.mean);
  return out;
}

}  // namespace hybridcache::sim
