// `hcbench compare`: several policies × capacities (× traces), run in parallel threads.
//
//   hcbench compare [--trace PATH --format F]... [--policies marconi,sglang+,vllm+,lru]
//                   [--capacities 1e9,2e9,5e9,1e10] [--model PRESET] [--alpha X|auto]
//                   [--block-size N] [--threads N] [--out DIR]
//                   [--drive commit|lifecycle] [--flop-candidates R] [--flop-index I] [--reference-quirks]
//
// The replay options that make sense per row apply to every row (single_tier_flags.hpp,
// selector_flags.hpp); the others (compare_refuses, the --tiers ones) are errors naming what
// to run instead.
//
// Prints an aligned table and writes DIR/results.csv and DIR/hit_rate_vs_capacity.svg.
// With no --trace it replays the embedded workload: synth-v1 chat (seed 1, 100 sessions,
// 2 s apart) and agent (seed 2, 100 sessions, 4 s apart), generated in memory — the same
// traces the Marconi reference was run on (anchors/marconi.md 1(i)).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>


#include <hybridcache/core/error.hpp>
#include <hybridcache/model/presets.hpp>
#include <hybridcache/sim/trace.hpp>

#include "atomic_file.hpp"
#include "cli_support.hpp"
#include "progress.hpp"
#include "command.hpp"
#include "model_flags.hpp"
#include "replay_args.hpp"
#include "replay_report.hpp"
#include "replay_run.hpp"
#include "selector_flags.hpp"
#include "single_tier_flags.hpp"
#include "tiered_flags.hpp"

