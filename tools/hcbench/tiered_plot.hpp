// tools/hcbench/tiered_plot.hpp
//
// The figure `hcbench replay --tiers` writes (--plot, or next to --per-request's CSV): two
// panels drawn by sim/svg_chart.hpp (its round ticks, palette and legend):
//   - TTFT distribution: the share of requests whose modelled TTFT is at or below x, single
//     tier (HBM only) against the tiers, on a log axis;
//   - hits per tier: each tier's hit tokens summed over the requests in dispatch order, so the
//     end of each line is the tier's total and its slope where in the trace the tier served.
// Both need the runs' per-request rows (tiered_replay_options::keep_per_request).
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include <hybridcache/sim/svg_chart.hpp>
#include <hybridcache/sim/tiered_replay_options.hpp>

namespace hcbench {

namespace detail {
/// At most this many points per line: a CDF of 20,000 requests needs no 20,000 vertices.
inline constexpr std::size_t max_plot_points = 400;

inline hybridcache::sim::chart_series ttft_cdf(const std::string& name, const hybridcache::sim::tiered_replay_result& r) {
  std::vector<double> ttft;
  ttft.reserve(r.per_request.size());
  for (const auto& row : r.per_request) ttft.push_back(row.ttft_ms);
  std::sort(ttft.begin(), ttft.end());
  hybridcache::sim::chart_series s{.name = name};
  const std::size_t n = ttft.size(), stride = std::max<std::size_t>(1, n / max_plot_points);
  for (std::size_t i = 0; i < n; i += stride)
    s.points.emplace_back(ttft[i], static_cast<double>(i + 1) / static_cast<double>(n));
  if (n > 0 && (n - 1) % stride != 0) s.points.emplace_back(ttft.back(), 1.0);
  return s;
}

/// Tier `tier`'s hit tokens summed over the rows (each hit split by the tier each entry was read from).
inline hybridcache::sim::chart_series cumulative_hits(const std::string& name, const hybridcache::sim::tiered_replay_result& r,
                                                      std::size_t tier) {
  hybridcache::sim::chart_series s{.name = name};
  const std::size_t n = r.per_request.size(), stride = std::max<std::size_t>(1, n / max_plot_points);
  double sum = 0;
  s.points.emplace_back(0.0, 0.0);
  for (std::size_t i = 0; i < n; ++i) {
    const auto& row = r.per_request[i];
    sum += static_cast<double>(tier < row.hit_tokens_by_tier.size() ? row.hit_tokens_by_tier[tier] : 0);
    if ((i + 1) % stride == 0 || i + 1 == n) s.points.emplace_back(static_cast<double>(i + 1), sum);
  }
  return s;
}
}  // namespace detail

/// The SVG of a --tiers run: `single` is the HBM-only baseline, `multi` the tiered run, `tiers`
/// the tier names (HBM first) as the table prints them.
[[nodiscard]] inline std::string tiered_svg(const hybridcache::sim::tiered_replay_result& single,
                                            const hybridcache::sim::tiered_replay_result& multi,
                                            const std::vector<std::string>& tiers, const std::string& title) {
  using namespace hybridcache::sim;
  chart_panel cdf{.title = "TTFT distribution (modelled)", .x_label = "TTFT", .y_label = "requests at or below",
                  .x_format = axis_format::ms, .y_format = axis_format::percent, .log_x = true, .series = {}};
  cdf.series.push_back(detail::ttft_cdf("single tier (hbm)", single));
  cdf.series.push_back(detail::ttft_cdf("tiers", multi));
  chart_panel hits{.title = "token hits per tier", .x_label = "requests (dispatch order)", .y_label = "hit tokens, summed",
                   .x_format = axis_format::number, .y_format = axis_format::number, .log_x = false, .series = {}};
  hits.series.push_back(detail::cumulative_hits("single tier: hbm", single, 0));
  for (std::size_t t = 0; t < tiers.size(); ++t) hits.series.push_back(detail::cumulative_hits("tiers: " + tiers[t], multi, t));
  hits.series[0].dash = "6,4";  // the baseline dashed, as the CDF's colours do not carry over
  return to_svg(std::vector<chart_panel>{cdf, hits}, title, chart_style{});
}

}  // namespace hcbench
