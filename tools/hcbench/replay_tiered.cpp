// `hcbench replay --tiers ...`: see replay_tiered.hpp.
#include "replay_tiered.hpp"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <exception>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <hybridcache/core/error.hpp>
#include <hybridcache/model/cost_model.hpp>
#include <hybridcache/model/prefill_time.hpp>
#include <hybridcache/model/presets.hpp>
#include <hybridcache/prefix/admission.hpp>
#include <hybridcache/prefix/flop_aware_scorer.hpp>
#include <hybridcache/prefix/gdsf_scorer.hpp>
#include <hybridcache/prefix/lru_scorer.hpp>
#include <hybridcache/sim/tiered_replay.hpp>
#include <hybridcache/sim/tiered_replay_real_bytes.hpp>
#include <hybridcache/sim/trace.hpp>
#include <hybridcache/tiered/car_score.hpp>

#include "atomic_file.hpp"
#include "cli_support.hpp"
#include "output_fields.hpp"
#include "progress.hpp"
#include "replay_report.hpp"
#include "replay_run.hpp"
#include "real_bytes_backends.hpp"
#include "tier_directories.hpp"
#include "tier_links.hpp"
#include "tiered_flags.hpp"
#include "tiered_plot.hpp"

namespace hcbench {
namespace {

namespace hc = hybridcache;
namespace pc = hybridcache::prefix;
namespace tr = hybridcache::tiered;

/// The prefill-time model of --prefill-time, chosen at run time (one instantiation).
class chosen_prefill_time {
 public:
  chosen_prefill_time(const hc::cost_model& m, bool flops) : flop_(m), flops_(flops) {}
  [[nodiscard]] double prefill_ms(std::int64_t tokens) const { return prefill_ms(0, tokens); }
  [[nodiscard]] double prefill_ms(std::int64_t prefix, std::int64_t tokens) const {
    return flops_ ? flop_.prefill_ms(prefix, tokens) : line_.prefill_ms(tokens);
  }

