// `hcbench replay`: one trace through one cache policy at one capacity.
//
//   hcbench replay --trace PATH --format marconi|mooncake|sharegpt|openai|swe-agent|tau-bench
//                  [--tokenizer tokenizer.json] [--chat-template FILE] --model PRESET
//                  --capacity BYTES --policy marconi|sglang+|vllm+|lru [--alpha X|auto]
//                  [--block-size N] [--concurrency N] [--json]
//   hcbench replay ... --tiers hbm=BYTES,host=BYTES[,disk@DIR=BYTES][,redis@HOST:PORT=BYTES]
//                  (each lower tier may add :gbps=G:lat_us=L; disk/redis links not given are
//                  measured at start-up) [--link-gbps 50] [--scheduler fcfs|car] [--real-bytes]
//                  [--prefetch none|deadline|threshold] [--sparsify off|profile]
//                  (multi-tier timeline replay vs the HBM-only baseline; see replay_tiered.hpp)
//
// --json prints exactly one JSON object on stdout (keys in replay_report.hpp's to_json);
// otherwise a one-row table and the hit rate by input length. Progress goes to stderr, only
// when stderr is a terminal.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <string>

#include <unistd.h>

#include <hybridcache/core/error.hpp>
#include <hybridcache/model/presets.hpp>
#include <hybridcache/sim/trace.hpp>

#include "atomic_file.hpp"
#include "cli_support.hpp"
#include "output_fields.hpp"
#include "command.hpp"
#include "model_flags.hpp"
#include "replay_args.hpp"
#include "replay_report.hpp"
#include "replay_run.hpp"
#include "replay_tiered.hpp"
#include "selector_flags.hpp"
#include "single_tier_flags.hpp"
#include "tiered_flags.hpp"

