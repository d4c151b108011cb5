// hybridcache/sim/tiered_replay_options.hpp
//
// The knobs (`tiered_replay_options`) and the results (`tiered_replay_result`) of the
// timed multi-tier replay (tiered_replay.hpp), and the arrival times it models. Kept apart
// from the engine so that a caller that only builds options or reads results (the CLI, a
// report) does not compile the replay. The model itself is described in docs/tiered.md.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "hybridcache/compose/adaptive_config.hpp"
#include "hybridcache/model/cost_model.hpp"
#include "hybridcache/model/prefill_time.hpp"
#include "hybridcache/sim/request.hpp"
#include "hybridcache/stores/tiered_state_types.hpp"
#include "hybridcache/tiered/offload_engine.hpp"
#include "hybridcache/tiered/sparsify.hpp"
#include "hybridcache/tiered/tier.hpp"

namespace hybridcache::sim {

/// Queue discipline of the replay (`--scheduler`).
enum class scheduler_kind : std::uint8_t { fcfs, car };
/// Prefetch rule of the replay (`--prefetch`).
enum class prefetch_kind : std::uint8_t { none, deadline, threshold };
/// Sparsification of demoted KV (`--sparsify`).
enum class sparsify_kind : std::uint8_t { off, profile };
/// Where a request's decode runs (`--decode`): on a decode pool of its own (prefill/decode
/// disaggregated, Mooncake's deployment; the prefill engine is free once the first token is
/// out), or on the prefill engine that prefilled it (colocated, CaR's setting: the engine is
/// busy until the last token, so the next dispatch waits on the running requests' decode).
enum class decode_placement : std::uint8_t { disaggregated, colocated };
/// Output-length predictor of the deadline prefetch (`--length-predictor`,
/// tiered/length_predictor.hpp): the running mean, the mean per prompt-length bucket, or the
/// true length (an oracle: the bound a predictor can reach).
enum class length_predictor_kind : std::uint8_t { mean, bucket, oracle };
/// Which scorer orders victims in the tiers below HBM (and the cleaner's HBM walk).
/// `automatic` is LRU. `car` is CaR's score-based replacement (tiered/car_score.hpp): the
/// HBM victims are the prefix cache's `tiered::car_scorer` (the caller passes one), whose
/// board the replay's scheduler events drive (+1 window, +1 dispatch, withdrawn when the
/// generation completes); below HBM and for the cleaner the table's `car_score_demotion`
/// over the same scores, which the replay mirrors onto each node's entries
/// (`tiered::mirror_score`).
enum class demotion_kind : std::uint8_t { automatic, lru, flop_aware, car };

/// Knobs of the tiered replay. The cache policy (admission and HBM eviction: marconi,
/// sglang+, ...) is the caller's: it picks the prefix cache the replay drives.
struct tiered_replay_options {
  /// Tiers, HBM first (`parse_tiers`). One tier = the single-tier baseline.
  std::vector<tiered::tier_config> tiers;
  /// Link bandwidth (GB/s) between HBM and every host/CXL tier (`--link-gbps`) whose spec
  /// gave no `:gbps=`; disk and redis tiers always keep their own (given, measured or
  /// defaulted). nullopt keeps every tier's own `tier_config::link_gbps`. Must be > 0.
  std::optional<double> link_gbps = 50.0;
  scheduler_kind scheduler = scheduler_kind::fcfs;
  prefetch_kind prefetch = prefetch_kind::none;
  sparsify_kind sparsify = sparsify_kind::off;
  demotion_kind demotion = demotion_kind::automatic;
  stores::write_policy write = stores::write_policy::write_back;  ///< `--write-policy`
  std::int32_t write_through_hits = 2;            ///< write_through_selective threshold
  tiered::watermarks marks{};                             ///< the cleaner (asynchronous offload): 90 % / 80 %
  double per_copy_overhead_us = 6.0;   ///< fixed cost of one copy call (anchors: 5-7 µs)
  bool layerwise = true;               ///< layer-wise pipelined loading
  bool recompute_when_faster = true;   ///< decline a lower-tier hit whose load is slower than recomputing it
  /// HBM room for loads, as a fraction of the HBM tier (the cache's budget is the rest);
  /// raised to hold the largest request's KV and checkpoint, at most half of HBM. The
  /// single-tier baseline needs none and keeps all of HBM.
  double staging_fraction = 0.125;
  std::size_t car_window = 8;          ///< CaR shuffled-window size
  std::uint64_t seed = 0x5eedcafe;     ///< CaR shuffle seed
  std::int64_t threshold_tokens = 256; ///< HiCache threshold rule
  std::size_t prefetch_depth = 1;      ///< queued requests (in dispatch order) a prefetch may serve
  /// Time per output token (ms) of decode: a request's last token comes TPOT x (output tokens
  /// - 1) after its first (TTET). Colocated, the deadline prefetch predicts a running
  /// request's end as TPOT x its predicted output length (CaR's rule). Must be finite, >= 0.
  double tpot_ms = 20.0;
  decode_placement decode = decode_placement::disaggregated;
  length_predictor_kind length_predictor = length_predictor_kind::mean;
  /// Multiplies inter-arrival times (1 = the trace's own rate).
  double arrival_time_scale = 1.0;
  /// Requests with identical arrival times are spread evenly over this many seconds
  /// (before scaling): the k-th of n gets + k/n · spread. 0 = off.
  double spread_equal_arrivals_s = 0.0;
  /// Spread requests with identical arrival times evenly up to the next distinct arrival
  /// time (the last bin uses the median bin width). Takes precedence over the above.
  bool spread_to_next_arrival = false;
  /// Prefill engines the queue dispatches to (each runs one prefill at a time and has its
  /// own links). They share the cache (the pooled HBM of the prefill pool). 0: the fewest
  /// that keep a cache-less run of the trace under 90 % busy (`auto_prefill_engines`).
  std::size_t prefill_engines = 0;
  /// Sparsity profile for `sparsify = profile`; empty = CaR's linear 60 % -> 95 %.
  tiered::sparsity_profile profile{};
  tiered::sparsify_options sparsify_opts{};
  /// Keep per-request rows (`tiered_replay_result::per_request`).
  bool keep_per_request = false;
  /// Called once per request dispatched (a progress meter); empty: nothing is called.
  std::function<void()> on_dispatch{};
};

/// What the real-bytes validation mode moved and checked (sim/real_bytes_copy_engine.hpp).
/// All zero in a modelled run.
struct real_bytes_stats {
  std::int64_t copies = 0;                ///< copies whose bytes were moved
  std::int64_t bytes = 0;                 ///< bytes written to their destination
  std::int64_t produced_entries = 0;      ///< entries whose computed bytes were written in HBM
  std::int64_t storage_puts = 0, storage_gets = 0;
  std::int64_t storage_removes = 0;       ///< dead values (their copy dropped, its pages reused) removed
  std::int64_t storage_put_failures = 0;  ///< puts a backend refused (full, unreachable)
  std::int64_t storage_misses = 0;        ///< gets that found no valid value (evicted, corrupt, unreachable)
  std::int64_t verified_copies = 0;       ///< copies of a whole entry whose bytes were checked against its CRC
  std::int64_t partial_copies = 0;        ///< copies of part of an entry (checked by the backend's CRC only)
  std::int64_t verify_failures = 0;       ///< copies whose bytes were not the entry's
  std::int64_t failed_copies = 0;         ///< copies that failed for any of the above (each a miss)
  double real_copy_wall_ms = 0.0;         ///< wall time spent moving real bytes
  double modelled_copy_ms = 0.0;          ///< Σ modelled duration of the same copies
  double late_ms = 0.0;                   ///< Σ max(0, real − modelled) per copy: what a model-paced run would wait
};

/// One request's row (with `keep_per_request`).
struct tiered_request_row {
  std::size_t request = 0;        ///< index in the replayed request list (trace order)
  bool refused = false;           ///< too large to cache even alone: computed from scratch
  std::int64_t input_tokens = 0;
  std::int64_t hbm_hit_tokens = 0;
  std::int64_t host_hit_tokens = 0;
  std::int64_t bytes_loaded = 0;  ///< bytes this request moved over a link (joined loads excluded)
  double ttft_ms = 0.0;
  std::size_t source_tier = 0;    ///< the slowest tier its lower-tier hit read from (0: none)
  double ttet_ms = 0.0;           ///< arrival -> last token: ttft_ms + TPOT x (output tokens - 1)
  /// Its hit tokens by tier (index: tier; 0: hbm_hit_tokens plus lower-tier hit tokens whose KV
  /// was still in HBM), summing to hbm_hit_tokens + host_hit_tokens; empty when refused.
  std::vector<std::int64_t> hit_tokens_by_tier{};
};

/// Results of a tiered replay.
struct tiered_replay_result {
  std::int64_t requests = 0;
  std::int64_t input_tokens = 0;
  std::int64_t hbm_hit_tokens = 0;         ///< reused tokens found in HBM
  std::int64_t host_hit_tokens = 0;        ///< reused tokens loaded from a lower tier
  /// Hit tokens by tier (index: tier), summing to hbm_hit_tokens + host_hit_tokens: each
  /// lower-tier hit split by the tier each of its KV entries is read from
  /// (`stores::tiered_hit::tier_tokens`), so a hit that reads some entries from host and some
  /// from disk counts each part under its tier. Tier 0 holds hbm_hit_tokens plus the
  /// lower-tier hit tokens whose KV was still in HBM (a demoted entry's copy not dropped yet).
  std::vector<std::int64_t> hit_tokens_by_tier;
  std::int64_t recomputed_hit_tokens = 0;  ///< lower-tier hit tokens recomputed (declined or split): recomputing was faster
  std::int64_t bytes_loaded = 0;           ///< lower tier -> HBM, for requests
  std::int64_t bytes_offloaded = 0;        ///< HBM -> lower tiers, and between lower tiers
  std::int64_t bytes_saved_by_sparsify = 0;///< write-back bytes avoided by sparsification
  std::int64_t dropped_blocks = 0;         ///< named entries that left the last tier
  std::int64_t recompute_instead_of_reload = 0;  ///< requests that declined a lower-tier hit
  /// Requests that loaded part of their lower-tier hit and recomputed the rest (a model
  /// without recurrent layers, where the whole load would outlast the compute hiding it).
  std::int64_t split_load_recompute = 0;
  std::int64_t prefetches = 0;             ///< requests whose load started before dispatch
  std::int64_t prefetches_declined_for_room = 0;  ///< prefetches not started: HBM lacked free pages for them beside the request's reservation
  std::int64_t joined_loads = 0;           ///< loads that joined a copy in flight (a prefetch's, another request's)
  std::int64_t copies = 0;                 ///< modelled copy calls
  std::int64_t write_backs = 0;            ///< entries copied down when the cache evicted them
  std::int64_t cascades = 0;               ///< entries moved between lower tiers to make room (host -> disk -> redis)
  std::int64_t copy_failures = 0;          ///< copies the engine reported failed (the store drops that copy)
  std::int64_t replicas = 0;               ///< clean copies made ahead (cleaner, write-through)
  std::int64_t clean_drops = 0;            ///< evictions that dropped a clean HBM copy: no copy
  std::int64_t write_back_waits = 0;       ///< allocations that waited for a write-back
  std::int64_t refused = 0;                ///< requests that could not begin (too large for HBM): not cached
  double flops_saved = 0.0;                ///< prefill FLOPs of every reused prefix (HBM + lower tiers)
  double ttft_p50_ms = 0.0, ttft_p95_ms = 0.0, ttft_mean_ms = 0.0;  ///< incl. queueing and load
  double service_p50_ms = 0.0;             ///< TTFT minus queueing (dispatch -> first token)
  /// Time to the last token (CaR's TTET): TTFT + TPOT x (output tokens - 1), per request.
  double ttet_p50_ms = 0.0, ttet_p95_ms = 0.0, ttet_mean_ms = 0.0;
  /// Mean |predicted - true| output length (tokens) of the length predictor, predicted for
  /// each request at its dispatch from the requests whose decode had ended by then.
  double output_length_mae_tokens = 0.0;
  double load_ms = 0.0;                    ///< Σ modelled load time of the loads requests waited on
  double stall_ms = 0.0;                   ///< Σ time requests waited for write-backs to free HBM
  /// Fraction of demand-load time that layer-wise pipelining hid behind compute (1 when
  /// nothing was loaded).
  double pipeline_hidden_fraction = 1.0;
  /// Fraction of all load time (demand + prefetch) that did not delay a first token.
  double load_hidden_fraction = 1.0;
  double utilization = 0.0;                ///< busy time / (makespan x engines)
  double arrival_time_scale = 1.0;
  std::size_t prefill_engines = 1;
  std::vector<tiered_request_row> per_request;
  real_bytes_stats real{};                 ///< the real-bytes mode's copies (zero when modelled)
  /// The adaptive selector's cost (a scorer with `overhead()`: --policy marconi's shadows;
  /// zeros for a fixed rule): wall time in its shadows, their memory now, its switches, and
  /// whether its shadows modelled the tiers below HBM (compose/adaptive_scorer.hpp).
  double selector_shadow_seconds = 0.0;
  std::int64_t selector_shadow_bytes = 0;
  std::int64_t selector_switches = 0;
  std::int64_t selector_guard_reverts = 0;  ///< switches back to the baseline the guard forced
  compose::guard_state selector_guard = compose::guard_state::off;  ///< the baseline guard: on, off, why it stood down
  std::int64_t selector_guard_suspended_at = -1;  ///< requests observed when it stood down (-1: it did not)
  bool selector_tier_aware = false;
  /// The candidate it followed at the end (compose::candidate_rule's part index and alpha);
  /// nullopt for a fixed rule.
  std::optional<std::size_t> selector_followed_rule;
  double selector_followed_alpha = 0.0;

