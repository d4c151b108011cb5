// The tensor-core product of attention/mma_fragments.hpp on the host: its lane/fragment map
// against the PTX ISA's m16n8k16 figures (written out here from the ISA's own conditions,
// independently of the library's functions), and the shuffled emulation under the CTA
// emulator against a naive fp64 product, for bf16 and fp16, with a check that fragments laid
// out in another map give a wrong product.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "../support/cta_emulator.hpp"
#include "hybridcache/attention/mma_fragments.hpp"

namespace hc = hybridcache::attention;
namespace emu = hctest::emu;

namespace {

// PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type", as the ISA states it.
int isa_a_row(int lane, int i) {
  const int group = lane >> 2;
  return (i < 2 || (i >= 4 && i < 6)) ? group : group + 8;
}
int isa_a_col(int lane, int i) {
  const int tig = lane % 4;
  return i < 4 ? tig * 2 + (i & 0x1) : tig * 2 + (i & 0x1) + 8;
}
int isa_b_row(int lane, int i) {
  const int tig = lane % 4;
  return i < 2 ? tig * 2 + (i & 0x1) : tig * 2 + (i & 0x1) + 8;
}
int isa_c_row(int lane, int i) { return i < 2 ? (lane >> 2) : (lane >> 2) + 8; }
int isa_c_col(int lane, int i) { return (lane % 4) * 2 + (i & 0x1); }

template <class T>
std::vector<T> random_matrix(int rows, int cols, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<T> m(static_cast<std::size_t>(rows) * cols);
  for (auto& x : m) {
    float v = u(rng);
    if (std::fabs(v) < 0.05f) v = 0.5f;  // non-zero
    x = hc::from_float<T>(v);
  }
  return m;
}

// D = A B + C by one warp under the emulator: A [16][16] row major, Bt [8][16] (B's columns as
// rows), C [16][8]; `swap` lays A's fragments out in a wrong map (registers 1 and 2 exchanged).
template <class T>
std::vector<float> warp_product(const std::vector<T>& a, const std::vector<T>& bt, const std::vector<float>& c,
                                bool swap = false) {
  std::vector<float> d(16 * 8, std::nanf(""));
  emu::launch({1, 32, 0}, [&](emu::lane& t) {
    const int lane = t.lane_id();
    auto fa = hc::load_fragment_a(a.data(), 16, 0, 0, 16, 16, lane);
    if (swap) std::swap(fa.r[1], fa.r[2]);
    const auto fb = hc::load_fragment_b_t(bt.data(), 16, 0, 0, 8, 16, lane);
    hc::mma_fragment_c fc;
    for (int e = 0; e < 4; ++e) fc.x[e] = c[static_cast<std::size_t>(hc::c_row(lane, e) * 8 + hc::c_col(lane, e))];
    hc::mma_m16n8k16<T>(t, fc, fa, fb);
    for (int e = 0; e < 4; ++e) d[static_cast<std::size_t>(hc::c_row(lane, e) * 8 + hc::c_col(lane, e))] = fc.x[e];
  });
  return d;
}

template <class T>
void product_case(std::uint64_t seed) {
  const auto a = random_matrix<T>(16, 16, seed), bt = random_matrix<T>(8, 16, seed + 1);
  std::vector<float> c(16 * 8);
  for (int i = 0; i < 128; ++i) c[static_cast<std::size_t>(i)] = 0.25f * static_cast<float>(i % 9) - 1.0f;
  const auto d = warp_product(a, bt, c);
  double worst = 0.0, scale = 0.0;
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 8; ++n) {
      double ref = c[static_cast<std::size_t>(r * 8 + n)], mag = std::fabs(ref);
      for (int k = 0; k < 16; ++k) {
        const double p = static_cast<double>(hc::to_float(a[static_cast<std::size_t>(r * 16 + k)])) *
                         hc::to_float(bt[static_cast<std::size_t>(n * 16 + k)]);
        ref += p;
        mag += std::fabs(p);
      }
      worst = std::max(worst, std::fabs(d[static_cast<std::size_t>(r * 8 + n)] - ref));
      scale = std::max(scale, mag);
    }
  // Exact products, 16 fp32 additions: within 16 ulps of the sum of magnitudes.
  CHECK(worst <= 16 * 6e-8 * scale);
  MESSAGE("m16n8k16 emulation: max |D - fp64| = " << worst << " (sum of |terms| up to " << scale << ")");
  // Fragments in another map: the product is wrong somewhere.
  const auto bad = warp_product(a, bt, c, true);
  double bad_worst = 0.0;
  for (int i = 0; i < 128; ++i) bad_worst = std::max(bad_worst, static_cast<double>(std::fabs(bad[i] - d[i])));
  CHECK(bad_worst > 1e-3);
}

}  // namespace

