// hybridcache/sim/tiered_replay_options.hpp
//
// The knobs (`tiered_replay_options`) and the results (`tiered_replay_result`) of the
// tiered timeline replay (tiered_replay.hpp), and the arrival times it models. Kept apart
// from the engine so that a caller that only builds options or reads results (the CLI, a
// report) does not compile the replay. The model itself is described in docs/replay.md.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "hybridcache/sim/request.hpp"
#include "hybridcache/tiered/offload_engine.hpp"
#include "hybridcache/tiered/sparsify.hpp"
#include "hybridcache/tiered/tier.hpp"

namespace hybridcache::tiered {


/// Queue discipline of the replay (`--scheduler`).
enum class scheduler_kind : std::uint8_t { fcfs, car };
/// Prefetch rule of the replay (`--prefetch`).
enum class prefetch_kind : std::uint8_t { none, deadline, threshold };
/// Sparsification of demoted KV (`--sparsify`).
enum class sparsify_kind : std::uint8_t { off, profile };
/// Which scorer orders demotion victims. `automatic`: CaR's score with the CaR scheduler,
/// LRU otherwise.
enum class demotion_kind : std::uint8_t { automatic, lru, car_score, flop_aware };

/// Knobs of the tiered replay. The first five are the CLI's (`--tiers`, `--link-gbps`,
/// `--scheduler`, `--prefetch`, `--sparsify`); the rest have defaults.
struct tiered_replay_options {
  /// Tiers, HBM first (`parse_tiers`). One tier = the single-tier baseline.
  std::vector<tier_config> tiers;
  /// Link bandwidth (GB/s) between HBM and every lower tier (`--link-gbps`); nullopt keeps
  /// each tier's own `tier_config::link_gbps` (e.g. a slower CXL tier). Must be > 0.
  std::optional<double> link_gbps = 50.0;
  scheduler_kind scheduler = scheduler_kind::fcfs;
  prefetch_kind prefetch = prefetch_kind::none;
  sparsify_kind sparsify = sparsify_kind::off;

