// Multi-tier cache: cache-table operations, the host copy engine (coalesced vs page-sized
// copies, the two-phase move), and the tiered replay on the Mooncake conversation trace
// (counters: token hit rate, modelled TTFT P50/P95, load hidden by pipelining).
//
//   build/<dir>/bench/bench_tiered --benchmark_filter=replay --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <hybridcache/model/prefill_time.hpp>
#include <hybridcache/model/presets.hpp>
#include <hybridcache/prefix/lru_scorer.hpp>
#include <hybridcache/prefix/prefix_cache.hpp>
#include "hybridcache/stores/counting_store.hpp"
#include <hybridcache/stores/tiered_state_store.hpp>
#include <hybridcache/sim/mooncake_trace.hpp>
#include <hybridcache/sim/synth_v1.hpp>
#include <hybridcache/tiered/host_copy_engine.hpp>
#include <hybridcache/sim/tiered_replay.hpp>
#include <hybridcache/tiered/tiered_store.hpp>

using namespace hybridcache;
using namespace hybridcache::tiered;

namespace {
std::vector<tier_config> tiers(std::int64_t hbm, std::int64_t host) {
  return {{.kind = tier_kind::hbm, .capacity_bytes = hbm}, {.kind = tier_kind::host, .capacity_bytes = host}};
}
}  // namespace

// insert + pin + unpin + touch + erase of one entry in a table of 16k entries.
static void bm_store_entry_lifecycle(benchmark::State& state) {
  tiered_store<> s(tiers(std::int64_t{1} << 30, std::int64_t{1} << 30), 4096);
  for (std::uint64_t n = 0; n < 16384; ++n) (void)s.insert(make_entry_id(n), 4096);
  std::uint64_t next = 1 << 20;
  for (auto _ : state) {
    const entry_id id = make_entry_id(next++);
    (void)s.insert(id, 4096);
    (void)s.pin(id);
    (void)s.unpin(id);
    (void)s.touch(id);
    (void)s.erase(id);
  }
}
BENCHMARK(bm_store_entry_lifecycle);

// victim + prepare_move + complete_move (metadata only) with 16k entries per tier.
static void bm_store_demote_promote(benchmark::State& state) {
  tiered_store<car_score_demotion> s(tiers(std::int64_t{1} << 30, std::int64_t{1} << 30), 4096);
  for (std::uint64_t n = 0; n < 16384; ++n) (void)s.insert(make_entry_id(n), 4 * 4096);
  for (auto _ : state) {
    const auto v = s.victim(hbm_tier);
    auto t = s.prepare_move(*v, tier_id{1});
    (void)s.complete_move(*t, true);
    auto b = s.prepare_move(*v, hbm_tier);
    (void)s.complete_move(*b, true);
    (void)s.add_score(*v, 1.0);
  }
}
BENCHMARK(bm_store_demote_promote);

// One 16 MiB entry moved HBM -> host through move_entry: pages of state.range(0) bytes,
// adjacent (coalesced into one copy) or scattered (one copy per page).
static void bm_host_move(benchmark::State& state) {
  const std::int64_t page = state.range(0), bytes = std::int64_t{16} << 20;
  const bool scattered = state.range(1) != 0;
  tiered_store<> s(tiers(4 * bytes, 4 * bytes), page);
  host_copy_engine e(tiers(4 * bytes, 4 * bytes), page, {.measure_bandwidth = false});
  if (scattered) {  // interleave two entries so each one's pages alternate
    const auto n_pages = static_cast<std::uint64_t>(2 * bytes / page);
    for (std::uint64_t n = 0; n < n_pages; ++n) (void)s.insert(make_entry_id(100 + n), page);
    for (std::uint64_t n = 0; n < n_pages; n += 2) (void)s.erase(make_entry_id(100 + n));
  }
  (void)s.insert(entry_id{1}, bytes);
  for (auto _ : state) {
    (void)move_entry(s, e, entry_id{1}, tier_id{1});
    (void)move_entry(s, e, entry_id{1}, hbm_tier);
  }
  const auto st = e.take_stats();
  state.counters["copies_per_move"] = static_cast<double>(st.transfers) / static_cast<double>(st.jobs);
  state.SetBytesProcessed(state.iterations() * 2 * bytes);
}
BENCHMARK(bm_host_move)->Args({64 << 10, 0})->Args({64 << 10, 1})->Args({2 << 20, 0})->UseRealTime();