 private:
  hc::flop_prefill_time flop_;
  hc::linear_prefill_time line_;
  bool flops_;
};
static_assert(hc::prefix_aware_prefill_time_model<chosen_prefill_time>);

double parse_spread_seconds(const std::string& s) {
  std::size_t used = 0;
  double v = -1.0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != s.size() || !(v >= 0) || !(v <= 1e6))
    throw hc::invalid_argument("--spread-arrivals: expected a number of seconds in [0, 1e6] or 'next', got '" + s + "'");
  return v;
}

/// The tiered replay of one policy (the same compositions as the single-tier replay).
/// The modelled replay, or (storage != nullptr) the real-bytes one over those backends.
template <class Admission, class Scorer>
hc::sim::tiered_replay_result run_one(const std::vector<hc::sim::request>& reqs, const hc::cost_model& m,
                                 const hc::sim::tiered_replay_options& o, Scorer scorer, const chosen_prefill_time& prefill,
                                 std::vector<hc::tiered::storage_tier_io>* storage) {
  if (o.demotion == hc::sim::demotion_kind::car) {
    // CaR's score replaces the policy's HBM scorer (the admission stays the policy's); the
    // board lives for this run, driven by the replay's scheduler events (and mirrored onto
    // the store's table, which orders the tiers below HBM and the cleaner).
    hc::tiered::car_score_board board;
    if (storage != nullptr)
      return hc::sim::run_tiered_replay_real_bytes<Admission>(reqs, m, o, std::move(*storage),
                                                              hc::tiered::car_scorer(board), prefill);
    return hc::sim::run_tiered_replay<Admission>(reqs, m, o, hc::tiered::car_scorer(board), prefill);
  }
  if (storage != nullptr)
    return hc::sim::run_tiered_replay_real_bytes<Admission>(reqs, m, o, std::move(*storage), std::move(scorer), prefill);
  return hc::sim::run_tiered_replay<Admission>(reqs, m, o, std::move(scorer), prefill);
}

hc::sim::tiered_replay_result run_policy(const std::vector<hc::sim::request>& reqs, const hc::cost_model& m,
                                    const hc::sim::tiered_replay_options& o, const tiered_policy& p,
                                    const chosen_prefill_time& prefill,
                                    std::vector<hc::tiered::storage_tier_io>* storage = nullptr) {
  const auto lru = [&] {
    return pc::lru_scorer({.ties = p.reference_lru_ties ? pc::lru_ties::python_heapq : pc::lru_ties::by_node_id});
  };
  if (p.name == "marconi" && p.selector) {
    if (o.demotion == hc::sim::demotion_kind::car)
      throw hc::invalid_argument("--demotion car replaces the HBM scorer: it does not combine with --alpha auto (the selector)");
    hc::compose::adaptive_config cfg = *p.selector;
    cfg.tokens_per_id = reqs.empty() ? 1 : reqs.front().tokens_per_id;  // Mooncake: one id per block
    return run_one<pc::judicious_admission>(reqs, m, o, hc::compose::make_marconi_adaptive_scorer(m, std::move(cfg)), prefill,
                                            storage);
  }
  if (p.name == "marconi") {
    const auto candidates =
        p.flop_candidates == "paper" ? pc::flop_candidates::paper : pc::flop_candidates::protect_branches;
    const auto index = p.flop_index == "classes"     ? pc::flop_index::efficiency_classes
                       : p.flop_index == "threshold" ? pc::flop_index::threshold_walk
                                                     : pc::flop_index::bounded_walk;
    return run_one<pc::judicious_admission>(
        reqs, m, o, pc::flop_aware_scorer(m, {.alpha = p.alpha.value_or(1.0), .candidates = candidates, .index = index}),
        prefill, storage);
  }
  if (p.name == "gdsf") return run_one<pc::judicious_admission>(reqs, m, o, pc::gdsf_scorer(m), prefill, storage);
  if (p.name == "sglang+") return run_one<pc::judicious_admission>(reqs, m, o, lru(), prefill, storage);
  if (p.name == "lru") return run_one<pc::last_token_admission>(reqs, m, o, lru(), prefill, storage);
  // vllm+: a checkpoint every `vllm_block` tokens = vllm_block / tokens_per_id ids.
  const std::int64_t ids = std::max<std::int64_t>(1, p.vllm_block / std::max<std::int32_t>(reqs.front().tokens_per_id, 1));
  if (ids == 1) return run_one<pc::every_block_admission<1>>(reqs, m, o, lru(), prefill, storage);
  if (ids == 32) return run_one<pc::every_block_admission<32>>(reqs, m, o, lru(), prefill, storage);
  throw hc::invalid_argument("vllm+ with --tiers: a checkpoint block of " + std::to_string(ids) +
                             " ids is not compiled in (1 or 32 ids: 32-token blocks, or one per Mooncake block)");
}

/// Each tier's name in the table and JSON: its kind ("host", "disk"), with its index when two
/// tiers share a kind ("disk1", "disk2").
std::vector<std::string> tier_names(const std::vector<tr::tier_config>& tiers) {
  std::vector<std::string> names;
  for (std::size_t i = 0; i < tiers.size(); ++i) {
    std::size_t same = 0;
    for (const auto& t : tiers) same += t.kind == tiers[i].kind ? 1 : 0;
    names.push_back(std::string(to_string(tiers[i].kind)) + (same > 1 ? std::to_string(i) : ""));
  }
  return names;
}

/// A row's hit tokens in tier `t` (the single-tier run has none below HBM).
std::int64_t hits_in(const hc::sim::tiered_replay_result& r, std::size_t t) {
  return t < r.hit_tokens_by_tier.size() ? r.hit_tokens_by_tier[t] : 0;
}

/// The single-tier and multi-tier rows (and the real-bytes one), hits split per tier.
std::string tiered_table(const std::vector<std::string>& names,
                         const std::vector<std::pair<const char*, const hc::sim::tiered_replay_result*>>& runs) {
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> header{"tiers", "requests", "token hit %"};
  for (const auto& n : names) header.push_back(n + " hit tok");
  // TTET last, so a quote of the older columns still reads the same.
  for (const char* h : {"TTFT p50 ms", "TTFT p95 ms", "hidden %", "busy %", "engines", "TTET p50 ms", "TTET p95 ms"})
    header.emplace_back(h);
  rows.push_back(std::move(header));
  auto f = [](const char* fmt, double v) {
    char b[48];
    std::snprintf(b, sizeof b, fmt, v);
    return std::string(b);
  };
  for (const auto& [name, r] : runs) {
    std::vector<std::string> row{name, std::to_string(r->requests), f("%.2f", 100.0 * r->token_hit_rate())};
    for (std::size_t t = 0; t < names.size(); ++t) row.push_back(std::to_string(hits_in(*r, t)));
    row.push_back(f("%.1f", r->ttft_p50_ms));
    row.push_back(f("%.1f", r->ttft_p95_ms));
    row.push_back(f("%.1f", 100.0 * r->pipeline_hidden_fraction));
    row.push_back(f("%.1f", 100.0 * r->utilization));
    row.push_back(std::to_string(r->prefill_engines));
    row.push_back(f("%.1f", r->ttet_p50_ms));
    row.push_back(f("%.1f", r->ttet_p95_ms));
    rows.push_back(std::move(row));
  }
  return aligned_table(rows, 1);
}

/// The candidate the selector followed at the end, in --candidates syntax ("" for a fixed rule).
std::string followed_of(const hc::sim::tiered_replay_result& r) {
  if (!r.selector_followed_rule) return "";
  return candidate_name({*r.selector_followed_rule, r.selector_followed_alpha});
}

}  // namespace

