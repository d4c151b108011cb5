// hcbench's replay runner: trace loading, the embedded workload, and the four cache
// compositions behind the CLI's policy names. All prefix_cache instantiations live in this
// one translation unit.
//
// Policies (all on the counting store, one byte budget for KV and SSM checkpoints, logical
// clock, as the Marconi reference simulates):
//   marconi  judicious admission (branch point + last decoded token) + FLOP-aware eviction
//            (U = alpha·eff' + rec'); --alpha auto: the adaptive selector (shadows of SGLang+'s
//            rule, FLOP-aware alphas and GDSF; compose/adaptive_scorer.hpp), or with
//            --tuner one-shot Marconi's bootstrap tuning of alpha
//   sglang+  judicious admission + LRU on leaves, whole path refreshed (the reference's V1)
//   vllm+    a checkpoint every block (32 tokens) + LRU on leaves (the reference's vLLM+)
//   lru      no branch-point checkpoints: only the state after each request's last decoded
//            token is kept (what an engine without speculative insertion caches), LRU on leaves
#include "replay_run.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <new>
#include <vector>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include <hybridcache/model/cost_model.hpp>
#include <hybridcache/core/error.hpp>
#include <hybridcache/compose/alpha_tuner.hpp>
#include <hybridcache/prefix/admission.hpp>
#include <hybridcache/sim/reference/block_tree_reference.hpp>
#include <hybridcache/stores/counting_store.hpp>
#include <hybridcache/prefix/flop_aware_scorer.hpp>
#include <hybridcache/prefix/gdsf_scorer.hpp>
#include <hybridcache/prefix/lru_scorer.hpp>
#include <hybridcache/prefix/prefix_cache.hpp>
#include <hybridcache/sim/reference/reference_scorer.hpp>
#include <hybridcache/sim/prefix_cache_replay.hpp>
#include <hybridcache/sim/replay.hpp>
#include <hybridcache/sim/trace.hpp>
#include <hybridcache/sim/synth_v1.hpp>

#include "cli_support.hpp"
#include "progress.hpp"
#include "replay_args.hpp"
#include "trace_input.hpp"

