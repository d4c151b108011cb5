// hybridcache/sim/metrics.hpp
//
// What a trace replay measures, and how it is summarised.
//
// `metrics_recorder` is fed one `record(input_tokens, skipped_tokens)` per request, in
// arrival order, and `finish()` turns that into a `run_metrics` summary:
//
//   token hit rate    Σ skipped / Σ input tokens            (Marconi's headline metric)
//   request hit rate  share of requests with skipped > 0
//   FLOPs saved       Σ_r prefill_flops(skipped_r) under the cost model. The reference sums
//                     the recurrent term over Σ skipped once; recurrent FLOPs are linear in
//                     L, so the two are equal (anchors/marconi.md 1(g)).
//   modelled TTFT     prefill_ms(input_r − skipped_r) under a `prefill_time_model`
//                     (default: the reference's `marconi_reference_ttft`); P5/P50/P95 and
//                     mean, plus the same P95 with no cache (every token prefilled)
//   by input length   token hit rate per power-of-two input-length bin
//
// Cache-side counters (checkpoints admitted / reused / evicted, KV bytes admitted,
// evictions, chosen alpha) are not visible per request; the replay engine copies them from
// the cache into `run_metrics::cache` after the run.
//
// Percentiles use linear interpolation between closest ranks (numpy's default, which the
// reference's plotting scripts use): rank = q/100 · (n − 1).
//
// Costs: `record` O(1) amortised (one push_back, one O(1) bin update); `finish` O(n log n)
// (it sorts a copy of the per-request TTFTs).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "hybridcache/model/cost_model.hpp"
#include "hybridcache/core/error.hpp"
#include "hybridcache/model/prefill_time.hpp"

