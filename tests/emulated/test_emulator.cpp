// The CTA emulator itself (tests/support/cta_emulator.hpp): collectives in hardware order,
// barriers, the checks that turn a bad barrier into a report, NaN-poisoned and bounded shared
// memory, launch limits.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "../support/cta_emulator.hpp"

namespace emu = hctest::emu;

namespace {

// What a kernel's butterfly sum computes on every lane, written out by hand: at each step
// lane l adds the value lane l ^ offset held before the step.
std::vector<float> butterfly(std::vector<float> x) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    std::vector<float> next(32);
    for (int l = 0; l < 32; ++l) next[l] = x[l] + x[l ^ offset];
    x = next;
  }
  return x;
}

std::string failure_of(const emu::launch_config& cfg, const std::function<void(emu::lane&)>& body) {
  try {
    emu::launch(cfg, body);
  } catch (const emu::emulation_error& e) {
    return e.what();
  }
  return {};
}

}  // namespace

TEST_CASE("emulator: xor butterfly, shfl_up scan, shfl, votes in hardware order") {
  std::vector<float> in(128), sum(128), scan(128), bcast(128);
  std::vector<std::uint32_t> ballots(128);
  std::vector<int> anys(128), alls(128);
  for (int i = 0; i < 128; ++i) in[i] = 1.0f / static_cast<float>(i + 3) + static_cast<float>(i % 7) * 1e3f;
  emu::launch({2, 128, 0}, [&](emu::lane& t) {
    if (t.block() != 1) return;
    const int i = static_cast<int>(t.thread());
    float x = in[i];
    for (int offset = 16; offset > 0; offset >>= 1) x += t.shfl_xor(x, offset);
    sum[i] = x;
    float s = in[i];
    for (int d = 1; d < 32; d <<= 1) {
      const float o = t.shfl_up(s, d);
      if (t.lane_id() >= d) s += o;
    }
    scan[i] = s;
    bcast[i] = t.shfl(in[i], 5);
    ballots[i] = t.ballot(i % 3 == 0);
    anys[i] = t.any(t.warp_id() == 2 && t.lane_id() == 31);
    alls[i] = t.all(t.warp_id() != 1 || t.lane_id() < 40);
  });
  for (int w = 0; w < 4; ++w) {
    const std::vector<float> lanes(in.begin() + w * 32, in.begin() + (w + 1) * 32);
    const auto expect = butterfly(lanes);
    for (int l = 0; l < 32; ++l) {
      const int i = w * 32 + l;
      CHECK(std::memcmp(&sum[i], &expect[l], sizeof(float)) == 0);  // bit-identical order
      float s = lanes[l];
      for (int d = 1; d < 32; d <<= 1) (void)d;
      CHECK(bcast[i] == lanes[5]);
      CHECK(anys[i] == (w == 2));
      CHECK(alls[i] == 1);
      std::uint32_t mask = 0;
      for (int b = 0; b < 32; ++b) mask |= ((w * 32 + b) % 3 == 0 ? 1u : 0u) << b;
      CHECK(ballots[i] == mask);
      (void)s;
    }
    // Hillis-Steele scan by hand.
    std::vector<float> h = lanes;
    for (int d = 1; d < 32; d <<= 1) {
      std::vector<float> nx = h;
      for (int l = d; l < 32; ++l) nx[l] = h[l] + h[l - d];
      h = nx;
    }
    for (int l = 0; l < 32; ++l) CHECK(std::memcmp(&scan[w * 32 + l], &h[l], sizeof(float)) == 0);
  }
}

TEST_CASE("emulator: __syncthreads orders shared memory between warps; shared memory starts as NaN") {
  std::vector<float> out(3 * 128);
  std::vector<int> was_nan(3 * 128);
  emu::launch({3, 128, 128 * sizeof(float)}, [&](emu::lane& t) {
    float* sh = t.shared<float>();
    const std::uint32_t i = t.thread();
    was_nan[t.block() * 128 + i] = std::isnan(sh[127 - i]) ? 1 : 0;
    t.sync_threads();
    sh[i] = static_cast<float>(t.block() * 1000 + i);
    t.sync_threads();
    out[t.block() * 128 + i] = sh[127 - i];  // written by another warp
  });
  for (int b = 0; b < 3; ++b)
    for (int i = 0; i < 128; ++i) {
      CHECK(out[b * 128 + i] == static_cast<float>(b * 1000 + 127 - i));
      CHECK(was_nan[b * 128 + i] == 1);
    }
}

