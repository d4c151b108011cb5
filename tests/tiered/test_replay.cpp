// Tiered replay: options validation, hit accounting, reload vs recompute, pipelining,
// prefetch, sparsification, determinism; and (when the shared trace is present) a short
// Mooncake run through the sim helper's reader.
#include <doctest/doctest.h>

#include <filesystem>
#include <random>

#include "hybridcache/model/presets.hpp"
#include "hybridcache/sim/mooncake_trace.hpp"
#include "hybridcache/sim/tiered_replay.hpp"

#include "../support/shared_data.hpp"

using namespace hybridcache;
using namespace hybridcache::tiered;

namespace {
constexpr std::int64_t B = 512;

sim::request make(double t_s, std::vector<sim::token_id> ids, std::int64_t tokens, std::int64_t out = 100) {
  sim::request r;
  r.arrival_s = t_s;
  r.input = std::move(ids);
  r.input_tokens = tokens;
  r.output_tokens = out;
  r.tokens_per_id = static_cast<std::int32_t>(B);
  return r;
}

// Multi-turn conversations: each turn extends the previous prompt by a few blocks.
std::vector<sim::request> conversations(int sessions, int turns, std::uint64_t seed, double gap_s = 0.4) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<sim::token_id>> hist(static_cast<std::size_t>(sessions));
  sim::token_id next_id = 0;
  std::vector<sim::request> out;
  double t = 0;
  for (int k = 0; k < sessions * turns; ++k) {
    auto& h = hist[rng() % static_cast<std::size_t>(sessions)];
    const int add = 1 + static_cast<int>(rng() % 4);
    for (int a = 0; a < add; ++a) h.push_back(next_id++);
    out.push_back(make(t, h, static_cast<std::int64_t>(h.size()) * B - static_cast<std::int64_t>(rng() % 200)));
    t += gap_s;
  }
  return out;
}
}  // namespace

TEST_CASE("tiered replay: bad input") {
  const cost_model m(presets::jamba_1_5_mini());
  const auto reqs = conversations(2, 3, 1);
  tiered_replay_options o;
  o.tiers = parse_tiers("hbm=1GiB,host=4GiB", o.page_bytes);
  o.link_gbps = 0.0;
  CHECK_THROWS_AS((void)run_tiered_replay(reqs, m, o), invalid_argument);
  o.link_gbps = -1.0;
  CHECK_THROWS_AS((void)run_tiered_replay(reqs, m, o), invalid_argument);
  o.link_gbps = 50.0;
  o.tiers[1].capacity_bytes = 1000;  // smaller than a page
  CHECK_THROWS_AS((void)run_tiered_replay(reqs, m, o), invalid_argument);
  o.tiers[1].capacity_bytes = 0;
  CHECK_THROWS_AS((void)run_tiered_replay(reqs, m, o), invalid_argument);
  // A request that cannot fit in HBM even with everything evicted.
  o.tiers = parse_tiers("hbm=64MiB,host=1GiB", o.page_bytes);
  std::vector<sim::request> big{make(0, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, 10 * B)};
  CHECK_THROWS_AS((void)run_tiered_replay(big, m, o), capacity_error);
}

