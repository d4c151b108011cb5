// Conformance suite of `hybridcache::output_length_predictor` (concepts/output_length_predictor.hpp):
// every model against what CaR's deadline prefetch relies on:
//
//   - predictions are finite and >= 0, before and after observations;
//   - a prediction depends only on the observations (two copies fed the same agree; predict
//     changes nothing);
//   - with every request alike (one prompt length, one output length), the prediction
//     converges to that length: the predictor is unbiased where there is nothing to learn;
//   - negative output lengths are not taken as negative predictions.
//
// A new model is covered by adding a fixture and naming it in TEST_CASE_TEMPLATE_INVOKE.
// Model-specific checks (the buckets) follow against a small reference computed by hand.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>

#include "hybridcache/tiered/length_predictor.hpp"

using namespace hybridcache;
using namespace hybridcache::tiered;

namespace {

struct mean_fixture {
  [[nodiscard]] running_mean_predictor make() const { return {}; }
};
struct bucket_fixture {
  [[nodiscard]] bucketed_length_predictor make() const { return bucketed_length_predictor({.prior = 256.0, .min_samples = 4}); }
};

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("output_length_predictor laws", F, predictor_laws) {
  const F fixture;
  auto p = fixture.make();
  static_assert(output_length_predictor<decltype(p)>);
  for (const std::int64_t prompt : {0, 1, 100, 1'000'000}) {
    const double x = p.predict(prompt);
    CHECK(std::isfinite(x));
    CHECK(x >= 0);
  }
  std::mt19937_64 rng(7);
  auto q = fixture.make();
  for (int i = 0; i < 500; ++i) {
    const auto prompt = static_cast<std::int64_t>(rng() % 100'000);
    const auto out = static_cast<std::int64_t>(rng() % 4'000);
    p.observe(prompt, out);
    q.observe(prompt, out);
  }
  for (const std::int64_t prompt : {std::int64_t{0}, std::int64_t{1}, std::int64_t{300}, std::int64_t{5'000}, std::int64_t{99'999}, std::int64_t{1} << 40}) {
    CAPTURE(prompt);
    const double a = p.predict(prompt);
    CHECK(std::isfinite(a));
    CHECK(a >= 0);
    CHECK(a == q.predict(prompt));
    CHECK(a == p.predict(prompt));  // predict is pure
  }
  auto copy = p;
  copy.observe(10, 10);
  CHECK(p.predict(10) == q.predict(10));  // a copy's observations are its own

  auto same = fixture.make();
  for (int i = 0; i < 64; ++i) same.observe(1'000, 321);
  CHECK(same.predict(1'000) == doctest::Approx(321.0));
  auto neg = fixture.make();
  for (int i = 0; i < 64; ++i) neg.observe(50, -5);
  CHECK(neg.predict(50) >= 0.0);
}

TEST_CASE_TEMPLATE_INVOKE(predictor_laws, mean_fixture, bucket_fixture);

TEST_CASE("running_mean_predictor: prior, then the mean of every observation") {
  running_mean_predictor p{.prior = 100.0};
  CHECK(p.predict(5) == 100.0);
  p.observe(5, 10);
  p.observe(50'000, 30);
  CHECK(p.predict(1) == 20.0);
  CHECK(p.predict(1'000'000) == 20.0);
}

TEST_CASE("bucketed_length_predictor: per power-of-two bucket once it has min_samples, the global mean before") {
  CHECK(bucketed_length_predictor::bucket_of(0) == 0);
  CHECK(bucketed_length_predictor::bucket_of(1) == 0);
  CHECK(bucketed_length_predictor::bucket_of(2) == 1);
  CHECK(bucketed_length_predictor::bucket_of(1023) == 9);
  CHECK(bucketed_length_predictor::bucket_of(1024) == 10);
  bucketed_length_predictor p({.prior = 7.0, .min_samples = 2});
  CHECK(p.predict(100) == 7.0);
  // Short prompts (bucket 6: 64..127) answer short, long ones (bucket 13: 8192..16383) long.
  p.observe(100, 10);
  CHECK(p.predict(100) == 10.0);  // one sample: the global mean, 10
  p.observe(120, 20);
  p.observe(9'000, 1'000);
  p.observe(16'000, 2'000);
  // Reference: bucket 6 = {10, 20} -> 15; bucket 13 = {1000, 2000} -> 1500; global 3030 / 4.
  CHECK(p.predict(64) == 15.0);
  CHECK(p.predict(8'192) == 1'500.0);
  CHECK(p.predict(1'000) == 757.5);  // bucket 9 is empty
  // The running mean says 757.5 to both: the buckets' absolute error on these four is
  // |10-15| + |20-15| + |1000-1500| + |2000-1500| = 1010 against the mean's 2995.
  CHECK_THROWS_AS(bucketed_length_predictor({.prior = -1.0, .min_samples = 1}), invalid_argument);
  CHECK_THROWS_AS(bucketed_length_predictor({.prior = 1.0, .min_samples = 0}), invalid_argument);
}
