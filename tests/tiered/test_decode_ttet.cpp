// The tiered replay's decode model (#38 item 3): TTET = TTFT + TPOT x (output tokens - 1) per
// request; disaggregated (the default) TPOT changes nothing else; colocated an engine is busy
// until its request's last token, so the next dispatch waits for it; the length predictors
// learn only from decodes that ended, and the prompt-length buckets beat the running mean where
// the output length follows the prompt length.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "hybridcache/model/presets.hpp"
#include "hybridcache/prefix/admission.hpp"
#include "hybridcache/prefix/lru_scorer.hpp"
#include "hybridcache/sim/tiered_replay.hpp"

using namespace hybridcache;
using namespace hybridcache::sim;

namespace {

// Sessions of 512-token ids; a session alternates short (1 new id, 10 output tokens) and long
// turns (8 new ids, 1,000 output tokens), so the output length follows the prompt's growth.
std::vector<sim::request> turns(int sessions, int per_session, double gap_s, bool two_lengths) {
  std::vector<sim::request> out;
  sim::token_id next = 0;
  std::vector<std::vector<sim::token_id>> hist(static_cast<std::size_t>(sessions));
  double t = 0;
  for (int k = 0; k < per_session; ++k)
    for (int s = 0; s < sessions; ++s) {
      auto& h = hist[static_cast<std::size_t>(s)];
      const bool long_turn = two_lengths && (k % 2 == 1);
      for (int a = 0; a < (long_turn ? 8 : 1); ++a) h.push_back(next++);
      sim::request r;
      r.arrival_s = t;
      r.input = h;
      r.tokens_per_id = 512;
      r.input_tokens = static_cast<std::int64_t>(h.size()) * 512;
      r.output_tokens = long_turn ? 1000 : 10;
      out.push_back(r);
      t += gap_s;
    }
  return out;
}

// Single requests of fresh ids, alternately short (1 id, 10 output tokens) and long (16 ids =
// 8,192 tokens, 1,000 output tokens): prompt-length buckets 9 and 13 of the predictor.
std::vector<sim::request> singles(int n, double gap_s) {
  std::vector<sim::request> out;
  sim::token_id next = 0;
  for (int k = 0; k < n; ++k) {
    const bool long_one = k % 2 == 1;
    sim::request r;
    r.arrival_s = gap_s * k;
    for (int a = 0; a < (long_one ? 16 : 1); ++a) r.input.push_back(next++);
    r.tokens_per_id = 512;
    r.input_tokens = static_cast<std::int64_t>(r.input.size()) * 512;
    r.output_tokens = long_one ? 1000 : 10;
    out.push_back(r);
  }
  return out;
}

tiered_replay_options options(const char* spec, std::size_t engines) {
  tiered_replay_options o;
  o.tiers = tiered::parse_tiers(spec, 1);
  o.prefill_engines = engines;
  o.keep_per_request = true;
  return o;
}

tiered_replay_result replay(const std::vector<sim::request>& reqs, const cost_model& m, const tiered_replay_options& o) {
  return run_tiered_replay<prefix::judicious_admission>(reqs, m, o, prefix::lru_scorer{}, flop_prefill_time(m));
}

}  // namespace

TEST_CASE("TTET is TTFT plus TPOT per output token after the first; disaggregated, TPOT changes nothing else") {
  const cost_model m(presets::jamba_1_5_mini());
  const auto reqs = turns(4, 6, 0.5, true);
  auto o = options("hbm=2GB,host=8GB", 2);
  o.tpot_ms = 0.0;
  const auto zero = replay(reqs, m, o);
  o.tpot_ms = 25.0;
  const auto r = replay(reqs, m, o);
  REQUIRE(r.per_request.size() == reqs.size());
  for (const auto& row : r.per_request) {
    const auto out = reqs[row.request].output_tokens;
    CHECK(row.ttet_ms == doctest::Approx(row.ttft_ms + 25.0 * static_cast<double>(out - 1)));
  }
  for (const auto& row : zero.per_request) CHECK(row.ttet_ms == row.ttft_ms);
  CHECK(r.ttet_p50_ms > r.ttft_p50_ms);
  CHECK(zero.ttet_p50_ms == zero.ttft_p50_ms);
  // Nothing but TTET moves: the decode runs on its own pool.
  CHECK(r.ttft_p50_ms == zero.ttft_p50_ms);
  CHECK(r.ttft_p95_ms == zero.ttft_p95_ms);
  CHECK(r.hbm_hit_tokens == zero.hbm_hit_tokens);
  CHECK(r.host_hit_tokens == zero.host_hit_tokens);
  CHECK(r.utilization == zero.utilization);
  o.tpot_ms = -1.0;
  CHECK_THROWS_AS(replay(reqs, m, o), invalid_argument);
  o.tpot_ms = std::nan("");
  CHECK_THROWS_AS(replay(reqs, m, o), invalid_argument);
}

TEST_CASE("colocated: an engine serves the next request only after its request's last token") {
  const cost_model m(presets::jamba_1_5_mini());
  auto reqs = turns(1, 4, 0.0, false);  // one engine, four requests arriving together
  for (auto& q : reqs) q.arrival_s = 0.0;
  auto o = options("hbm=2GB,host=8GB", 1);
  o.tpot_ms = 30.0;
  o.decode = decode_placement::colocated;
  const auto r = replay(reqs, m, o);
  REQUIRE(r.per_request.size() == 4);
  for (std::size_t k = 0; k + 1 < r.per_request.size(); ++k) {
    CAPTURE(k);
    // Same arrival: the next first token comes after this request's last one.
    CHECK(r.per_request[k + 1].ttft_ms >= r.per_request[k].ttet_ms);
  }
  o.decode = decode_placement::disaggregated;
  const auto d = replay(reqs, m, o);
  CHECK(d.per_request.back().ttft_ms < r.per_request.back().ttft_ms);
}

TEST_CASE("length predictors: the oracle is exact, the buckets beat the mean where output follows the prompt") {
  const cost_model m(presets::jamba_1_5_mini());
  const auto reqs = singles(80, 0.5);
  auto o = options("hbm=1GB,host=8GB", 2);
  o.decode = decode_placement::colocated;
  o.prefetch = prefetch_kind::deadline;
  o.tpot_ms = 1.0;
  double mae[3] = {0, 0, 0};
  for (const auto k : {length_predictor_kind::mean, length_predictor_kind::bucket, length_predictor_kind::oracle}) {
    o.length_predictor = k;
    const auto r = replay(reqs, m, o);
    mae[static_cast<int>(k)] = r.output_length_mae_tokens;
    CHECK(std::isfinite(r.output_length_mae_tokens));
  }
  MESSAGE("MAE mean " << mae[0] << ", bucket " << mae[1] << ", oracle " << mae[2]);
  CHECK(mae[2] == 0.0);
  // Mean: about |505 - 10| and |505 - 1000| each; buckets: exact once each has 8 samples.
  CHECK(mae[0] > 400.0);
  CHECK(mae[1] < 0.5 * mae[0]);
  CHECK(mae[0] > 0.0);
}