TEST_CASE("tiered replay: hits move between tiers and are counted where they were found") {
  const cost_model m(presets::jamba_1_5_mini());
  const std::int64_t blk = m.kv_bytes(B) + m.ssm_checkpoint_bytes();  // ~16 MB
  // A: blocks 0-3. Then 8 unrelated requests push A's blocks out of a 6-block HBM into the
  // host tier. Then C reuses A's prefix: its 4 blocks come from the host.
  std::vector<sim::request> reqs{make(0, {0, 1, 2, 3}, 4 * B)};
  for (int k = 0; k < 8; ++k) reqs.push_back(make(1 + k, {100 + k}, B));
  reqs.push_back(make(20, {0, 1, 2, 3, 50}, 5 * B));
  tiered_replay_options o;
  o.page_bytes = 1 << 20;
  o.tiers = {{.kind = tier_kind::hbm, .capacity_bytes = 6 * ((blk + (1 << 20) - 1) >> 20 << 20)},
             {.kind = tier_kind::host, .capacity_bytes = std::int64_t{1} << 32}};
  const auto two = run_tiered_replay(reqs, m, o);
  CHECK(two.requests == 10);
  CHECK(two.host_hit_tokens == 4 * B);
  CHECK(two.hbm_hit_tokens == 0);
  CHECK(two.bytes_loaded == 4 * blk);
  CHECK(two.bytes_offloaded >= 4 * blk);
  CHECK(two.recompute_instead_of_reload == 0);
  CHECK(two.pipeline_hidden_fraction > 0.5);
  // Single tier: the prefix was dropped; nothing hits.
  o.tiers.resize(1);
  const auto one = run_tiered_replay(reqs, m, o);
  CHECK(one.host_hit_tokens == 0);
  CHECK(one.hbm_hit_tokens == 0);
  CHECK(one.bytes_offloaded == 0);
  CHECK(one.ttft_mean_ms > two.ttft_mean_ms);
  // A link so slow that recomputing is faster: recompute instead of reload, counted.
  o.tiers = {{.kind = tier_kind::hbm, .capacity_bytes = 6 * ((blk + (1 << 20) - 1) >> 20 << 20)},
             {.kind = tier_kind::host, .capacity_bytes = std::int64_t{1} << 32, .link_gbps = 0.05}};
  o.link_gbps = std::nullopt;  // keep the tier's own (slow) link
  const auto slow = run_tiered_replay(reqs, m, o);
  CHECK(slow.recompute_instead_of_reload == 1);
  CHECK(slow.host_hit_tokens == 0);
  CHECK(slow.recomputed_hit_tokens == 4 * B);
  CHECK(slow.bytes_loaded == 0);
  o.recompute_when_faster = false;
  const auto forced = run_tiered_replay(reqs, m, o);
  CHECK(forced.host_hit_tokens == 4 * B);
  CHECK(forced.ttft_p95_ms >= slow.ttft_p95_ms);
}

TEST_CASE("tiered replay: two tiers beat one; pipelining, prefetch and sparsification do what they say") {
  const cost_model m(presets::jamba_1_5_mini());
  const auto reqs = conversations(40, 12, 9, 0.5);
  tiered_replay_options o;
  o.tiers = parse_tiers("hbm=1GiB", o.page_bytes);
  const auto one = run_tiered_replay(reqs, m, o);
  o.tiers = parse_tiers("hbm=1GiB,host=4GiB", o.page_bytes);
  const auto two = run_tiered_replay(reqs, m, o);
  CHECK(two.token_hit_rate() > one.token_hit_rate());
  CHECK(two.ttft_p50_ms < one.ttft_p50_ms);
  CHECK(two.host_hit_tokens > 0);
  CHECK(one.host_hit_tokens == 0);
  o.layerwise = false;
  const auto serial = run_tiered_replay(reqs, m, o);
  CHECK(serial.pipeline_hidden_fraction < two.pipeline_hidden_fraction);
  CHECK(serial.ttft_mean_ms >= two.ttft_mean_ms);
  o.layerwise = true;
  o.prefetch = prefetch_kind::deadline;
  const auto dl = run_tiered_replay(reqs, m, o);
  CHECK(dl.prefetches > 0);
  // Prefetched loads overlap the previous request, so they hide more than demand loads do
  // (prefetch is not free overall: it competes for the link and for HBM room).
  CHECK(dl.load_hidden_fraction >= dl.pipeline_hidden_fraction);
  CHECK(dl.load_hidden_fraction > 0.8);
  o.prefetch = prefetch_kind::threshold;
  const auto th = run_tiered_replay(reqs, m, o);
  CHECK(th.prefetches > 0);
  o.prefetch = prefetch_kind::none;
  o.sparsify = sparsify_kind::profile;
  const auto sp = run_tiered_replay(reqs, m, o);
  CHECK(sp.bytes_saved_by_sparsify > 0);
  CHECK(sp.bytes_offloaded < two.bytes_offloaded);
  // CaR scheduler: deterministic for a seed.
  o.sparsify = sparsify_kind::off;
  o.scheduler = scheduler_kind::car;
  const auto c1 = run_tiered_replay(reqs, m, o), c2 = run_tiered_replay(reqs, m, o);
  CHECK(c1.ttft_p50_ms == c2.ttft_p50_ms);
  CHECK(c1.hbm_hit_tokens == c2.hbm_hit_tokens);
  CHECK(c1.requests == static_cast<std::int64_t>(reqs.size()));
  o.demotion = demotion_kind::flop_aware;
  CHECK(run_tiered_replay(reqs, m, o).requests == static_cast<std::int64_t>(reqs.size()));
  MESSAGE("synthetic: 1 tier hit " << one.token_hit_rate() << " p50 " << one.ttft_p50_ms << " ms; 2 tiers hit "
                                   << two.token_hit_rate() << " p50 " << two.ttft_p50_ms << " ms, hidden "
                                   << two.pipeline_hidden_fraction << " (serial " << serial.pipeline_hidden_fraction
                                   << ")");
}

