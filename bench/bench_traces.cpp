// Trace reader throughput: the whole Mooncake conversation trace, the ShareGPT zh-1k file,
// an 18 MB Marconi-format JSONL (synth-v1 chat, seed 1) and the generator itself.
//
//   cmake --build build/<dir> --target bench_traces && ./build/<dir>/bench/bench_traces
//
// Files come from ../shared/data/traces next to the source tree; a benchmark whose file
// is absent reports an error and is skipped.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <filesystem>
#include <sstream>
#include <string>

#include <hybridcache/sim/trace.hpp>
#include <hybridcache/sim/trace_stats.hpp>
#include <hybridcache/sim/synth_v1.hpp>

namespace {

using namespace hybridcache::sim;

const std::filesystem::path traces_dir = std::filesystem::path(HYBRIDCACHE_SOURCE_DIR) / ".." / "shared" / "data" / "traces";

template <class Open>
void drain(benchmark::State& state, const std::filesystem::path& path, Open open) {
  if (!std::filesystem::exists(path)) {
    state.SkipWithError(("absent: " + path.string()).c_str());
    return;
  }
  std::int64_t requests = 0;
  for (auto _ : state) {
    auto reader = open(path);
    request r;
    while (reader.next(r)) {
      ++requests;
      benchmark::DoNotOptimize(r.input.data());
    }
  }
  state.SetItemsProcessed(requests);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(std::filesystem::file_size(path)));
}

void BM_mooncake_read(benchmark::State& state) {
  const auto block = static_cast<std::int32_t>(state.range(0));
  drain(state, traces_dir / "mooncake" / "conversation_trace.jsonl",
        [block](const std::filesystem::path& p) { return mooncake_reader(p, {.block_size = block}); });
}
BENCHMARK(BM_mooncake_read)->Arg(512)->Arg(16)->Unit(benchmark::kMillisecond);

void BM_mooncake_infinite_bound(benchmark::State& state) {
  const std::filesystem::path path = traces_dir / "mooncake" / "conversation_trace.jsonl";
  if (!std::filesystem::exists(path)) {
    state.SkipWithError("absent: mooncake trace");
    return;
  }
  for (auto _ : state) {
    mooncake_reader reader(path);
    benchmark::DoNotOptimize(infinite_cache_bound(reader).hit_ids);
  }
}
BENCHMARK(BM_mooncake_infinite_bound)->Unit(benchmark::kMillisecond);

void BM_sharegpt_read(benchmark::State& state) {
  drain(state, traces_dir / "sharegpt_zh_1k" / "sharegpt_zh_1K_format.jsonl",
        [](const std::filesystem::path& p) { return sharegpt_reader(p, {.max_input_tokens = 0}); });
}
BENCHMARK(BM_sharegpt_read)->Unit(benchmark::kMillisecond);

void BM_azure_read(benchmark::State& state) {
  drain(state, traces_dir / "azure2023" / "AzureLLMInferenceTrace_conv.csv", [](const std::filesystem::path& p) { return azure_reader(p); });
}
BENCHMARK(BM_azure_read)->Unit(benchmark::kMillisecond);

void BM_marconi_read_synth_chat(benchmark::State& state) {
  const std::string jsonl = synth_v1_jsonl(generate_synth_v1({.profile = synth_profile::chat, .seed = 1, .sessions = 100, .session_gap_ms = 2000}));
  std::int64_t requests = 0;
  for (auto _ : state) {
    std::istringstream in(jsonl);
    marconi_reader reader(in);
    request r;
    while (reader.next(r)) ++requests;
  }
  state.SetItemsProcessed(requests);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(jsonl.size()));
}
BENCHMARK(BM_marconi_read_synth_chat)->Unit(benchmark::kMillisecond);

void BM_synth_v1_generate_and_write(benchmark::State& state) {
  for (auto _ : state) {
    const auto requests = generate_synth_v1({.profile = synth_profile::chat, .seed = 1, .sessions = 100, .session_gap_ms = 2000});
    benchmark::DoNotOptimize(synth_v1_jsonl(requests).size());
  }
}
BENCHMARK(BM_synth_v1_generate_and_write)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
