// The engine on the real prefix_cache, through the adapter hcbench and the benchmarks replay
// with (sim/prefix_cache_replay.hpp): the golden fixture's hit rates through replay() and
// metrics_recorder, and the N-in-flight model on a real cache (pins hold, nothing leaks).
#include <doctest/doctest.h>

#include <vector>

#include <hybridcache/model/presets.hpp>
#include <hybridcache/prefix/prefix_cache.hpp>
#include <hybridcache/sim/prefix_cache_replay.hpp>
#include <hybridcache/sim/synth_v1.hpp>

using namespace hybridcache;

namespace {

const sim::replay_trace& fixture() {  // synth-v1 chat, seed 7, 12 sessions, 1 s apart (70 requests)
  static const sim::replay_trace t = [] {
    std::vector<sim::request> rs;
    for (const auto& r : sim::generate_synth_v1(
             {.profile = sim::synth_profile::chat, .seed = 7, .sessions = 12, .session_gap_ms = 1000}))
      rs.push_back(r.to_request());
    return sim::replay_trace(rs);
  }();
  return t;
}

stores::counting_store store(const cost_model& m, std::int64_t capacity = 500'000'000) {
  // Not strict, as the reference: a sequence larger than the cache is inserted anyway.
  return sim::replay_store(m, {.capacity_bytes = capacity});
}

}  // namespace

TEST_CASE("replay of the synth-v1 seed-7 fixture at 5e8 B gives the reference's SGLang+ and vLLM+ rates") {
  const cost_model m(presets::marconi_7b());
  using heapq = prefix::lru_scorer;
  const prefix::lru_config ties{.ties = prefix::lru_ties::python_heapq};
  {
    prefix::prefix_cache<cost_model, prefix::judicious_admission, heapq, stores::counting_store> c(m, store(m), heapq(ties), {},
                                                                           {.admit_oversized = true});
    const auto r = sim::replay_prefix_cache(c, fixture(), m);
    CHECK(r.requests == 70);
    CHECK(r.input_tokens == 227356);
    CHECK(r.skipped_tokens == 33360);  // 14.6730 %
    CHECK(r.token_hit_rate == doctest::Approx(0.146730).epsilon(1e-6));
    CHECK(r.hit_requests == 20);
    CHECK(r.cache.checkpoints_reused == 20);
    CHECK(r.cache.evictions > 0);
    CHECK(r.cache.peak_bytes > 500'000'000);  // the 8k-token requests alone exceed 5e8 B
    CHECK(r.cache.refused_commits == 0);  // not strict: nothing is refused
  }
  {
    prefix::prefix_cache<cost_model, prefix::every_block_admission<32>, heapq, stores::counting_store> c(m, store(m), heapq(ties), {},
                                                                                 {.admit_oversized = true});
    const auto r = sim::replay_prefix_cache(c, fixture(), m);
    CHECK(r.skipped_tokens == 27563);  // 12.1233 %
    CHECK(r.hit_requests == 16);
  }
}

TEST_CASE("replay_store: options by name, bad ones refused") {
  const cost_model m(presets::marconi_7b());
  const stores::counting_store loose = sim::replay_store(m, {.capacity_bytes = 1'000'000'000, .tokens_per_id = 512});
  CHECK(loose.capacity_bytes() == 1'000'000'000);
  CHECK(loose.kv_bytes(1) == m.kv_bytes_per_token() * 512);
  CHECK(loose.checkpoint_bytes() == m.ssm_checkpoint_bytes());
  CHECK_THROWS_AS((void)sim::replay_store(m, {.capacity_bytes = -1}), invalid_argument);
  CHECK_THROWS_AS((void)sim::replay_store(m, {.capacity_bytes = 1, .tokens_per_id = 0}), invalid_argument);
  CHECK_THROWS_AS((void)sim::replay_store(m, {.capacity_bytes = 1, .tokens_per_id = std::int64_t{1} << 62}), invalid_argument);
}

TEST_CASE("replay with N requests in flight on a real cache: each pin is handed back exactly once") {
  // commit() validates the match's pin (the adapter throws on a stale or double-released
  // pin), so 70 successful commits mean every pin was live until its request finished.
  const cost_model m(presets::marconi_7b());
  std::int64_t previous = -1;
  for (std::int64_t n : {1, 2, 8, 70}) {
    CAPTURE(n);
    prefix::prefix_cache<cost_model, prefix::judicious_admission, prefix::lru_scorer, stores::counting_store> c(
        m, store(m, 5'000'000'000), prefix::lru_scorer{}, {}, {.admit_oversized = true});
    const auto r = sim::replay_prefix_cache(c, fixture(), m, {.concurrency = n});
    CHECK(r.requests == 70);
    CHECK(r.cache.refused_commits == 0);
    CHECK(c.counters().commits == 70);
    // On this fixture, turns that arrive while their predecessor is still in flight miss.
    if (previous >= 0) CHECK(r.skipped_tokens <= previous);
    previous = r.skipped_tokens;
    if (n == 70) CHECK(r.skipped_tokens == 0);  // nothing is committed before the last match
  }
}
