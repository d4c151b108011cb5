// compare_with_reference (examples/llama_cpp/verify.hpp), the rule `hybridcache-llama replay
// --verify` applies: on random logit rows (never zeros), perturbed below and above the bound,
// with and without a token flip, and on malformed input.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "verify.hpp"

namespace hcl = hybridcache_llama;

namespace {

struct run {
  std::vector<std::int32_t> tokens;
  std::vector<float> logits;
};

// `steps` rows of `n` logits in [-8, 8]; each token the row's argmax.
run random_run(std::mt19937_64& rng, std::int32_t n, int steps) {
  std::uniform_real_distribution<float> u(-8.0f, 8.0f);
  run r;
  for (int s = 0; s < steps; ++s) {
    const std::size_t row = r.logits.size();
    std::int32_t best = 0;
    for (std::int32_t j = 0; j < n; ++j) {
      r.logits.push_back(u(rng));
      if (r.logits.back() > r.logits[row + static_cast<std::size_t>(best)]) best = j;
    }
    r.tokens.push_back(best);
  }
  return r;
}

// Every logit moved by at most `rel` of the row's largest magnitude (nonzero moves).
run perturbed(const run& ref, std::int32_t n, double rel, std::mt19937_64& rng) {
  run r = ref;
  std::uniform_real_distribution<double> u(0.5, 1.0);
  for (std::size_t s = 0; s < ref.tokens.size(); ++s) {
    double scale = 0;
    for (std::int32_t j = 0; j < n; ++j) scale = std::max(scale, std::abs(double(ref.logits[s * n + j])));
    for (std::int32_t j = 0; j < n; ++j) r.logits[s * n + j] += float((j % 2 ? 1 : -1) * u(rng) * rel * scale);
  }
  return r;
}

}  // namespace

TEST_CASE("verify: identical runs, and runs within the bound, pass; beyond it they fail") {
  std::mt19937_64 rng(7);
  constexpr std::int32_t n = 257;
  for (int trial = 0; trial < 50; ++trial) {
    const run ref = random_run(rng, n, 4);
    const auto same = hcl::compare_with_reference(ref.tokens, ref.logits, ref.tokens, ref.logits, n);
    CHECK(same.ok);
    CHECK(same.tokens_identical);
    CHECK(same.logits_identical);
    CHECK(same.max_relative_deviation == 0);

    const run near = perturbed(ref, n, 1e-4, rng);
    const auto v = hcl::compare_with_reference(ref.tokens, near.logits, ref.tokens, ref.logits, n);
    CHECK(v.ok);
    CHECK_FALSE(v.logits_identical);
    CHECK(v.max_relative_deviation > 0);
    CHECK(v.max_relative_deviation <= 1e-4 * 1.001);

    const run far = perturbed(ref, n, 0.05, rng);
    const auto w = hcl::compare_with_reference(ref.tokens, far.logits, ref.tokens, ref.logits, n);
    CHECK_FALSE(w.ok);
    CHECK(w.why.find("output 0") != std::string::npos);
  }
}

TEST_CASE("verify: a token flip is a near tie only when the logits are within the bound") {
  std::mt19937_64 rng(11);
  constexpr std::int32_t n = 64;
  run ref = random_run(rng, n, 3);
  // Step 1: make the runner-up within 1e-4 of the top, then let the run pick the runner-up.
  auto row = [&](run& r, int s) { return r.logits.data() + s * n; };
  const std::int32_t top = ref.tokens[1], other = (top + 1) % n;
  row(ref, 1)[other] = row(ref, 1)[top] - 1e-4f;
  run near = ref;
  row(near, 1)[other] = row(ref, 1)[top] + 1e-4f;
  near.tokens[1] = other;
  near.tokens[2] = (ref.tokens[2] + 5) % n;  // after a flip the continuations are not compared
  const auto v = hcl::compare_with_reference(near.tokens, near.logits, ref.tokens, ref.logits, n);
  CHECK(v.ok);
  CHECK_FALSE(v.tokens_identical);
  CHECK(v.flip_at == 1);

  run wrong = ref;  // the same flip, but the row moved by whole units: a wrong state
  for (std::int32_t j = 0; j < n; ++j) row(wrong, 1)[j] += (j % 3) * 2.0f;
  row(wrong, 1)[other] = row(wrong, 1)[top] + 1.0f;
  wrong.tokens[1] = other;
  const auto w = hcl::compare_with_reference(wrong.tokens, wrong.logits, ref.tokens, ref.logits, n);
  CHECK_FALSE(w.ok);
  CHECK(w.flip_at == 1);
  CHECK(w.why.find("the token differs") != std::string::npos);
}

TEST_CASE("verify: malformed input is not ok") {
  std::mt19937_64 rng(3);
  constexpr std::int32_t n = 32;
  const run ref = random_run(rng, n, 2);
  std::vector<float> short_rows(ref.logits.begin(), ref.logits.end() - 1);
  CHECK_FALSE(hcl::compare_with_reference(ref.tokens, short_rows, ref.tokens, ref.logits, n).ok);
  CHECK_FALSE(hcl::compare_with_reference(ref.tokens, ref.logits, ref.tokens, ref.logits, 0).ok);
  // Equal tokens, but one run stopped a step earlier.
  const std::vector<std::int32_t> fewer(ref.tokens.begin(), ref.tokens.end() - 1);
  const std::vector<float> fewer_rows(ref.logits.begin(), ref.logits.end() - n);
  const auto v = hcl::compare_with_reference(fewer, fewer_rows, ref.tokens, ref.logits, n);
  CHECK_FALSE(v.ok);
  CHECK(v.why.find("generated") != std::string::npos);
}