TEST_CASE("tiered replay: token traces are grouped into hashed 512-token blocks") {
  const cost_model m(presets::jamba_1_5_mini());
  auto tokens = [](int n, int seed) {
    std::vector<sim::token_id> v(static_cast<std::size_t>(n));
    for (int k = 0; k < n; ++k) v[static_cast<std::size_t>(k)] = (k * 7919 + seed) % 50000;
    return v;
  };
  auto a = tokens(1100, 1), b = a;
  b.resize(1300);
  for (std::size_t k = 1100; k < 1300; ++k) b[k] = 3;
  auto c = tokens(1100, 2);  // different from the first token on
  std::vector<sim::request> reqs;
  for (auto* v : {&a, &b, &c}) {
    sim::request r;
    r.arrival_s = static_cast<double>(reqs.size());
    r.input = *v;
    r.input_tokens = static_cast<std::int64_t>(v->size());
    r.output_tokens = 10;
    r.tokens_per_id = 1;
    reqs.push_back(r);
  }
  tiered_replay_options o;
  o.tiers = parse_tiers("hbm=4GiB", o.page_bytes);
  const auto res = run_tiered_replay(reqs, m, o);
  // b reuses a's two full blocks (1,024 tokens); a's partial third block (76 tokens) differs
  // from b's full third block; c shares nothing.
  CHECK(res.hbm_hit_tokens == 1024);
  CHECK(res.input_tokens == 3500);
  o.block_tokens = 100;
  CHECK(run_tiered_replay(reqs, m, o).hbm_hit_tokens == 1100);  // b reuses all 11 blocks of a
  o.block_tokens = 0;
  CHECK_THROWS_AS((void)run_tiered_replay(reqs, m, o), invalid_argument);
}

TEST_CASE("tiered replay: first 1,500 Mooncake requests through the sim reader" * doctest::test_suite("shared_data")) {
  const std::filesystem::path path = hybridcache::test::shared_path("data/traces/mooncake/conversation_trace.jsonl");
  if (!hybridcache::test::shared_available(path)) return;
  sim::mooncake_reader reader(path, {.block_size = 512, .synthesize_output_ids = false});
  std::vector<sim::request> reqs;
  sim::request r;
  while (reqs.size() < 1500 && reader.next(r)) reqs.push_back(r);
  const cost_model m(presets::jamba_1_5_mini());
  tiered_replay_options o;
  o.arrival_time_scale = 3.0;
  o.tiers = parse_tiers("hbm=8GiB", o.page_bytes);
  const auto one = run_tiered_replay(reqs, m, o);
  o.tiers = parse_tiers("hbm=8GiB,host=32GiB", o.page_bytes);
  const auto two = run_tiered_replay(reqs, m, o);
  CHECK(two.token_hit_rate() >= one.token_hit_rate());
  CHECK(two.requests == 1500);
  // The reader's 16-token expansion regrouped into 512-token blocks gives the same replay.
  sim::mooncake_reader reader16(path, {.block_size = 16, .synthesize_output_ids = false});
  std::vector<sim::request> reqs16;
  while (reqs16.size() < 1500 && reader16.next(r)) reqs16.push_back(r);
  const auto two16 = run_tiered_replay(reqs16, m, o);
  CHECK(two16.hbm_hit_tokens == two.hbm_hit_tokens);
  CHECK(two16.host_hit_tokens == two.host_hit_tokens);
  CHECK(two16.ttft_p50_ms == doctest::Approx(two.ttft_p50_ms));
  MESSAGE("mooncake[0:1500] jamba: 1 tier hit " << one.token_hit_rate() << " p50 " << one.ttft_p50_ms << " ms; 2 tiers hit "
                                                << two.token_hit_rate() << " p50 " << two.ttft_p50_ms << " ms");
}

