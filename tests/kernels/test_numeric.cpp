// 16-bit storage types: exact widening and round-to-nearest-even narrowing.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "hybridcache/attention/numeric.hpp"

namespace hc = hybridcache::attention;

namespace {

// Independent oracle: the representable neighbours of x by brute-force search over the 65536
// encodings (sorted by value), ties to the even encoding.
template <class T>
std::uint16_t nearest_even(float x, const std::vector<std::pair<double, std::uint16_t>>& sorted) {
  const double v = x;
  auto it = std::lower_bound(sorted.begin(), sorted.end(), std::make_pair(v, std::uint16_t{0}));
  if (it == sorted.end()) return sorted.back().second;
  if (it->first == v) return it->second;
  if (it == sorted.begin()) return it->second;
  const auto lo = *(it - 1), hi = *it;
  const double dl = v - lo.first, dh = hi.first - v;
  if (dl < dh) return lo.second;
  if (dh < dl) return hi.second;
  return (lo.second & 1u) == 0 ? lo.second : hi.second;
}

template <class T>
std::vector<std::pair<double, std::uint16_t>> finite_values() {
  std::vector<std::pair<double, std::uint16_t>> out;
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const float f = hc::to_float(T{static_cast<std::uint16_t>(b)});
    if (!std::isfinite(f) || (f == 0.0f && std::signbit(f))) continue;
    out.emplace_back(f, static_cast<std::uint16_t>(b));
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("half_t: every encoding round-trips; known values") {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const hc::half_t h{static_cast<std::uint16_t>(b)};
    const float f = hc::to_float(h);
    if (std::isnan(f)) {
      CHECK(std::isnan(hc::to_float(hc::from_float<hc::half_t>(f))));
      continue;
    }
    REQUIRE(hc::from_float<hc::half_t>(f).bits == b);
  }
  CHECK(hc::to_float(hc::half_t{0x3C00}) == 1.0f);
  CHECK(hc::to_float(hc::half_t{0x7BFF}) == 65504.0f);
  CHECK(hc::to_float(hc::half_t{0x0001}) == std::ldexp(1.0f, -24));
  CHECK(hc::from_float<hc::half_t>(65520.0f).bits == 0x7C00);  // ties to even -> inf
  CHECK(hc::from_float<hc::half_t>(65519.0f).bits == 0x7BFF);
}

TEST_CASE("bfloat16_t: every encoding round-trips; known values") {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const float f = hc::to_float(hc::bfloat16_t{static_cast<std::uint16_t>(b)});
    if (std::isnan(f)) continue;
    REQUIRE(hc::from_float<hc::bfloat16_t>(f).bits == b);
  }
  CHECK(hc::to_float(hc::bfloat16_t{0x3F80}) == 1.0f);
  CHECK(std::isnan(hc::to_float(hc::from_float<hc::bfloat16_t>(std::numeric_limits<float>::quiet_NaN()))));
}

TEST_CASE("narrowing is round-to-nearest-even against a brute-force oracle") {
  const auto hv = finite_values<hc::half_t>();
  const auto bv = finite_values<hc::bfloat16_t>();
  std::mt19937_64 rng(3);
  std::uniform_int_distribution<std::uint32_t> bits(0, 0xFFFFFFFFu);
  int checked = 0;
  for (int i = 0; i < 200000; ++i) {
    std::uint32_t u = bits(rng);
    // Bias towards the binary16 range (exponents around 0) and exact ties.
    if (i % 2 == 0) u = (u & 0x80FFFFFFu) | ((100u + (u >> 24) % 45u) << 23);
    if (i % 7 == 0) u &= 0xFFFFF000u;
    float f;
    std::memcpy(&f, &u, 4);
    if (!std::isfinite(f) || f == 0.0f) continue;
    const float af = std::fabs(f);
    if (af < 65504.0f) {
      const auto want = nearest_even<hc::half_t>(af, hv);
      REQUIRE(hc::from_float<hc::half_t>(af).bits == want);
      REQUIRE(hc::from_float<hc::half_t>(-af).bits == (want | 0x8000u));
    }
    if (af < 3.38e38f) REQUIRE(hc::from_float<hc::bfloat16_t>(af).bits == nearest_even<hc::bfloat16_t>(af, bv));
    ++checked;
  }
  CHECK(checked > 100000);
  CHECK(hc::is_finite(1.0f));
  CHECK_FALSE(hc::is_finite(std::numeric_limits<float>::infinity()));
  CHECK_FALSE(hc::is_finite(std::numeric_limits<float>::quiet_NaN()));
}
