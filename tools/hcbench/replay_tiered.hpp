// `hcbench replay ... --tiers hbm=BYTES,host=BYTES`: the timed multi-tier replay.
//
// With --tiers, `hcbench replay` runs `sim::run_tiered_replay` (sim/tiered_replay.hpp)
// twice over the same requests, both through the library's prefix cache with the policy
// of --policy (and --alpha, --flop-candidates, --flop-index, --lru-ties): over every tier
// given, and over the HBM tier alone (the single-tier baseline of the same policy), so one
// command shows what the slower tiers buy. With --real-bytes the multi-tier run is repeated
// with a copy engine that moves real bytes (sim/tiered_replay_real_bytes.hpp): memory tiers
// as host arenas, disk tiers through `disk_backend` (values under DIR/hcbench-real-PID,
// removed after), redis tiers through `redis_backend` (keys `hcbench-real-PID:...`); the
// command fails unless its hits and loaded bytes equal the modelled run's.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <hybridcache/compose/adaptive_scorer.hpp>
#include <hybridcache/model/model_spec.hpp>

#include "replay_run.hpp"

namespace hcbench {

/// The tiered replay's CLI knobs (strings are validated by the parsers of tiered_flags.hpp).
struct tiered_cli {
  std::string tiers;                  ///< "hbm=BYTES,host=BYTES[,cxl@NODE=BYTES][,disk@DIR=BYTES][,redis@HOST:PORT=BYTES]"; empty = off
  double link_gbps = 50.0;            ///< --link-gbps
  std::string scheduler = "fcfs";     ///< --scheduler fcfs|car
  std::string prefetch = "none";      ///< --prefetch none|deadline|threshold
  std::string sparsify = "off";       ///< --sparsify off|profile
  std::string demotion = "auto";      ///< --demotion auto|lru|flop
  std::string write_policy = "write-back";  ///< --write-policy
  std::int64_t write_through_hits = 2;      ///< --write-through-hits
  std::string watermarks = "0.9,0.8"; ///< --watermarks HIGH,LOW (the cleaner)
  std::string layerwise = "on";       ///< --layerwise on|off
  std::string recompute = "on";       ///< --recompute-when-faster on|off
  double staging_fraction = 0.125;    ///< --staging-fraction
  double arrival_scale = 1.0;         ///< --arrival-scale: multiplies inter-arrival times
  std::string spread_arrivals = "0";  ///< --spread-arrivals: seconds to spread equal timestamps over, or "next"
  std::string prefill_engines = "auto";  ///< --prefill-engines N | auto
  std::int64_t prefetch_depth = 1;    ///< --prefetch-depth
  std::string prefill_time = "flops"; ///< --prefill-time flops (cost model) | line (Jamba 4xA100 fit)
  double per_copy_us = 6.0;           ///< --per-copy-us
  std::string decode = "disaggregated";  ///< --decode disaggregated|colocated
  double tpot_ms = 20.0;              ///< --tpot-ms: time per output token (TTET; colocated: the deadline rule)
  std::string length_predictor = "mean";  ///< --length-predictor mean|bucket|oracle
  bool real_bytes = false;            ///< --real-bytes: validate the multi-tier run with real bytes
  std::string plot;                   ///< --plot FILE: the SVG (default: next to --per-request's CSV)
};

/// The cache policy of the tiered replay (the same names as the single-tier replay).
struct tiered_policy {
  std::string name = "marconi";       ///< marconi | sglang+ | vllm+ | lru | gdsf
  std::optional<double> alpha;        ///< marconi: a fixed FLOP weight (nullopt: the selector)
  /// marconi --alpha auto: the adaptive selector's settings (compose/adaptive_scorer.hpp)
  std::optional<hybridcache::compose::adaptive_config> selector;
  std::string flop_candidates = "protect-branches";
  std::string flop_index = "bounded";
  bool reference_lru_ties = true;
  std::int64_t vllm_block = 32;       ///< vllm+: checkpoint every this many tokens
};

/// Loads the trace, runs the tiered and the single-tier replay, prints a table or (json)
/// one JSON object; `per_request` (non-empty) gets one CSV row per request of the tiered
/// run. @throws hybridcache::error for bad options or input.
/// `model` is the preset with any --model-attn-ratio / --model-state-dim applied.
void run_tiered_replay_command(const std::string& trace, const std::string& format, const hybridcache::model_spec& model,
                               std::int64_t mooncake_block, const trace_load_options& load, const tiered_cli& t,
                               const tiered_policy& policy, const std::string& per_request, bool json);

}  // namespace hcbench
