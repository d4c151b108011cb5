// tools/hcbench/selector_flags.hpp
//
// What `--alpha auto` means for marconi, shared by `replay` and `compare`:
//   --tuner shadow|one-shot   the adaptive selector (default) or Marconi's one-shot tuning
//   --candidates LIST         the selector's candidates: sglang+, gdsf, marconi:ALPHA
//   --selector-decay X        per-request decay of the shadows' FLOPs scores
//   --switch-margin X         fraction by which the leader must beat the followed candidate
//   --min-dwell N             requests between two switches
//   --switch-confidence Z     the paired test's threshold, in standard deviations
//   --shadow-sample R         sampled shadows: the fraction of conversations they see (1: exact)
//   --shadow-sample-floor N   sample only once R x (conversations the cache holds) >= N
//   --baseline-slack X|off    the baseline guard (0.02 by default): the live cache kept >= (1 - X) x the first candidate's
//                             shadow while requests run one at a time (suspended at the first overlap)
// Each applies to marconi with --alpha auto only (the selector flags to --tuner shadow only);
// given elsewhere it is an error. --reference-quirks with --alpha auto runs the reference's
// own one-shot tuning (an explicit --tuner shadow with it is an error).
#pragma once

#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>

#include <CLI/CLI.hpp>

#include <hybridcache/compose/adaptive_scorer.hpp>
#include <hybridcache/core/error.hpp>

#include "cli_support.hpp"
#include "replay_run.hpp"