namespace {
const std::vector<sim::request>& mooncake() {
  static const std::vector<sim::request> reqs = [] {
    std::vector<sim::request> out;
    const std::filesystem::path p =
        std::filesystem::path(HYBRIDCACHE_SOURCE_DIR) / "../shared/data/traces/mooncake/conversation_trace.jsonl";
    if (!std::filesystem::exists(p)) return out;
    sim::mooncake_reader r(p, {.block_size = 512, .synthesize_output_ids = false});
    sim::request q;
    while (r.next(q)) out.push_back(q);
    return out;
  }();
  return reqs;
}

// One replay setup. The defaults are the headline: jamba_1_5_mini, 4 prefill engines
// sharing the cache, the trace's own arrival rate and timestamps, FCFS, layer-wise loading
// with the load/recompute split, prefill time from the cost model, 50 GB/s links.
struct replay_setup {
  const char* tiers = "hbm=128GiB,host=512GiB";
  const char* model = "jamba_1_5_mini";
  scheduler_kind scheduler = scheduler_kind::fcfs;
  prefetch_kind prefetch = prefetch_kind::none;
  sparsify_kind sparsify = sparsify_kind::off;
  demotion_kind demotion = demotion_kind::automatic;
  std::size_t engines = 4;
  double arrival_scale = 1.0;
  bool spread_next = false;  // spread each timestamp's requests up to the next timestamp
  bool layerwise = true;
  bool split = true;
  bool flop_time = true;     // prefill time from the cost model (false: the Jamba line)
  double link_gbps = 50.0;
  std::size_t prefetch_depth = 1;
};

void replay(benchmark::State& state, const replay_setup& c) {
  const auto& reqs = mooncake();
  if (reqs.empty()) {
    state.SkipWithError("Mooncake trace not found");
    return;
  }
  const cost_model m(presets::preset(c.model));
  tiered_replay_options o;
  o.tiers = parse_tiers(c.tiers, o.page_bytes);
  o.link_gbps = c.link_gbps;
  o.demotion = c.demotion;
  o.scheduler = c.scheduler;
  o.prefetch = c.prefetch;
  o.prefetch_depth = c.prefetch_depth;
  o.sparsify = c.sparsify;
  o.prefill_engines = c.engines;
  o.arrival_time_scale = c.arrival_scale;
  o.spread_to_next_arrival = c.spread_next;
  o.layerwise = c.layerwise;
  o.split_load_recompute = c.split;
  tiered_replay_result r;
  const flop_prefill_time flops(m);
  for (auto _ : state) r = c.flop_time ? run_tiered_replay(reqs, m, o, flops) : run_tiered_replay(reqs, m, o);
  state.counters["hit"] = r.token_hit_rate();
  state.counters["host_hit"] = static_cast<double>(r.host_hit_tokens) / static_cast<double>(r.input_tokens);
  state.counters["p50_ms"] = r.ttft_p50_ms;
  state.counters["p95_ms"] = r.ttft_p95_ms;
  state.counters["mean_ms"] = r.ttft_mean_ms;
  state.counters["svc_p50_ms"] = r.service_p50_ms;
  state.counters["util"] = r.utilization;
  state.counters["loaded_GB"] = static_cast<double>(r.bytes_loaded) / 1e9;
  state.counters["offl_GB"] = static_cast<double>(r.bytes_offloaded) / 1e9;
  state.counters["recompute"] = static_cast<double>(r.recompute_instead_of_reload);
  state.counters["split"] = static_cast<double>(r.split_load_recompute);
  state.counters["prefetch"] = static_cast<double>(r.prefetches);
  state.counters["pipe_hidden"] = r.pipeline_hidden_fraction;
  state.counters["load_hidden"] = r.load_hidden_fraction;
  state.counters["recomp_tok"] = static_cast<double>(r.recomputed_hit_tokens) / static_cast<double>(r.input_tokens);
}
}  // namespace

