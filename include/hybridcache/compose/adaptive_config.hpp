// hybridcache/compose/adaptive_config.hpp
//
// The adaptive selector's options and report (compose/adaptive_scorer.hpp has the selector
// and its file comment says what each option does): `candidate_rule`,
// `shadow_sampling_config`, `adaptive_config`, the measured constants, `guard_state`,
// `adaptive_overhead`, `default_candidates()`. Standard library only, so a report type (the
// tiered replay's result) can carry them without the selector.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace hybridcache::compose {

/// One candidate of the adaptive selector: a part of the switching scorer and, for a part
/// with a FLOP weight, its alpha.
struct candidate_rule {
  std::size_t rule = 0;  ///< index of the part (lru_flop_gdsf: 0 LRU, 1 FLOP-aware, 2 GDSF)
  double alpha = 0.0;    ///< FLOP weight, for parts with set_alpha (ignored otherwise)
};

/// Sampled shadows (see adaptive_scorer.hpp's file comment and compose/detail/shadow_sampling.hpp).
struct shadow_sampling_config {
  /// R in (0, 1]: the fraction of conversations the sampled shadows see, each with the live
  /// capacity x R. 1: exact shadows only (bit for bit what the selector did before sampling).
  double rate = 1.0;
  /// Leading ids of a request that name its conversation (>= 1); see adaptive_scorer.hpp's file comment.
  std::int64_t key_ids = 2;
  /// Sample only once R x (conversations the live capacity holds, estimated) reaches this
  /// (>= 0); until then the exact shadows decide and the sampled ones warm up beside them.
  /// 0: sampled shadows only, from the first request.
  double min_sampled_conversations = 0.0;
};

/// The baseline guard's measured slack (`adaptive_config::baseline_slack`'s default).
inline constexpr double recommended_baseline_slack = 0.02;
/// The part of a candidate's decayed score over the baseline's that the guard does not count
/// toward its budget: leads of a few per cent are what the rules' noise and a switch's
/// reshaping of the cache cost, so only a lead beyond 5 % buys a switch the guard's sums do not
/// cover (docs/prefix-cache.md, "The baseline guard").
inline constexpr double guard_lead_margin = 0.05;

/// Options of `adaptive_scorer` (aggregate; checked by its constructor).
struct adaptive_config {
  /// One shadow per entry; the first is followed until another leads. Empty: the library's
  /// set for `lru_flop_gdsf_scorer` (default_candidates()).
  std::vector<candidate_rule> candidates{};
  /// Per request, in (0, 1]: weight of older requests' FLOPs. Unset: `single_tier_decay`
  /// with single-tier shadows, `tier_aware_decay` with tier-aware ones (see adaptive_scorer.hpp's file comment).
  std::optional<double> decay{};
  double switch_margin = 0.02;  ///< the leader must beat the followed score by this fraction
  /// ... and its decayed lead over the followed candidate, summed per request, must exceed
  /// `confidence` standard deviations of those per-request differences (a paired test:
  /// requests that every shadow serves alike add nothing, so one lucky hit does not switch).
  double confidence = 0.5;
  std::int64_t min_dwell = 0;  ///< requests between two switches (>= 0)
  /// Tokens each id of the request stream stands for (1 for token ids; a block-hash trace's
  /// block size), so that a shadow's hit is scored in the FLOPs of its real tokens.
  std::int64_t tokens_per_id = 1;
  /// What the shadows model below HBM. Unset: the live store's tiers (a tiered store with
  /// a tier below HBM gets tier-aware shadows, any other store single-tier ones). 0:
  /// single-tier shadows of the HBM budget whatever the store.
  /// > 0: tier-aware shadows whose first tier below HBM holds this many bytes (the live
  /// store must have one: invalid_argument at attach_store otherwise). < 0: invalid_argument.
  std::optional<std::int64_t> shadow_host_capacity_bytes{};
  /// Sampled shadows: rate, conversation key, floor. The default (rate 1) is exact.
  shadow_sampling_config sampling{};
  /// The baseline guard (conservative switching; see adaptive_scorer.hpp's file comment), in [0, 1): the live
  /// cache's FLOPs saved, summed over the requests observed, is kept at or above (1 - this) x
  /// the first candidate's shadow's over the same requests. It stands down for good where
  /// the two stop comparing (`guard_state`: requests in flight together, or a baseline shadow
  /// that disagrees with the live cache before the first switch). With sampled shadows it
  /// compares the live cache with the baseline's miniature on the sampled requests, scaled by
  /// what the live cache saved over that miniature while it followed the baseline before the
  /// first switch (`adaptive_overhead::guard_calibration`): a miniature cache saves less than
  /// the live cache on the same rule (docs/prefix-cache.md, "The baseline guard"). Unset: no guard.
  std::optional<double> baseline_slack = recommended_baseline_slack;
};