  /// (hbm_hit_tokens + host_hit_tokens) / input_tokens.
  [[nodiscard]] double token_hit_rate() const noexcept {
    return input_tokens > 0 ? static_cast<double>(hbm_hit_tokens + host_hit_tokens) / static_cast<double>(input_tokens) : 0.0;
  }
  /// A modelled system this busy queues without bound: its TTFTs measure the queue.
  [[nodiscard]] bool saturated() const noexcept { return utilization >= 0.9; }
};

/// The arrival times (ms) the replay uses: the trace's seconds, spread within runs of equal
/// timestamps (`spread_equal_arrivals_s` or `spread_to_next_arrival`), times
/// `arrival_time_scale`. Requests must be in arrival order. O(n log n).
[[nodiscard]] inline std::vector<double> modelled_arrivals_ms(std::span<const sim::request> reqs,
                                                              const tiered_replay_options& o) {
  std::vector<double> out(reqs.size());
  double last_width = o.spread_equal_arrivals_s;  // the last run's width in `spread_to_next_arrival` mode
  if (o.spread_to_next_arrival) {
    std::vector<double> gaps;
    for (std::size_t i = 1; i < reqs.size(); ++i)
      if (reqs[i].arrival_s > reqs[i - 1].arrival_s) gaps.push_back(reqs[i].arrival_s - reqs[i - 1].arrival_s);
    std::sort(gaps.begin(), gaps.end());
    last_width = gaps.empty() ? 0.0 : gaps[gaps.size() / 2];
  }
  for (std::size_t i = 0; i < reqs.size();) {
    std::size_t j = i;
    while (j < reqs.size() && reqs[j].arrival_s == reqs[i].arrival_s) ++j;
    // Never past the next distinct timestamp: arrivals stay in trace order.
    const double gap = j < reqs.size() ? std::max(0.0, reqs[j].arrival_s - reqs[i].arrival_s) : last_width;
    double width = o.spread_to_next_arrival ? gap : o.spread_equal_arrivals_s;
    if (j < reqs.size()) width = std::min(width, gap);
    for (std::size_t k = i; k < j; ++k) {
      const double off = width * static_cast<double>(k - i) / static_cast<double>(j - i);
      out[k] = (reqs[k].arrival_s + off) * 1000.0 * o.arrival_time_scale;
    }
    i = j;
  }
  return out;
}

/// The fewest prefill engines that keep a cache-less run of `reqs` under `busy` (0.9) of
/// their time: ceil(Σ prefill time (+ decode time, colocated) / (busy · span of the
/// arrivals)), at least 1. A cache
/// only lowers the work, so the replay with this many engines is below `busy` too.
template <prefill_time_model Prefill>
[[nodiscard]] std::size_t auto_prefill_engines(std::span<const sim::request> reqs, const tiered_replay_options& o,
                                               const Prefill& prefill, double busy = 0.9) {
  if (reqs.empty()) return 1;
  const std::vector<double> at = modelled_arrivals_ms(reqs, o);
  double work = 0.0;
  for (const auto& q : reqs) work += prefill_ms_after(prefill, std::int64_t{0}, q.input_tokens);
  // Colocated, an engine also decodes: TPOT per output token after the first.
  if (o.decode == decode_placement::colocated)
    for (const auto& q : reqs) work += o.tpot_ms * static_cast<double>(std::max<std::int64_t>(q.output_tokens - 1, 0));
  const double span = std::max(at.back() - at.front(), 1.0);
  return static_cast<std::size_t>(std::clamp(std::ceil(work / (busy * span)), 1.0, 4096.0));
}

}  // namespace hybridcache::sim