namespace {

struct replay_cli {
  std::string trace;
  std::string format = "marconi";
  std::string model = "marconi_7b";
  hcbench::model_cli model_flags;  // --model-attn-ratio, --model-state-dim
  std::string capacity;
  std::string policy = "marconi";
  std::string alpha = "auto";
  std::int64_t block_size = 0;  // not given: the format's default (mooncake 512 = one id per hash id; vllm+ 32)
  std::int64_t concurrency = 1;
  double sessions_per_second = 1.0;
  std::string tokenizer;
  std::string chat_template;
  double tool_time_mean_s = 5.0;
  std::int64_t collapse_observations = -1;
  std::int64_t max_turns = 0;
  bool json = false;
  bool strict_capacity = false;
  std::string lru_ties = "reference";
  std::string per_request;
  hcbench::single_tier_cli scan;  // --drive, --flop-candidates, --flop-index, --reference-quirks
  hcbench::tiered_cli tiered;
  hcbench::selector_cli selector;
};

// Options that belong to one mode only; giving one in the other mode is an error (the --tiers
// ones: tiered_flags.hpp's tiered_only_options, which compare refuses too).
// The tiered replay drives the lifecycle with strict capacity on its own engines: these
// single-tier knobs have no meaning there (--policy, --alpha and the scorer options do).
const char* const single_only[] = {"--capacity", "--concurrency", "--strict-capacity", "--reference-quirks", "--drive"};

void run(const replay_cli& o, const CLI::App& sub) {
  using namespace hcbench;
  const bool tiered = !o.tiered.tiers.empty();
  for (const char* name : tiered_only_options) reject_unless(tiered, sub, name, "without --tiers");
  for (const char* name : single_only) reject_unless(!tiered, sub, name, "with --tiers (the multi-tier replay)");
  namespace sim = hybridcache::sim;
  const std::optional<sim::trace_format> format = sim::find_trace_format(o.format);  // unknown: load_trace says so
  const bool chat = !format || sim::is_chat_format(*format);  // an unknown format: load_trace names it
  reject_unless(!format || sim::is_text_format(*format), sub, "--sessions-per-second",
                "to --format " + o.format + " (" + sim::trace_format_list(sim::is_text_format) + ")");
  for (const char* name : chat_only_options)
    reject_unless(chat, sub, name, "to --format " + o.format + " (" + sim::trace_format_list(sim::is_chat_format) + ")");
  // --block-size is read twice: as a mooncake trace's engine block size (every policy) and,
  // on the other formats, as vllm+'s checkpoint block. Anywhere else it would be ignored.
  check_policy(o.policy);
  reject_unless(!format || *format == sim::trace_format::mooncake || o.policy == "vllm+", sub, "--block-size",
                "to --policy " + o.policy + " on --format " + o.format + " (" + block_size_meaning + ")");
  if (given(sub, "--block-size")) check_block_size(o.block_size);
  trace_load_options load{0, o.sessions_per_second};
  load.tokenizer = o.tokenizer;
  load.chat_template = o.chat_template;
  load.tool_time_mean_s = o.tool_time_mean_s;
  load.collapse_observations = o.collapse_observations;
  load.max_turns = o.max_turns;
  const hybridcache::model_spec model = resolve_model(o.model, o.model_flags, sub);  // throws naming the flag
  if (tiered) {
    const std::int64_t block = o.format == "mooncake" && o.block_size > 0 ? o.block_size : 512;
    hcbench::tiered_policy p;
    p.name = o.policy;
    // As in the single-tier replay, marconi's default is --alpha auto: the adaptive selector
    // (its shadows watch the requests the lifecycle finishes and size themselves like HBM).
    p.alpha = parse_alpha(o.alpha);
    hcbench::replay_job selector_job;
    apply_selector_options(o.selector, sub, o.policy == "marconi" && !p.alpha, false, selector_job);
    if (selector_job.tuner == hcbench::alpha_tuner::one_shot)
      throw hybridcache::invalid_argument(
          "--tuner one-shot with --tiers: Marconi's bootstrap tuning replays commits, not the request lifecycle "
          "the tiered replay drives (--tuner shadow, the default, runs the adaptive selector)");
    if (o.policy == "marconi" && !p.alpha) p.selector = selector_job.selector;
    // Knobs of one tiered setting only: given without it they would be silently ignored.
    reject_unless(o.tiered.write_policy == "write-through-selective", sub, "--write-through-hits",
                  "without --write-policy write-through-selective");
    reject_unless(o.tiered.prefetch != "none", sub, "--prefetch-depth", "with --prefetch none (the default)");
    reject_unless(o.tiered.decode == "colocated", sub, "--length-predictor",
                  "without --decode colocated (disaggregated, no dispatch waits on a decode)");
    reject_unless(o.policy == "marconi", sub, "--flop-candidates", "to --policy " + o.policy + " (marconi only)");
    reject_unless(o.policy == "marconi", sub, "--flop-index", "to --policy " + o.policy + " (marconi only)");
    (void)parse_flop_candidates(o.scan.flop_candidates);  // refuses a bad value
    (void)parse_flop_index(o.scan.flop_index);
    p.flop_candidates = o.scan.flop_candidates;
    p.flop_index = o.scan.flop_index;
    p.reference_lru_ties = parse_lru_ties(o.lru_ties);
    if (o.format != "mooncake" && o.block_size > 0) p.vllm_block = o.block_size;
    run_tiered_replay_command(o.trace, o.format, model, block, load, o.tiered, p, o.per_request, o.json);
    return;
  }
  if (o.capacity.empty()) throw hybridcache::invalid_argument("--capacity is required (or --tiers for a multi-tier replay)");
  reject_unless(o.policy == "marconi", sub, "--alpha", "to --policy " + o.policy + " (marconi only)");
  hcbench::replay_job job;
  job.model = model;
  job.policy = o.policy;
  job.capacity_bytes = parse_capacity(o.capacity);
  job.alpha = parse_alpha(o.alpha);
  apply_selector_options(o.selector, sub, o.policy == "marconi" && !job.alpha, o.scan.reference_quirks, job);
  if (o.concurrency < 1 || o.concurrency > 1'000'000)
    throw hybridcache::invalid_argument("--concurrency: expected 1..1000000, got " + std::to_string(o.concurrency));
  const std::int64_t mooncake_block = o.format == "mooncake" && o.block_size > 0 ? o.block_size : 512;
  if (o.format != "mooncake" && o.block_size > 0) job.vllm_block = o.block_size;
  job.concurrency = o.concurrency;
  job.progress = true;  // progress.hpp shows it only for a run that takes a while
  // In-flight requests pin their matches, which cannot be evicted; letting commits overflow
  // then runs the cache far past its capacity (1.79 GB at 5e8 B, concurrency 8). So with
  // more than one request in flight the capacity is a hard limit.
  job.strict_capacity = o.strict_capacity || o.concurrency > 1;
  apply_single_tier_options(o.scan, sub, {o.policy == "marconi", o.policy == "vllm+", "to --policy " + o.policy}, job);
  job.reference_lru_ties = parse_lru_ties(o.lru_ties);
  job.keep_per_request = !o.per_request.empty();
  load.block_size = mooncake_block;
  const auto requests = load_trace(o.trace, o.format, load);
  job.requests = &requests;
  job.trace = trace_label(o.trace);
  replay_result r = run_replay(job);
  r.tokenizer = tokenizer_label(o.format, load);
  if (!o.per_request.empty()) {  // request index, input tokens, skipped tokens (replay order)
    std::string csv = std::string(fields::per_request_csv) + "\n";
    for (std::size_t i = 0; i < r.metrics.skipped_per_request.size(); ++i)
      csv += std::to_string(i) + ',' + std::to_string(requests[i].input_tokens) + ',' +
             std::to_string(r.metrics.skipped_per_request[i]) + '\n';
    write_file_atomic(o.per_request, csv, "--per-request");
  }
  if (o.json) {
    std::printf("%s\n", to_json(r).c_str());
    return;
  }
  std::printf("%s", format_table({r}).c_str());
  if (!r.tokenizer.empty())
    std::printf("tokenizer: %s\n", r.tokenizer == "built-in approximation"
                                        ? "built-in approximation (text_tokenizer.hpp; --tokenizer tokenizer.json for a model's own)"
                                        : r.tokenizer.c_str());
  const byte_units units = units_of(o.capacity);  // sizes in the family the user gave --capacity in
  std::printf("\ntoken hit rate by input length:\n");
  for (const auto& b : r.metrics.by_input_length) {
    if (b.requests == 0) continue;
    const std::string range = b.hi == std::numeric_limits<std::int64_t>::max()
                                  ? ">= " + std::to_string(b.lo)
                                  : std::to_string(b.lo) + "-" + std::to_string(b.hi - 1);
    std::printf("  %-14s %16s  %6.2f%%\n", range.c_str(), count_of(static_cast<std::size_t>(b.requests), "request").c_str(),
                100.0 * b.token_hit_rate());
  }
  std::printf("checkpoints: %lld admitted, %lld reused, %lld evicted; KV admitted %s; peak %s\n",
              static_cast<long long>(r.metrics.cache.checkpoints_admitted),
              static_cast<long long>(r.metrics.cache.checkpoints_reused),
              static_cast<long long>(r.metrics.cache.checkpoints_evicted),
              format_bytes(r.metrics.cache.kv_bytes_admitted, units).c_str(),
              format_bytes(r.metrics.cache.peak_bytes, units).c_str());
  std::printf("%s", selector_summary(r).c_str());
  if (r.metrics.cache.peak_bytes > r.capacity_bytes)
    std::printf("note: the cache peaked at %s, over its %s capacity: a request whose state alone exceeds the free "
                "space is inserted anyway, as the Marconi reference does (--strict-capacity forbids it)\n",
                format_bytes(r.metrics.cache.peak_bytes, units).c_str(), format_bytes(r.capacity_bytes, units).c_str());
}

const bool registered = hcbench::register_command(
    {"replay", "replay one trace through one cache policy at one capacity", [](CLI::App& sub) {
       static replay_cli o;
       o = replay_cli{};  // the defaults again: python/ builds an App per call, CLI11 writes only what is given
       sub.add_option("--trace", o.trace, "trace file; - reads stdin; a .gz file is decompressed")->required();
       sub.add_option("--format", o.format, "trace format: marconi (token-id JSONL), mooncake (hash_ids JSONL), "
                                            "sharegpt (conversation JSONL), openai (chat JSONL), swe-agent (.traj file "
                                            "or directory), tau-bench (results JSON), lmsys (LMSys-Chat-1M rows, JSONL); default marconi");
       sub.add_option("--model", o.model, "model preset (see `hcbench models`); default marconi_7b");
       hcbench::add_model_options(sub, o.model_flags);
       sub.add_option("--capacity", o.capacity, "cache capacity in bytes: 5e8, 500000000, 5GB, 4GiB (required unless --tiers)");
       sub.add_option("--policy", o.policy, "marconi | sglang+ | vllm+ | lru | gdsf; default marconi");
       sub.add_option("--alpha", o.alpha, "marconi's FLOP-efficiency weight: a number, or auto (chosen online, see "
                                          "--tuner; default)");
       hcbench::add_selector_options(sub, o.selector, true);
       // No "=0" in --help: 0 only marks "not given"; the defaults are the format's and policy's.
       sub.add_option("--block-size", o.block_size, hcbench::block_size_help)->default_str("");
       sub.add_option("--sessions-per-second", o.sessions_per_second,
                      "sharegpt, openai, swe-agent, tau-bench, lmsys: conversations started per second (default 1)");
       sub.add_option("--tokenizer", o.tokenizer,
                      "text formats: a Hugging Face tokenizer.json (byte-level BPE) to tokenize with; default: the "
                      "built-in approximation");
       sub.add_option("--chat-template", o.chat_template,
                      "openai, swe-agent, tau-bench, lmsys: JSON file of role prefixes/suffixes (default ChatML)");
       sub.add_option("--tool-time-mean", o.tool_time_mean_s,
                      "openai, swe-agent, tau-bench, lmsys: Poisson mean of the tool time before a call, s (default 5)");
       sub.add_option("--collapse-observations", o.collapse_observations,
                      "openai, swe-agent, tau-bench, lmsys: keep only the last K observations whole (Marconi's SWE-bench: 5); "
                      "-1: off (the default)");
       sub.add_option("--max-turns", o.max_turns,
                      "openai, swe-agent, tau-bench, lmsys: at most this many requests per session (default 0: no limit)");
       sub.add_option("--concurrency", o.concurrency, "requests in flight; a match stays pinned until its "
                                                      "request finishes (default 1, the reference's model); above 1 "
                                                      "the capacity is strict (see --strict-capacity)");
       sub.add_flag("--json", o.json,
                    std::string("print one JSON object on stdout; keys: ") + hcbench::fields::replay_json +
                        ". With --tiers: " + hcbench::fields::tiered_json);
       sub.add_flag("--strict-capacity", o.strict_capacity,
                    "never exceed the capacity: do not cache a request whose state alone is larger "
                    "(default: insert it anyway, as the Marconi reference does)");
       hcbench::add_single_tier_options(sub, o.scan);
       sub.add_option("--per-request", o.per_request,
                      std::string("write one CSV row per request (replay order) to this file, columns ") +
                          hcbench::fields::per_request_csv + "; with --tiers (dispatch order): " +
                          hcbench::fields::tiered_per_request_csv + hcbench::fields::tiered_per_request_tier_columns);
       sub.add_option("--lru-ties", o.lru_ties,
                      "sglang+/vllm+/lru tie-breaking: reference (CPython heapq order, exact reference victims, "
                      "O(n) per eviction round; default) or node-id (O(log n))");
       sub.add_option("--tiers", o.tiered.tiers,
                      "multi-tier replay: hbm=BYTES,host=BYTES[,cxl@NODE=BYTES][,disk@DIR=BYTES]"
                      "[,redis@HOST:PORT=BYTES], fastest first; a lower tier may add :gbps=G:lat_us=L (a disk or "
                      "redis tier's link not given is measured at start-up); the prefix cache of --policy over "
                      "these tiers, timed (CaR), against the same policy on HBM alone");
       sub.add_option("--link-gbps", o.tiered.link_gbps,
                      "--tiers: HBM <-> host/cxl tier bandwidth, GB/s, unless the tier gives :gbps= (default 50)");
       sub.add_option("--scheduler", o.tiered.scheduler, "--tiers: fcfs | car (default fcfs)");
       sub.add_option("--prefetch", o.tiered.prefetch, "--tiers: none | deadline | threshold (default none)");
       sub.add_option("--sparsify", o.tiered.sparsify, "--tiers: off | profile (default off)");
       sub.add_option("--demotion", o.tiered.demotion,
                      "--tiers: victim order below HBM: auto | lru | flop (FLOP-aware: saved FLOPs per byte of KV or "
                      "checkpoint; default auto = lru) | car (CaR's score: +1 when a request enters the window, +1 "
                      "when it is dispatched, -2 when its generation completes; the HBM victim is the smallest "
                      "score, then LRU, then node id; replaces the policy's HBM scorer, keeps its admission)");
       sub.add_option("--write-policy", o.tiered.write_policy,
                      "--tiers: write-back (copy down when evicted; default) | write-through (copy down when a "
                      "request finishes) | write-through-selective (after --write-through-hits hits)");
       sub.add_option("--write-through-hits", o.tiered.write_through_hits,
                      "--tiers: write-through-selective threshold (default 2)");
       sub.add_option("--watermarks", o.tiered.watermarks,
                      "--tiers: HIGH,LOW of HBM use: the cleaner copies the coldest entries down above HIGH until "
                      "those down to LOW are clean (default 0.9,0.8)");
       sub.add_option("--layerwise", o.tiered.layerwise, "--tiers: layer-wise pipelined loading on | off (default on)");
       sub.add_option("--recompute-when-faster", o.tiered.recompute,
                      "--tiers: decline a lower-tier hit whose load is slower than recomputing it, on | off (default on)");
       sub.add_option("--staging-fraction", o.tiered.staging_fraction,
                      "--tiers: share of HBM kept as room for loads (default 0.125; the cache gets the rest)");
       sub.add_option("--arrival-scale", o.tiered.arrival_scale,
                      "--tiers: multiply inter-arrival times (default 1; > 1 unloads the modelled prefill engine)");
       sub.add_option("--spread-arrivals", o.tiered.spread_arrivals,
                      "--tiers: spread requests with equal timestamps over this many seconds, or 'next': up to "
                      "the next distinct timestamp (the trace's sampling bin); default 0 (as recorded)");
       sub.add_option("--prefill-engines", o.tiered.prefill_engines,
                      "--tiers: prefill engines sharing the cache, each with its own links: N, or auto (default: the "
                      "fewest that keep a cache-less run under 90 % busy)");
       sub.add_option("--prefetch-depth", o.tiered.prefetch_depth,
                      "--tiers: queued requests (in dispatch order) a prefetch may serve (default 1)");
       sub.add_option("--prefill-time", o.tiered.prefill_time,
                      "--tiers: flops (the cost model's FLOPs at Jamba-on-4xA100 throughput, prefix-aware; "
                      "default) | line (the measured Jamba-1.5-Mini line for every model)");
       sub.add_option("--per-copy-us", o.tiered.per_copy_us, "--tiers: fixed cost of one copy call, us (default 6)");
       sub.add_option("--decode", o.tiered.decode,
                      "--tiers: where decode runs: disaggregated (its own pool; the prefill engine is free at the first "
                      "token; default) | colocated (on the prefill engine, busy until the last token: CaR's setting, "
                      "where --prefetch deadline waits on TPOT x the predicted output lengths)");
       sub.add_option("--tpot-ms", o.tiered.tpot_ms,
                      "--tiers: time per output token, ms: TTET = TTFT + TPOT x (output tokens - 1) (default 20)");
       sub.add_option("--length-predictor", o.tiered.length_predictor,
                      "--tiers --decode colocated: output-length predictor of the deadline prefetch: mean (running "
                      "mean; default) | bucket (mean per power-of-two prompt-length bucket) | oracle (the true length)");
       sub.add_option("--plot", o.tiered.plot,
                      "--tiers: write the figure (TTFT distribution single tier vs tiers, token hits per tier) as SVG "
                      "to this file (default: next to --per-request's CSV, as .svg; without either, none)");
       sub.add_flag("--real-bytes", o.tiered.real_bytes,
                    "--tiers: also run the multi-tier replay moving real bytes (memory tiers as host arenas of their "
                    "full size, disk/redis through their backends, every load checked) and fail unless its hits "
                    "equal the modelled run's (validation; slow; scale the tiers to fit this machine)");
       sub.callback([&sub] { run(o, sub); });
     }});

}  // namespace
