// Metrics math against hand-computed values (numpy.percentile for the percentiles).
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include <hybridcache/model/presets.hpp>
#include <hybridcache/sim/metrics.hpp>

using namespace hybridcache;

TEST_CASE("percentile interpolates between closest ranks like numpy") {
  const std::vector<double> v{1, 2, 3, 4};
  CHECK(sim::percentile(v, 5) == doctest::Approx(1.15));
  CHECK(sim::percentile(v, 50) == doctest::Approx(2.5));
  CHECK(sim::percentile(v, 95) == doctest::Approx(3.85));
  const std::vector<double> u{3, 1, 7, 5, 9};  // unsorted on purpose
  CHECK(sim::percentile(u, 0) == 1.0);
  CHECK(sim::percentile(u, 25) == doctest::Approx(3.0));
  CHECK(sim::percentile(u, 90) == doctest::Approx(8.2));
  CHECK(sim::percentile(u, 100) == 9.0);
  const std::vector<double> one{42.5};
  CHECK(sim::percentile(one, 95) == 42.5);
  CHECK(std::isnan(sim::percentile(std::vector<double>{}, 50)));
  CHECK_THROWS_AS((void)sim::percentile(v, 101), invalid_argument);
  CHECK_THROWS_AS((void)sim::percentile(v, -1), invalid_argument);
}

TEST_CASE("metrics_recorder: hit rates, FLOPs, TTFT percentiles and length bins") {
  sim::metrics_recorder<> rec(cost_model(presets::marconi_7b()));
  rec.record(1000, 0);
  rec.record(2000, 500);
  rec.record(3000, 3000);  // a full-input hit is allowed (the reference allows it)
  rec.record(50, 0);
  const sim::run_metrics m = rec.finish();
  CHECK(m.requests == 4);
  CHECK(m.input_tokens == 6050);
  CHECK(m.skipped_tokens == 3500);
  CHECK(m.hit_requests == 2);
  CHECK(m.token_hit_rate == doctest::Approx(3500.0 / 6050.0));
  CHECK(m.request_hit_rate == 0.5);
  // prefill_flops(500) + prefill_flops(3000) of the 7B hybrid, by hand:
  // 4·(8LD²+4L²D) + 24·(12LD²+16LDN+10LD) + 28·16LD², D = 4096, N = 128.
  CHECK(m.flops_saved == 6559989760000.0 + 39851458560000.0);
  // Uncached lengths 1000, 1500, 0, 50 -> reference TTFT 73.4262, 99.9084, 20.4618, 23.11002 ms.
  CHECK(m.ttft_p5_ms == doctest::Approx(20.859033));
  CHECK(m.ttft_p50_ms == doctest::Approx(48.26811));
  CHECK(m.ttft_p95_ms == doctest::Approx(95.93607));
  CHECK(m.ttft_mean_ms == doctest::Approx((73.4262 + 99.9084 + 20.4618 + 23.11002) / 4));
  CHECK(m.ttft_p95_no_cache_ms == doctest::Approx(171.41034));
  REQUIRE(m.by_input_length.size() == std::size(sim::length_bin_edges));
  const auto& b = m.by_input_length;
  CHECK((b[0].lo == 0 && b[0].hi == 1024 && b[0].requests == 2 && b[0].input_tokens == 1050 && b[0].skipped_tokens == 0));
  CHECK((b[1].requests == 1 && b[1].input_tokens == 2000 && b[1].skipped_tokens == 500));
  CHECK(b[1].token_hit_rate() == 0.25);
  CHECK((b[2].lo == 2048 && b[2].requests == 1 && b[2].token_hit_rate() == 1.0));
  for (std::size_t i = 3; i < b.size(); ++i) CHECK(b[i].requests == 0);
  CHECK(b.back().hi == std::numeric_limits<std::int64_t>::max());
}

TEST_CASE("metrics_recorder: the last bin takes very long inputs; bad records throw and change nothing") {
  sim::metrics_recorder<linear_prefill_time> rec(cost_model(presets::marconi_7b()), {.intercept_ms = 10, .per_token_ms = 1});
  rec.record(100000, 99000);
  CHECK_THROWS_AS(rec.record(10, 11), invalid_argument);
  CHECK_THROWS_AS(rec.record(-1, 0), invalid_argument);
  const auto m = rec.finish();
  CHECK(m.requests == 1);
  CHECK(m.by_input_length.back().requests == 1);
  CHECK(m.ttft_p50_ms == 1010.0);  // linear model: 10 + 1·1000 uncached tokens
  CHECK(m.ttft_p95_no_cache_ms == 100010.0);
}

TEST_CASE("metrics_recorder: an empty run reports zeros, not NaN rates") {
  sim::metrics_recorder<> rec(cost_model(presets::marconi_7b()));
  const auto m = rec.finish();
  CHECK(m.requests == 0);
  CHECK(m.token_hit_rate == 0.0);
  CHECK(m.request_hit_rate == 0.0);
  CHECK(std::isnan(m.ttft_p95_ms));
}
