// tools/hcbench/tiered_flags.hpp
//
// The `--tiers` mode's flag values, parsed: scheduler, prefetch, sparsify and demotion
// names, and the options built from the CLI's strings. CLI only (the library takes the
// enums of sim/tiered_replay_options.hpp). Each parser is O(length) and throws
// `invalid_argument` naming the flag and listing the valid values.
#pragma once

#include <string>
#include <string_view>

#include <hybridcache/core/error.hpp>
#include <hybridcache/sim/tiered_replay_options.hpp>
#include <hybridcache/tiered/tier.hpp>

namespace hcbench {

using hybridcache::invalid_argument;
using hybridcache::tiered::demotion_kind;
using hybridcache::tiered::parse_tiers;
using hybridcache::tiered::prefetch_kind;
using hybridcache::tiered::scheduler_kind;
using hybridcache::tiered::sparsify_kind;
using hybridcache::tiered::tiered_replay_options;

/// Parses `fcfs` / `car`. @throws invalid_argument listing the valid names.
[[nodiscard]] inline scheduler_kind parse_scheduler(std::string_view s) {
  if (s == "fcfs") return scheduler_kind::fcfs;
  if (s == "car") return scheduler_kind::car;
  throw invalid_argument("--scheduler: unknown value '" + std::string(s) + "' (fcfs, car)");
}
/// Parses `none` / `deadline` / `threshold`. @throws invalid_argument.
[[nodiscard]] inline prefetch_kind parse_prefetch(std::string_view s) {
  if (s == "none") return prefetch_kind::none;
  if (s == "deadline") return prefetch_kind::deadline;
  if (s == "threshold") return prefetch_kind::threshold;
  throw invalid_argument("--prefetch: unknown value '" + std::string(s) + "' (none, deadline, threshold)");
}
/// Parses `off` / `profile`. @throws invalid_argument.
[[nodiscard]] inline sparsify_kind parse_sparsify(std::string_view s) {
  if (s == "off") return sparsify_kind::off;
  if (s == "profile") return sparsify_kind::profile;
  throw invalid_argument("--sparsify: unknown value '" + std::string(s) + "' (off, profile)");
}
/// Parses `auto` / `lru` / `car` / `flop`. @throws invalid_argument.
[[nodiscard]] inline demotion_kind parse_demotion(std::string_view s) {
  if (s == "auto") return demotion_kind::automatic;
  if (s == "lru") return demotion_kind::lru;
  if (s == "car") return demotion_kind::car_score;
  if (s == "flop") return demotion_kind::flop_aware;
  throw invalid_argument("--demotion: unknown value '" + std::string(s) + "' (auto, lru, car, flop)");
}

/// Builds the options from the CLI's strings in one call (`--tiers hbm=BYTES,host=BYTES
/// [--link-gbps 50] [--scheduler fcfs|car] [--prefetch none|deadline|threshold]
/// [--sparsify off|profile]`), every value validated; the other knobs keep their defaults.
/// @throws invalid_argument naming the option (zero or sub-page tier sizes, bandwidth <= 0,
///         unknown names).
[[nodiscard]] inline tiered_replay_options make_tiered_replay_options(std::string_view tiers, double link_gbps = 50.0,
                                                                      std::string_view scheduler = "fcfs",
                                                                      std::string_view prefetch = "none",
                                                                      std::string_view sparsify = "off") {
  tiered_replay_options o;
  o.tiers = parse_tiers(tiers, o.page_bytes, link_gbps);
  o.link_gbps = link_gbps;
  o.scheduler = parse_scheduler(scheduler);
  o.prefetch = parse_prefetch(prefetch);
  o.sparsify = parse_sparsify(sparsify);
  return o;
}

}  // namespace hcbench
