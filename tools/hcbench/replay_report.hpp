// How hcbench prints replay results: one JSON object (the `replay --json` contract), an
// aligned text table, CSV rows, and the hit-rate / P95-TTFT vs capacity SVG.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <hybridcache/sim/svg_chart.hpp>

#include "cli_support.hpp"
#include "output_fields.hpp"
#include "replay_args.hpp"
#include "replay_run.hpp"

namespace hcbench {

namespace detail {
inline std::string json_string(const std::string& s) { return json::string(s); }
inline std::string json_number(double v) { return json::number(v); }
}  // namespace detail

/// One JSON object with the keys of the CLI contract (and a few more). Stable key names.
[[nodiscard]] inline std::string to_json(const replay_result& r) {
  using detail::json_number;
  using detail::json_string;
  const auto& m = r.metrics;
  auto i = [](std::int64_t v) { return std::to_string(v); };
  std::string o = "{";
  auto kv = [&](const char* k, const std::string& v) {
    if (o.size() > 1) o += ", ";
    o += json_string(k) + ": " + v;
  };
  kv("policy", json_string(r.policy));
  kv("trace", json_string(r.trace));
  kv("model", json_string(r.model));
  kv("capacity_bytes", i(r.capacity_bytes));
  kv("requests", i(m.requests));
  kv("input_tokens", i(m.input_tokens));
  kv("skipped_tokens", i(m.skipped_tokens));
  kv("hit_requests", i(m.hit_requests));
  kv("token_hit_rate", json_number(m.token_hit_rate));
  kv("request_hit_rate", json_number(m.request_hit_rate));
  kv("flops_saved", json_number(m.flops_saved));
  kv("ttft_p5_ms", json_number(m.ttft_p5_ms));
  kv("ttft_p50_ms", json_number(m.ttft_p50_ms));
  kv("ttft_p95_ms", json_number(m.ttft_p95_ms));
  kv("ttft_mean_ms", json_number(m.ttft_mean_ms));
  kv("ttft_p95_no_cache_ms", json_number(m.ttft_p95_no_cache_ms));
  kv("checkpoints_admitted", i(m.cache.checkpoints_admitted));
  kv("checkpoints_reused", i(m.cache.checkpoints_reused));
  kv("checkpoints_evicted", i(m.cache.checkpoints_evicted));
  kv("kv_bytes_admitted", i(m.cache.kv_bytes_admitted));
  kv("evictions", i(m.cache.evictions));
  kv("peak_bytes", i(m.cache.peak_bytes));
  kv("refused_commits", i(m.cache.refused_commits));
  kv("alpha", json_number(m.cache.alpha));
  kv("tokenizer", r.tokenizer.empty() ? std::string("null") : json_string(r.tokenizer));
  kv("drive", json_string(r.drive));
  std::string bins = "[";
  for (const auto& b : m.by_input_length) {
    if (bins.size() > 1) bins += ", ";
    bins += "{\"min_tokens\": " + i(b.lo) + ", \"max_tokens\": " +
            (b.hi == std::numeric_limits<std::int64_t>::max() ? std::string("null") : i(b.hi)) +
            ", \"requests\": " + i(b.requests) + ", \"input_tokens\": " + i(b.input_tokens) +
            ", \"skipped_tokens\": " + i(b.skipped_tokens) + ", \"token_hit_rate\": " + json_number(b.token_hit_rate()) + "}";
  }
  kv("hit_rate_by_input_length", bins + "]");
  kv("capacity_exceeded", m.cache.peak_bytes > r.capacity_bytes ? "true" : "false");
  kv("wall_seconds", json_number(m.wall_seconds));
  kv("cpu_seconds", json_number(m.cpu_seconds));
  if (!r.tuner.empty()) kv("tuner", json_string(r.tuner));
  if (r.selector) {  // the adaptive selector's decisions and overhead (--alpha auto, --tuner shadow)
    const auto& s = *r.selector;
    kv("selector_shadows", i(static_cast<std::int64_t>(s.shadows)));
    kv("selector_switches", i(s.switches));
    kv("selector_followed", json_string(r.selector_followed));
    kv("selector_shadow_seconds", json_number(s.shadow_seconds));
    kv("selector_shadow_fraction", json_number(m.wall_seconds > 0 ? s.shadow_seconds / m.wall_seconds : 0.0));
    kv("selector_shadow_nodes", i(s.shadow_nodes));
    kv("selector_shadow_tokens", i(s.shadow_tokens));
    kv("selector_shadow_bytes", i(s.shadow_bytes));
    kv("selector_sample_rate", json_number(s.sample_rate));
    kv("selector_sampled_requests", i(s.sampled_requests));
    kv("selector_sampling_since", i(s.sampling_since));
    kv("selector_guard_reverts", i(s.guard_reverts));
    kv("selector_guard_calibration", json_number(s.guard_calibration));
    kv("selector_guard", json_string(to_string(s.guard)));
    kv("selector_guard_suspended_at", i(s.guard_suspended_at));
    std::string list = "[";
    for (const auto& [name, flops] : r.selector_candidates)
      list += (list.size() > 1 ? ", " : "") + std::string("{\"candidate\": ") + json_string(name) +
              ", \"shadow_flops_saved\": " + json_number(flops) + "}";
    kv("selector_candidates", list + "]");
  }
  json::object meta;
  meta.provenance();
  const std::string p = meta.text();  // {"command": ..., "version": ..., "date": ...}
  return o + ", " + p.substr(1, p.size() - 2) + "}";
}

/// One line on what the adaptive selector did and cost ("" without one).
[[nodiscard]] inline std::string selector_summary(const replay_result& r) {
  if (!r.selector) return "";
  const auto& s = *r.selector;
  char b[512];
  std::snprintf(b, sizeof b,
                "selector: %zu shadows, %lld switches, following %s at the end; shadows took %.4f s (%.0f%% of the "
                "replay's %.4f s) and hold %lld nodes, %lld token ids (~%s)\n",
                s.shadows, static_cast<long long>(s.switches), r.selector_followed.c_str(), s.shadow_seconds,
                r.metrics.wall_seconds > 0 ? 100.0 * s.shadow_seconds / r.metrics.wall_seconds : 0.0,
                r.metrics.wall_seconds, static_cast<long long>(s.shadow_nodes), static_cast<long long>(s.shadow_tokens),
                format_bytes(s.shadow_bytes).c_str());
  std::string line = b;
  using hybridcache::compose::guard_state;
  if (s.guard == guard_state::overlap || s.guard == guard_state::mismatch)  // say why, or it looks on
    line += "selector: the baseline guard stood down at request " + std::to_string(s.guard_suspended_at) +
            (s.guard == guard_state::overlap ? " (requests in flight together: the live hits no longer compare with the shadows')\n"
                                             : " (the baseline shadow found another hit than the live cache on the same rule)\n");
  return line;
}

/// CSV header matching csv_row() (output_fields.hpp).
inline const char* csv_header() { return fields::compare_csv; }

[[nodiscard]] inline std::string csv_row(const replay_result& r) {
  const auto& m = r.metrics;
  auto n = [](double v) { return std::isfinite(v) ? detail::json_number(v) : std::string(); };
  auto i = [](std::int64_t v) { return std::to_string(v); };
  return csv_field(r.trace) + "," + csv_field(r.model) + "," + csv_field(r.policy) + "," + i(r.capacity_bytes) + "," + i(m.requests) + "," +
         i(m.input_tokens) + "," + i(m.skipped_tokens) + "," + n(m.token_hit_rate) + "," + n(m.request_hit_rate) + "," +
         n(m.flops_saved) + "," + n(m.ttft_p5_ms) + "," + n(m.ttft_p50_ms) + "," + n(m.ttft_p95_ms) + "," +
         n(m.ttft_p95_no_cache_ms) + "," + i(m.cache.checkpoints_admitted) + "," + i(m.cache.checkpoints_reused) + "," +
         i(m.cache.checkpoints_evicted) + "," + i(m.cache.kv_bytes_admitted) + "," + i(m.cache.evictions) + "," +
         n(m.cache.alpha) + "," + n(m.wall_seconds) + "," + n(m.cpu_seconds) + "," + csv_field(r.selector_followed);
}

/// Rows (the first the header) as hcbench prints every table: columns two spaces apart, the
/// first `text_columns` left-aligned, the rest (numbers) right-aligned, a rule under the header.
[[nodiscard]] inline std::string aligned_table(const std::vector<std::vector<std::string>>& rows,
                                               std::size_t text_columns) {
  std::vector<std::size_t> w(rows.empty() ? 0 : rows[0].size(), 0);
  for (const auto& row : rows)
    for (std::size_t c = 0; c < row.size() && c < w.size(); ++c) w[c] = std::max(w[c], row[c].size());
  std::string out;
  for (std::size_t k = 0; k < rows.size(); ++k) {
    for (std::size_t c = 0; c < rows[k].size() && c < w.size(); ++c) {
      const std::string& cell = rows[k][c];
      const std::string pad(w[c] - cell.size(), ' ');
      out += c < text_columns ? cell + pad : pad + cell;
      out += c + 1 < rows[k].size() ? "  " : "\n";
    }
    if (k == 0) {
      std::size_t total = 0;
      for (auto x : w) total += x + 2;
      out += std::string(total - 2, '-') + "\n";
    }
  }
  return out;
}

/// An aligned text table, one row per result (in the given order).
[[nodiscard]] inline std::string format_table(const std::vector<replay_result>& results) {
  std::vector<std::vector<std::string>> rows;
  // Units in the header, bare numbers in the cells; sizes carry their unit (docs/replay.md,
  // "Output conventions"); alpha `-`: no alpha followed; followed: the selector's candidate at
  // the end in --candidates syntax (gdsf, marconi:0.5), `-` without a selector.
  rows.push_back({"trace", "policy", "capacity", "requests", "token hit %", "req hit %", "FLOPs saved", "TTFT p50 ms",
                  "TTFT p95 ms", "ckpt adm", "evictions", "alpha", "followed", "wall s"});
  auto f = [](const char* fmt, double v) {
    char b[48];
    std::snprintf(b, sizeof b, fmt, v);
    return std::string(b);
  };
  for (const auto& r : results) {
    const auto& m = r.metrics;
    rows.push_back({r.trace, r.policy, format_bytes(r.capacity_bytes), std::to_string(m.requests),
                    f("%.2f", 100 * m.token_hit_rate), f("%.2f", 100 * m.request_hit_rate),
                    f("%.3e", m.flops_saved), f("%.1f", m.ttft_p50_ms), f("%.1f", m.ttft_p95_ms),
                    std::to_string(m.cache.checkpoints_admitted), std::to_string(m.cache.evictions),
                    std::isfinite(m.cache.alpha) ? f("%.2f", m.cache.alpha) : std::string("-"),
                    r.selector_followed.empty() ? std::string("-") : r.selector_followed, f("%.4f", m.wall_seconds)});
  }
  return aligned_table(rows, 2);  // trace and policy left, numbers right
}

inline std::string detail_palette(std::size_t i) {
  return hybridcache::sim::detail::palette[i % std::size(hybridcache::sim::detail::palette)];
}

/// The figure: token hit rate and P95 TTFT against capacity, one line per (trace, policy).
[[nodiscard]] inline std::string hit_rate_svg(const std::vector<replay_result>& results, const std::string& title) {
  using namespace hybridcache::sim;
  std::vector<std::string> traces;
  for (const auto& r : results)
    if (std::find(traces.begin(), traces.end(), r.trace) == traces.end()) traces.push_back(r.trace);
  chart_panel hit{.title = "token hit rate", .x_label = "cache capacity", .y_label = "token hit rate",
                  .x_format = axis_format::bytes, .y_format = axis_format::percent, .log_x = true, .series = {}};
  chart_panel ttft{.title = "P95 TTFT (modelled)", .x_label = "cache capacity", .y_label = "P95 TTFT",
                   .x_format = axis_format::bytes, .y_format = axis_format::ms, .log_x = true, .series = {}};
  // One line per (trace, policy): colour by policy, dash pattern by trace.
  std::vector<std::string> policies;
  for (const auto& r : results)
    if (std::find(policies.begin(), policies.end(), r.policy) == policies.end()) policies.push_back(r.policy);
  static constexpr const char* dashes[] = {"", "7,4", "2,3", "9,3,2,3"};
  std::map<std::string, std::vector<const replay_result*>> by_line;
  std::vector<std::string> order;
  for (const auto& r : results) {
    const std::string name = traces.size() > 1 ? r.trace + " " + r.policy : r.policy;
    if (!by_line.count(name)) order.push_back(name);
    by_line[name].push_back(&r);
  }
  for (const auto& name : order) {
    auto& v = by_line[name];
    std::sort(v.begin(), v.end(), [](auto* a, auto* b) { return a->capacity_bytes < b->capacity_bytes; });
    const auto pi = static_cast<std::size_t>(std::find(policies.begin(), policies.end(), v.front()->policy) - policies.begin());
    const auto ti = static_cast<std::size_t>(std::find(traces.begin(), traces.end(), v.front()->trace) - traces.begin());
    chart_series h{name, {}, detail_palette(pi), dashes[ti % std::size(dashes)]};
    for (const auto* r : v) h.points.emplace_back(static_cast<double>(r->capacity_bytes), r->metrics.token_hit_rate);
    chart_series t = h;
    t.points.clear();
    for (const auto* r : v) t.points.emplace_back(static_cast<double>(r->capacity_bytes), r->metrics.ttft_p95_ms);
    hit.series.push_back(std::move(h));
    ttft.series.push_back(std::move(t));
  }
  const chart_style style;
  return to_svg(std::vector<chart_panel>{hit, ttft}, title, style);
}

}  // namespace hcbench
