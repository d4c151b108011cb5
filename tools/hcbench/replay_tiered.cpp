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

#include "replay_report.hpp"
#include "tiered_flags.hpp"

namespace hcbench {
namespace {

std::vector<hybridcache::sim::request> read_requests(const std::string& path, const std::string& format,
                                                     std::int64_t mooncake_block, const trace_load_options& load) {
  namespace sim = hybridcache::sim;
  if (!std::filesystem::is_regular_file(path) && !(format == "swe-agent" && std::filesystem::is_directory(path)))
    throw hybridcache::invalid_argument("trace file '" + path + "' does not exist or is not a regular file");
  sim::trace_options opts;
  opts.mooncake.block_size = mooncake_block;
  opts.sharegpt.sessions_per_second = load.sessions_per_second;
  if (tokenizer_label(format, load).empty() && !load.tokenizer.empty())
    throw hybridcache::invalid_argument("--tokenizer applies to text formats only (sharegpt, openai, swe-agent, tau-bench), not " + format);
  if (!load.tokenizer.empty()) opts.sharegpt.tokenizer = opts.chat.tokenizer = load_tokenizer(load.tokenizer);
  opts.chat.sessions_per_second = load.sessions_per_second;
  opts.chat.tool_time_mean_s = load.tool_time_mean_s;
  opts.chat.collapse_observations = load.collapse_observations;
  opts.chat.max_requests_per_session = load.max_turns;
  if (!load.chat_template.empty()) opts.chat.chat = sim::chat_template::from_file(load.chat_template);
  auto reader = sim::open_trace(path, sim::parse_trace_format(format), opts);
  std::vector<sim::request> out;
  sim::request r;
  while (reader.next(r)) out.push_back(r);
  return out;
}

double parse_spread_seconds(const std::string& s) {
  std::size_t used = 0;
  double v = -1.0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != s.size() || !(v >= 0) || !std::isfinite(v))
    throw hybridcache::invalid_argument("--spread-arrivals: '" + s + "' is neither a number of seconds >= 0 nor 'next'");
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
  tiered::tiered_replay_options multi =
      make_tiered_replay_options(t.tiers, t.link_gbps, t.scheduler, t.prefetch, t.sparsify);
  multi.demotion = parse_demotion(t.demotion);
  if (!(t.arrival_scale > 0)) throw hybridcache::invalid_argument("--arrival-scale must be > 0");
  if (!(t.per_copy_us >= 0)) throw hybridcache::invalid_argument("--per-copy-us must be >= 0");
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
  const auto requests = read_requests(trace, format, mooncake_block, load);
  const std::string tokenizer = tokenizer_label(format, load);
  auto replay = [&](const tiered::tiered_replay_options& o) {
    if (t.prefill_time == "line") return tiered::run_tiered_replay(requests, model, o, hybridcache::linear_prefill_time{});
    return tiered::run_tiered_replay(requests, model, o, hybridcache::flop_prefill_time(model));
  };
  const tiered::tiered_replay_result r = replay(multi);
  const tiered::tiered_replay_result b = replay(single);
  const double cut = b.ttft_p50_ms > 0 ? 1.0 - r.ttft_p50_ms / b.ttft_p50_ms : 0.0;
  const std::int64_t skipped = r.hbm_hit_tokens + r.host_hit_tokens;

  if (json) {
    std::printf(
        "{\"policy\": \"tiered:%s\", \"tiers\": \"%s\", \"model\": \"%s\", \"requests\": %lld, \"input_tokens\": %lld, "
        "\"skipped_tokens\": %lld, \"token_hit_rate\": %.6f, \"hbm_hit_tokens\": %lld, \"host_hit_tokens\": %lld, "
        "\"recomputed_hit_tokens\": %lld, \"recompute_instead_of_reload\": %lld, \"bytes_loaded\": %lld, "
        "\"bytes_offloaded\": %lld, \"bytes_saved_by_sparsify\": %lld, \"prefetches\": %lld, "
        "\"ttft_p50_ms\": %.3f, \"ttft_p95_ms\": %.3f, \"pipeline_hidden_fraction\": %.4f, "
        "\"load_hidden_fraction\": %.4f, \"utilization\": %.4f, \"single_tier_token_hit_rate\": %.6f, "
        "\"single_tier_ttft_p50_ms\": %.3f, \"single_tier_ttft_p95_ms\": %.3f, \"ttft_p50_reduction\": %.4f, "
        "\"service_p50_ms\": %.3f, \"single_tier_service_p50_ms\": %.3f, \"single_tier_utilization\": %.4f, "
        "\"prefill_engines\": %lld, \"arrival_scale\": %.6g, \"prefill_time\": \"%s\", "
        "\"split_load_recompute\": %lld, \"tokenizer\": %s}\n",
        t.demotion.c_str(), tier_summary(multi).c_str(), model_name.c_str(), static_cast<long long>(r.requests),
        static_cast<long long>(r.input_tokens), static_cast<long long>(skipped), r.token_hit_rate(),
        static_cast<long long>(r.hbm_hit_tokens), static_cast<long long>(r.host_hit_tokens),
        static_cast<long long>(r.recomputed_hit_tokens), static_cast<long long>(r.recompute_instead_of_reload),
        static_cast<long long>(r.bytes_loaded), static_cast<long long>(r.bytes_offloaded),
        static_cast<long long>(r.bytes_saved_by_sparsify), static_cast<long long>(r.prefetches), r.ttft_p50_ms,
        r.ttft_p95_ms, r.pipeline_hidden_fraction, r.load_hidden_fraction, r.utilization, b.token_hit_rate(),
        b.ttft_p50_ms, b.ttft_p95_ms, cut, r.service_p50_ms, b.service_p50_ms, b.utilization,
        static_cast<long long>(t.prefill_engines), t.arrival_scale, t.prefill_time.c_str(),
        static_cast<long long>(r.split_load_recompute),
        tokenizer.empty() ? "null" : detail::json_string(tokenizer).c_str());
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
