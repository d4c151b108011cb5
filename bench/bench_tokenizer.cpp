// Tokenizing ShareGPT vs replaying it, side by side in one run (issue #19's speed goal:
// "tokenising the ShareGPT file costs less than replaying it"). The file is the real
// ShareGPT-zh trace (../shared/data/traces/sharegpt_zh_1k, 8,751 messages, 3.8 MB of text);
// the tokenizer is a byte-level BPE tokenizer.json named by $HYBRIDCACHE_BPE_TOKENIZER, e.g.
// one trained by scripts/train_bpe_tokenizer.py on that file (docs/replay.md):
//
//   python3 scripts/train_bpe_tokenizer.py --vocab-size 32000 --out bpe32k.json
//       ../shared/data/traces/sharegpt_zh_1k/sharegpt_zh_1K_format.jsonl
//   HYBRIDCACHE_BPE_TOKENIZER=bpe32k.json build/release/bench/bench_tokenizer
//       --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
// (each command on one line).
//
//   bpe_load              read and parse the tokenizer.json
//   bpe_encode            every message's ids from a freshly loaded tokenizer (its pre-token
//                         cache cold, as in one hcbench run); bytes/s is message text
//   builtin_encode        the same with the built-in approximation (text_tokenizer.hpp)
//   sharegpt_read/bpe     the whole reader: JSON, tokenizing, requests (what hcbench reads)
//   sharegpt_read/builtin
//   replay/<policy>       one replay of the BPE-tokenized trace at 2 GB, the trace read once
//                         outside the timing. marconi: --alpha auto, the adaptive selector
//                         (what hcbench runs by default); marconi_one_shot: the one-shot
//                         tuner with one tuning thread (--tuner one-shot)
// Without the file or the tokenizer the benchmarks needing them report an error and skip.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <hybridcache/sim/tokenizer/bpe_tokenizer.hpp>
#include <hybridcache/sim/json.hpp>
#include <hybridcache/sim/replay.hpp>
#include <hybridcache/sim/sharegpt_trace.hpp>
#include <hybridcache/sim/tokenizer/text_tokenizer.hpp>

#include "replay_bench.hpp"

namespace {

namespace hc = hybridcache;
namespace pc = hybridcache::prefix;

const std::filesystem::path sharegpt_path =
    std::filesystem::path(HYBRIDCACHE_SOURCE_DIR) / ".." / "shared" / "data" / "traces" / "sharegpt_zh_1k" / "sharegpt_zh_1K_format.jsonl";

std::filesystem::path tokenizer_path() {
  const char* p = std::getenv("HYBRIDCACHE_BPE_TOKENIZER");
  return p != nullptr ? std::filesystem::path(p) : std::filesystem::path();
}

/// Every message's text ("value") in file order.
const std::vector<std::string>& messages() {
  static const std::vector<std::string> all = [] {
    std::vector<std::string> out;
    std::ifstream in(sharegpt_path);
    std::string line;
    std::int64_t number = 0;
    while (std::getline(in, line)) {
      ++number;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      hc::sim::json_cursor c(line, number);
      c.begin_object("");
      std::string_view key;
      while (c.next_member(key)) {
        if (key != "conversations") {
          c.skip_value(key);
          continue;
        }
        c.begin_array("conversations");
        while (c.next_element("conversations")) {
          c.begin_object("conversations[]");
          std::string_view member;
          while (c.next_member(member)) {
            if (member == "value")
              out.emplace_back(c.read_string("value"));
            else
              c.skip_value(member);
          }
        }
      }
    }
    return out;
  }();
  return all;
}

/// The tokenizer as loaded once (copied per iteration, so every encode starts cold).
const hc::sim::bpe_tokenizer* loaded_tokenizer() {
  static const std::unique_ptr<hc::sim::bpe_tokenizer> t = []() -> std::unique_ptr<hc::sim::bpe_tokenizer> {
    const auto p = tokenizer_path();
    if (p.empty() || !std::filesystem::exists(p)) return nullptr;
    return std::make_unique<hc::sim::bpe_tokenizer>(hc::sim::bpe_tokenizer::from_file(p));
  }();
  return t.get();
}

bool have_inputs(benchmark::State& state, bool need_tokenizer) {
  if (!std::filesystem::exists(sharegpt_path)) {
    state.SkipWithError(("absent: " + sharegpt_path.string()).c_str());
    return false;
  }
  if (need_tokenizer && loaded_tokenizer() == nullptr) {
    state.SkipWithError("set HYBRIDCACHE_BPE_TOKENIZER to a byte-level BPE tokenizer.json (scripts/train_bpe_tokenizer.py)");
    return false;
  }
  return true;
}

std::int64_t message_bytes() {
  std::int64_t n = 0;
  for (const auto& m : messages()) n += static_cast<std::int64_t>(m.size());
  return n;
}

void bpe_load(benchmark::State& state) {
  if (!have_inputs(state, true)) return;
  for (auto _ : state) benchmark::DoNotOptimize(hc::sim::bpe_tokenizer::from_file(tokenizer_path()).vocab_size());
}
BENCHMARK(bpe_load)->Unit(benchmark::kMillisecond);

void bpe_encode(benchmark::State& state) {
  if (!have_inputs(state, true)) return;
  std::vector<hc::sim::token_id> ids;
  std::unique_ptr<hc::sim::bpe_tokenizer> tok;
  for (auto _ : state) {
    state.PauseTiming();
    tok.reset();  // copied and freed outside the timing
    tok = std::make_unique<hc::sim::bpe_tokenizer>(*loaded_tokenizer());
    ids.clear();
    state.ResumeTiming();
    for (const auto& m : messages()) tok->encode(m, ids);
    benchmark::DoNotOptimize(ids.data());
  }
  state.counters["ids"] = benchmark::Counter(static_cast<double>(ids.size()));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * message_bytes());
}
BENCHMARK(bpe_encode)->Unit(benchmark::kMillisecond);

