// Multi-tier cache: cache-table operations, the host copy engine (coalesced vs page-sized
// copies, the two-phase move, a hit's layer 0 grouped vs per entry), and the timed replay of the tiered prefix cache on the
// Mooncake conversation trace and ShareGPT (counters: token hit rate, modelled TTFT
// P50/P95 against the single-tier baseline of the same policy, load hidden by pipelining).
//
//   build/release/bench/bench_tiered --benchmark_filter=replay --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <hybridcache/compose/adaptive_scorer.hpp>
#include <hybridcache/model/prefill_time.hpp>
#include <hybridcache/model/presets.hpp>
#include <hybridcache/prefix/admission.hpp>
#include <hybridcache/prefix/flop_aware_scorer.hpp>
#include <hybridcache/prefix/lru_scorer.hpp>
#include <hybridcache/prefix/prefix_cache.hpp>
#include "hybridcache/stores/counting_store.hpp"
#include <hybridcache/stores/tiered_state_store.hpp>
#include <hybridcache/sim/mooncake_trace.hpp>
#include <hybridcache/sim/sharegpt_trace.hpp>
#include <hybridcache/sim/synth_v1.hpp>
#include <hybridcache/tiered/host_copy_engine.hpp>
#include <hybridcache/sim/tiered_replay.hpp>
#include <hybridcache/tiered/tiered_store.hpp>

using namespace hybridcache;
using namespace hybridcache::tiered;
using namespace hybridcache::stores;
using namespace hybridcache::sim;

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
  if (scattered) {  // fill the tier with one-page entries, free every other: only one-page holes are left
    const auto n_pages = static_cast<std::uint64_t>(4 * bytes / page);
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

// A hit of four 32 MiB entries (8 layer segments each) loaded from host into HBM, as one
// group (state.range(0) = 1: layer-major across the entries, `submit_group`) or as one
// submit per entry (0). The iteration time is until layer 0 of the LAST entry landed (when
// a runtime may start computing layer 0 of the whole hit); `all_ms` is until everything
// landed, `layer0_share` their ratio.
static void bm_host_hit_layer0(benchmark::State& state) {
  constexpr std::int64_t page = 1 << 20, layers = 8, per_layer = 4, entries = 4;
  constexpr std::int64_t entry_bytes = layers * per_layer * page;
  const bool grouped = state.range(0) != 0;
  tiered_store<> s(tiers(entries * entry_bytes, entries * entry_bytes), page);
  host_copy_engine e(tiers(entries * entry_bytes, entries * entry_bytes), page, {.measure_bandwidth = false});
  for (std::uint64_t id = 1; id <= entries; ++id) (void)s.insert(entry_id{id}, entry_bytes, tier_id{1}, {}, false, layers);
  std::vector<move_ticket> group;
  std::vector<copy_event> ev(entries);
  double all_ms = 0.0, share = 0.0;
  for (auto _ : state) {
    group.clear();
    for (std::uint64_t id = 1; id <= entries; ++id) group.push_back(*s.prepare_move(entry_id{id}, hbm_tier));
    const auto t0 = std::chrono::steady_clock::now();
    if (grouped) {
      (void)e.submit_group(group, ev);
    } else {
      for (std::size_t k = 0; k < group.size(); ++k) ev[k] = *e.submit(group[k]);
    }
    (void)e.wait_segments(ev.back(), 1);
    const auto t1 = std::chrono::steady_clock::now();
    for (const copy_event& x : ev) (void)e.wait(x);
    const auto t2 = std::chrono::steady_clock::now();
    const double first = std::chrono::duration<double>(t1 - t0).count(), all = std::chrono::duration<double>(t2 - t0).count();
    state.SetIterationTime(first);
    all_ms += all * 1e3;
    share += first / all;
    for (const move_ticket& t : group) (void)s.complete_move(t, true);
    for (std::uint64_t id = 1; id <= entries; ++id) (void)move_entry(s, e, entry_id{id}, tier_id{1});  // back down
  }
  state.counters["all_ms"] = all_ms / static_cast<double>(state.iterations());
  state.counters["layer0_share"] = share / static_cast<double>(state.iterations());
}
BENCHMARK(bm_host_hit_layer0)->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMillisecond);

