// tools/hcbench/single_tier_flags.hpp
//
// The single-tier replay's scorer and driver options, shared by `replay` and `compare` (which
// applies them to every row): --flop-candidates, --flop-index, --reference-quirks, --drive.
// One place for their --help text, their parsing and the rules on where they apply, so both
// commands take the same values with the same defaults. The multi-tier replay (--tiers)
// parses --flop-candidates / --flop-index through the same parsers.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include <hybridcache/core/error.hpp>
#include <hybridcache/prefix/flop_aware_scorer.hpp>

#include "cli_support.hpp"
#include "replay_run.hpp"

namespace hcbench {

/// The options' values as given (defaults: the library's).
struct single_tier_cli {
  std::string drive = "commit";
  std::string flop_candidates = "protect-branches";
  std::string flop_index = "bounded";
  bool reference_quirks = false;
};

/// Parses --flop-candidates. @throws hybridcache::invalid_argument naming the value.
[[nodiscard]] inline hybridcache::prefix::flop_candidates parse_flop_candidates(const std::string& s) {
  if (s == "paper") return hybridcache::prefix::flop_candidates::paper;
  if (s == "protect-branches") return hybridcache::prefix::flop_candidates::protect_branches;
  throw hybridcache::invalid_argument("--flop-candidates: expected paper or protect-branches, got '" + s + "'");
}

/// Parses --flop-index. @throws hybridcache::invalid_argument naming the value.
[[nodiscard]] inline hybridcache::prefix::flop_index parse_flop_index(const std::string& s) {
  if (s == "classes") return hybridcache::prefix::flop_index::efficiency_classes;
  if (s == "threshold") return hybridcache::prefix::flop_index::threshold_walk;
  if (s == "bounded") return hybridcache::prefix::flop_index::bounded_walk;
  throw hybridcache::invalid_argument("--flop-index: expected bounded, threshold or classes, got '" + s + "'");
}

/// Registers the four options with their --help text.
inline void add_single_tier_options(CLI::App& sub, single_tier_cli& o) {
  sub.add_option("--drive", o.drive,
                 "how each request drives the cache: commit (match, then commit after decode: the "
                 "reference's model; default) or lifecycle (begin reserves the prompt's KV and checkpoint "
                 "slots before prefill, grow, finish: what a runtime does; strict capacity)");
  sub.add_option("--flop-candidates", o.flop_candidates,
                 "marconi: which single-child nodes eviction may merge: protect-branches (not a branch "
                 "point while it has a child; default) or paper (every one with a checkpoint, as published)");
  sub.add_option("--flop-index", o.flop_index,
                 "marconi: bounded (the exact threshold walk for up to 64 steps, then efficiency classes: "
                 "O(log n) worst case; default), threshold (always exact, worst case O(n)) or classes "
                 "(efficiency classes only, may pick a near-optimal victim)");
  sub.add_flag("--reference-quirks", o.reference_quirks,
               "marconi: reproduce the reference simulator's scoring defects (MLP term, whole-prefix KV "
               "bytes, leaf byte accounting); vllm+: replay on the reference's block tree; both to match "
               "its rows exactly, for validation only");
}

/// Where the options apply: `marconi` is among the policies that run (replay: --policy;
/// compare: --policies), `vllm` likewise; `no_marconi` says what is missing otherwise, in the
/// command's words ("to --policy lru", "without marconi in --policies").
struct single_tier_scope {
  bool marconi = false;
  bool vllm = false;
  std::string no_marconi;
};

/// Checks the options against the policies and fills the job's driver and scorer fields.
/// @throws hybridcache::invalid_argument naming the option that does not apply or its bad value.
inline void apply_single_tier_options(const single_tier_cli& o, const CLI::App& sub, const single_tier_scope& scope,
                                      replay_job& job) {
  reject_unless(scope.marconi || scope.vllm, sub, "--reference-quirks",
                scope.no_marconi + " (it changes marconi and vllm+ only)");
  reject_unless(scope.marconi, sub, "--flop-candidates", scope.no_marconi + " (marconi only)");
  reject_unless(!o.reference_quirks, sub, "--flop-candidates", "with --reference-quirks (the reference's own rule)");
  job.flop_candidates = parse_flop_candidates(o.flop_candidates);
  reject_unless(scope.marconi, sub, "--flop-index", scope.no_marconi + " (marconi only)");
  reject_unless(!o.reference_quirks, sub, "--flop-index", "with --reference-quirks (the reference's own scan)");
  job.flop_index = parse_flop_index(o.flop_index);
  if (o.drive == "lifecycle") {
    job.driver = replay_driver::lifecycle;
    job.strict_capacity = true;  // it reserves before prefill: nothing runs over capacity
  } else if (o.drive != "commit") {
    throw hybridcache::invalid_argument("--drive: expected commit or lifecycle, got '" + o.drive + "'");
  }
  job.reference_quirks = o.reference_quirks;
}

}  // namespace hcbench