namespace hcbench {

/// `v` as %g prints it (0, 1.5, nan), for messages.
inline std::string format_number(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

/// The flags' values as parsed.
struct selector_cli {
  std::string tuner = "shadow";
  std::string candidates;
  double decay = hybridcache::compose::single_tier_decay;  // applied only when given (the default depends on the shadows)
  double margin = hybridcache::compose::adaptive_config{}.switch_margin;
  std::int64_t dwell = hybridcache::compose::adaptive_config{}.min_dwell;
  double confidence = hybridcache::compose::adaptive_config{}.confidence;
  double sample = hybridcache::compose::shadow_sampling_config{}.rate;
  double sample_floor = hybridcache::compose::shadow_sampling_config{}.min_sampled_conversations;
  std::string baseline_slack;  // empty: the library's default
};

/// `tiers`: the command has --tiers, whose tier-aware shadows decay more slowly by default.
inline void add_selector_options(CLI::App& sub, selector_cli& o, bool tiers = false) {
  sub.add_option("--tuner", o.tuner,
                 "marconi --alpha auto: shadow (the adaptive selector: metadata-only shadows of SGLang+'s rule, "
                 "FLOP-aware alphas and GDSF, the cache following the leader; default) or one-shot (Marconi's "
                 "bootstrap tuning of alpha, as the reference)");
  sub.add_option("--candidates", o.candidates,
                 "--tuner shadow: comma-separated candidates, the first followed from the start: sglang+, gdsf, "
                 "marconi:ALPHA (default sglang+,marconi:0,marconi:0.5,marconi:1,marconi:2,gdsf)");
  CLI::Option* decay = sub.add_option("--selector-decay", o.decay,
                                      std::string("--tuner shadow: per-request decay of the shadows' FLOPs scores") +
                                          (tiers ? " (default 0.995, 0.9995 under --tiers, whose shadows are tier-aware)" : ""));
  if (tiers) decay->default_str("");  // one "=0.995" would be wrong under --tiers
  sub.add_option("--switch-margin", o.margin,
                 "--tuner shadow: the leader must beat the followed candidate's score by this fraction");
  sub.add_option("--min-dwell", o.dwell, "--tuner shadow: requests between two switches");
  sub.add_option("--switch-confidence", o.confidence,
                 "--tuner shadow: the leader's summed per-request lead must exceed this many standard deviations");
  sub.add_option("--shadow-sample", o.sample,
                 "--tuner shadow: sampled shadows (SHARDS-style): the fraction R in (0, 1] of conversations "
                 "(hashed by their first 2 ids) each shadow sees, at capacity x R; 1 = exact shadows");
  sub.add_option("--shadow-sample-floor", o.sample_floor,
                 "--tuner shadow with --shadow-sample < 1: sample only once R x (conversations the cache holds, "
                 "estimated) reaches this; until then the exact shadows decide (0: sample from the start)");
  sub.add_option("--baseline-slack", o.baseline_slack,
                 "--tuner shadow: the baseline guard: the live cache's FLOPs saved are kept >= (1 - X) x the first "
                 "candidate's shadow's, going back to it when they fall below; X in [0, 1) (" +
                     format_number(hybridcache::compose::recommended_baseline_slack) +
                     ", the default), or off; suspended for good once two requests are in flight together");
}

/// Checks the flags against the mode and fills the job's tuner and selector options.
/// `auto_marconi`: marconi with --alpha auto is among what runs; `why` says what is missing
/// otherwise (replay and compare name their flags differently).
inline void apply_selector_options(const selector_cli& o, const CLI::App& sub, bool auto_marconi, bool quirks,
                                   replay_job& job, const std::string& why = "without --policy marconi and --alpha auto") {
  for (const char* name : {"--tuner", "--candidates", "--selector-decay", "--switch-margin", "--min-dwell",
                           "--switch-confidence", "--shadow-sample", "--shadow-sample-floor", "--baseline-slack"})
    reject_unless(auto_marconi, sub, name, why);
  const CLI::Option* tuner_opt = sub.get_option_no_throw("--tuner");
  const bool tuner_given = tuner_opt != nullptr && tuner_opt->count() > 0;
  if (o.tuner == "one-shot" || (quirks && !tuner_given)) {
    job.tuner = alpha_tuner::one_shot;
  } else if (o.tuner == "shadow") {
    if (quirks) throw hybridcache::invalid_argument("--tuner shadow cannot be combined with --reference-quirks "
                                                    "(the reference tunes alpha once: --tuner one-shot)");
    job.tuner = alpha_tuner::shadow;
  } else {
    throw hybridcache::invalid_argument("--tuner: expected shadow or one-shot, got '" + o.tuner + "'");
  }
  for (const char* name : {"--candidates", "--selector-decay", "--switch-margin", "--min-dwell", "--switch-confidence",
                           "--shadow-sample", "--shadow-sample-floor", "--baseline-slack"})
    reject_unless(job.tuner == alpha_tuner::shadow, sub, name, "with --tuner one-shot");
  if (!o.candidates.empty()) job.selector.candidates = parse_candidates(o.candidates);
  if (const CLI::Option* d = sub.get_option_no_throw("--selector-decay"); d != nullptr && d->count() > 0)
    job.selector.decay = check_finite_range(o.decay, 1e-6, 1.0, "--selector-decay");
  job.selector.switch_margin = check_finite_range(o.margin, 0.0, 1e6, "--switch-margin");
  if (o.dwell < 0 || o.dwell > 1'000'000'000)
    throw hybridcache::invalid_argument("--min-dwell: expected 0..1000000000, got " + std::to_string(o.dwell));
  job.selector.min_dwell = o.dwell;
  job.selector.confidence = check_finite_range(o.confidence, 0.0, 1e6, "--switch-confidence");
  if (!(o.sample > 0.0 && o.sample <= 1.0))  // (0, 1]: check_finite_range's bounds are closed
    throw hybridcache::invalid_argument("--shadow-sample: expected a fraction in (0, 1], got " + format_number(o.sample));
  job.selector.sampling.rate = o.sample;
  job.selector.sampling.min_sampled_conversations = check_finite_range(o.sample_floor, 0.0, 1e9, "--shadow-sample-floor");
  // A floor only matters below rate 1: given at rate 1 it would be ignored, so it is an error.
  if (const CLI::Option* f = sub.get_option_no_throw("--shadow-sample-floor"); f != nullptr && f->count() > 0 && o.sample >= 1.0)
    throw hybridcache::invalid_argument("--shadow-sample-floor needs --shadow-sample below 1 (rate 1 is exact: nothing is sampled)");
  if (o.baseline_slack == "off") {
    job.selector.baseline_slack.reset();
  } else if (!o.baseline_slack.empty()) {
    std::size_t used = 0;
    double x = -1;
    try {
      x = std::stod(o.baseline_slack, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != o.baseline_slack.size() || !(x >= 0.0 && x < 1.0))
      throw hybridcache::invalid_argument("--baseline-slack: expected a fraction in [0, 1) or off, got " + o.baseline_slack);
    job.selector.baseline_slack = x;
  }
}

}  // namespace hcbench
