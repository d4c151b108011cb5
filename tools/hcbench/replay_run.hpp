// What `hcbench replay` and `hcbench compare` run: one trace through one cache policy at
// one capacity. The cache compositions are instantiated once, in replay_run.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <hybridcache/compose/adaptive_scorer.hpp>
#include <hybridcache/model/model_spec.hpp>
#include <hybridcache/prefix/flop_aware_scorer.hpp>
#include <hybridcache/sim/tokenizer/bpe_tokenizer.hpp>
#include <hybridcache/sim/metrics.hpp>
#include <hybridcache/sim/replay.hpp>
#include <hybridcache/sim/request.hpp>

namespace hcbench {

/// The policy names of the CLI contract, in the order tables list them.
inline const std::vector<std::string>& policy_names() {
  static const std::vector<std::string> names{"marconi", "sglang+", "vllm+", "lru", "gdsf"};
  return names;
}

/// Throws hybridcache::invalid_argument unless `name` is a known policy.
void check_policy(const std::string& name);

/// One replay to run.
/// How the replay drives the cache per request.
enum class replay_driver {
  /// match, then commit after decode (the reference's model; the fidelity rows).
  commit,
  /// the request lifecycle a runtime uses: begin (match, plan, reserve the prompt's KV and
  /// the checkpoint slots before prefill), grow by the output's KV, finish with every planned
  /// state captured. The capacity is strict; a request that cannot be reserved is refused.
  lifecycle,
};

/// What `--alpha auto` runs for marconi.
enum class alpha_tuner {
  /// the adaptive selector (compose/adaptive_scorer.hpp): metadata-only shadows of every
  /// candidate rule, the live cache following the leader (the default)
  shadow,
  /// Marconi's one-shot bootstrap tuning of alpha (compose/alpha_tuner.hpp), as the
  /// reference does: for fidelity with its rows
  one_shot,
};

struct replay_job {
  const hybridcache::sim::replay_trace* requests = nullptr;  ///< parsed trace (not owned; shared by jobs)
  std::string trace;                        ///< label for tables and JSON
  hybridcache::model_spec model{};          ///< the model preset
  std::int64_t capacity_bytes = 0;
  std::string policy = "marconi";
  std::optional<double> alpha{};            ///< fixed FLOP weight; nullopt = auto (marconi only; see tuner)
  alpha_tuner tuner = alpha_tuner::shadow;  ///< what --alpha auto means
  /// --alpha auto with the shadow tuner: candidates, decay and hysteresis (empty candidates:
  /// the library's default set)
  hybridcache::compose::adaptive_config selector{};
  std::int64_t vllm_block = 32;             ///< vllm+: tokens per checkpointed block
  std::int64_t concurrency = 1;             ///< requests in flight (matches pinned until they finish)
  bool progress = false;                    ///< progress on stderr (progress.hpp; one replay per process)
  /// Keep the cache within capacity: a request whose new state alone exceeds the capacity
  /// is not cached (counted in refused_commits). Off (default): like the reference, it is
  /// inserted and the cache runs over capacity until later evictions.
  bool strict_capacity = false;
  unsigned tuning_threads = 0;              ///< alpha-tuning replay threads (0 = hardware concurrency)
  /// LRU tie-breaking among leaves with equal last access: true = CPython heapq's order over
  /// a DFS-preorder leaf list (the reference's exact victims; O(n) per eviction round),
  /// false = lowest node id (O(log n) per victim; may pick a different tied leaf).
  bool reference_lru_ties = true;
  bool keep_per_request = false;            ///< fill metrics.skipped_per_request
  /// marconi: score with the reference's three defects (naive O(n) scorer), to reproduce
  /// the reference simulator's V2/V3 rows. vllm+: replay on sim::block_tree_reference
  /// (the reference's block tree: fractional byte estimate, in-place partial blocks,
  /// duplicated partly shared blocks) for its exact vLLM+ rows. Not for choosing a policy.
  bool reference_quirks = false;
  replay_driver driver = replay_driver::commit;
  /// marconi: which single-child nodes eviction may take (flop_aware_scorer.hpp).
  hybridcache::prefix::flop_candidates flop_candidates = hybridcache::prefix::flop_candidates::protect_branches;
  /// marconi: how the FLOP-aware scorer finds its victim (bounded walk, exact walk, or classes).
  hybridcache::prefix::flop_index flop_index = hybridcache::prefix::flop_index::bounded_walk;
};

/// A finished replay: the job's labels and its metrics.
struct replay_result {
  std::string trace;
  std::string model;
  std::string policy;
  std::int64_t capacity_bytes = 0;
  hybridcache::sim::run_metrics metrics{};
  /// How text was tokenized: "" (an id trace), "built-in approximation" or "bpe:PATH".
  std::string tokenizer{};
  /// How requests drove the cache: "commit" or "lifecycle" (replay_driver).
  std::string drive = "commit";
  /// marconi --alpha auto: "shadow" or "one-shot"; empty for a fixed alpha or another policy.
  std::string tuner{};
  /// The adaptive selector's overhead and decisions (tuner "shadow" only).
  std::optional<hybridcache::compose::adaptive_overhead> selector{};
  /// The candidate the selector followed at the end, in --candidates syntax ("marconi:0.5", "gdsf").
  std::string selector_followed{};
  /// Each candidate (as text) and the FLOPs its shadow saved over the whole trace.
  std::vector<std::pair<std::string, double>> selector_candidates{};
};

/// A candidate of the library's selector in --candidates syntax: "sglang+", "marconi:0.5", "gdsf".
[[nodiscard]] std::string candidate_name(const hybridcache::compose::candidate_rule& c);
/// Whether the candidate's rule takes an alpha (marconi:ALPHA does; sglang+ and gdsf do not).
[[nodiscard]] bool candidate_has_alpha(const hybridcache::compose::candidate_rule& c);
/// Parses a comma-separated candidate list: sglang+, gdsf, marconi:ALPHA (e.g.
/// "sglang+,marconi:0,marconi:1,gdsf"). @throws hybridcache::invalid_argument.
[[nodiscard]] std::vector<hybridcache::compose::candidate_rule> parse_candidates(const std::string& text);

/// Runs `job`. @throws hybridcache::invalid_argument (unknown policy, bad alpha),
/// hybridcache::capacity_error (capacity below one checkpoint plus one block of KV).
[[nodiscard]] replay_result run_replay(const replay_job& job);

/// How `load_trace` reads a file.
struct trace_load_options {
  /// Mooncake: engine block size B dividing 512 (each 512-token hash id expands into 512/B ids).
  std::int64_t block_size = 512;
  /// ShareGPT, openai, swe-agent, tau-bench, lmsys: conversations started per second (Marconi's
  /// sweeps: 0.25 ... 10).
  double sessions_per_second = 1.0;
  /// Text formats: a Hugging Face tokenizer.json (byte-level BPE); empty: the built-in
  /// approximation.
  std::string tokenizer{};
  /// openai, swe-agent, tau-bench, lmsys: a chat template file (JSON role prefixes/suffixes);
  /// empty: ChatML.
  std::string chat_template{};
  /// openai, swe-agent, tau-bench, lmsys: Poisson mean of the tool time before a call (s).
  double tool_time_mean_s = 5.0;
  /// openai, swe-agent, tau-bench, lmsys: keep the last K observations whole (-1: off).
  std::int64_t collapse_observations = -1;
  /// openai, swe-agent, tau-bench, lmsys: at most this many requests per session (0: no limit).
  std::int64_t max_turns = 0;
};

/// Reads every request of a trace of any format (sim::trace_format_names) from a file,
/// stdin ("-") or a .gz file. @throws input_error (FILE:LINE: field ...) for bad input,
/// hybridcache::invalid_argument for a bad path or option. Never returns an empty trace.
[[nodiscard]] std::vector<hybridcache::sim::request> read_requests(const std::string& path, const std::string& format,
                                                                   const trace_load_options& options = {});

/// The label of the tokenizer a text format uses ("" for id formats).
[[nodiscard]] std::string tokenizer_label(const std::string& format, const trace_load_options& options);

/// Loads a tokenizer.json once per path (shared by every trace that names it).
/// @throws hybridcache::invalid_argument when it cannot be read or is not supported.
[[nodiscard]] std::shared_ptr<hybridcache::sim::bpe_tokenizer> load_tokenizer(const std::string& path);

/// Reads a whole trace for a prefix-cache replay (`format` one of sim::trace_format_names
/// that has_prefix_ids).
/// @throws hybridcache::invalid_argument (missing file, unknown format, bad options),
///         hybridcache::format_error (malformed line).
[[nodiscard]] hybridcache::sim::replay_trace load_trace(const std::string& path, const std::string& format,
                                                        const trace_load_options& options = {});

/// The embedded default workload of `hcbench compare`: a synth-v1 trace generated in memory.
[[nodiscard]] hybridcache::sim::replay_trace synth_workload(const std::string& profile, std::uint64_t seed,
                                                            std::int64_t sessions, std::int64_t gap_ms);

}  // namespace hcbench