namespace {

struct compare_cli {
  std::vector<std::string> traces;
  std::vector<std::string> formats;
  std::vector<std::string> labels;
  std::string policies = "marconi,sglang+,vllm+,lru";
  std::string capacities = "1e9,2e9,5e9,1e10";
  std::string model = "marconi_7b";
  hcbench::model_cli model_flags;  // --model-attn-ratio, --model-state-dim
  std::string alpha = "auto";
  std::int64_t block_size = 0;
  std::int64_t threads = 0;
  double sessions_per_second = 1.0;
  std::string tokenizer;
  std::string chat_template;
  double tool_time_mean_s = 5.0;
  std::int64_t collapse_observations = -1;
  std::int64_t max_turns = 0;
  std::int64_t concurrency = 1;
  std::string out = "hcbench-results";
  bool strict_capacity = false;
  std::string lru_ties = "reference";
  hcbench::selector_cli selector;
  hcbench::single_tier_cli scan;  // --drive, --flop-candidates, --flop-index, --reference-quirks: every row
  std::string refused;            // the value of an option compare refuses (see compare_refuses)
  bool refused_flag = false;
};

/// replay's options that have no meaning per row of compare's table: each is an error that
/// says what to run instead (CLI11 would only say "The following argument was not expected").
struct refused_option {
  const char* name;
  bool flag;          // takes no value
  const char* instead;
};
constexpr refused_option compare_refuses[] = {
    {"--capacity", false, "compare runs each of --capacities LIST"},
    {"--policy", false, "compare runs each of --policies LIST"},
    {"--json", true, "compare writes every row to DIR/results.csv (--out); `hcbench replay --json` prints one run's object"},
    {"--per-request", false, "it writes one file per replay: run `hcbench replay --per-request FILE` for the row you want"},
    {"--tiers", false, "the multi-tier replay compares tiers, not policies: run `hcbench replay --tiers`"},
};

struct loaded_trace {
  std::string label;
  hybridcache::sim::replay_trace requests;
  std::string tokenizer{};
  bool mooncake = false;  // --block-size is its engine block size, not vllm+'s checkpoint block
};

void run(const compare_cli& o, const CLI::App& sub) {
  using namespace hcbench;
  const hybridcache::model_spec model = resolve_model(o.model, o.model_flags, sub);  // throws naming the flag
  const std::vector<std::string> policies = split_list(o.policies);
  if (policies.empty()) throw hybridcache::invalid_argument("--policies is empty");
  for (const auto& p : policies) check_policy(p);
  const bool has_marconi = std::find(policies.begin(), policies.end(), "marconi") != policies.end();
  reject_unless(has_marconi, sub, "--alpha", "without marconi in --policies (marconi only)");
  const std::optional<double> alpha = parse_alpha(o.alpha);
  for (const refused_option& r : compare_refuses)
    if (given(sub, r.name)) throw hybridcache::invalid_argument(std::string(r.name) + " does not apply to compare: " + r.instead);
  for (const char* name : tiered_only_options)
    if (given(sub, name))
      throw hybridcache::invalid_argument(std::string(name) + " does not apply to compare: it is a --tiers option (run `hcbench replay --tiers`)");
  const bool has_vllm = std::find(policies.begin(), policies.end(), "vllm+") != policies.end();
  replay_job row_options;  // the tuner, selector and scorer options every row gets (where they apply)
  apply_single_tier_options(o.scan, sub, {has_marconi, has_vllm, "without marconi in --policies"}, row_options);
  apply_selector_options(o.selector, sub, has_marconi && !alpha, o.scan.reference_quirks, row_options,
                         has_marconi ? "with a fixed --alpha" : "without marconi in --policies");
  const bool reference_ties = parse_lru_ties(o.lru_ties);
  // The trace options apply to the formats that have them, as in replay: --block-size to a
  // mooncake trace (its engine block size) or to vllm+ (its checkpoint block), the text and
  // chat options to those formats. With a format this does not know, load_trace says so.
  namespace sim = hybridcache::sim;
  // No --format: marconi for every trace, replay's default (compare used to demand one).
  const std::vector<std::string> trace_formats =
      o.formats.empty() && !o.traces.empty() ? std::vector<std::string>{"marconi"} : o.formats;
  bool known = true, mooncake = false, text = false, chat = false;
  std::string formats;
  for (const auto& name : trace_formats) {
    const std::optional<sim::trace_format> f = sim::find_trace_format(name);
    known = known && f.has_value();
    mooncake = mooncake || (f && *f == sim::trace_format::mooncake);
    text = text || (f && sim::is_text_format(*f));
    chat = chat || (f && sim::is_chat_format(*f));
    formats += (formats.empty() ? "" : ",") + name;
  }
  const std::string to_these = o.traces.empty() ? "to the embedded synth-v1 workloads" : "to --format " + formats;
  reject_unless(!known || mooncake || has_vllm, sub, "--block-size",
                std::string("without vllm+ in --policies or a mooncake --trace (") + block_size_meaning + ")");
  if (given(sub, "--block-size")) check_block_size(o.block_size);
  for (const char* name : {"--sessions-per-second", "--tokenizer"})
    reject_unless(!known || text, sub, name, to_these + " (" + sim::trace_format_list(sim::is_text_format) + ")");
  for (const char* name : chat_only_options)
    reject_unless(!known || chat, sub, name, to_these + " (" + sim::trace_format_list(sim::is_chat_format) + ")");
  if (o.threads < 0) throw hybridcache::invalid_argument("--threads must be >= 0");
  if (o.concurrency < 1 || o.concurrency > 1'000'000)
    throw hybridcache::invalid_argument("--concurrency: expected 1..1000000, got " + std::to_string(o.concurrency));
  if (o.threads > 4096) throw hybridcache::invalid_argument("--threads: expected 0..4096, got " + std::to_string(o.threads));
  reject_unless(!o.traces.empty(), sub, "--format", "without --trace");
  reject_unless(!o.traces.empty(), sub, "--label", "without --trace");
  if (o.labels.size() > o.traces.size())
    throw hybridcache::invalid_argument("--label given " + std::to_string(o.labels.size()) + " times for " +
                                        std::to_string(o.traces.size()) + " --trace");

  if (split_list(o.capacities).empty())
    throw hybridcache::invalid_argument("--capacities: expected a comma-separated list of byte sizes, got '" +
                                        o.capacities + "'");
  std::vector<loaded_trace> traces;
  if (o.traces.empty()) {
    std::fprintf(stderr, "hcbench compare: no --trace given; replaying the embedded synth-v1 chat and agent workloads\n");
    traces.push_back({"synth-chat", synth_workload("chat", 1, 100, 2000)});
    traces.push_back({"synth-agent", synth_workload("agent", 2, 100, 4000)});
  } else {
    if (!(trace_formats.size() == 1 || trace_formats.size() == o.traces.size()))
      throw hybridcache::invalid_argument("give one --format for all traces or one per --trace");
    for (std::size_t i = 0; i < o.traces.size(); ++i) {
      const std::string& fmt = trace_formats.size() == 1 ? trace_formats[0] : trace_formats[i];
      const std::int64_t block = fmt == "mooncake" && o.block_size > 0 ? o.block_size : 512;
      std::string label = i < o.labels.size() ? o.labels[i] : trace_label(o.traces[i]);
      trace_load_options load{block, o.sessions_per_second};
      load.tokenizer = o.tokenizer;
      load.chat_template = o.chat_template;
      load.tool_time_mean_s = o.tool_time_mean_s;
      load.collapse_observations = o.collapse_observations;
      load.max_turns = o.max_turns;
      traces.push_back({label, load_trace(o.traces[i], fmt, load), tokenizer_label(fmt, load), fmt == "mooncake"});
    }
  }
  std::vector<std::int64_t> capacities;
  for (const auto& c : split_list(o.capacities)) capacities.push_back(parse_capacity(c));
  std::sort(capacities.begin(), capacities.end());

  std::vector<replay_job> jobs;
  for (const auto& t : traces)
    for (const auto& p : policies)
      for (std::int64_t cap : capacities) {
        replay_job j;
        j.requests = &t.requests;
        j.trace = t.label;
        j.model = model;
        j.capacity_bytes = cap;
        j.policy = p;
        j.alpha = alpha;
        j.tuner = row_options.tuner;
        j.selector = row_options.selector;
        j.strict_capacity = o.strict_capacity || o.concurrency > 1 || row_options.strict_capacity;  // see replay's --concurrency, --drive
        j.driver = row_options.driver;
        j.flop_candidates = row_options.flop_candidates;
        j.flop_index = row_options.flop_index;
        j.reference_quirks = row_options.reference_quirks && (p == "marconi" || p == "vllm+");  // the rows it changes
        j.concurrency = o.concurrency;
        j.reference_lru_ties = reference_ties;
        j.tuning_threads = 1;  // the jobs already run in parallel
        if (o.block_size > 0 && !t.mooncake) j.vllm_block = o.block_size;  // as replay: 32 tokens on mooncake
        jobs.push_back(std::move(j));
      }

  // Parallel std::threads over a shared job index; results land in job order.
  std::vector<replay_result> results(jobs.size());
  std::vector<std::exception_ptr> errors(jobs.size());
  std::atomic<std::size_t> next{0};
  progress_meter meter({.total = jobs.size(), .what = "replays"});
  const std::size_t n_threads = std::min<std::size_t>(
      jobs.size(), o.threads > 0 ? static_cast<std::size_t>(o.threads) : std::max(1u, std::thread::hardware_concurrency()));
  auto worker = [&] {
    for (std::size_t i; (i = next.fetch_add(1)) < jobs.size();) {
      try {
        results[i] = run_replay(jobs[i]);
      } catch (...) {
        errors[i] = std::current_exception();
      }
      meter.step();
    }
  };
  std::vector<std::thread> pool;
  for (std::size_t t = 0; t < n_threads; ++t) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
  meter.finish();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  for (std::size_t i = 0; i < results.size(); ++i) {
    for (const auto& t : traces)
      if (t.label == jobs[i].trace) results[i].tokenizer = t.tokenizer;
  }

  const std::string table = format_table(results);
  std::printf("%s", table.c_str());
  for (const auto& t : traces)
    if (!t.tokenizer.empty()) std::printf("tokenizer (%s): %s\n", t.label.c_str(), t.tokenizer.c_str());

  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(o.out, ec);
  if (ec) throw hybridcache::invalid_argument("--out '" + o.out + "': cannot create directory (" + ec.message() + ")");
  const fs::path csv_path = fs::path(o.out) / "results.csv";
  const fs::path svg_path = fs::path(o.out) / "hit_rate_vs_capacity.svg";
  const fs::path table_path = fs::path(o.out) / "table.txt";
  std::string csv = std::string(csv_header()) + "\n";
  for (const auto& r : results) csv += csv_row(r) + "\n";
  std::string title = "hcbench compare: " + model.name;
  for (const auto& t : traces) title += (&t == &traces.front() ? " on " : ", ") + t.label;
  atomic_file_set files;  // all three or none
  files.add(csv_path.string(), csv);
  files.add(table_path.string(), table);
  files.add(svg_path.string(), hit_rate_svg(results, title));
  files.commit("--out");
  std::printf("\ntable: %s\ncsv:   %s\nplot:  %s\n", table_path.string().c_str(), csv_path.string().c_str(),
              svg_path.string().c_str());
}

const bool registered = hcbench::register_command(
    {"compare", "run several policies over several capacities (and traces) in parallel; table, CSV and SVG plot",
     [](CLI::App& sub) {
       static compare_cli o;
       o = compare_cli{};  // the defaults again: python/ builds an App per call, CLI11 writes only what is given
       sub.add_option("--trace", o.traces, "trace file (repeatable); none: the embedded synth-v1 workloads");
       sub.add_option("--format", o.formats,
                      "format of each --trace (one for all, or one per trace; see replay --help); default marconi");
       sub.add_option("--label", o.labels, "table label of each --trace (default: file stem)");
       sub.add_option("--policies", o.policies, "comma-separated: marconi,sglang+,vllm+,lru,gdsf");
       sub.add_option("--capacities", o.capacities, "comma-separated byte capacities");
       sub.add_option("--model", o.model, "model preset (see `hcbench models`)");
       hcbench::add_model_options(sub, o.model_flags);
       sub.add_option("--alpha", o.alpha, "marconi's FLOP-efficiency weight: a number, or auto");
       hcbench::add_selector_options(sub, o.selector);
       hcbench::add_single_tier_options(sub, o.scan);
       sub.add_option("--block-size", o.block_size, hcbench::block_size_help)->default_str("");  // see replay
       sub.add_option("--sessions-per-second", o.sessions_per_second,
                      "sharegpt, openai, swe-agent, tau-bench, lmsys: conversations started per second");
       sub.add_option("--tokenizer", o.tokenizer,
                      "text formats: a Hugging Face tokenizer.json (byte-level BPE); default: the built-in approximation");
       sub.add_option("--chat-template", o.chat_template, "openai, swe-agent, tau-bench, lmsys: role prefix/suffix JSON file");
       sub.add_option("--tool-time-mean", o.tool_time_mean_s, "agent formats: Poisson mean tool time, s (default 5)");
       sub.add_option("--collapse-observations", o.collapse_observations,
                      "agent formats: keep only the last K observations whole; -1: off (the default)");
       sub.add_option("--max-turns", o.max_turns, "agent formats: at most this many requests per session (0: no limit)");
       sub.add_option("--concurrency", o.concurrency, "requests in flight per replay (see replay --help)");
       sub.add_option("--threads", o.threads, "worker threads; 0: hardware concurrency (the default)");
       sub.add_option("--out", o.out,
                      std::string("output directory: results.csv (one row per replay, columns ") +
                          hcbench::fields::compare_csv +
                          "), table.txt (the table printed) and hit_rate_vs_capacity.svg (token hit rate and P95 TTFT "
                          "against capacity)");
       sub.add_flag("--strict-capacity", o.strict_capacity, "never exceed the capacity (see replay --help)");
       sub.add_option("--lru-ties", o.lru_ties,
                      "sglang+/vllm+/lru tie-breaking: reference (CPython heapq order, exact reference victims, "
                      "O(n) per eviction round; default) or node-id (O(log n))");
       for (const refused_option& r : compare_refuses) {  // accepted only to be refused with a message
         const std::string help = std::string("not in compare: ") + r.instead;
         if (r.flag) sub.add_flag(r.name, o.refused_flag, help)->group("Refused (replay only)");
         else sub.add_option(r.name, o.refused, help)->group("Refused (replay only)");
       }
       for (const char* name : hcbench::tiered_only_options)  // hidden: refused as --tiers options
         (name == hcbench::tiered_only_flag ? sub.add_flag(name, o.refused_flag) : sub.add_option(name, o.refused))->group("");
       sub.callback([&sub] { run(o, sub); });
     }});

}  // namespace
