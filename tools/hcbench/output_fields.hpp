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
/// host_hit_tokens were read from, 0 for none, the index in --tiers; ttet_ms: arrival to the
/// last token, ttft_ms + --tpot-ms x (output tokens - 1); then tier<i>_hit_tokens per tier).
inline constexpr const char* tiered_per_request_csv =
    "request,refused,input_tokens,hbm_hit_tokens,host_hit_tokens,bytes_loaded,ttft_ms,source_tier,ttet_ms";
/// What --help says of the columns that follow `tiered_per_request_csv`, one per tier.
inline constexpr const char* tiered_per_request_tier_columns =
    ",tier<i>_hit_tokens,... (one per tier i of --tiers, tier0 = HBM): the request's hit tokens read from that tier "
    "(a lower-tier hit split by the tier each entry was read from; tier0 also holds lower-tier hit tokens still in "
    "HBM), summing to hbm_hit_tokens + host_hit_tokens";

/// replay --json, single tier (replay_report.hpp's to_json).
inline constexpr const char* replay_json =
    "policy, trace, model, capacity_bytes, requests, input_tokens, skipped_tokens, hit_requests, token_hit_rate, "
    "request_hit_rate, flops_saved, ttft_p5_ms, ttft_p50_ms, ttft_p95_ms, ttft_mean_ms, ttft_p95_no_cache_ms, "
    "checkpoints_admitted, checkpoints_reused, checkpoints_evicted, kv_bytes_admitted, evictions, peak_bytes, "
    "refused_commits, alpha (null: none followed), tokenizer, drive, hit_rate_by_input_length [min_tokens, max_tokens, "
    "requests, input_tokens, skipped_tokens, token_hit_rate], capacity_exceeded, wall_seconds, cpu_seconds; "
    "marconi --alpha auto: tuner; with the selector: selector_shadows, selector_switches, selector_followed, "
    "selector_shadow_seconds, selector_shadow_fraction, selector_shadow_nodes, selector_shadow_tokens, "
    "selector_shadow_bytes, selector_sample_rate (1: exact shadows), selector_sampled_requests, "
    "selector_sampling_since (-1: never sampled), selector_guard_reverts (switches back to the first candidate the "
    "baseline guard forced), selector_guard_calibration (sampled shadows: the live cache's FLOPs over the baseline "
    "miniature's before the first switch; 1: not measured, or exact shadows), selector_guard (on, off, or why it stood down: overlap, mismatch), "
    "selector_guard_suspended_at (requests observed when it stood down; -1: it did not), selector_candidates [candidate, shadow_flops_saved]; command, version, date";

/// replay --tiers --json (replay_tiered.cpp).
inline constexpr const char* tiered_json =
    "policy, tiers (as given), model, tier_links [tier, kind, location, capacity_bytes, link_gbps, link_gbps_source, "
    "latency_us, latency_source, probe_write_gbps, probe_read_gbps, probe_method, probe_round_trip_us, "
    "probe_set_gbps, probe_get_gbps, probe_bytes], alpha (marconi; with the selector the followed candidate's, null when it has none), requests, input_tokens, skipped_tokens, "
    "token_hit_rate, hbm_hit_tokens, host_hit_tokens (every tier below HBM), hit_tokens_by_tier [tier, name, hit_tokens] "
    "(each hit split by the tier each entry was read from; hbm: hbm_hit_tokens and lower-tier hit tokens still in HBM), recomputed_hit_tokens, recompute_instead_of_reload, "
    "bytes_loaded, bytes_offloaded, bytes_saved_by_sparsify, prefetches, prefetches_declined_for_room, ttft_p50_ms, "
    "ttft_p95_ms, pipeline_hidden_fraction, load_hidden_fraction, utilization, single_tier_token_hit_rate, "
    "single_tier_ttft_p50_ms, single_tier_ttft_p95_ms, ttft_p50_reduction, service_p50_ms, "
    "single_tier_service_p50_ms, single_tier_utilization, prefill_engines, arrival_scale, prefill_time, "
    "split_load_recompute, prefill_engines_auto, arrivals, saturated, single_tier_saturated, flops_saved, "
    "single_tier_flops_saved, write_policy, write_backs, replicas, clean_drops, joined_loads, copies, "
    "dropped_entries, stall_ms, refused, single_tier_refused, layerwise, cascades, copy_failures, decode, tpot_ms, "
    "length_predictor, ttet_p50_ms, ttet_p95_ms, ttet_mean_ms, single_tier_ttet_p50_ms, single_tier_ttet_p95_ms, "
    "single_tier_ttet_mean_ms, output_length_mae_tokens (the length predictor's mean absolute error); with the "
    "selector: selector_shadow_seconds, selector_shadow_bytes, selector_switches, selector_tier_aware, "
    "single_tier_selector_shadow_seconds, single_tier_selector_switches, selector_guard_reverts, "
    "selector_guard, single_tier_selector_guard (on, off, overlap, mismatch), selector_guard_suspended_at, "
    "single_tier_selector_guard_suspended_at (-1: the guard did not stand down), "
    "selector_followed, "
    "single_tier_selector_followed (--candidates syntax); --real-bytes: real_bytes [agrees, "
    "hbm_hit_tokens, host_hit_tokens, bytes_loaded, copies, bytes, verified_copies, partial_copies, storage_puts, "
    "storage_gets, storage_misses, storage_put_failures, verify_failures, failed_copies, real_copy_wall_ms, "
    "modelled_copy_ms, late_ms]; tokenizer, command, version, date";

