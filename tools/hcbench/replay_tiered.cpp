// `hcbench replay --tiers ...`: see replay_tiered.hpp.
#include "replay_tiered.hpp"

#include <cmath>
#include <cstdint>
#include <exception>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <hybridcache/model/cost_model.hpp>
#include <hybridcache/core/error.hpp>
#include <hybridcache/model/presets.hpp>
#include <hybridcache/model/prefill_time.hpp>
#include <hybridcache/sim/trace.hpp>
#include <hybridcache/sim/tiered_replay.hpp>

#include "cli_support.hpp"
#include "replay_run.hpp"
#include "replay_report.hpp"
#include "tiered_flags.hpp"

namespace hcbench {
namespace {

double parse_spread_seconds(const std::string& s) {
  std::size_t used = 0;
  double v = -1.0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != s.size() || !(v >= 0) || !(v <= 1e6))
    throw hybridcache::invalid_argument("--spread-arrivals: expected a number of seconds in [0, 1e6] or 'next', got '" + s +
                                        "'");
  return v;
}

std::string tier_summary(const hybridcache::tiered::tiered_replay_options& o) {
  std::string s;
  for (const auto& t : o.tiers) {
    if (!s.empty()) s += ",";
    s += std::string(to_string(t.kind)) + "=" + std::to_string(t.capacity_bytes);
  }
  return s;
}

}  // namespace