namespace hcbench {

std::string candidate_name(const hybridcache::compose::candidate_rule& c) {
  if (c.rule == 0) return "sglang+";
  if (c.rule == 2) return "gdsf";
  return "marconi:" + json::number(c.alpha);  // as --candidates takes it
}

bool candidate_has_alpha(const hybridcache::compose::candidate_rule& c) { return c.rule == 1; }

std::vector<hybridcache::compose::candidate_rule> parse_candidates(const std::string& text) {
  std::vector<hybridcache::compose::candidate_rule> out;
  std::size_t from = 0;
  while (from <= text.size()) {
    const std::size_t comma = std::min(text.find(',', from), text.size());
    const std::string item = text.substr(from, comma - from);
    from = comma + 1;
    if (item == "sglang+") {
      out.push_back({0, 0.0});
    } else if (item == "gdsf") {
      out.push_back({2, 0.0});
    } else if (item.rfind("marconi:", 0) == 0) {
      const std::optional<double> a = parse_alpha(item.substr(8));
      if (!a) throw hybridcache::invalid_argument("--candidates: 'marconi:auto' is not a candidate; give an alpha");
      out.push_back({1, *a});
    } else {
      throw hybridcache::invalid_argument("--candidates: unknown candidate '" + item +
                                          "' (known: sglang+, gdsf, marconi:ALPHA)");
    }
  }
  return out;
}

void check_policy(const std::string& name) {
  for (const auto& p : policy_names())
    if (p == name) return;
  std::string known;
  for (const auto& p : policy_names()) known += (known.empty() ? "" : ", ") + p;
  throw hybridcache::invalid_argument("unknown policy '" + name + "' (known: " + known + ")");
}

std::string tokenizer_label(const std::string& format, const trace_load_options& options) {
  const auto f = hybridcache::sim::find_trace_format(format);
  if (!f || !hybridcache::sim::is_text_format(*f)) return "";
  return options.tokenizer.empty() ? std::string("built-in approximation") : "bpe:" + options.tokenizer;
}

std::shared_ptr<hybridcache::sim::bpe_tokenizer> load_tokenizer(const std::string& path) {
  static std::mutex mutex;
  static std::map<std::string, std::shared_ptr<hybridcache::sim::bpe_tokenizer>> loaded;
  std::lock_guard lock(mutex);
  auto& t = loaded[path];
  if (!t) t = std::make_shared<hybridcache::sim::bpe_tokenizer>(hybridcache::sim::bpe_tokenizer::from_file(path));
  return t;
}

namespace {
/// Reads every request of `reader` through `sink`, turning any failure into one
/// `input_error` naming the file and the line being read.
template <class Reader, class Sink>
void read_each(Reader& reader, const std::string& path, Sink&& sink) {
  namespace hc = hybridcache;
  hc::sim::request r;
  auto line = [&]() -> std::int64_t {
    if constexpr (requires { reader.line_number(); }) return reader.line_number() > 0 ? reader.line_number() : 0;
    else return 0;
  };
  try {
    while (reader.next(r)) sink(r);
  } catch (const hc::format_error& e) {
    throw input_error(path, e.line(), e.field(), format_error_detail(e));
  } catch (const hc::error& e) {
    throw input_error(path, line(), "", strip_library_prefix(e.what()));
  } catch (const std::bad_alloc&) {
    throw input_error(path, line(), "", "out of memory while reading this request");
  }
}
}  // namespace

std::vector<hybridcache::sim::request> read_requests(const std::string& path, const std::string& format,
                                                     const trace_load_options& options) {
  using namespace hybridcache;
  const sim::trace_format f = sim::parse_trace_format(format);
  const std::int64_t block_size = options.block_size;
  if (f == sim::trace_format::mooncake && (block_size <= 0 || block_size > 512 || 512 % block_size != 0))
    throw invalid_argument("--block-size " + std::to_string(block_size) + ": must divide 512 for mooncake traces");
  if (f == sim::trace_format::sharegpt && (!(options.sessions_per_second >= 1e-6) ||
                                           !(options.sessions_per_second <= 1e6)))
    throw invalid_argument("--sessions-per-second: expected a finite number in [1e-06, 1e+06], got " +
                           json::number(options.sessions_per_second));
  if (!sim::is_text_format(f) && !options.tokenizer.empty())
    throw invalid_argument("--tokenizer applies to text formats only (" + sim::trace_format_list(sim::is_text_format) +
                           "), not " + format);
  const bool chat = sim::is_chat_format(f);
  if (chat) {
    if (!(options.sessions_per_second >= 1e-6) || !(options.sessions_per_second <= 1e6))
      throw invalid_argument("--sessions-per-second: expected a finite number in [1e-06, 1e+06], got " +
                             json::number(options.sessions_per_second));
    if (!(options.tool_time_mean_s >= 0 && options.tool_time_mean_s <= 600))
      throw invalid_argument("--tool-time-mean must be in [0, 600] seconds");
    if (options.collapse_observations < -1) throw invalid_argument("--collapse-observations must be >= 0");
    if (options.max_turns < 0) throw invalid_argument("--max-turns must be >= 0 (0: no limit)");
  }
  std::shared_ptr<sim::bpe_tokenizer> tokenizer;
  if (!options.tokenizer.empty()) tokenizer = load_tokenizer(options.tokenizer);
  sim::chat_options chat_opts;
  if (chat) {
    chat_opts.tokenizer = tokenizer;
    chat_opts.sessions_per_second = options.sessions_per_second;
    chat_opts.tool_time_mean_s = options.tool_time_mean_s;
    chat_opts.collapse_observations = options.collapse_observations;
    chat_opts.max_requests_per_session = options.max_turns;
    if (!options.chat_template.empty()) chat_opts.chat = sim::chat_template::from_file(options.chat_template);
  }
  sim::trace_options reader_options;
  reader_options.mooncake = {.block_size = static_cast<std::int32_t>(block_size), .synthesize_output_ids = true};
  reader_options.sharegpt = {.sessions_per_second = options.sessions_per_second};
  reader_options.sharegpt.tokenizer = tokenizer;
  reader_options.chat = chat_opts;
  std::vector<sim::request> out;
  auto sink = [&out](const sim::request& r) { out.push_back(r); };
  std::error_code ec;
  if (f == sim::trace_format::swe_agent && path != "-" && std::filesystem::is_directory(path, ec)) {
    // A directory of .traj files (read by path: not a stream).
    sim::trace_reader reader = sim::open_trace(std::filesystem::path(path), f, reader_options);
    read_each(reader, path, sink);
    if (out.empty()) throw input_error(path, 0, "", "holds no requests");
    return out;
  }
  trace_input input(path);  // a file, stdin or a .gz file
  sim::trace_reader reader = sim::open_trace(input.stream(), f, reader_options);
  read_each(reader, path, sink);
  if (out.empty()) {
    std::string why = "holds no requests";
    if (f == sim::trace_format::sharegpt)
      why += " (a ShareGPT conversation whose first human turn exceeds the 32,768-token cap is skipped, "
             "as Marconi's loader does)";
    throw input_error(path, 0, "", why);
  }
  return out;
}

hybridcache::sim::replay_trace load_trace(const std::string& path, const std::string& format,
                                          const trace_load_options& options) {
  using namespace hybridcache;
  const sim::trace_format f = sim::parse_trace_format(format);
  if (!sim::has_prefix_ids(f))
    throw invalid_argument("trace format '" + format + "' holds lengths, not token ids: a prefix-cache replay reads " +
                           sim::trace_format_list(sim::has_prefix_ids) + " (lengths replay with replay --tiers)");
  const std::vector<sim::request> requests = read_requests(path, format, options);
  sim::replay_trace out;
  // The prefix cache matches at least one id: an empty input is bad input, named here
  // rather than as a failed match in the middle of the replay.
  const char* const input_field = f == sim::trace_format::mooncake  ? "input_length"
                                  : f == sim::trace_format::marconi ? "input_tokens"
                                                                    : "";
  for (const auto& r : requests) {
    if (r.input.empty())
      throw input_error(path, r.source_line, input_field, "expected at least one input token, got 0");
    try {
      out.append(r);
    } catch (const hybridcache::error& e) {
      throw input_error(path, r.source_line, "", strip_library_prefix(e.what()));
    }
  }
  return out;
}

hybridcache::sim::replay_trace synth_workload(const std::string& profile, std::uint64_t seed, std::int64_t sessions,
                                              std::int64_t gap_ms) {
  using namespace hybridcache::sim;
  synth_v1_source source({.profile = parse_synth_profile(profile), .seed = seed, .sessions = sessions,
                          .session_gap_ms = gap_ms});
  return replay_trace::read_all(source);
}

namespace {

namespace hc = hybridcache;
namespace pc = hybridcache::prefix;

using pc::last_token_admission;  // the `lru` policy's admission (prefix/admission.hpp)

struct run_context {
  const replay_job& job;
  const hc::sim::replay_trace& trace;
  const hc::cost_model& costs;
  std::int32_t tokens_per_id;
};

hc::stores::counting_store make_store(const run_context& ctx) {
  return hc::sim::replay_store(ctx.costs, {.capacity_bytes = ctx.job.capacity_bytes,
                                           .tokens_per_id = ctx.tokens_per_id,
                                           .strict_capacity = ctx.job.strict_capacity});
}

/// `job.progress`: the requests replayed so far, on stderr (progress.hpp: nothing for a run
/// under 2 s). The sim replay calls it every 4,096 requests and at the end; each replay of
/// the process gets its own meter.
void print_progress(std::size_t done, std::size_t total) {
  static std::optional<progress_meter> meter;
  static std::size_t shown = 0;
  if (!meter) meter.emplace(progress_options{.total = total, .what = "requests replayed"});
  meter->step(done - shown);
  shown = done;
  if (done == total) {
    meter->finish();
    meter.reset();
    shown = 0;
  }
}

/// Replays the trace through `cache` (a prefix_cache or an alpha_tuned_cache) with `Adapter`.
template <template <class> class Adapter = hc::sim::commit_adapter, class Cache>
hc::sim::run_metrics replay_through(const run_context& ctx, Cache& cache) {
  const hc::sim::replay_options opt{.concurrency = ctx.job.concurrency, .keep_per_request = ctx.job.keep_per_request};
  if (ctx.job.progress) return hc::sim::replay_prefix_cache<Adapter>(cache, ctx.trace, ctx.costs, opt, print_progress);
  return hc::sim::replay_prefix_cache<Adapter>(cache, ctx.trace, ctx.costs, opt);
}

/// One policy run: a prefix_cache over a counting store, wrapped in an alpha_tuned_cache
/// when `tuning` is given (Marconi's --alpha auto).
template <class Admission, class Scorer>
hc::sim::run_metrics run_with(const run_context& ctx, Scorer scorer, std::optional<hc::compose::tuning_config> tuning = {}) {
  const pc::prefix_cache_config cfg{.admit_oversized = !ctx.job.strict_capacity};
  using cache_type = pc::prefix_cache<hc::cost_model, Admission, Scorer, hc::stores::counting_store>;
  if constexpr (hc::compose::alpha_tunable_scorer<Scorer>) {
    if (tuning) {
      hc::compose::alpha_tuned_cache<cache_type> cache(ctx.costs, make_store(ctx), std::move(scorer), Admission{}, cfg, *tuning);
      return replay_through(ctx, cache);
    }
  }
  HYBRIDCACHE_EXPECTS(!tuning, hc::invalid_argument, "alpha tuning needs a FLOP-aware scorer");
  cache_type cache(ctx.costs, make_store(ctx), std::move(scorer), Admission{}, cfg);
  if (ctx.job.driver == replay_driver::lifecycle) return replay_through<hc::sim::lifecycle_adapter>(ctx, cache);
  return replay_through(ctx, cache);
}

/// marconi --alpha auto with the shadow tuner: the library's adaptive Marconi scorer.
hc::sim::run_metrics run_adaptive(const run_context& ctx, std::optional<hc::compose::adaptive_overhead>& overhead,
                                  std::string& followed, std::vector<std::pair<std::string, double>>& candidates) {
  const pc::prefix_cache_config cfg{.admit_oversized = !ctx.job.strict_capacity};
  using cache_type = pc::prefix_cache<hc::cost_model, pc::judicious_admission, hc::compose::marconi_adaptive_scorer,
                                      hc::stores::counting_store>;
  hc::compose::adaptive_config selector = ctx.job.selector;
  selector.tokens_per_id = ctx.tokens_per_id;  // Mooncake: one id per block of tokens
  cache_type cache(ctx.costs, make_store(ctx), hc::compose::make_marconi_adaptive_scorer(ctx.costs, std::move(selector)),
                   pc::judicious_admission{}, cfg);
  hc::sim::run_metrics m = ctx.job.driver == replay_driver::lifecycle ? replay_through<hc::sim::lifecycle_adapter>(ctx, cache)
                                                                       : replay_through(ctx, cache);
  overhead = cache.scorer().overhead();
  const auto& sel = cache.scorer();
  const hc::compose::candidate_rule& last = sel.config().candidates[sel.followed()];
  followed = candidate_name(last);
  // The alpha the cache ran with at the end is the followed rule's; a rule without one
  // (sglang+, gdsf) has none to report, not the 0 the switching scorer keeps for it.
  if (!candidate_has_alpha(last)) m.cache.alpha = std::numeric_limits<double>::quiet_NaN();
  for (std::size_t i = 0; i < sel.config().candidates.size(); ++i)
    candidates.emplace_back(candidate_name(sel.config().candidates[i]), sel.shadow_flops()[i]);
  return m;
}

pc::lru_scorer make_lru(const replay_job& job) {
  return pc::lru_scorer({.ties = job.reference_lru_ties ? pc::lru_ties::python_heapq : pc::lru_ties::by_node_id});
}

template <std::int64_t Block>
hc::sim::run_metrics run_every_block(const run_context& ctx) {
  return run_with<pc::every_block_admission<Block>>(ctx, make_lru(ctx.job));
}

/// vllm+ --reference-quirks: the reference simulator's block tree (its byte estimate,
/// in-place partial blocks, duplicated partly shared blocks), for its exact rows.
hc::sim::run_metrics run_block_tree_reference(const run_context& ctx) {
  auto tree = hc::sim::block_tree_reference::from_costs(ctx.costs, ctx.job.capacity_bytes, ctx.job.vllm_block,
                                                   ctx.tokens_per_id);
  const hc::sim::replay_options opt{.concurrency = ctx.job.concurrency, .keep_per_request = ctx.job.keep_per_request};
  if (!ctx.job.progress) return hc::sim::replay(tree, ctx.trace, ctx.costs, opt);
  return hc::sim::replay(tree, ctx.trace, ctx.costs, opt, hc::marconi_reference_ttft{}, print_progress);
}

}  // namespace

replay_result run_replay(const replay_job& job) {
  namespace hc = hybridcache;
  check_policy(job.policy);
  if (job.driver == replay_driver::lifecycle) {
    HYBRIDCACHE_EXPECTS(!job.reference_quirks, hc::invalid_argument,
                        "--drive lifecycle cannot be combined with --reference-quirks (the reference commits after decode)");
    HYBRIDCACHE_EXPECTS(job.policy != "marconi" || job.alpha.has_value() || job.tuner == alpha_tuner::shadow,
                        hc::invalid_argument,
                        "--drive lifecycle cannot be combined with --tuner one-shot (the one-shot tuner wraps commit)");
    HYBRIDCACHE_EXPECTS(job.strict_capacity, hc::invalid_argument,
                        "--drive lifecycle reserves before prefill: the capacity is always strict");
  }
  HYBRIDCACHE_EXPECTS(!job.reference_quirks || job.policy == "marconi" || job.policy == "vllm+", hc::invalid_argument,
                      "--reference-quirks applies to --policy marconi and vllm+ only");
  HYBRIDCACHE_EXPECTS(!job.reference_quirks || job.policy != "vllm+" || !job.strict_capacity, hc::invalid_argument,
                      "--reference-quirks with --policy vllm+ overshoots the capacity like the reference; "
                      "it cannot be combined with --strict-capacity");
  HYBRIDCACHE_EXPECTS(job.requests != nullptr && job.requests->size() > 0, hc::invalid_argument,
                      "replay: the trace holds no requests");
  HYBRIDCACHE_EXPECTS(!job.alpha || (*job.alpha >= 0 && std::isfinite(*job.alpha)), hc::invalid_argument,
                      "--alpha must be a number >= 0 or auto");
  const hc::cost_model costs(job.model);
  const hc::sim::replay_trace& trace = *job.requests;
  const std::int32_t per_id = trace[0].tokens_per_id;
  for (std::size_t i = 0; i < trace.size(); ++i)
    HYBRIDCACHE_EXPECTS(trace[i].tokens_per_id == per_id, hc::invalid_argument,
                        "replay: requests of one trace must share tokens_per_id");
  // Fail early, with the model's name, when no checkpoint fits.
  if (costs.ssm_checkpoint_bytes() > job.capacity_bytes)
    throw hc::capacity_error("capacity " + std::to_string(job.capacity_bytes) + " B is smaller than one SSM checkpoint of " +
                             job.model.name + " (" + std::to_string(costs.ssm_checkpoint_bytes()) + " B)");
  const run_context ctx{job, trace, costs, per_id};

  hc::sim::run_metrics m;
  std::optional<hc::compose::adaptive_overhead> selector;
  std::string followed;
  std::vector<std::pair<std::string, double>> candidates;
  const bool shadow = job.policy == "marconi" && !job.alpha && job.tuner == alpha_tuner::shadow && !job.reference_quirks;
  if (shadow) {
    m = run_adaptive(ctx, selector, followed, candidates);
  } else if (job.policy == "marconi") {
    std::optional<hc::compose::tuning_config> tuning;
    if (!job.alpha.has_value()) tuning = hc::compose::tuning_config{.threads = job.tuning_threads};
    if (job.reference_quirks)
      m = run_with<pc::judicious_admission>(
          ctx, hc::sim::reference_flop_scorer(costs, {.alpha = job.alpha.value_or(0.0), .quirks = true}), tuning);
    else
      m = run_with<pc::judicious_admission>(
          ctx,
          pc::flop_aware_scorer(costs, {.alpha = job.alpha.value_or(0.0), .candidates = job.flop_candidates, .index = job.flop_index}),
          tuning);
  } else if (job.policy == "gdsf") {
    m = run_with<pc::judicious_admission>(ctx, pc::gdsf_scorer(costs));
  } else if (job.policy == "sglang+") {
    m = run_with<pc::judicious_admission>(ctx, make_lru(job));
  } else if (job.policy == "lru") {
    m = run_with<last_token_admission>(ctx, make_lru(job));
  } else if (job.reference_quirks) {  // vllm+ as the reference's block tree
    m = run_block_tree_reference(ctx);
  } else {  // vllm+: a checkpoint every `vllm_block` tokens = vllm_block / tokens_per_id ids
    const std::int64_t ids = std::max<std::int64_t>(1, job.vllm_block / per_id);
    switch (ids) {
      case 1: m = run_every_block<1>(ctx); break;
      case 2: m = run_every_block<2>(ctx); break;
      case 16: m = run_every_block<16>(ctx); break;
      case 32: m = run_every_block<32>(ctx); break;
      case 64: m = run_every_block<64>(ctx); break;
      default:
        throw hc::invalid_argument("vllm+ block of " + std::to_string(ids) +
                                   " ids is not compiled in (supported: 1, 2, 16, 32, 64 ids; default 32 tokens)");
    }
  }
  if (job.policy != "marconi") m.cache.alpha = std::numeric_limits<double>::quiet_NaN();  // recency only
  replay_result out{job.trace, job.model.name, job.policy, job.capacity_bytes, std::move(m)};
  out.drive = job.driver == replay_driver::lifecycle ? "lifecycle" : "commit";
  if (job.policy == "marconi" && !job.alpha) out.tuner = shadow ? "shadow" : "one-shot";
  out.selector = selector;
  out.selector_followed = followed;
  out.selector_candidates = std::move(candidates);
  return out;
}

}  // namespace hcbench