TEST_CASE("emulator: a barrier not every lane reaches is reported, not hung") {
  SUBCASE("lanes 1-31 at __syncwarp, every other lane at __syncthreads: deadlock") {
    const auto f = failure_of({1, 128, 0}, [](emu::lane& t) {
      if (t.warp_id() == 0 && t.lane_id() > 0) t.sync_warp();
      t.sync_threads();
    });
    CHECK(f.find("deadlock") != std::string::npos);
    CHECK(f.find("__syncwarp at") != std::string::npos);
    CHECK(f.find("__syncthreads at") != std::string::npos);
  }
  SUBCASE("early return before __syncthreads") {
    const auto f = failure_of({1, 128, 0}, [](emu::lane& t) {
      if (t.thread() == 77) return;
      t.sync_threads();
    });
    CHECK(f.find("lane 77 returned") != std::string::npos);
  }
  SUBCASE("a lane returns while its warp waits in a shuffle") {
    const auto f = failure_of({1, 64, 0}, [](emu::lane& t) {
      if (t.thread() == 40) return;
      (void)t.shfl_xor(1.0f, 1);
    });
    CHECK(!f.empty());
  }
  SUBCASE("lanes at two different __syncthreads") {
    const auto f = failure_of({1, 128, 0}, [](emu::lane& t) {
      if (t.thread() < 64) t.sync_threads();
      else t.sync_threads();
    });
    CHECK(f.find("different __syncthreads") != std::string::npos);
  }
  SUBCASE("one warp split between a shuffle and __syncwarp") {
    const auto f = failure_of({1, 32, 0}, [](emu::lane& t) {
      if (t.lane_id() < 16) (void)t.shfl_xor(1.0f, 16);
      else t.sync_warp();
    });
    CHECK(f.find("diverged") != std::string::npos);
  }
  SUBCASE("an exception in one lane unwinds the others") {
    const auto f = failure_of({2, 128, 0}, [](emu::lane& t) {
      if (t.thread() == 3) throw std::runtime_error("boom");
      t.sync_threads();
    });
    CHECK(f.find("boom") != std::string::npos);
  }
}

TEST_CASE("emulator: launch limits and shared-memory bounds") {
  std::string why;
  CHECK(emu::valid_launch({std::uint64_t{1} << 31, 128, 0}, &why) == false);
  CHECK(why.find("blocks") != std::string::npos);
  CHECK(emu::valid_launch({70000, 128, 0}));
  CHECK_FALSE(emu::valid_launch({1, 2048, 0}));
  CHECK_FALSE(emu::valid_launch({1, 128, 300 * 1024}));
  CHECK_THROWS_AS(emu::launch({0, 128, 0}, [](emu::lane&) {}), emu::emulation_error);
#if !HCTEST_EMU_ASAN
  // Without ASan the guard zone catches a write past the end (with ASan the write itself
  // is reported and the process stops, so this case runs only without it).
  const auto f = failure_of({1, 32, 64}, [](emu::lane& t) {
    if (t.thread() == 0) t.shared<float>()[16] = 1.0f;
  });
  CHECK(f.find("past its 64 B") != std::string::npos);
#endif
  std::atomic<int> ran{0};
  emu::options only;
  only.only_blocks = [](std::uint64_t b) { return b == 69999; };
  std::uint32_t hits = 0;
  emu::launch({70000, 32, 0}, [&](emu::lane& t) {
    if (t.block() == 69999) ran.fetch_add(1);
    t.atomic_add(&hits, 1);
  }, only);
  CHECK(ran.load() == 32);
  CHECK(hits == 32);
}