  demotion_kind demotion = demotion_kind::automatic;
  double per_copy_overhead_us = 6.0;   ///< fixed cost of one copy call (anchors: 5-7 µs)
  bool layerwise = true;               ///< layer-wise pipelined loading
  bool recompute_when_faster = true;   ///< recompute instead of reload when that is faster
  /// With `recompute_when_faster`: also consider resuming at any block boundary inside the
  /// match (load the blocks before it, prefill from there: more compute to hide a shorter
  /// load behind), not only all-or-nothing. Cake's "compute or load? both" split, at block
  /// granularity; for hybrid models the resume point is that block's checkpoint.
  bool split_load_recompute = true;
  watermarks marks{};                  ///< async offload thresholds (90 % / 80 %)
  std::int64_t page_bytes = std::int64_t{2} << 20;  ///< allocation unit of every tier
  std::size_t car_window = 8;          ///< CaR shuffled-window size
  std::uint64_t seed = 0x5eedcafe;     ///< CaR shuffle seed
  std::int64_t threshold_tokens = 256; ///< HiCache threshold rule
  std::size_t prefetch_depth = 1;      ///< requests ahead (in dispatch order) a prefetch may serve
  /// Cache block size in tokens: consecutive ids are grouped into blocks of
  /// max(1, block_tokens / tokens_per_id) ids, each identified by a chained hash of the ids
  /// (so token traces, tokens_per_id = 1, get 512-token blocks, and Mooncake's 512-token
  /// ids map one to one). A block's entry holds its KV and, for hybrid models, a checkpoint.
  std::int64_t block_tokens = 512;
  double tpot_ms = 30.0;               ///< decode time per output token (request lifetime for CaR's -2)
  /// Multiplies inter-arrival times (1 = the trace's own rate; > 1 slows arrivals so a
  /// single modelled prefill engine is not overloaded). Reported with the results.
  double arrival_time_scale = 1.0;
  /// Requests with identical arrival times are spread evenly over this many seconds
  /// (before scaling): the k-th of n gets + k/n · spread. 0 = off. The Mooncake trace's
  /// timestamps are milliseconds but sampled every ~3 s (1,180 distinct values for 12,031
  /// requests, consecutive values 3,000 ± 3 ms apart), so with 0 each 3-second bin's
  /// requests arrive in one burst and queue behind each other.
  double spread_equal_arrivals_s = 0.0;
  /// Spread requests with identical arrival times evenly up to the next distinct arrival
  /// time (the bin the trace's sampling put them in; the last bin uses the median bin width).
  /// Takes precedence over `spread_equal_arrivals_s`.
  bool spread_to_next_arrival = false;
  /// Prefill engines the queue dispatches to (each runs one prefill at a time and has its
  /// own onboard link). They share the tiered cache: the HBM tier is the prefill pool's
  /// pooled HBM, as in a cluster whose router sends a request where its prefix is (the
  /// Mooncake trace is one hour of a whole cluster's traffic). A block that a running
  /// prefill is still computing is not a hit for a concurrent request (it recomputes it, as
  /// SGLang's and vLLM's caches do: blocks are published when their prefill is done).
  std::size_t prefill_engines = 1;
  /// Sparsity profile for `sparsify = profile`; empty = CaR's linear 60 % -> 95 %.
  sparsity_profile profile{};
  sparsify_options sparsify_opts{};
};

/// Results of a tiered replay.
struct tiered_replay_result {
  std::int64_t requests = 0;
  std::int64_t input_tokens = 0;
  std::int64_t hbm_hit_tokens = 0;         ///< matched tokens found in HBM
  std::int64_t host_hit_tokens = 0;        ///< matched tokens loaded from a lower tier
  std::int64_t recomputed_hit_tokens = 0;  ///< lower-tier hits recomputed instead (faster)
  std::int64_t bytes_loaded = 0;           ///< lower tier -> HBM
  std::int64_t bytes_offloaded = 0;        ///< HBM -> lower tiers (and between lower tiers)
  std::int64_t bytes_saved_by_sparsify = 0;///< offloaded bytes avoided by sparsification
  std::int64_t dropped_blocks = 0;         ///< left the last tier
  std::int64_t recompute_instead_of_reload = 0;  ///< requests that recomputed a lower-tier hit
  std::int64_t split_load_recompute = 0;   ///< of those, requests that also loaded part of it
  std::int64_t prefetches = 0;             ///< requests whose load started before dispatch
  std::int64_t copies = 0;                 ///< modelled copy calls (runs × layers)
  double ttft_p50_ms = 0.0, ttft_p95_ms = 0.0, ttft_mean_ms = 0.0;  ///< incl. queueing and load
  double service_p50_ms = 0.0;             ///< TTFT minus queueing (dispatch -> first token)
  double load_ms = 0.0;                    ///< Σ modelled load time of reloads
  /// Fraction of demand-load time (loads issued at dispatch, reload chosen) that layer-wise
  /// pipelining hid behind compute. 1 when nothing was loaded on demand.
  double pipeline_hidden_fraction = 1.0;
  /// Fraction of all load time (demand + prefetch) that did not delay a first token.
  double load_hidden_fraction = 1.0;
  double utilization = 0.0;                ///< busy time / makespan of the prefill engine
  double arrival_time_scale = 1.0;

  /// (hbm_hit_tokens + host_hit_tokens) / input_tokens.
  [[nodiscard]] double token_hit_rate() const noexcept {
    return input_tokens > 0 ? static_cast<double>(hbm_hit_tokens + host_hit_tokens) / static_cast<double>(input_tokens) : 0.0;
  }
};

/// The arrival times (ms) the replay uses: the trace's seconds, spread within runs of equal
/// timestamps (`spread_equal_arrivals_s` or `spread_to_next_arrival`), times
/// `arrival_time_scale`. Requests must be in arrival order. O(n log n).
[[nodiscard]] inline std::vector<double> modelled_arrivals_ms(std::span<const sim::request> reqs,
                                                              const tiered_replay_options& o) {
  std::vector<double> out(reqs.size());
  // Bin width for the last run in `spread_to_next_arrival` mode: the median gap.
  double last_width = o.spread_equal_arrivals_s;
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
    // Never past the next distinct timestamp: arrivals stay in trace order (the replay
    // admits them in that order).
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

}  // namespace hybridcache::tiered