TEST_CASE("tiered replay: arrivals spread within their timestamp bin") {
  // Timestamps sampled in 3 s bins: 3 requests at 0 s, 2 at 3 s, 1 at 9 s.
  std::vector<sim::request> reqs{make(0, {1}, B), make(0, {2}, B), make(0, {3}, B),
                                 make(3, {4}, B), make(3, {5}, B), make(9, {6}, B)};
  tiered_replay_options o;
  const auto raw = modelled_arrivals_ms(reqs, o);
  CHECK(raw == std::vector<double>{0, 0, 0, 3000, 3000, 9000});
  o.spread_equal_arrivals_s = 1.5;
  o.arrival_time_scale = 2.0;
  CHECK(modelled_arrivals_ms(reqs, o) == std::vector<double>{0, 1000, 2000, 6000, 7500, 18000});
  o.arrival_time_scale = 1.0;
  o.spread_to_next_arrival = true;  // up to the next distinct timestamp; the last bin: median gap (3 s)
  CHECK(modelled_arrivals_ms(reqs, o) == std::vector<double>{0, 1000, 2000, 3000, 6000, 9000});
  const std::vector<double> spread = modelled_arrivals_ms(reqs, o);
  CHECK(std::is_sorted(spread.begin(), spread.end()));
}

namespace {
// Reference: k FCFS servers, no cache (every request unique), service = prefill time of its
// tokens; a request goes to the server that frees first. Returns the TTFTs.
std::vector<double> naive_servers(const std::vector<sim::request>& reqs, std::size_t k) {
  const linear_prefill_time p{};
  std::vector<double> free_at(k, 0.0), ttft;
  for (const auto& q : reqs) {
    auto it = std::min_element(free_at.begin(), free_at.end());
    const double start = std::max(*it, q.arrival_s * 1000.0);
    *it = start + p.prefill_ms(q.input_tokens);
    ttft.push_back(*it - q.arrival_s * 1000.0);
  }
  std::sort(ttft.begin(), ttft.end());
  return ttft;
}
}  // namespace