void run_tiered_replay_command(const std::string& trace, const std::string& format, const std::string& model_name,
                               std::int64_t mooncake_block, const trace_load_options& load, const tiered_cli& t,
                               bool json) {
  namespace tiered = hybridcache::tiered;
  const hybridcache::cost_model model(hybridcache::presets::preset(model_name));
  if (!(t.link_gbps > 0)) throw hybridcache::invalid_argument("--link-gbps: link bandwidth must be > 0");
  tiered::tiered_replay_options multi =
      make_tiered_replay_options(t.tiers, t.link_gbps, t.scheduler, t.prefetch, t.sparsify);
  multi.demotion = parse_demotion(t.demotion);
  // Finite and bounded, so every modelled time (<= 1e10 s of trace times this) stays finite.
  check_finite_range(t.arrival_scale, 1e-6, 1e6, "--arrival-scale");
  check_finite_range(t.per_copy_us, 0, 1e6, "--per-copy-us");
  check_finite_range(t.link_gbps, 1e-6, 1e6, "--link-gbps");
  if (t.prefill_engines < 1 || t.prefill_engines > 4096)
    throw hybridcache::invalid_argument("--prefill-engines must be in 1..4096");
  multi.arrival_time_scale = t.arrival_scale;
  if (t.spread_arrivals == "next") multi.spread_to_next_arrival = true;
  else multi.spread_equal_arrivals_s = parse_spread_seconds(t.spread_arrivals);
  multi.prefill_engines = static_cast<std::size_t>(t.prefill_engines);
  if (t.prefetch_depth < 1 || t.prefetch_depth > 1 << 20)
    throw hybridcache::invalid_argument("--prefetch-depth must be in 1..1048576");
  multi.prefetch_depth = static_cast<std::size_t>(t.prefetch_depth);
  if (t.split != "on" && t.split != "off")
    throw hybridcache::invalid_argument("--split-load-recompute: unknown value '" + t.split + "' (on, off)");
  multi.split_load_recompute = t.split == "on";
  multi.per_copy_overhead_us = t.per_copy_us;
  tiered::tiered_replay_options single = multi;
  single.tiers.resize(1);  // HBM alone: parse_tiers puts it first

  if (t.prefill_time != "flops" && t.prefill_time != "line")
    throw hybridcache::invalid_argument("--prefill-time: unknown value '" + t.prefill_time + "' (flops, line)");
  trace_load_options with_block = load;
  with_block.block_size = mooncake_block;
  const auto requests = read_requests(trace, format, with_block);
  const std::string tokenizer = tokenizer_label(format, load);
  const bool tty = progress_enabled();
  auto replay = [&](const tiered::tiered_replay_options& o) {
    if (t.prefill_time == "line") return tiered::run_tiered_replay(requests, model, o, hybridcache::linear_prefill_time{});
    return tiered::run_tiered_replay(requests, model, o, hybridcache::flop_prefill_time(model));
  };
  if (tty) std::fprintf(stderr, "\r[1/2] multi-tier replay of %zu requests", requests.size());
  const tiered::tiered_replay_result r = replay(multi);
  if (tty) std::fprintf(stderr, "\r[2/2] single-tier baseline of %zu requests", requests.size());
  const tiered::tiered_replay_result b = replay(single);
  if (tty) std::fprintf(stderr, "\r[2/2] done%40s\n", "");
  const double cut = b.ttft_p50_ms > 0 ? 1.0 - r.ttft_p50_ms / b.ttft_p50_ms : 0.0;
  const std::int64_t skipped = r.hbm_hit_tokens + r.host_hit_tokens;

  if (json) {
    json::object o;
    o.str("policy", "tiered:" + t.demotion).str("tiers", tier_summary(multi)).str("model", model_name);
    o.integer("requests", r.requests).integer("input_tokens", r.input_tokens).integer("skipped_tokens", skipped);
    o.num("token_hit_rate", r.token_hit_rate()).integer("hbm_hit_tokens", r.hbm_hit_tokens);
    o.integer("host_hit_tokens", r.host_hit_tokens).integer("recomputed_hit_tokens", r.recomputed_hit_tokens);
    o.integer("recompute_instead_of_reload", r.recompute_instead_of_reload).integer("bytes_loaded", r.bytes_loaded);
    o.integer("bytes_offloaded", r.bytes_offloaded).integer("bytes_saved_by_sparsify", r.bytes_saved_by_sparsify);
    o.integer("prefetches", r.prefetches).num("ttft_p50_ms", r.ttft_p50_ms).num("ttft_p95_ms", r.ttft_p95_ms);
    o.num("pipeline_hidden_fraction", r.pipeline_hidden_fraction).num("load_hidden_fraction", r.load_hidden_fraction);
    o.num("utilization", r.utilization).num("single_tier_token_hit_rate", b.token_hit_rate());
    o.num("single_tier_ttft_p50_ms", b.ttft_p50_ms).num("single_tier_ttft_p95_ms", b.ttft_p95_ms);
    o.num("ttft_p50_reduction", cut).num("service_p50_ms", r.service_p50_ms);
    o.num("single_tier_service_p50_ms", b.service_p50_ms).num("single_tier_utilization", b.utilization);
    o.integer("prefill_engines", t.prefill_engines).num("arrival_scale", t.arrival_scale);
    o.str("prefill_time", t.prefill_time).integer("split_load_recompute", r.split_load_recompute);
    if (tokenizer.empty())
      o.raw("tokenizer", "null");
    else
      o.str("tokenizer", tokenizer);
    o.provenance();
    std::printf("%s\n", o.text().c_str());
    return;
  }
  if (!tokenizer.empty()) std::printf("tokenizer: %s\n", tokenizer.c_str());
  std::printf("%-12s %10s %10s %14s %14s %12s %12s %10s\n", "tiers", "requests", "hit rate", "hbm hit tok",
              "host hit tok", "TTFT p50 ms", "TTFT p95 ms", "hidden");
  std::printf("%-12s %10lld %9.2f%% %14lld %14lld %12.1f %12.1f %9.1f%%\n", "single-tier",
              static_cast<long long>(b.requests), 100.0 * b.token_hit_rate(), static_cast<long long>(b.hbm_hit_tokens),
              0LL, b.ttft_p50_ms, b.ttft_p95_ms, 100.0 * b.pipeline_hidden_fraction);
  std::printf("%-12s %10lld %9.2f%% %14lld %14lld %12.1f %12.1f %9.1f%%\n", "multi-tier",
              static_cast<long long>(r.requests), 100.0 * r.token_hit_rate(), static_cast<long long>(r.hbm_hit_tokens),
              static_cast<long long>(r.host_hit_tokens), r.ttft_p50_ms, r.ttft_p95_ms,
              100.0 * r.pipeline_hidden_fraction);
  std::printf("\nP50 TTFT %+.1f%% vs single-tier; %lld B loaded, %lld B offloaded; recompute instead of reload in "
              "%lld requests (%lld tokens)\n",
              -100.0 * cut, static_cast<long long>(r.bytes_loaded), static_cast<long long>(r.bytes_offloaded),
              static_cast<long long>(r.recompute_instead_of_reload), static_cast<long long>(r.recomputed_hit_tokens));
}

}  // namespace hcbench