void builtin_encode(benchmark::State& state) {
  if (!have_inputs(state, false)) return;
  std::vector<hc::sim::token_id> ids;
  for (auto _ : state) {
    ids.clear();
    for (const auto& m : messages()) hc::sim::tokenize_text(m, ids);
    benchmark::DoNotOptimize(ids.data());
  }
  state.counters["ids"] = benchmark::Counter(static_cast<double>(ids.size()));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * message_bytes());
}
BENCHMARK(builtin_encode)->Unit(benchmark::kMillisecond);

hc::sim::sharegpt_options bpe_options(const hc::sim::bpe_tokenizer& t) {
  hc::sim::sharegpt_options o;
  o.tokenizer = std::make_shared<hc::sim::bpe_tokenizer>(t);
  return o;
}

void sharegpt_read(benchmark::State& state, bool bpe) {
  if (!have_inputs(state, bpe)) return;
  std::int64_t requests = 0;
  hc::sim::sharegpt_options o;
  for (auto _ : state) {
    state.PauseTiming();
    o = bpe ? bpe_options(*loaded_tokenizer()) : hc::sim::sharegpt_options{};  // copied outside the timing
    state.ResumeTiming();
    hc::sim::sharegpt_reader reader(sharegpt_path, o);
    requests = static_cast<std::int64_t>(hc::sim::replay_trace::read_all(reader).size());
  }
  state.counters["requests"] = benchmark::Counter(static_cast<double>(requests));
}
BENCHMARK_CAPTURE(sharegpt_read, bpe, true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(sharegpt_read, builtin, false)->Unit(benchmark::kMillisecond);

const hc::sim::replay_trace* bpe_trace() {
  static const std::unique_ptr<hc::sim::replay_trace> t = []() -> std::unique_ptr<hc::sim::replay_trace> {
    if (loaded_tokenizer() == nullptr || !std::filesystem::exists(sharegpt_path)) return nullptr;
    hc::sim::sharegpt_reader reader(sharegpt_path, bpe_options(*loaded_tokenizer()));
    return std::make_unique<hc::sim::replay_trace>(hc::sim::replay_trace::read_all(reader));
  }();
  return t.get();
}

void replay(benchmark::State& state, int policy) {
  if (!have_inputs(state, true)) return;
  const std::int64_t capacity = 2'000'000'000;
  switch (policy) {
    case 0: replay_bench::run<pc::judicious_admission>(state, *bpe_trace(), capacity, 1, replay_bench::marconi_selector); break;
    case 3: replay_bench::run<pc::judicious_admission>(state, *bpe_trace(), capacity, 1, replay_bench::flop_alpha0, hc::compose::tuning_config{.threads = 1}); break;
    case 1: replay_bench::run<pc::judicious_admission>(state, *bpe_trace(), capacity, 1, replay_bench::heapq_lru); break;
    default: replay_bench::run<pc::every_block_admission<32>>(state, *bpe_trace(), capacity, 1, replay_bench::heapq_lru); break;
  }
}
BENCHMARK_CAPTURE(replay, marconi, 0)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(replay, marconi_one_shot, 3)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(replay, sglang_plus, 1)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(replay, vllm_plus, 2)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