TEST_CASE("tiered replay: several prefill engines equal a naive k-server queue when nothing is shared") {
  const cost_model m(presets::jamba_1_5_mini());
  std::mt19937_64 rng(17);
  for (int round = 0; round < 20; ++round) {
    std::vector<sim::request> reqs;
    double t = 0;
    sim::token_id id = 0;
    const int n = 30 + static_cast<int>(rng() % 40);
    for (int k = 0; k < n; ++k) {
      if (rng() % 3 == 0) t += static_cast<double>(rng() % 1000) / 1000.0;  // bursts of equal timestamps
      const int blocks = 1 + static_cast<int>(rng() % 6);
      std::vector<sim::token_id> ids;
      for (int b = 0; b < blocks; ++b) ids.push_back(id++);
      reqs.push_back(make(t, ids, blocks * B - static_cast<std::int64_t>(rng() % 300)));
    }
    const std::size_t engines = 1 + rng() % 5;
    tiered_replay_options o;
    o.tiers = parse_tiers("hbm=64GiB", o.page_bytes);
    o.prefill_engines = engines;
    const auto r = run_tiered_replay(reqs, m, o);
    const auto ref = naive_servers(reqs, engines);
    CAPTURE(round);
    CAPTURE(engines);
    CHECK(r.hbm_hit_tokens == 0);
    CHECK(r.ttft_p50_ms == doctest::Approx(tiered::detail::percentile_of_sorted(ref, 50)).epsilon(1e-9));
    CHECK(r.ttft_p95_ms == doctest::Approx(tiered::detail::percentile_of_sorted(ref, 95)).epsilon(1e-9));
    double mean = 0;
    for (double x : ref) mean += x;
    CHECK(r.ttft_mean_ms == doctest::Approx(mean / static_cast<double>(ref.size())).epsilon(1e-9));
  }
  tiered_replay_options bad;
  bad.tiers = parse_tiers("hbm=1GiB", bad.page_bytes);
  bad.prefill_engines = 0;
  CHECK_THROWS_AS((void)run_tiered_replay(std::vector<sim::request>{make(0, {1}, B)}, m, bad), invalid_argument);
}

TEST_CASE("tiered replay: a block another engine is still computing is not a hit") {
  const cost_model m(presets::jamba_1_5_mini());
  // A and B arrive together and share their first 4 blocks; C comes after both finished.
  std::vector<sim::request> reqs{make(0, {0, 1, 2, 3, 10}, 5 * B), make(0, {0, 1, 2, 3, 20}, 5 * B),
                                 make(60, {0, 1, 2, 3, 30}, 5 * B)};
  tiered_replay_options o;
  o.tiers = parse_tiers("hbm=8GiB,host=8GiB", o.page_bytes);
  const auto one = run_tiered_replay(reqs, m, o);  // one engine: B waits for A, then hits
  CHECK(one.hbm_hit_tokens == 8 * B);
  o.prefill_engines = 2;  // B runs beside A: A's blocks are not published yet, B recomputes them
  const auto two = run_tiered_replay(reqs, m, o);
  CHECK(two.hbm_hit_tokens == 4 * B);  // only C hits
  CHECK(two.ttft_mean_ms < one.ttft_mean_ms);
  const linear_prefill_time p{};
  CHECK(two.ttft_p95_ms == doctest::Approx(p.prefill_ms(5 * B)).epsilon(1e-9));  // nobody waited
}