TEST_CASE("mma fragments: the m16n8k16 lane map is the PTX ISA's, and each map is a bijection") {
  std::set<std::pair<int, int>> a, b, c;
  for (int lane = 0; lane < 32; ++lane) {
    for (int e = 0; e < 8; ++e) {
      CHECK(hc::a_row(lane, e) == isa_a_row(lane, e));
      CHECK(hc::a_col(lane, e) == isa_a_col(lane, e));
      a.insert({hc::a_row(lane, e), hc::a_col(lane, e)});
    }
    for (int e = 0; e < 4; ++e) {
      CHECK(hc::b_row(lane, e) == isa_b_row(lane, e));
      CHECK(hc::b_col(lane, e) == (lane >> 2));
      CHECK(hc::c_row(lane, e) == isa_c_row(lane, e));
      CHECK(hc::c_col(lane, e) == isa_c_col(lane, e));
      b.insert({hc::b_row(lane, e), hc::b_col(lane, e)});
      c.insert({hc::c_row(lane, e), hc::c_col(lane, e)});
    }
  }
  CHECK(a.size() == 256);  // 16 x 16, each element in exactly one lane
  CHECK(b.size() == 128);  // 16 x 8
  CHECK(c.size() == 128);  // 16 x 8
  // Spot entries of the ISA's figures: lane 5 (groupID 1, threadID_in_group 1).
  CHECK(hc::a_row(5, 0) == 1);
  CHECK(hc::a_col(5, 0) == 2);
  CHECK(hc::a_row(5, 3) == 9);
  CHECK(hc::a_col(5, 7) == 11);
  CHECK(hc::b_row(5, 3) == 11);
  CHECK(hc::c_row(5, 2) == 9);
  CHECK(hc::c_col(5, 1) == 3);
}

TEST_CASE("mma fragments: the shuffled m16n8k16 equals a naive product (bf16, fp16), a wrong map does not") {
  SUBCASE("bf16") { product_case<hc::bfloat16_t>(7); }
  SUBCASE("fp16") { product_case<hc::half_t>(11); }
}

TEST_CASE("mma fragments: edge tiles read zeros past the given rows and columns") {
  // A 16x16 tile of a 5 x 11 matrix (row stride 14), B from 3 rows of length 11 (an odd edge): the rest is 0.
  const auto a = random_matrix<hc::bfloat16_t>(5, 14, 3), bt = random_matrix<hc::bfloat16_t>(3, 14, 4);
  std::vector<float> d(16 * 8, std::nanf(""));
  emu::launch({1, 32, 0}, [&](emu::lane& t) {
    const int lane = t.lane_id();
    const auto fa = hc::load_fragment_a(a.data(), 14, 0, 0, 5, 11, lane);
    const auto fb = hc::load_fragment_b_t(bt.data(), 14, 0, 0, 3, 11, lane);
    hc::mma_fragment_c fc;
    hc::mma_m16n8k16<hc::bfloat16_t>(t, fc, fa, fb);
    for (int e = 0; e < 4; ++e) d[static_cast<std::size_t>(hc::c_row(lane, e) * 8 + hc::c_col(lane, e))] = fc.x[e];
  });
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 8; ++n) {
      double ref = 0.0;
      if (r < 5 && n < 3)
        for (int k = 0; k < 11; ++k)
          ref += static_cast<double>(hc::to_float(a[static_cast<std::size_t>(r * 14 + k)])) *
                 hc::to_float(bt[static_cast<std::size_t>(n * 14 + k)]);
      CAPTURE(r);
      CAPTURE(n);
      CHECK(std::fabs(d[static_cast<std::size_t>(r * 8 + n)] - ref) <= 1e-5);
    }
}
