// The grid-stride kernels (count_nonfinite: the debug input check; qwen3_next_gates) executed by
// the CTA emulator: several CTAs of 256 lanes, a grid smaller than the data (every lane loops),
// atomics on one counter from every CTA.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "emulated_kernels.hpp"
#include "hybridcache/attention/kernel_bodies.hpp"

namespace hc = hybridcache::attention;
namespace emu = hctest::emu;

TEST_CASE("emulated count_nonfinite: NaN and +-inf counted across CTAs; -inf allowed for log decays") {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> x(700);
  for (auto& e : x) e = u(rng);
  for (std::size_t i = 17; i < x.size(); i += 97) x[i] = std::numeric_limits<float>::quiet_NaN();
  for (std::size_t i = 40; i < x.size(); i += 301) x[i] = std::numeric_limits<float>::infinity();
  for (std::size_t i = 90; i < x.size(); i += 250) x[i] = -std::numeric_limits<float>::infinity();
  std::uint32_t nonfinite = 0, neg_inf = 0;
  for (float e : x) {
    nonfinite += std::isfinite(e) ? 0u : 1u;
    neg_inf += std::isinf(e) && e < 0 ? 1u : 0u;
  }
  REQUIRE(nonfinite == 14);
  REQUIRE(neg_inf == 3);
  const auto bf = [&] {
    std::vector<hc::bfloat16_t> b(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) b[i] = hc::from_float<hc::bfloat16_t>(x[i]);
    return b;
  }();
  // 3 CTAs of 256 lanes (fp32), then 2 CTAs whose lanes loop (bf16).
  for (const bool allow : {false, true}) {
    std::uint32_t count = 0, count_bf = 0;
    hctest::emulate("count_nonfinite", hc::elementwise_shape(static_cast<std::int64_t>(x.size()), 1024), [&](emu::lane& t) {
      hc::kernel_bodies::count_nonfinite(t, x.data(), static_cast<std::int64_t>(x.size()), allow, &count);
    });
    hctest::emulate("count_nonfinite", hc::elementwise_shape(static_cast<std::int64_t>(bf.size()), 2), [&](emu::lane& t) {
      hc::kernel_bodies::count_nonfinite(t, bf.data(), static_cast<std::int64_t>(bf.size()), allow, &count_bf);
    });
    CHECK(count == (allow ? nonfinite - neg_inf : nonfinite));
    CHECK(count_bf == count);
  }
}

TEST_CASE("emulated qwen3_next_gates: the host functions' bits for every (token, head)") {
  constexpr int tokens = 37, HV = 12;
  std::mt19937_64 rng(9);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<hc::bfloat16_t> a(tokens * HV), b(tokens * HV);
  std::vector<float> a_log(HV), dt_bias(HV);
  for (auto& e : a) e = hc::from_float<hc::bfloat16_t>(4.0f * n01(rng));
  for (auto& e : b) e = hc::from_float<hc::bfloat16_t>(3.0f * n01(rng));
  for (auto& e : a_log) e = 0.5f * n01(rng);
  for (auto& e : dt_bias) e = n01(rng);
  std::vector<float> g(a.size(), -1.0f), beta(a.size(), -1.0f);
  hctest::emulate("qwen3_next_gates", hc::elementwise_shape(tokens * HV, 1), [&](emu::lane& t) {
    hc::kernel_bodies::qwen3_next_gates(t, a.data(), b.data(), a_log.data(), dt_bias.data(), g.data(), beta.data(),
                                        tokens, HV);
  });
  for (int i = 0; i < tokens * HV; ++i) {
    const float eg = hc::qwen3_next_log_decay(a_log[i % HV], hc::to_float(a[i]), dt_bias[i % HV]);
    const float eb = hc::qwen3_next_beta(hc::to_float(b[i]));
    REQUIRE(std::memcmp(&g[i], &eg, sizeof(float)) == 0);
    REQUIRE(std::memcmp(&beta[i], &eb, sizeof(float)) == 0);
  }
}
