// `hcbench replay ... --tiers hbm=BYTES,host=BYTES`: the multi-tier (CaR) timeline replay.
//
// With --tiers, `hcbench replay` runs `tiered::run_tiered_replay` (include/hybridcache/
// tiered/tiered_replay.hpp) twice over the same requests: with every tier given, and with
// the HBM tier alone (the single-tier baseline), so one command shows what the slower tier
// buys. The cache there is block-granular (512-token blocks, a checkpoint per block for
// hybrid models) with the demotion policy of --demotion; --policy does not apply.
#pragma once

#include <cstdint>
#include <string>

#include "replay_run.hpp"

namespace hcbench {

/// The tiered replay's CLI knobs (strings are validated by the library's parsers).
struct tiered_cli {
  std::string tiers;                 ///< "hbm=BYTES,host=BYTES[,cxl@NODE=BYTES]"; empty = off
  double link_gbps = 50.0;           ///< --link-gbps
  std::string scheduler = "fcfs";    ///< --scheduler fcfs|car
  std::string prefetch = "none";     ///< --prefetch none|deadline|threshold
  std::string sparsify = "off";      ///< --sparsify off|profile
  std::string demotion = "auto";     ///< --demotion auto|lru|car|flop
  double arrival_scale = 1.0;        ///< --arrival-scale: multiplies inter-arrival times
  std::string spread_arrivals = "0"; ///< --spread-arrivals: seconds to spread equal timestamps over, or "next"
  std::int64_t prefill_engines = 1;  ///< --prefill-engines
  std::int64_t prefetch_depth = 1;   ///< --prefetch-depth
  std::string split = "on";          ///< --split-load-recompute on|off
  std::string prefill_time = "flops";///< --prefill-time flops (cost model) | line (Jamba 4xA100 fit)
  double per_copy_us = 6.0;          ///< --per-copy-us
};

/// Loads the trace, runs the tiered and the single-tier replay, prints a table or (json)
/// one JSON object. @throws hybridcache::error for bad options or input.
void run_tiered_replay_command(const std::string& trace, const std::string& format, const std::string& model,
                               std::int64_t mooncake_block, const trace_load_options& load, const tiered_cli& t,
                               bool json);

}  // namespace hcbench