namespace {
std::filesystem::path shared(const char* rel) { return std::filesystem::path(HYBRIDCACHE_SOURCE_DIR) / "../shared" / rel; }

const std::vector<sim::request>& mooncake() {
  static const std::vector<sim::request> reqs = [] {
    std::vector<sim::request> out;
    const auto p = shared("data/traces/mooncake/conversation_trace.jsonl");
    if (!std::filesystem::exists(p)) return out;
    sim::mooncake_reader r(p, {.block_size = 512, .synthesize_output_ids = true});  // as hcbench reads it
    sim::request q;
    while (r.next(q)) out.push_back(q);
    return out;
  }();
  return reqs;
}
const std::vector<sim::request>& sharegpt() {
  static const std::vector<sim::request> reqs = [] {
    std::vector<sim::request> out;
    const auto p = shared("data/traces/sharegpt_zh_1k/sharegpt_zh_1K_format.jsonl");
    if (!std::filesystem::exists(p)) return out;
    sim::sharegpt_reader r(p);
    sim::request q;
    while (r.next(q)) out.push_back(q);
    return out;
  }();
  return reqs;
}

// marconi: the library's Marconi (judicious admission + the adaptive selector over SGLang+'s
// rule, FLOP-aware alphas and GDSF: what hcbench's --policy marconi runs by default);
// marconi_a1: the FLOP-aware rule at a fixed alpha 1.
enum class policy : std::uint8_t { sglang, marconi, marconi_a1, vllm };

// One tiered replay setup. The defaults are hcbench's: auto prefill engines, the trace's
// own arrivals, FCFS, layer-wise loading, write-back with the 90 %/80 % cleaner, prefill
// time from the cost model, 50 GB/s links.
struct replay_setup {
  const char* trace = "mooncake";
  const char* model = "jamba_1_5_mini";
  policy pol = policy::sglang;
  const char* tiers = "hbm=64GiB,host=256GiB";
  scheduler_kind scheduler = scheduler_kind::fcfs;
  prefetch_kind prefetch = prefetch_kind::none;
  sparsify_kind sparsify = sparsify_kind::off;
  demotion_kind demotion = demotion_kind::automatic;
  write_policy write = write_policy::write_back;
  std::size_t engines = 0;  // auto
  bool layerwise = true;
  bool recompute = true;
  double link_gbps = 50.0;
};

tiered_replay_result run_one(const replay_setup& c, const std::vector<sim::request>& reqs, const cost_model& m,
                             const tiered_replay_options& o) {
  const flop_prefill_time prefill(m);
  switch (c.pol) {
    case policy::marconi: {
      compose::adaptive_config cfg;
      cfg.tokens_per_id = reqs.front().tokens_per_id;
      return run_tiered_replay<prefix::judicious_admission>(reqs, m, o, compose::make_marconi_adaptive_scorer(m, cfg),
                                                            prefill);
    }
    case policy::marconi_a1:
      return run_tiered_replay<prefix::judicious_admission>(reqs, m, o, prefix::flop_aware_scorer(m, {.alpha = 1.0}), prefill);
    case policy::vllm:
      if (reqs.front().tokens_per_id > 1)
        return run_tiered_replay<prefix::every_block_admission<1>>(reqs, m, o, prefix::lru_scorer{}, prefill);
      return run_tiered_replay<prefix::every_block_admission<32>>(reqs, m, o, prefix::lru_scorer{}, prefill);
    default:
      return run_tiered_replay<prefix::judicious_admission>(reqs, m, o, prefix::lru_scorer{}, prefill);
  }
}

// Runs the setup and its single-tier baseline (same policy, same engines, HBM alone).
void replay(benchmark::State& state, const replay_setup& c) {
  const auto& reqs = std::string_view(c.trace) == "sharegpt" ? sharegpt() : mooncake();
  if (reqs.empty()) {
    state.SkipWithError("trace not found under ../shared");
    return;
  }
  const cost_model m(presets::preset(c.model));
  tiered_replay_options o;
  o.tiers = parse_tiers(c.tiers, 1);
  o.link_gbps = c.link_gbps;
  o.scheduler = c.scheduler;
  o.prefetch = c.prefetch;
  o.sparsify = c.sparsify;
  o.demotion = c.demotion;
  o.write = c.write;
  o.layerwise = c.layerwise;
  o.recompute_when_faster = c.recompute;
  o.prefill_engines = c.engines > 0 ? c.engines : auto_prefill_engines(reqs, o, flop_prefill_time(m));
  tiered_replay_options single = o;
  single.tiers.resize(1);
  single.prefetch = prefetch_kind::none;
  tiered_replay_result r, b;
  for (auto _ : state) {
    r = run_one(c, reqs, m, o);
    b = run_one(c, reqs, m, single);
  }
  state.counters["engines"] = static_cast<double>(r.prefill_engines);
  state.counters["hit_1"] = b.token_hit_rate();
  state.counters["hit"] = r.token_hit_rate();
  state.counters["p50_1"] = b.ttft_p50_ms;
  state.counters["p50"] = r.ttft_p50_ms;
  state.counters["p95"] = r.ttft_p95_ms;
  state.counters["p50_cut"] = b.ttft_p50_ms > 0 ? 1.0 - r.ttft_p50_ms / b.ttft_p50_ms : 0.0;
  state.counters["util_1"] = b.utilization;
  state.counters["util"] = r.utilization;
  state.counters["TFLOP_1"] = b.flops_saved / 1e12;
  state.counters["TFLOP"] = r.flops_saved / 1e12;
  state.counters["loaded_GB"] = static_cast<double>(r.bytes_loaded) / 1e9;
  state.counters["offl_GB"] = static_cast<double>(r.bytes_offloaded) / 1e9;
  state.counters["hidden"] = r.pipeline_hidden_fraction;
  state.counters["load_hidden"] = r.load_hidden_fraction;
  state.counters["recompute"] = static_cast<double>(r.recompute_instead_of_reload);
  state.counters["prefetch"] = static_cast<double>(r.prefetches);
  state.counters["stall_ms"] = r.stall_ms;
}
}  // namespace

