// tools/hcbench/output_fields.hpp
//
// The columns and keys of every file replay and compare write, in one place: the writers take
// their CSV headers from here and --help lists them from here, so the help cannot name a
// column a file lacks (tools.cli.robustness checks every key of a real --json object and every
// CSV column against --help).
#pragma once

namespace hcbench::fields {

/// compare's results.csv (csv_row in replay_report.hpp writes them in this order). Sizes in
/// exact bytes, rates as fractions, times in ms or s as named; an empty alpha: none followed;
/// followed: the selector's candidate at the end in --candidates syntax (empty without one).
inline constexpr const char* compare_csv =
    "trace,model,policy,capacity_bytes,requests,input_tokens,skipped_tokens,token_hit_rate,request_hit_rate,"
    "flops_saved,ttft_p5_ms,ttft_p50_ms,ttft_p95_ms,ttft_p95_no_cache_ms,checkpoints_admitted,checkpoints_reused,"
    "checkpoints_evicted,kv_bytes_admitted,evictions,alpha,wall_seconds,cpu_seconds,followed";

/// replay --per-request, single tier: one row per request in replay order.
inline constexpr const char* per_request_csv = "request,input_tokens,skipped_tokens";

/// replay --tiers --per-request: one row per request in dispatch order (`request`: its index in
/// the trace; refused: 1 when it could not be cached at all; source_tier: the slowest tier its
/// host_hit_tokens were read from, 0 for none, the index in --tiers).
inline constexpr const char* tiered_per_request_csv =
    "request,refused,input_tokens,hbm_hit_tokens,host_hit_tokens,bytes_loaded,ttft_ms,source_tier";

/// replay --json, single tier (replay_report.hpp's to_json).
inline constexpr const char* replay_json =
    "policy, trace, model, capacity_bytes, requests, input_tokens, skipped_tokens, hit_requests, token_hit_rate, "
    "request_hit_rate, flops_saved, ttft_p5_ms, ttft_p50_ms, ttft_p95_ms, ttft_mean_ms, ttft_p95_no_cache_ms, "
    "checkpoints_admitted, checkpoints_reused, checkpoints_evicted, kv_bytes_admitted, evictions, peak_bytes, "
    "refused_commits, alpha (null: none followed), tokenizer, drive, hit_rate_by_input_length [min_tokens, max_tokens, "
    "requests, input_tokens, skipped_tokens, token_hit_rate], capacity_exceeded, wall_seconds, cpu_seconds; "
    "marconi --alpha auto: tuner; with the selector: selector_shadows, selector_switches, selector_followed, "
    "selector_shadow_seconds, selector_shadow_fraction, selector_shadow_nodes, selector_shadow_tokens, "
    "selector_shadow_bytes, selector_candidates [candidate, shadow_flops_saved]; command, version, date";

/// replay --tiers --json (replay_tiered.cpp).
inline constexpr const char* tiered_json =
    "policy, tiers (as given), model, tier_links [tier, kind, location, capacity_bytes, link_gbps, link_gbps_source, "
    "latency_us, latency_source, probe_write_gbps, probe_read_gbps, probe_method, probe_round_trip_us, "
    "probe_set_gbps, probe_get_gbps, probe_bytes], alpha (marconi; with the selector the followed candidate's, null when it has none), requests, input_tokens, skipped_tokens, "
    "token_hit_rate, hbm_hit_tokens, host_hit_tokens (every tier below HBM), hit_tokens_by_tier [tier, name, hit_tokens] "
    "(a hit under the slowest tier it read from), recomputed_hit_tokens, recompute_instead_of_reload, "
    "bytes_loaded, bytes_offloaded, bytes_saved_by_sparsify, prefetches, prefetches_declined_for_room, ttft_p50_ms, "
    "ttft_p95_ms, pipeline_hidden_fraction, load_hidden_fraction, utilization, single_tier_token_hit_rate, "
    "single_tier_ttft_p50_ms, single_tier_ttft_p95_ms, ttft_p50_reduction, service_p50_ms, "
    "single_tier_service_p50_ms, single_tier_utilization, prefill_engines, arrival_scale, prefill_time, "
    "split_load_recompute, prefill_engines_auto, arrivals, saturated, single_tier_saturated, flops_saved, "
    "single_tier_flops_saved, write_policy, write_backs, replicas, clean_drops, joined_loads, copies, "
    "dropped_entries, stall_ms, refused, single_tier_refused, layerwise, cascades, copy_failures; with the "
    "selector: selector_shadow_seconds, selector_shadow_bytes, selector_switches, selector_tier_aware, "
    "single_tier_selector_shadow_seconds, single_tier_selector_switches, selector_followed, "
    "single_tier_selector_followed (--candidates syntax); --real-bytes: real_bytes [agrees, "
    "hbm_hit_tokens, host_hit_tokens, bytes_loaded, copies, bytes, verified_copies, partial_copies, storage_puts, "
    "storage_gets, storage_misses, storage_put_failures, verify_failures, failed_copies, real_copy_wall_ms, "
    "modelled_copy_ms, late_ms]; tokenizer, command, version, date";

}  // namespace hcbench::fields