#define HC_REPLAY(name, ...)                                                                    \
  static void bm_replay_##name(benchmark::State& s) { replay(s, replay_setup{__VA_ARGS__}); } \
  BENCHMARK(bm_replay_##name)->Iterations(1)->Unit(benchmark::kMillisecond)

using enum scheduler_kind;
using enum prefetch_kind;
using enum sparsify_kind;
// The headline: HBM 128 GiB alone hits below half the infinite-cache bound (36.64 % of
// blocks); the same HBM plus a host tier 4x larger. Each variant changes one thing.
HC_REPLAY(hbm128, .tiers = "hbm=128GiB");
HC_REPLAY(hbm128_host512);
HC_REPLAY(hbm128_host512_serial, .layerwise = false);
HC_REPLAY(hbm128_host512_nosplit, .split = false);
HC_REPLAY(hbm128_car, .tiers = "hbm=128GiB", .scheduler = car);
HC_REPLAY(hbm128_host512_car_deadline, .scheduler = car, .prefetch = deadline);
HC_REPLAY(hbm128_host512_threshold, .prefetch = threshold);
HC_REPLAY(hbm128_host512_sparsify, .sparsify = profile);
HC_REPLAY(hbm128_spread, .tiers = "hbm=128GiB", .spread_next = true);
HC_REPLAY(hbm128_host512_spread, .spread_next = true);
HC_REPLAY(hbm128_line, .tiers = "hbm=128GiB", .flop_time = false);
HC_REPLAY(hbm128_host512_line, .flop_time = false);
HC_REPLAY(hbm10T_infinite, .tiers = "hbm=10TiB");
// One engine at a quarter of the trace's rate (the previous headline): same load, but each
// 3-second timestamp bin's burst is served one request at a time.
HC_REPLAY(one_engine_hbm128, .tiers = "hbm=128GiB", .engines = 1, .arrival_scale = 4.0);
HC_REPLAY(one_engine_hbm128_host512, .engines = 1, .arrival_scale = 4.0);

// Demotion scorers: FLOP-aware per block vs LRU (with the CaR queue, whose default is CaR's score).
HC_REPLAY(hbm128_flop, .tiers = "hbm=128GiB", .demotion = demotion_kind::flop_aware);
HC_REPLAY(hbm128_host512_flop, .demotion = demotion_kind::flop_aware);
HC_REPLAY(hbm128_host512_car_lru, .scheduler = car, .demotion = demotion_kind::lru);
HC_REPLAY(hbm128_host512_car_score, .scheduler = car, .demotion = demotion_kind::car_score);

// HBM capacity x prefill engines: args = HBM GiB, host tier as a multiple of HBM (0 = single
// tier), engines. The goal's condition (single-tier hit below half the bound) picks no
// capacity, so docs/tiered.md reports the whole curve.
static void bm_replay_sweep(benchmark::State& s) {
  static std::string spec;
  spec = "hbm=" + std::to_string(s.range(0)) + "GiB";
  if (s.range(1) > 0) spec += ",host=" + std::to_string(s.range(0) * s.range(1)) + "GiB";
  replay(s, {.tiers = spec.c_str(), .engines = static_cast<std::size_t>(s.range(2))});
}
BENCHMARK(bm_replay_sweep)
    ->ArgsProduct({{16, 32, 64, 96, 128, 160}, {0, 4}, {4}})
    ->ArgsProduct({{128}, {0, 4}, {2, 3, 6, 8}})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

// Link-bandwidth sweep (GB/s = range(0) / 10): where reloading stops paying, the replay
// loads less (or nothing) and recomputes the rest, and says how often.
static void bm_replay_link_sweep(benchmark::State& s) {
  replay(s, {.link_gbps = static_cast<double>(s.range(0)) / 10.0});
}
BENCHMARK(bm_replay_link_sweep)->Arg(500)->Arg(50)->Arg(5)->Arg(1)->Iterations(1)->Unit(benchmark::kMillisecond);

// A pure Transformer with 512 KiB of KV per token (268 MB per block): loads are large, so
// layer-wise overlap, the split and prefetch matter more. HBM 1.5 TiB hits below half the bound.
HC_REPLAY(llama2_hbm1536G, .tiers = "hbm=1536GiB", .model = "llama2_7b");
HC_REPLAY(llama2_hbm1536G_host6T, .tiers = "hbm=1536GiB,host=6TiB", .model = "llama2_7b");
HC_REPLAY(llama2_hbm1536G_host6T_nosplit, .tiers = "hbm=1536GiB,host=6TiB", .model = "llama2_7b", .split = false);
HC_REPLAY(llama2_hbm1536G_host6T_serial, .tiers = "hbm=1536GiB,host=6TiB", .model = "llama2_7b", .layerwise = false);
HC_REPLAY(llama2_hbm1536G_host6T_deadline, .tiers = "hbm=1536GiB,host=6TiB", .model = "llama2_7b", .prefetch = deadline);
HC_REPLAY(llama2_hbm1536G_host6T_deadline8, .tiers = "hbm=1536GiB,host=6TiB", .model = "llama2_7b",
          .prefetch = deadline, .prefetch_depth = 8);
HC_REPLAY(llama2_hbm1536G_host6T_car_deadline, .tiers = "hbm=1536GiB,host=6TiB", .model = "llama2_7b", .scheduler = car,
          .prefetch = deadline);
HC_REPLAY(llama2_hbm1536G_car, .tiers = "hbm=1536GiB", .model = "llama2_7b", .scheduler = car);

// The library's own composition on the same trace: Marconi's prefix cache (judicious
// admission, LRU) over `tiered_state_store`, whose evictions demote to a host tier 4x larger
// (arg 1 = 4) or, with a single tier (arg 1 = 0), over a `counting_store` of the same HBM
// budget. Mooncake ids are 512-token blocks, so one id carries 512 tokens of KV. Counters:
// token hit from HBM and from the host tier (reusable ids x 512, capped at the input).
template <class ADM>
static void bm_prefix_tiered_mooncake(benchmark::State& state) {
  const auto& reqs = mooncake();
  if (reqs.empty()) {
    state.SkipWithError("Mooncake trace not found");
    return;
  }
  const cost_model m(presets::jamba_1_5_mini());
  const std::int64_t hbm = std::int64_t{state.range(0)} << 30, host = hbm * state.range(1);
  const std::int64_t kv_per_id = m.kv_bytes_per_token() * 512;
  std::int64_t input = 0, from_hbm = 0, from_host = 0;
  auto tokens = [](const sim::request& r, std::int64_t ids) { return std::min<std::int64_t>(ids * 512, r.input_tokens); };
  for (auto _ : state) {
    input = from_hbm = from_host = 0;
    if (host == 0) {
      prefix::prefix_cache<cost_model, ADM, prefix::lru_scorer> c(
          m, prefix::counting_store(hbm, kv_per_id, m.ssm_checkpoint_bytes()), prefix::lru_scorer{});
      for (const auto& r : reqs) {
        auto mt = c.match(r.input);
        from_hbm += tokens(r, mt->reusable_tokens);
        input += r.input_tokens;
        (void)c.commit(r.input, static_cast<std::int64_t>(r.input.size()), &*mt);
      }
    } else {
      using store_t = tiered_state_store<>;
      prefix::prefix_cache<cost_model, ADM, prefix::lru_scorer, store_t> c(
          m,
          store_t({.hbm_bytes = hbm, .host_bytes = host, .kv_bytes_per_token = kv_per_id,
                   .checkpoint_bytes = m.ssm_checkpoint_bytes()}),
          prefix::lru_scorer{});
      for (const auto& r : reqs) {
        auto mt = c.match(r.input);
        const tiered_hit h = c.store().lookup(r.input, *mt);
        from_hbm += tokens(r, h.hbm_tokens);
        from_host += tokens(r, h.reusable_tokens) - tokens(r, h.hbm_tokens);
        input += r.input_tokens;
        (void)c.commit(r.input, static_cast<std::int64_t>(r.input.size()), &*mt);
        c.store().settle(c.tree(), r.input, h);
      }
    }
  }
  state.counters["hit"] = static_cast<double>(from_hbm + from_host) / static_cast<double>(input);
  state.counters["hbm_hit"] = static_cast<double>(from_hbm) / static_cast<double>(input);
  state.counters["host_hit"] = static_cast<double>(from_host) / static_cast<double>(input);
}
BENCHMARK_TEMPLATE(bm_prefix_tiered_mooncake, prefix::judicious_admission)
    ->ArgsProduct({{32, 64, 128}, {0, 4}})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(bm_prefix_tiered_mooncake, prefix::every_block_admission<1>)
    ->ArgsProduct({{32, 64, 128}, {0, 4}})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

// The prefix cache over `tiered_state_store` with the bytes really moving: the synth-v1 chat
// fixture (seed 7, 12 sessions; marconi_7b: 64 KiB of KV per token, a 26.8 MB checkpoint),
// HBM 1 GB, host 4 GB, a 1 GB staging room. Arg 0: metadata only (`metadata_only_copies`);
// arg 1: a `host_copy_engine` (memcpy workers) copies every demotion and every `load` of a
// host hit, and `settle` adopts the staged pages. Both runs must reuse the same tokens.
// Counters: reuse (reused / input tokens), GB copied, copy calls after coalescing, copies
// below 0.5 MB, and the copy rate seen by the request loop.
static void bm_prefix_tiered_bytes(benchmark::State& state) {
  static const auto reqs = sim::generate_synth_v1(
      {.profile = sim::synth_profile::chat, .seed = 7, .sessions = 12, .session_gap_ms = 1000});
  const cost_model m(presets::marconi_7b());
  const tiered_state_store_config cfg{.hbm_bytes = 1'000'000'000,
                                      .host_bytes = 4'000'000'000,
                                      .kv_bytes_per_token = m.kv_bytes_per_token(),
                                      .checkpoint_bytes = m.ssm_checkpoint_bytes(),
                                      .staging_bytes = 1'000'000'000};
  const bool copies = state.range(0) == 1;
  std::int64_t reused = 0, input = 0;
  copy_stats st;
  auto run = [&](auto& cache, bool load) {
    reused = input = 0;
    for (const auto& r : reqs) {
      auto mt = cache.match(r.input);
      const tiered_hit h = cache.store().lookup(r.input, *mt);
      if (load && h.host_tokens > 0 && !cache.store().load(h)) state.SkipWithError("load failed");
      reused += h.reusable_tokens;
      input += static_cast<std::int64_t>(r.input.size());
      std::vector<prefix::token_id> seq = r.input;
      seq.insert(seq.end(), r.output.begin(), r.output.end());
      (void)cache.commit(seq, static_cast<std::int64_t>(r.input.size()), &*mt);
      cache.store().settle(cache.tree(), seq, h);
    }
  };
  if (!copies) {
    using store_t = tiered_state_store<>;
    for (auto _ : state) {
      prefix::prefix_cache<cost_model, prefix::judicious_admission, prefix::lru_scorer, store_t> c(
          m, store_t(cfg), prefix::lru_scorer{});
      run(c, false);
    }
  } else {
    using store_t = tiered_state_store<lru_demotion, host_copy_engine>;
    host_copy_engine engine(store_t::tiers_for(cfg), store_t::page_bytes_for(cfg), {.measure_bandwidth = false});
    for (auto _ : state) {
      prefix::prefix_cache<cost_model, prefix::judicious_admission, prefix::lru_scorer, store_t> c(
          m, store_t(cfg, engine), prefix::lru_scorer{});
      (void)engine.take_stats();
      run(c, true);
      st = engine.take_stats();
    }
  }
  state.counters["reuse"] = static_cast<double>(reused) / static_cast<double>(input);
  state.counters["GB_copied"] = static_cast<double>(st.bytes) / 1e9;
  state.counters["copies"] = static_cast<double>(st.transfers);
  state.counters["small_copies"] = static_cast<double>(st.small_transfers);
  state.counters["copy_GBps"] =
      benchmark::Counter(static_cast<double>(st.bytes) / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(bm_prefix_tiered_bytes)->Arg(0)->Arg(1)->Iterations(3)->Unit(benchmark::kMillisecond)->UseRealTime();

BENCHMARK_MAIN();