/// alloc --json (cmd_alloc.cpp's json_of; definitions in sim/alloc_replay.hpp's header).
/// time_to_first_oom_ticks is null without an OOM; rebalance_batch, threshold_low,
/// threshold_high and rebalance_interval are the rebalancer the variant ran with (null for a
/// variant without one).
inline constexpr const char* alloc_json =
    "workload, model, capacity_bytes, variant, seed, submitted, oom_events, completed, completion, "
    "completed_reference, completion_reference, evicted, eviction_events, rebalances, bytes_migrated, bytes_wasted, "
    "padding_bytes_peak, compactions, fragmentation_mean, fragmentation_peak, external_fragmentation_mean, "
    "peak_reserved_bytes, kv_bytes_end, ssm_bytes_end, allocate_calls, growth_events, replay_ticks, "
    "goodput_per_ktick, goodput_requests_per_second, batch_size_p50, time_to_first_oom_ticks, calls_served_directly, "
    "calls_served_after_eviction, calls_served_after_rebalance, service_seconds, oom_retry_seconds, migration_seconds, "
    "idle_seconds, wall_seconds, rebalance_batch, threshold_low, threshold_high, rebalance_interval; command, version, "
    "date";

/// alloc --sweep's alloc_sweep.csv: one row per cell, the --json keys but the provenance (an
/// empty time_to_first_oom_ticks: no OOM; empty rebalancer columns: no rebalancer).
inline constexpr const char* alloc_sweep_csv =
    "workload,model,capacity_bytes,seed,variant,submitted,oom_events,completed,completion,completed_reference,"
    "completion_reference,evicted,eviction_events,rebalances,bytes_migrated,bytes_wasted,padding_bytes_peak,compactions,"
    "fragmentation_mean,fragmentation_peak,external_fragmentation_mean,peak_reserved_bytes,kv_bytes_end,"
    "ssm_bytes_end,replay_ticks,goodput_per_ktick,goodput_requests_per_second,batch_size_p50,time_to_first_oom_ticks,"
    "calls_served_directly,calls_served_after_eviction,calls_served_after_rebalance,service_seconds,oom_retry_seconds,"
    "migration_seconds,idle_seconds,wall_seconds,rebalance_batch,threshold_low,threshold_high,rebalance_interval";

/// alloc --sweep's alloc_sweep_summary.csv: one row per (panel, workload, variant), means over
/// the seeds; *_ci_low / *_ci_high: the bootstrap 95 % interval of the mean (sim/bootstrap.hpp:
/// seeds resampled with replacement 1,000 times, RNG seed 20260520); seeds_with_oom and
/// time_to_first_oom_ticks_mean (over those seeds; empty when none had an OOM).
inline constexpr const char* alloc_summary_csv =
    "panel,workload,variant,seeds,oom_mean,completion_mean,completion_reference_mean,evicted_mean,rebalances_mean,"
    "migrated_mib_mean,fragmentation_mean,peak_reserved_bytes,oom_ci_low,oom_ci_high,completion_ci_low,"
    "completion_ci_high,goodput_per_ktick_mean,goodput_per_ktick_ci_low,goodput_per_ktick_ci_high,batch_size_p50_mean,"
    "batch_size_p50_ci_low,batch_size_p50_ci_high,seeds_with_oom,time_to_first_oom_ticks_mean";

}  // namespace hcbench::fields