/// The selector's default decays (`adaptive_config::decay` unset): single-tier shadows
/// (half-life ~140 requests) and tier-aware ones (~1,400 requests).
inline constexpr double single_tier_decay = 0.995;
inline constexpr double tier_aware_decay = 0.9995;

/// Where the baseline guard stands (`adaptive_overhead::guard`). It stands down for good when
/// the live cache's hits stop being comparable with the baseline shadow's: `overlap`, another
/// request was in flight between a request's match and its insert (the cache passed a
/// negative live hit); `mismatch`, before the first switch the exact baseline shadow found
/// another hit than the live cache on the same rule (it does not model the live store).
enum class guard_state : std::uint8_t { off, on, overlap, mismatch };

[[nodiscard]] constexpr const char* to_string(guard_state g) noexcept {
  switch (g) {
    case guard_state::off: return "off";
    case guard_state::on: return "on";
    case guard_state::overlap: return "overlap";
    case guard_state::mismatch: return "mismatch";
  }
  return "?";
}

/// What the selector costs and did (`adaptive_scorer::overhead()`).
struct adaptive_overhead {
  std::int64_t requests = 0;       ///< requests observed (each replayed on every shadow)
  std::int64_t switches = 0;       ///< times the live cache changed rule
  std::size_t followed = 0;        ///< the candidate followed now
  std::size_t shadows = 0;         ///< shadow caches
  double shadow_seconds = 0.0;     ///< wall time spent replaying requests on the shadows
  bool tier_aware = false;         ///< the shadows model the tiers below HBM
  std::int64_t shadow_nodes = 0;   ///< tree nodes the shadows hold now
  std::int64_t shadow_tokens = 0;  ///< token ids the shadows hold now
  /// The shadows' memory now, in heap bytes: each shadow cache's object and its
  /// prefix_cache::memory_bytes (tree slots with their token buffers, child table, scorer
  /// index, scratch), the lower tiers' entries of tier-aware shadows (~64 B each, estimated)
  /// and the warm-up's conversation estimate. Capacities, not the allocator's own overhead.
  std::int64_t shadow_bytes = 0;
  double sample_rate = 1.0;            ///< the shadows' sampling rate now (1: exact)
  std::int64_t sampled_requests = 0;   ///< requests the sampled shadows replayed
  std::int64_t sampling_since = -1;    ///< request count when sampling took over (-1: not yet)
  /// The baseline guard: FLOPs the live cache saved on the requests it counts, what the
  /// baseline's shadow saved on them (sampled shadows: the sampled requests, unscaled), and the
  /// switches back to the baseline it forced (counted in `switches` too); whether it is on, off
  /// or stood down (and at which request count; -1: it did not).
  double live_flops = 0.0;
  double baseline_flops = 0.0;
  std::int64_t guard_reverts = 0;
  /// Sampled shadows: the live cache's FLOPs saved over the baseline miniature's on the sampled
  /// requests before the first switch; the guard compares the live cache with the miniature
  /// x this (1 until measured, and with exact shadows).
  double guard_calibration = 1.0;
  guard_state guard = guard_state::off;
  std::int64_t guard_suspended_at = -1;
};

/// The library's candidates over `lru_flop_gdsf_scorer`: SGLang+'s rule first (the
/// baseline, followed from the start), Marconi's FLOP-aware rule at alpha 0, 0.5, 1, 2, GDSF.
[[nodiscard]] inline std::vector<candidate_rule> default_candidates() {
  return {{0, 0.0}, {1, 0.0}, {1, 0.5}, {1, 1.0}, {1, 2.0}, {2, 0.0}};
}

}  // namespace hybridcache::compose