TEST_CASE("tiered replay: a host hit is loaded up to the best block and recomputed after it") {
  // llama2_7b (KV-heavy: 268 MB per 512-token block) on a 5 GB/s link: loading a block takes
  // ~54 ms, prefilling it ~25 ms. A fills blocks 0-3; fillers push them to the host tier;
  // C = A's 4 blocks + 1 new one arrives on an idle engine. Reference: every resume point s
  // (load blocks [0, s), prefill the rest) through an explicit per-layer timeline.
  const cost_model m(presets::llama2_7b());
  const flop_prefill_time prefill(m);
  const std::int64_t blk = m.kv_bytes(B);
  std::vector<sim::request> reqs{make(0, {0, 1, 2, 3}, 4 * B)};
  for (int k = 0; k < 8; ++k) reqs.push_back(make(10 + 10 * k, {100 + k}, B));
  reqs.push_back(make(200, {0, 1, 2, 3, 50}, 5 * B));
  tiered_replay_options o;
  o.page_bytes = 1 << 20;
  o.per_copy_overhead_us = 0.0;
  o.link_gbps = 5.0;
  o.tiers = {{.kind = tier_kind::hbm, .capacity_bytes = 6 * ((blk + (1 << 20) - 1) >> 20 << 20)},
             {.kind = tier_kind::host, .capacity_bytes = std::int64_t{1} << 34}};
  auto finish_at = [&](std::int64_t s) {  // C's prefill time when resuming after block s
    const double load_l = static_cast<double>(s * blk) / 32.0 / 5e6;  // bytes per ms at 5 GB/s
    const double compute_l = prefill.prefill_ms(s * B, (5 - s) * B) / 32.0;
    double ready = 0, end = 0;
    for (int l = 0; l < 32; ++l) {
      ready += load_l;
      end = std::max(end, ready) + compute_l;
    }
    return end;
  };
  double best = finish_at(0);
  std::int64_t best_s = 0;
  for (std::int64_t s = 1; s <= 4; ++s)
    if (finish_at(s) <= best) best = finish_at(s), best_s = s;
  REQUIRE(best_s > 0);
  REQUIRE(best_s < 4);  // the split is strictly better than both all-or-nothing choices here
  REQUIRE(best < std::min(finish_at(0), finish_at(4)));
  double others = prefill.prefill_ms(4 * B);
  for (int k = 0; k < 8; ++k) others += prefill.prefill_ms(B);
  const auto split = run_tiered_replay(reqs, m, o, prefill);
  CHECK(split.requests == 10);
  CHECK(split.ttft_mean_ms * 10 - others == doctest::Approx(best).epsilon(1e-9));
  CHECK(split.host_hit_tokens == best_s * B);
  CHECK(split.recompute_instead_of_reload == 1);
  CHECK(split.split_load_recompute == 1);
  CHECK(split.recomputed_hit_tokens == (4 - best_s) * B);
  CHECK(split.bytes_loaded == best_s * blk);
  o.split_load_recompute = false;  // all or nothing
  const auto whole = run_tiered_replay(reqs, m, o, prefill);
  CHECK(whole.ttft_mean_ms * 10 - others == doctest::Approx(std::min(finish_at(0), finish_at(4))).epsilon(1e-9));
  CHECK(whole.split_load_recompute == 0);
  o.recompute_when_faster = false;  // always reload
  const auto reload = run_tiered_replay(reqs, m, o, prefill);
  CHECK(reload.ttft_mean_ms * 10 - others == doctest::Approx(finish_at(4)).epsilon(1e-9));
  CHECK(reload.host_hit_tokens == 4 * B);
}

// Regressions found in review: each case is the smallest input that showed the defect.
namespace {
tiered_replay_options small_blocks(std::int64_t hbm_mib, std::int64_t host_mib) {
  tiered_replay_options o;
  o.page_bytes = 1 << 20;  // a jamba block (17.6 MB) is 17 pages
  o.tiers = {{.kind = tier_kind::hbm, .capacity_bytes = hbm_mib << 20},
             {.kind = tier_kind::host, .capacity_bytes = host_mib << 20}};
  return o;
}
}  // namespace

TEST_CASE("tiered replay: room made for a promotion never drops the request's own host blocks") {
  // A full host tier: promoting block {0} demotes an HBM victim, whose room in the host
  // must not come from dropping {0} (or {5}) themselves. Request 7 repeats request 6: its
  // blocks must all be in HBM then, and what counted as loaded must have been loaded.
  const cost_model m(presets::jamba_1_5_mini());
  const std::vector<sim::request> reqs{make(0, {0}, B), make(1, {1}, B), make(2, {2}, B),    make(3, {3}, B),
                                       make(4, {4}, B), make(5, {0, 5}, 2 * B), make(6, {0, 5}, 2 * B)};
  const auto o = small_blocks(77, 26);
  const auto six = run_tiered_replay(std::span(reqs).first(6), m, o);
  const std::int64_t block = m.kv_bytes(B) + m.ssm_checkpoint_bytes();
  CHECK(six.host_hit_tokens == B);
  CHECK(six.bytes_loaded == block);  // every host-hit block was really loaded
  const auto seven = run_tiered_replay(reqs, m, o);
  CHECK(seven.hbm_hit_tokens - six.hbm_hit_tokens == 2 * B);
}