#define HC_REPLAY(name, ...)                                                                    \
  static void bm_replay_##name(benchmark::State& s) { replay(s, replay_setup{__VA_ARGS__}); } \
  BENCHMARK(bm_replay_##name)->Iterations(1)->Unit(benchmark::kMillisecond)

using enum scheduler_kind;
using enum prefetch_kind;
using enum sparsify_kind;

// The goal table (docs/tiered.md): per trace and model, an HBM at which the single tier
// reaches under half the infinite-cache bound of the policy, host 4x HBM, defaults.
// Counters *_1 are the single-tier baseline of the same policy; p50_cut = 1 - p50 / p50_1.
HC_REPLAY(goal_mooncake_jamba_sglang, .pol = policy::sglang);
HC_REPLAY(goal_mooncake_jamba_marconi, .pol = policy::marconi);
HC_REPLAY(goal_mooncake_jamba_marconi_a1, .pol = policy::marconi_a1);
HC_REPLAY(goal_mooncake_qwen3_sglang, .model = "qwen3_next_80b_a3b", .pol = policy::sglang,
          .tiers = "hbm=128GiB,host=512GiB");
HC_REPLAY(goal_mooncake_qwen3_marconi, .model = "qwen3_next_80b_a3b", .pol = policy::marconi,
          .tiers = "hbm=128GiB,host=512GiB");
HC_REPLAY(goal_sharegpt_jamba_sglang, .trace = "sharegpt", .pol = policy::sglang, .tiers = "hbm=1GiB,host=4GiB");
HC_REPLAY(goal_sharegpt_jamba_marconi, .trace = "sharegpt", .pol = policy::marconi, .tiers = "hbm=1GiB,host=4GiB");
HC_REPLAY(goal_sharegpt_qwen3_sglang, .trace = "sharegpt", .model = "qwen3_next_80b_a3b", .pol = policy::sglang,
          .tiers = "hbm=4GiB,host=16GiB");
HC_REPLAY(goal_sharegpt_qwen3_marconi, .trace = "sharegpt", .model = "qwen3_next_80b_a3b", .pol = policy::marconi,
          .tiers = "hbm=4GiB,host=16GiB");
// The infinite-cache bound of each policy (HBM holds the whole trace).
HC_REPLAY(bound_mooncake_jamba_sglang, .tiers = "hbm=8TiB,host=1TiB");
HC_REPLAY(bound_mooncake_jamba_vllm, .pol = policy::vllm, .tiers = "hbm=8TiB,host=1TiB");
HC_REPLAY(vllm_mooncake_jamba, .pol = policy::vllm);

// CaR's mechanisms, each switched on alone against the same tiered baseline, at a load
// where they can matter: a 5 GB/s link (loading is slow), SGLang+ on Jamba.
HC_REPLAY(car_base, .link_gbps = 5.0);
HC_REPLAY(car_serial_load, .layerwise = false, .link_gbps = 5.0);
HC_REPLAY(car_queue, .scheduler = car, .link_gbps = 5.0);
HC_REPLAY(car_deadline_prefetch, .prefetch = deadline, .link_gbps = 5.0);
HC_REPLAY(car_threshold_prefetch, .prefetch = threshold, .link_gbps = 5.0);
HC_REPLAY(car_sparsify, .sparsify = profile, .link_gbps = 5.0);
HC_REPLAY(car_flop_demotion, .demotion = demotion_kind::flop_aware, .link_gbps = 5.0);
HC_REPLAY(car_write_through, .write = write_policy::write_through, .link_gbps = 5.0);
HC_REPLAY(car_no_recompute, .recompute = false, .link_gbps = 5.0);

// Layer-wise loading across link speeds (GB/s = range(0) / 10), Jamba and a pure
// Transformer (llama2_7b, 512 KiB of KV per token): the share of load time hidden.
static void bm_replay_layerwise(benchmark::State& s) {
  const bool llama = s.range(1) != 0;
  replay(s, {.model = llama ? "llama2_7b" : "jamba_1_5_mini",
             .tiers = llama ? "hbm=2TiB,host=8TiB" : "hbm=64GiB,host=256GiB",
             .link_gbps = static_cast<double>(s.range(0)) / 10.0});
}
BENCHMARK(bm_replay_layerwise)->ArgsProduct({{500, 50, 5}, {0, 1}})->Iterations(1)->Unit(benchmark::kMillisecond);

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
      prefix::prefix_cache<cost_model, ADM, prefix::lru_scorer, counting_store> c(
          m, stores::counting_store(hbm, kv_per_id, m.ssm_checkpoint_bytes()), prefix::lru_scorer{});
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
          store_t({.capacity_bytes = hbm, .host_capacity_bytes = host, .kv_bytes_per_token = kv_per_id,
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
  const tiered_state_store_config cfg{.capacity_bytes = 1'000'000'000,
                                      .host_capacity_bytes = 4'000'000'000,
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
      std::vector<token_id> seq = r.input;
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