namespace hybridcache::sim {

/// The q-th percentile (0 <= q <= 100) of `sorted` (ascending), by linear interpolation
/// between closest ranks (numpy's default): rank = q/100 · (n − 1). NaN when empty.
/// @throws invalid_argument when q is outside [0, 100] or NaN.
[[nodiscard]] inline double percentile_sorted(std::span<const double> sorted, double q) {
  HYBRIDCACHE_EXPECTS(q >= 0.0 && q <= 100.0, invalid_argument, "percentile: q must be in [0, 100]");
  if (sorted.empty()) return std::numeric_limits<double>::quiet_NaN();
  const double rank = q / 100.0 * static_cast<double>(sorted.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(rank));
  const std::size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = rank - static_cast<double>(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

/// The q-th percentile of unsorted `values` (copies and sorts them). O(n log n).
[[nodiscard]] inline double percentile(std::span<const double> values, double q) {
  std::vector<double> v(values.begin(), values.end());
  std::sort(v.begin(), v.end());
  return percentile_sorted(v, q);
}

/// Requests whose input length lies in [lo, hi) tokens, and how much of them hit.
struct length_bin {
  std::int64_t lo = 0;  ///< inclusive lower bound (tokens)
  std::int64_t hi = 0;  ///< exclusive upper bound (tokens); int64 max for the last bin
  std::int64_t requests = 0;
  std::int64_t input_tokens = 0;
  std::int64_t skipped_tokens = 0;

  /// skipped / input tokens of this bin (0 when the bin is empty).
  [[nodiscard]] double token_hit_rate() const noexcept {
    return input_tokens > 0 ? static_cast<double>(skipped_tokens) / static_cast<double>(input_tokens) : 0.0;
  }
};

/// Counters only the cache knows; the replay engine fills them in after a run.
struct cache_stats {
  std::int64_t checkpoints_admitted = 0;  ///< SSM checkpoints stored (leaf + branch points)
  std::int64_t checkpoints_reused = 0;    ///< hits that resumed from a stored checkpoint
  std::int64_t checkpoints_evicted = 0;   ///< SSM checkpoints dropped by eviction
  std::int64_t kv_bytes_admitted = 0;     ///< KV bytes written into the cache
  std::int64_t evictions = 0;             ///< eviction steps (nodes evicted or merged)
  double alpha = std::numeric_limits<double>::quiet_NaN();  ///< FLOP weight in use at the end; NaN if none
  std::int64_t peak_bytes = 0;            ///< largest resident size seen
  std::int64_t refused_commits = 0;       ///< commits the cache refused (state larger than capacity)
};

/// Summary of one replay run.
struct run_metrics {
  std::int64_t requests = 0;
  std::int64_t input_tokens = 0;
  std::int64_t skipped_tokens = 0;
  std::int64_t hit_requests = 0;    ///< requests with skipped > 0
  double token_hit_rate = 0.0;      ///< skipped / input tokens, in [0, 1]
  double request_hit_rate = 0.0;    ///< hit requests / requests, in [0, 1]
  double flops_saved = 0.0;         ///< Σ prefill FLOPs of the skipped prefixes (double: may pass 2^63)
  double ttft_p5_ms = 0.0;
  double ttft_p50_ms = 0.0;
  double ttft_p95_ms = 0.0;
  double ttft_mean_ms = 0.0;
  double ttft_p95_no_cache_ms = 0.0;  ///< P95 TTFT if nothing were cached
  std::vector<length_bin> by_input_length{};
  cache_stats cache{};
  double wall_seconds = 0.0;  ///< time in the replay loop only (set by the engine)
  double cpu_seconds = 0.0;   ///< process CPU time in the loop (all threads; robust to a loaded machine)
  /// Per request, in replay order: skipped tokens (filled only when the engine is asked to
  /// keep them, `replay_options::keep_per_request`).
  std::vector<std::int64_t> skipped_per_request{};
};

/// Lower bounds of the input-length bins: [0,1k), [1k,2k), [2k,4k) ... [64k, ∞).
inline constexpr std::int64_t length_bin_edges[] = {0, 1024, 2048, 4096, 8192, 16384, 32768, 65536};

/// Accumulates per-request outcomes of one replay. Not thread-safe (one per run).
/// @tparam PrefillTime the TTFT model (see core/prefill_time.hpp).
template <prefill_time_model PrefillTime = marconi_reference_ttft>
class metrics_recorder {
 public:
  /// @param costs  the model's cost model, for FLOPs saved (copied).
  /// @param ttft   the prefill-time model.
  /// @param expected_requests  reserves space for that many requests (0: none).
  explicit metrics_recorder(cost_model costs, PrefillTime ttft = {}, std::size_t expected_requests = 0)
      : costs_(std::move(costs)), ttft_(ttft) {
    ttft_ms_.reserve(expected_requests);
    no_cache_ms_.reserve(expected_requests);
    constexpr std::size_t n = std::size(length_bin_edges);
    bins_.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      bins_[i].lo = length_bin_edges[i];
      bins_[i].hi = i + 1 < n ? length_bin_edges[i + 1] : std::numeric_limits<std::int64_t>::max();
    }
  }

  /// Records one request: `input_tokens` long, of which the first `skipped_tokens` were
  /// served from the cache. @throws invalid_argument unless 0 <= skipped <= input.
  void record(std::int64_t input_tokens, std::int64_t skipped_tokens) {
    HYBRIDCACHE_EXPECTS(input_tokens >= 0 && skipped_tokens >= 0 && skipped_tokens <= input_tokens,
                        invalid_argument, "metrics_recorder::record: need 0 <= skipped_tokens <= input_tokens");
    ++requests_;
    input_ += input_tokens;
    skipped_ += skipped_tokens;
    if (skipped_tokens > 0) {
      ++hits_;
      flops_ += static_cast<double>(costs_.hit_flops(skipped_tokens));
    }
    ttft_ms_.push_back(ttft_.prefill_ms(input_tokens - skipped_tokens));
    no_cache_ms_.push_back(ttft_.prefill_ms(input_tokens));
    length_bin& b = bins_[bin_of(input_tokens)];
    ++b.requests;
    b.input_tokens += input_tokens;
    b.skipped_tokens += skipped_tokens;
  }

  /// Requests recorded so far.
  [[nodiscard]] std::int64_t requests() const noexcept { return requests_; }

  /// Per-request modelled TTFT (ms), in record order.
  [[nodiscard]] std::span<const double> ttft_ms() const noexcept { return ttft_ms_; }

  /// The summary (cache counters and wall time left for the engine to fill). O(n log n).
  [[nodiscard]] run_metrics finish() const {
    run_metrics m;
    m.requests = requests_;
    m.input_tokens = input_;
    m.skipped_tokens = skipped_;
    m.hit_requests = hits_;
    m.token_hit_rate = input_ > 0 ? static_cast<double>(skipped_) / static_cast<double>(input_) : 0.0;
    m.request_hit_rate = requests_ > 0 ? static_cast<double>(hits_) / static_cast<double>(requests_) : 0.0;
    m.flops_saved = flops_;
    std::vector<double> t(ttft_ms_);
    std::sort(t.begin(), t.end());
    m.ttft_p5_ms = percentile_sorted(t, 5);
    m.ttft_p50_ms = percentile_sorted(t, 50);
    m.ttft_p95_ms = percentile_sorted(t, 95);
    double sum = 0;
    for (double x : t) sum += x;
    m.ttft_mean_ms = t.empty() ? std::numeric_limits<double>::quiet_NaN() : sum / static_cast<double>(t.size());
    t.assign(no_cache_ms_.begin(), no_cache_ms_.end());
    std::sort(t.begin(), t.end());
    m.ttft_p95_no_cache_ms = percentile_sorted(t, 95);
    m.by_input_length = bins_;
    return m;
  }

 private:
  static std::size_t bin_of(std::int64_t len) noexcept {
    std::size_t i = std::size(length_bin_edges) - 1;
    while (i > 0 && len < length_bin_edges[i]) --i;
    return i;
  }

  cost_model costs_;
  PrefillTime ttft_;
  std::int64_t requests_ = 0, input_ = 0, skipped_ = 0, hits_ = 0;
  double flops_ = 0.0;
  std::vector<double> ttft_ms_, no_cache_ms_;
  std::vector<length_bin> bins_;
};

}  // namespace hybridcache::sim