TEST_CASE("tiered replay: a prefetch never evicts its own blocks; prefetched tokens are host hits") {
  const cost_model m(presets::jamba_1_5_mini());
  const std::vector<sim::request> reqs{make(0, {0, 1}, 2 * B), make(1, {10}, B), make(2, {11}, B), make(3, {12}, B),
                                       make(4, {13}, B),      make(5, {14}, B), make(5.01, {0, 1, 2}, 3 * B)};
  auto o = small_blocks(110, 1024);
  o.prefetch = prefetch_kind::none;
  const auto none = run_tiered_replay(reqs, m, o);
  o.prefetch = prefetch_kind::threshold;
  const auto pf = run_tiered_replay(reqs, m, o);
  CHECK(none.host_hit_tokens == 2 * B);
  CHECK(pf.host_hit_tokens == none.host_hit_tokens);
  CHECK(pf.hbm_hit_tokens == none.hbm_hit_tokens);
  CHECK(pf.bytes_loaded == none.bytes_loaded);  // two blocks, each loaded once
  CHECK(pf.bytes_offloaded == none.bytes_offloaded);
}

TEST_CASE("tiered replay: with several engines a request that fits alone waits for HBM pinned by others") {
  // HBM holds 4 blocks; two 3-block requests arrive together. On two engines the second
  // waits for the first to finish (its blocks unpinned) instead of failing as oversized.
  const cost_model m(presets::jamba_1_5_mini());
  const std::vector<sim::request> reqs{make(0, {0, 1, 2}, 3 * B), make(0, {10, 11, 12}, 3 * B)};
  auto o = small_blocks(80, 1024);
  const auto one = run_tiered_replay(reqs, m, o);
  o.prefill_engines = 2;
  tiered_replay_result two;
  REQUIRE_NOTHROW(two = run_tiered_replay(reqs, m, o));
  CHECK(two.requests == 2);
  CHECK(two.ttft_p95_ms == doctest::Approx(one.ttft_p95_ms));  // served one after the other
  // A request larger than HBM alone is still an error.
  const std::vector<sim::request> big{make(0, {0, 1, 2, 3, 4}, 5 * B)};
  CHECK_THROWS_AS((void)run_tiered_replay(big, m, o), capacity_error);
}

TEST_CASE("tiered replay: a fixed arrival spread never reorders arrivals") {
  const std::vector<sim::request> reqs{make(0, {1}, B), make(0, {2}, B), make(1, {3}, B)};
  tiered_replay_options o;
  o.tiers = parse_tiers("hbm=1GiB", o.page_bytes);
  o.spread_equal_arrivals_s = 4.0;  // wider than the 1 s to the next timestamp
  const auto a = modelled_arrivals_ms(reqs, o);
  CHECK(a[0] == 0.0);
  CHECK(a[1] == doctest::Approx(500.0));  // clamped to the next distinct timestamp
  CHECK(a[2] == doctest::Approx(1000.0));
  CHECK(std::is_sorted(a.begin(), a.end()));
}

TEST_CASE("tiered replay: a partial last block of a block-id trace does not match the full block") {
  // {0,1} with 600 tokens caches 512 + 88; {0,1,2} with 1536 tokens shares only the first
  // 512-token block with it, exactly as the same prompts written as token ids.
  const cost_model m(presets::jamba_1_5_mini());
  tiered_replay_options o;
  o.tiers = parse_tiers("hbm=1GiB", o.page_bytes);
  const auto ids = run_tiered_replay(std::vector{make(0, {0, 1}, 600), make(1, {0, 1, 2}, 1536)}, m, o);
  std::vector<sim::token_id> a(600), b(1536);
  for (int i = 0; i < 1536; ++i) {
    b[static_cast<std::size_t>(i)] = i;
    if (i < 600) a[static_cast<std::size_t>(i)] = i;
  }
  auto ta = make(0, a, 600), tb = make(1, b, 1536);
  ta.tokens_per_id = tb.tokens_per_id = 1;
  const auto toks = run_tiered_replay(std::vector{ta, tb}, m, o);
  CHECK(ids.hbm_hit_tokens == B);
  CHECK(toks.hbm_hit_tokens == B);
}
