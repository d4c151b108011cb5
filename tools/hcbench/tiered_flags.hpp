// tools/hcbench/tiered_flags.hpp
//
// The `--tiers` mode's flag values, parsed: scheduler, prefetch, sparsify, demotion and
// write-policy names, on/off switches, watermarks, and the options built from the CLI's
// strings. CLI only (the library takes the enums of sim/tiered_replay_options.hpp). Each
// parser is O(length) and throws `invalid_argument` naming the flag and listing the valid
// values.
#pragma once

#include <cmath>
#include <string>
#include <string_view>

#include <hybridcache/core/error.hpp>
#include <hybridcache/sim/tiered_replay_options.hpp>
#include <hybridcache/tiered/tier.hpp>

namespace hcbench {

using hybridcache::invalid_argument;
using hybridcache::sim::decode_placement;
using hybridcache::sim::demotion_kind;
using hybridcache::sim::length_predictor_kind;
using hybridcache::tiered::parse_tiers;
using hybridcache::sim::prefetch_kind;
using hybridcache::sim::scheduler_kind;
using hybridcache::sim::sparsify_kind;
using hybridcache::sim::tiered_replay_options;
using hybridcache::stores::write_policy;

/// The options of the multi-tier replay (`replay --tiers`) only: replay refuses them without
/// --tiers, compare always. `--real-bytes` is the one flag among them.
inline constexpr const char* tiered_only_options[] = {
    "--link-gbps",  "--scheduler",        "--prefetch",     "--sparsify",        "--demotion",
    "--write-policy", "--write-through-hits", "--watermarks", "--layerwise",      "--recompute-when-faster",
    "--staging-fraction", "--arrival-scale", "--spread-arrivals", "--prefill-engines", "--prefetch-depth",
    "--prefill-time", "--per-copy-us",    "--plot",            "--real-bytes",      "--decode",
    "--tpot-ms",      "--length-predictor"};
inline constexpr std::string_view tiered_only_flag = "--real-bytes";

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
/// Parses `auto` / `lru` / `flop` / `car` (CaR's score-based replacement: the HBM victims
/// by the score the scheduler's events drive, tiered/car_score.hpp). @throws invalid_argument.
[[nodiscard]] inline demotion_kind parse_demotion(std::string_view s) {
  if (s == "auto" || s == "lru") return s == "auto" ? demotion_kind::automatic : demotion_kind::lru;
  if (s == "flop") return demotion_kind::flop_aware;
  if (s == "car") return demotion_kind::car;
  throw invalid_argument("--demotion: unknown value '" + std::string(s) + "' (auto, lru, flop, car)");
}
/// Parses `disaggregated` / `colocated` (--decode). @throws invalid_argument.
[[nodiscard]] inline decode_placement parse_decode(std::string_view s) {
  if (s == "disaggregated") return decode_placement::disaggregated;
  if (s == "colocated") return decode_placement::colocated;
  throw invalid_argument("--decode: unknown value '" + std::string(s) + "' (disaggregated, colocated)");
}
/// Parses `mean` / `bucket` / `oracle` (--length-predictor). @throws invalid_argument.
[[nodiscard]] inline length_predictor_kind parse_length_predictor(std::string_view s) {
  if (s == "mean") return length_predictor_kind::mean;
  if (s == "bucket") return length_predictor_kind::bucket;
  if (s == "oracle") return length_predictor_kind::oracle;
  throw invalid_argument("--length-predictor: unknown value '" + std::string(s) + "' (mean, bucket, oracle)");
}
/// Parses `write-back` / `write-through` / `write-through-selective`. @throws invalid_argument.
[[nodiscard]] inline write_policy parse_write_policy(std::string_view s) {
  if (s == "write-back") return write_policy::write_back;
  if (s == "write-through") return write_policy::write_through;
  if (s == "write-through-selective") return write_policy::write_through_selective;
  throw invalid_argument("--write-policy: unknown value '" + std::string(s) +
                         "' (write-back, write-through, write-through-selective)");
}
/// Parses `on` / `off` for `flag`. @throws invalid_argument.
[[nodiscard]] inline bool parse_on_off(std::string_view s, std::string_view flag) {
  if (s == "on") return true;
  if (s == "off") return false;
  throw invalid_argument(std::string(flag) + ": unknown value '" + std::string(s) + "' (on, off)");
}
/// Parses `HIGH,LOW` watermarks (fractions, 0 <= low < high <= 1). @throws invalid_argument.
[[nodiscard]] inline hybridcache::tiered::watermarks parse_watermarks(const std::string& s) {
  const auto comma = s.find(',');
  hybridcache::tiered::watermarks w;
  try {
    std::size_t a = 0, b = 0;
    if (comma == std::string::npos) throw invalid_argument("");
    w.high = std::stod(s.substr(0, comma), &a);
    w.low = std::stod(s.substr(comma + 1), &b);
    if (a != comma || b != s.size() - comma - 1) throw invalid_argument("");
    w.validate();
  } catch (const std::exception&) {
    throw invalid_argument("--watermarks: expected HIGH,LOW with 0 <= LOW < HIGH <= 1 (e.g. 0.9,0.8), got '" + s + "'");
  }
  return w;
}

/// Builds the options from the CLI's strings in one call (`--tiers hbm=BYTES,host=BYTES
/// [--link-gbps 50] [--scheduler fcfs|car] [--prefetch none|deadline|threshold]
/// [--sparsify off|profile]`), every value validated; the other knobs keep their defaults.
/// Tier sizes are checked against the store's page when the replay builds it.
/// @throws invalid_argument naming the option (zero tier sizes, bandwidth <= 0, unknown names).
[[nodiscard]] inline tiered_replay_options make_tiered_replay_options(std::string_view tiers, double link_gbps = 50.0,
                                                                      std::string_view scheduler = "fcfs",
                                                                      std::string_view prefetch = "none",
                                                                      std::string_view sparsify = "off") {
  tiered_replay_options o;
  o.tiers = parse_tiers(tiers, 1, link_gbps);
  o.link_gbps = link_gbps;
  o.scheduler = parse_scheduler(scheduler);
  o.prefetch = parse_prefetch(prefetch);
  o.sparsify = parse_sparsify(sparsify);
  return o;
}

}  // namespace hcbench