void run_tiered_replay_command(const std::string& trace, const std::string& format, const hc::model_spec& spec,
                               std::int64_t mooncake_block, const trace_load_options& load, const tiered_cli& t,
                               const tiered_policy& policy, const std::string& per_request, bool json) {
  const hc::cost_model model(spec);
  const std::string& model_name = spec.name;  // the preset's, with the overrides applied
  check_policy(policy.name);
  if (!(t.link_gbps > 0)) throw hc::invalid_argument("--link-gbps: link bandwidth must be > 0");
  if (policy.name != "marconi" && policy.alpha)
    throw hc::invalid_argument("--alpha applies to --policy marconi only");
  hc::sim::tiered_replay_options multi = make_tiered_replay_options(t.tiers, t.link_gbps, t.scheduler, t.prefetch, t.sparsify);
  multi.demotion = parse_demotion(t.demotion);
  multi.write = parse_write_policy(t.write_policy);
  if (t.write_through_hits < 1 || t.write_through_hits > 1'000'000)
    throw hc::invalid_argument("--write-through-hits must be in 1..1000000");
  multi.write_through_hits = static_cast<std::int32_t>(t.write_through_hits);
  multi.marks = parse_watermarks(t.watermarks);
  multi.layerwise = parse_on_off(t.layerwise, "--layerwise");
  multi.recompute_when_faster = parse_on_off(t.recompute, "--recompute-when-faster");
  check_finite_range(t.staging_fraction, 0.01, 0.5, "--staging-fraction");
  multi.staging_fraction = t.staging_fraction;
  // Finite and bounded, so every modelled time (<= 1e10 s of trace times this) stays finite.
  check_finite_range(t.arrival_scale, 1e-6, 1e6, "--arrival-scale");
  check_finite_range(t.per_copy_us, 0, 1e6, "--per-copy-us");
  check_finite_range(t.link_gbps, 1e-6, 1e6, "--link-gbps");
  multi.arrival_time_scale = t.arrival_scale;
  if (t.spread_arrivals == "next") multi.spread_to_next_arrival = true;
  else multi.spread_equal_arrivals_s = parse_spread_seconds(t.spread_arrivals);
  const bool auto_engines = t.prefill_engines == "auto";
  if (!auto_engines) {
    std::size_t used = 0;
    long long n = 0;
    try {
      n = std::stoll(t.prefill_engines, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != t.prefill_engines.size() || n < 1 || n > 4096)
      throw hc::invalid_argument("--prefill-engines: expected 1..4096 or auto, got '" + t.prefill_engines + "'");
    multi.prefill_engines = static_cast<std::size_t>(n);
  }
  if (t.prefetch_depth < 1 || t.prefetch_depth > 1 << 20)
    throw hc::invalid_argument("--prefetch-depth must be in 1..1048576");
  multi.prefetch_depth = static_cast<std::size_t>(t.prefetch_depth);
  multi.per_copy_overhead_us = t.per_copy_us;
  multi.decode = parse_decode(t.decode);
  check_finite_range(t.tpot_ms, 0, 1e6, "--tpot-ms");
  multi.tpot_ms = t.tpot_ms;
  multi.length_predictor = parse_length_predictor(t.length_predictor);
  multi.keep_per_request = !per_request.empty();
  if (t.prefill_time != "flops" && t.prefill_time != "line")
    throw hc::invalid_argument("--prefill-time: unknown value '" + t.prefill_time + "' (flops, line)");
  trace_load_options with_block = load;
  with_block.block_size = mooncake_block;
  const auto requests = read_requests(trace, format, with_block);
  if (requests.empty()) throw hc::invalid_argument("replay: the trace holds no requests");
  const chosen_prefill_time prefill(model, t.prefill_time == "flops");
  // From here on a disk tier's directory may be created (the probe, --real-bytes); if the run
  // then fails, the directories it created go again (#34: bad input changes nothing).
  const new_directories_guard new_directories(multi.tiers);
  // Disk and redis tiers without :gbps= / :lat_us= are measured now (a failed probe is an error).
  const std::vector<tier_link_row> links = measure_tier_links(multi.tiers, multi.link_gbps.has_value());
  // Both runs on the same engines: the single-tier baseline's load decides the default.
  if (auto_engines) multi.prefill_engines = hc::sim::auto_prefill_engines(requests, multi, prefill);
  hc::sim::tiered_replay_options single = multi;
  single.tiers.resize(1);  // HBM alone: parse_tiers puts it first
  single.prefetch = hc::sim::prefetch_kind::none;
  const std::string tokenizer = tokenizer_label(format, load);
  // The figure needs every request's row of both runs.
  const std::string plot = !t.plot.empty() ? t.plot
                           : per_request.empty() ? std::string()
                                                 : std::filesystem::path(per_request).replace_extension(".svg").string();
  multi.keep_per_request = single.keep_per_request = !per_request.empty() || !plot.empty();
  // Progress over the requests of every run (the multi-tier one, the baseline, the real-bytes one).
  progress_meter meter({.total = requests.size() * (t.real_bytes ? 3 : 2), .what = "requests replayed"});
  multi.on_dispatch = single.on_dispatch = [&meter] { meter.step(); };
  const hc::sim::tiered_replay_result r = run_policy(requests, model, multi, policy, prefill);
  const hc::sim::tiered_replay_result b = run_policy(requests, model, single, policy, prefill);
  std::optional<hc::sim::tiered_replay_result> real;
  if (t.real_bytes) {
    if (multi.tiers.size() < 2) throw hc::invalid_argument("--real-bytes needs a tier below hbm");
    const real_bytes_backends backends(multi.tiers);
    auto io = backends.io();
    real = run_policy(requests, model, multi, policy, prefill, &io);
  }
  meter.finish();
  const bool agrees = !real || (real->hbm_hit_tokens == r.hbm_hit_tokens && real->host_hit_tokens == r.host_hit_tokens &&
                                real->bytes_loaded == r.bytes_loaded && real->real.failed_copies == 0);
  for (const auto* x : {&b, &r})
    if (x->saturated())
      std::fprintf(stderr,
                   "hcbench: warning: the %s run is saturated (%.0f %% busy on %zu prefill engines): its TTFT measures "
                   "the queue; add --prefill-engines or --arrival-scale\n",
                   x == &b ? "single-tier" : "multi-tier", 100.0 * x->utilization, x->prefill_engines);
  const double cut = b.ttft_p50_ms > 0 ? 1.0 - r.ttft_p50_ms / b.ttft_p50_ms : 0.0;
  const std::int64_t skipped = r.hbm_hit_tokens + r.host_hit_tokens;
  const std::vector<std::string> names = tier_names(multi.tiers);
  if (!plot.empty())
    write_file_atomic(plot, tiered_svg(b, r, names, "hcbench replay --tiers " + t.tiers + ": " + policy.name + ", " + model_name),
                      "--plot");
  const std::string arrivals = (multi.spread_to_next_arrival ? std::string("spread to the next timestamp")
                                : multi.spread_equal_arrivals_s > 0
                                    ? "equal timestamps spread over " + json::number(multi.spread_equal_arrivals_s) + " s"
                                    : std::string("as recorded")) +
                               (multi.arrival_time_scale != 1.0 ? ", gaps x" + json::number(multi.arrival_time_scale) : "");
  if (!per_request.empty()) {
    // One row per request in dispatch order; `request` is its index in the trace's request
    // list (the order of the rows differs from it under --scheduler car), refused ones included.
    std::string csv = fields::tiered_per_request_csv;
    for (std::size_t t = 0; t < names.size(); ++t) csv += ",tier" + std::to_string(t) + "_hit_tokens";
    csv += '\n';
    for (const auto& x : r.per_request) {
      csv += std::to_string(x.request) + ',' + (x.refused ? '1' : '0') + ',' + std::to_string(x.input_tokens) + ',' + std::to_string(x.hbm_hit_tokens) + ',' +
             std::to_string(x.host_hit_tokens) + ',' + std::to_string(x.bytes_loaded) + ',' + json::number(x.ttft_ms) + ',' + std::to_string(x.source_tier) + ',' + json::number(x.ttet_ms);
      for (std::size_t t = 0; t < names.size(); ++t)
        csv += ',' + std::to_string(t < x.hit_tokens_by_tier.size() ? x.hit_tokens_by_tier[t] : 0);
      csv += '\n';
    }
    write_file_atomic(per_request, csv, "--per-request");
  }
  if (json) {
    json::object o;
    o.str("policy", policy.name).str("tiers", t.tiers).str("model", model_name);  // the spec as given
    o.raw("tier_links", tier_links_json(links));
    if (policy.name == "marconi") {  // the selector's: the followed candidate's alpha, null for one without
      const bool has_alpha = !r.selector_followed_rule ||
                             candidate_has_alpha({*r.selector_followed_rule, r.selector_followed_alpha});
      o.num("alpha", !has_alpha ? std::numeric_limits<double>::quiet_NaN()
                     : r.selector_followed_rule ? r.selector_followed_alpha
                                                : policy.alpha.value_or(1.0));
    }
    o.integer("requests", r.requests).integer("input_tokens", r.input_tokens).integer("skipped_tokens", skipped);
    o.num("token_hit_rate", r.token_hit_rate()).integer("hbm_hit_tokens", r.hbm_hit_tokens);
    o.integer("host_hit_tokens", r.host_hit_tokens);
    std::string by_tier = "[";  // hit tokens split by the tier each entry was read from
    for (std::size_t i = 0; i < names.size(); ++i) {
      json::object x;
      x.integer("tier", static_cast<std::int64_t>(i)).str("name", names[i]).integer("hit_tokens", hits_in(r, i));
      by_tier += (i > 0 ? ", " : "") + x.text();
    }
    o.raw("hit_tokens_by_tier", by_tier + "]").integer("recomputed_hit_tokens", r.recomputed_hit_tokens);
    o.integer("recompute_instead_of_reload", r.recompute_instead_of_reload).integer("bytes_loaded", r.bytes_loaded);
    o.integer("bytes_offloaded", r.bytes_offloaded).integer("bytes_saved_by_sparsify", r.bytes_saved_by_sparsify);
    o.integer("prefetches", r.prefetches).integer("prefetches_declined_for_room", r.prefetches_declined_for_room).num("ttft_p50_ms", r.ttft_p50_ms).num("ttft_p95_ms", r.ttft_p95_ms);
    o.num("pipeline_hidden_fraction", r.pipeline_hidden_fraction).num("load_hidden_fraction", r.load_hidden_fraction);
    o.num("utilization", r.utilization).num("single_tier_token_hit_rate", b.token_hit_rate());
    o.num("single_tier_ttft_p50_ms", b.ttft_p50_ms).num("single_tier_ttft_p95_ms", b.ttft_p95_ms);
    o.num("ttft_p50_reduction", cut).num("service_p50_ms", r.service_p50_ms);
    o.num("single_tier_service_p50_ms", b.service_p50_ms).num("single_tier_utilization", b.utilization);
    o.integer("prefill_engines", static_cast<std::int64_t>(r.prefill_engines)).num("arrival_scale", t.arrival_scale);
    o.str("prefill_time", t.prefill_time).integer("split_load_recompute", r.split_load_recompute);
    o.raw("prefill_engines_auto", auto_engines ? "true" : "false").str("arrivals", arrivals);
    o.raw("saturated", r.saturated() ? "true" : "false").raw("single_tier_saturated", b.saturated() ? "true" : "false");
    o.num("flops_saved", r.flops_saved).num("single_tier_flops_saved", b.flops_saved);
    o.str("write_policy", t.write_policy).integer("write_backs", r.write_backs).integer("replicas", r.replicas);
    o.integer("clean_drops", r.clean_drops).integer("joined_loads", r.joined_loads).integer("copies", r.copies);
    o.integer("dropped_entries", r.dropped_blocks).num("stall_ms", r.stall_ms).integer("refused", r.refused);
    o.integer("single_tier_refused", b.refused).str("layerwise", t.layerwise);
    o.integer("cascades", r.cascades).integer("copy_failures", r.copy_failures);
    o.str("decode", t.decode).num("tpot_ms", t.tpot_ms).str("length_predictor", t.length_predictor);
    o.num("ttet_p50_ms", r.ttet_p50_ms).num("ttet_p95_ms", r.ttet_p95_ms).num("ttet_mean_ms", r.ttet_mean_ms);
    o.num("single_tier_ttet_p50_ms", b.ttet_p50_ms).num("single_tier_ttet_p95_ms", b.ttet_p95_ms);
    o.num("single_tier_ttet_mean_ms", b.ttet_mean_ms).num("output_length_mae_tokens", r.output_length_mae_tokens);
    if (policy.name == "marconi" && policy.selector) {  // the adaptive selector's cost, both runs
      o.num("selector_shadow_seconds", r.selector_shadow_seconds).integer("selector_shadow_bytes", r.selector_shadow_bytes);
      o.integer("selector_switches", r.selector_switches).raw("selector_tier_aware", r.selector_tier_aware ? "true" : "false");
      o.num("single_tier_selector_shadow_seconds", b.selector_shadow_seconds);
      o.integer("single_tier_selector_switches", b.selector_switches);
      o.integer("selector_guard_reverts", r.selector_guard_reverts);
      o.str("selector_guard", to_string(r.selector_guard)).str("single_tier_selector_guard", to_string(b.selector_guard));
      o.integer("selector_guard_suspended_at", r.selector_guard_suspended_at);
      o.integer("single_tier_selector_guard_suspended_at", b.selector_guard_suspended_at);
      o.str("selector_followed", followed_of(r)).str("single_tier_selector_followed", followed_of(b));
    }
    if (real) {
      const auto& x = real->real;
      json::object v;
      v.raw("agrees", agrees ? "true" : "false").integer("hbm_hit_tokens", real->hbm_hit_tokens);
      v.integer("host_hit_tokens", real->host_hit_tokens).integer("bytes_loaded", real->bytes_loaded);
      v.integer("copies", x.copies).integer("bytes", x.bytes).integer("verified_copies", x.verified_copies);
      v.integer("partial_copies", x.partial_copies).integer("storage_puts", x.storage_puts);
      v.integer("storage_gets", x.storage_gets).integer("storage_misses", x.storage_misses);
      v.integer("storage_put_failures", x.storage_put_failures).integer("verify_failures", x.verify_failures);
      v.integer("failed_copies", x.failed_copies).num("real_copy_wall_ms", x.real_copy_wall_ms);
      v.num("modelled_copy_ms", x.modelled_copy_ms).num("late_ms", x.late_ms);
      o.raw("real_bytes", v.text());
    }
    if (tokenizer.empty())
      o.raw("tokenizer", "null");
    else
      o.str("tokenizer", tokenizer);
    o.provenance();
    std::printf("%s\n", o.text().c_str());
    if (!agrees) throw hc::error("--real-bytes: the run with real bytes disagrees with the modelled run (see real_bytes)");
    return;
  }
  if (!tokenizer.empty()) std::printf("tokenizer: %s\n", tokenizer.c_str());
  if (!plot.empty()) std::printf("plot: %s\n", plot.c_str());
  print_tier_links(links);
  const std::string selector = followed_of(r).empty() ? "" : " (the selector followed " + followed_of(r) + " at the end)";
  std::printf("policy %s%s over %s; %s%s; arrivals %s\n", policy.name.c_str(), selector.c_str(), t.tiers.c_str(),
              count_of(r.prefill_engines, "prefill engine").c_str(),
              auto_engines ? " (auto: the fewest that keep a cache-less run under 90 % busy)" : "", arrivals.c_str());
  std::vector<std::pair<const char*, const hc::sim::tiered_replay_result*>> runs{{"single-tier", &b}, {"multi-tier", &r}};
  if (real) runs.emplace_back("real bytes", &*real);
  std::printf("%s", tiered_table(names, runs).c_str());
  if (multi.tiers.size() > 2)
    std::printf("(a hit that reads from several tiers counts each entry under the tier it is read from)\n");
  const byte_units units = units_of(t.tiers);  // sizes in the family the tiers were given in
  std::printf("\nP50 TTFT %+.1f%% vs single-tier; FLOPs saved %.3g vs %.3g; %s loaded, %s offloaded "
              "(%s, %lld clean copies made ahead); recompute instead of reload in %s (%s)\n",
              -100.0 * cut, r.flops_saved, b.flops_saved, format_bytes(r.bytes_loaded, units).c_str(),
              format_bytes(r.bytes_offloaded, units).c_str(),
              count_of(static_cast<std::size_t>(r.write_backs), "write-back").c_str(), static_cast<long long>(r.replicas),
              count_of(static_cast<std::size_t>(r.recompute_instead_of_reload), "request").c_str(),
              count_of(static_cast<std::size_t>(r.recomputed_hit_tokens), "token").c_str());
  if (real) {
    const auto& x = real->real;
    std::printf("real bytes: %s the modelled run; %lld copies (%s), %lld whole-entry copies checked by CRC, %lld "
                "partial; storage %lld puts / %lld gets, %lld misses, %lld put failures, %lld wrong bytes; %lld failed "
                "copies; %.1f ms of real copies against %.1f ms modelled (%.1f ms later than the model)\n",
                agrees ? "agrees with" : "DISAGREES with", static_cast<long long>(x.copies),
                format_bytes(x.bytes, units).c_str(), static_cast<long long>(x.verified_copies),
                static_cast<long long>(x.partial_copies), static_cast<long long>(x.storage_puts),
                static_cast<long long>(x.storage_gets), static_cast<long long>(x.storage_misses),
                static_cast<long long>(x.storage_put_failures), static_cast<long long>(x.verify_failures),
                static_cast<long long>(x.failed_copies), x.real_copy_wall_ms, x.modelled_copy_ms, x.late_ms);
    if (!agrees) throw hc::error("--real-bytes: the run with real bytes disagrees with the modelled run");
  }
}

}  // namespace hcbench
