// Device tests of the CUDA copy engine (run where a GPU exists; the device test main exits
// 77 -> "skipped" elsewhere): moves between HBM and pinned host carry the bytes, hazards
// between the two copy streams hold without host syncs, bad tickets are refused, failed CUDA
// calls raise cuda_error, per-layer events order compute after each layer's load.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include <hybridcache/tiered/cuda/copy_engine.cuh>
#include <hybridcache/tiered/tiered_store.hpp>

using namespace hybridcache;
using namespace hybridcache::tiered;

namespace {
constexpr std::int64_t page = 64 * 1024;
std::vector<tier_config> tiers(std::int64_t hbm_pages, std::int64_t host_pages, int numa = -1) {
  return {{.kind = tier_kind::hbm, .capacity_bytes = hbm_pages * page},
          {.kind = tier_kind::host, .capacity_bytes = host_pages * page, .numa_node = numa}};
}

__global__ void check_layer(const std::uint8_t* data, std::int64_t bytes, std::uint8_t expect, int* bad) {
  for (std::int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < bytes; i += gridDim.x * blockDim.x)
    if (data[i] != expect) atomicAdd(bad, 1);
}
}  // namespace

TEST_CASE("cuda copy engine: demotion and promotion carry the bytes; bandwidth measured") {
  tiered_store<> s(tiers(32, 64), page);
  tiered::copy_engine e(tiers(32, 64), page, {.probe_bytes = 1 << 20});
  MESSAGE("measured D2H " << e.measured_gbps(tier_id{1}, copy_stream::offload) << " GB/s, H2D "
                          << e.measured_gbps(tier_id{1}, copy_stream::onboard) << " GB/s");
  CHECK(e.measured_gbps(tier_id{1}, copy_stream::offload) > 0.0);
  REQUIRE(s.insert(entry_id{1}, 7 * page - 3).has_value());
  const auto row = s.find(entry_id{1});
  std::vector<std::uint8_t> pattern(static_cast<std::size_t>(row->bytes()));
  std::mt19937 rng(1);
  for (auto& b : pattern) b = static_cast<std::uint8_t>(rng());
  HYBRIDCACHE_CUDA_TRY(cudaMemcpy(e.base(hbm_tier) + row->address(page), pattern.data(), pattern.size(), cudaMemcpyHostToDevice));
  REQUIRE(move_entry(s, e, entry_id{1}, tier_id{1}).has_value());
  const auto host_row = s.find(entry_id{1});
  CHECK(host_row->tier() == tier_id{1});
  CHECK(std::memcmp(e.base(tier_id{1}) + host_row->address(page), pattern.data(), pattern.size()) == 0);
  const auto st = e.take_stats();
  CHECK(st.transfers == 1);
  REQUIRE(move_entry(s, e, entry_id{1}, hbm_tier).has_value());
  std::vector<std::uint8_t> back(pattern.size());
  HYBRIDCACHE_CUDA_TRY(cudaMemcpy(back.data(), e.base(hbm_tier) + s.find(entry_id{1})->address(page), back.size(), cudaMemcpyDeviceToHost));
  CHECK(back == pattern);
  CHECK(s.check_invariants().empty());
}

TEST_CASE("cuda copy engine: cross-stream hazards equal submission order (no host syncs)") {
  const std::int64_t pages = 16;
  tiered::copy_engine e(tiers(pages, pages), page, {.measure_bandwidth = false});
  std::vector<std::vector<std::uint8_t>> shadow(2, std::vector<std::uint8_t>(static_cast<std::size_t>(pages * page)));
  std::mt19937_64 rng(3);
  for (auto& b : shadow[0]) b = static_cast<std::uint8_t>(rng());
  for (auto& b : shadow[1]) b = static_cast<std::uint8_t>(rng());
  HYBRIDCACHE_CUDA_TRY(cudaMemcpy(e.base(hbm_tier), shadow[0].data(), shadow[0].size(), cudaMemcpyHostToDevice));
  std::memcpy(e.base(tier_id{1}), shadow[1].data(), shadow[1].size());
  for (int j = 0; j < 300; ++j) {
    const tier_id src{static_cast<std::uint8_t>(rng() % 2)}, dst{static_cast<std::uint8_t>(1 - src.value)};
    const std::int64_t sp = static_cast<std::int64_t>(rng() % pages), dp = static_cast<std::int64_t>(rng() % pages);
    const std::int64_t n = 1 + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(std::min(pages - sp, pages - dp)));
    const auto s = (rng() & 1) ? copy_stream::offload : copy_stream::onboard;
    REQUIRE(e.submit(src, dst, {{sp * page, dp * page, n * page}}, s).has_value());
    std::memmove(shadow[dst.value].data() + dp * page, shadow[src.value].data() + sp * page, static_cast<std::size_t>(n * page));
  }
  e.synchronize();
  std::vector<std::uint8_t> dev(shadow[0].size());
  HYBRIDCACHE_CUDA_TRY(cudaMemcpy(dev.data(), e.base(hbm_tier), dev.size(), cudaMemcpyDeviceToHost));
  CHECK(dev == shadow[0]);
  CHECK(std::memcmp(e.base(tier_id{1}), shadow[1].data(), shadow[1].size()) == 0);
}

TEST_CASE("cuda copy engine: bad input and failed CUDA calls") {
  tiered::copy_engine e(tiers(4, 4), page, {.measure_bandwidth = false});
  move_ticket t;
  t.src = hbm_tier;
  t.dst = tier_id{1};
  t.src_bytes = t.dst_bytes = page;
  t.src_pages = page_list::contiguous(0, 1);
  t.dst_pages = page_list::contiguous(99, 1);
  CHECK(e.submit(t).error() == errc::invalid_argument);
  CHECK_THROWS_AS(tiered::copy_engine(tiers(4, 4), page, {.device = 9999}), cuda_error);
  try {
    tiered::copy_engine bad(tiers(4, 4), page, {.device = 9999});
  } catch (const cuda_error& err) {
    CHECK(std::string(err.what()).find("cudaSetDevice") != std::string::npos);
  }
  CHECK_THROWS_AS(tiered::cuda_layer_event_ring(0), invalid_argument);
}

TEST_CASE("cuda layer events: compute of layer l waits only for layer l's copy") {
  const int layers = 8;
  const std::int64_t layer_bytes = 2 * page;
  tiered::copy_engine e(tiers(layers * 2, layers * 2), page, {.measure_bandwidth = false});
  for (int l = 0; l < layers; ++l) std::memset(e.base(tier_id{1}) + l * layer_bytes, 10 + l, static_cast<std::size_t>(layer_bytes));
  cudaStream_t compute;
  HYBRIDCACHE_CUDA_TRY(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  tiered::cuda_layer_event_ring ring(layers, 3);
  auto set = ring.begin();
  REQUIRE(set.has_value());
  int* bad = nullptr;
  HYBRIDCACHE_CUDA_TRY(cudaMalloc(&bad, sizeof(int)));
  HYBRIDCACHE_CUDA_TRY(cudaMemset(bad, 0, sizeof(int)));
  e.wait_for(compute);
  for (int l = 0; l < layers; ++l) {
    REQUIRE(e.submit(tier_id{1}, hbm_tier, {{l * layer_bytes, l * layer_bytes, layer_bytes}}, copy_stream::onboard).has_value());
    ring.record(*set, l, e.stream(copy_stream::onboard));
  }
  for (int l = 0; l < layers; ++l) {
    ring.wait(*set, l, compute);
    check_layer<<<32, 256, 0, compute>>>(reinterpret_cast<const std::uint8_t*>(e.base(hbm_tier)) + l * layer_bytes, layer_bytes,
                                         static_cast<std::uint8_t>(10 + l), bad);
    HYBRIDCACHE_CUDA_TRY(cudaGetLastError());
  }
  e.join_into(compute);
  HYBRIDCACHE_CUDA_TRY(cudaStreamSynchronize(compute));
  int h = -1;
  HYBRIDCACHE_CUDA_TRY(cudaMemcpy(&h, bad, sizeof(int), cudaMemcpyDeviceToHost));
  CHECK(h == 0);
  for (int l = 0; l < layers; ++l) CHECK(ring.query(*set, l));
  CHECK(ring.begin().has_value());
  (void)cudaFree(bad);
  (void)cudaStreamDestroy(compute);
}

TEST_CASE("cuda layer events: a wait issued before the loader records the layer waits for that record (issue #15)") {
  // The compute thread reaches layer l before the loader queued its copy. Before, the stream
  // wait took the event as it was (unrecorded in this use: complete) and the kernel read
  // the layer before the copy; now the wait blocks until the record, then orders the kernel.
  const int layers = 4;
  const std::int64_t layer_bytes = 2 * page;
  tiered::copy_engine e(tiers(layers * 2, layers * 2), page, {.measure_bandwidth = false});
  for (int l = 0; l < layers; ++l) std::memset(e.base(tier_id{1}) + l * layer_bytes, 40 + l, static_cast<std::size_t>(layer_bytes));
  HYBRIDCACHE_CUDA_TRY(cudaMemset(e.base(hbm_tier), 0, static_cast<std::size_t>(layers * layer_bytes)));
  cudaStream_t compute;
  HYBRIDCACHE_CUDA_TRY(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  tiered::cuda_layer_event_ring ring(layers, 2);
  // Use set 0 once so its events hold a completed record from an earlier use.
  const auto first = ring.begin();
  REQUIRE(first.has_value());
  for (int l = 0; l < layers; ++l) ring.record(*first, l, e.stream(copy_stream::onboard));
  HYBRIDCACHE_CUDA_TRY(cudaStreamSynchronize(e.stream(copy_stream::onboard)));
  REQUIRE(ring.begin().has_value());  // set 1, unused
  const auto set = ring.begin();      // set 0 again: its old records are complete
  REQUIRE(set.has_value());
  REQUIRE(*set == *first);
  CHECK_FALSE(ring.query(*set, 0));  // not recorded in this use
  int* bad = nullptr;
  HYBRIDCACHE_CUDA_TRY(cudaMalloc(&bad, sizeof(int)));
  HYBRIDCACHE_CUDA_TRY(cudaMemset(bad, 0, sizeof(int)));
  bool submitted = true;
  std::thread loader([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the compute thread is already waiting
    for (int l = 0; l < layers; ++l) {
      submitted = submitted &&
                  e.submit(tier_id{1}, hbm_tier, {{l * layer_bytes, l * layer_bytes, layer_bytes}}, copy_stream::onboard).has_value();
      ring.record(*set, l, e.stream(copy_stream::onboard));
    }
  });
  for (int l = 0; l < layers; ++l) {
    ring.wait(*set, l, compute);
    check_layer<<<32, 256, 0, compute>>>(reinterpret_cast<const std::uint8_t*>(e.base(hbm_tier)) + l * layer_bytes, layer_bytes,
                                         static_cast<std::uint8_t>(40 + l), bad);
    HYBRIDCACHE_CUDA_TRY(cudaGetLastError());
  }
  loader.join();
  CHECK(submitted);
  HYBRIDCACHE_CUDA_TRY(cudaStreamSynchronize(compute));
  int h = -1;
  HYBRIDCACHE_CUDA_TRY(cudaMemcpy(&h, bad, sizeof(int), cudaMemcpyDeviceToHost));
  CHECK(h == 0);
  (void)cudaFree(bad);
  (void)cudaStreamDestroy(compute);
}

TEST_CASE("cuda copy engine: a multi-layer load lands layer by layer (wait_segments returns before the whole copy)") {
  // 8 layer segments of 32 MiB each (256 MiB, several ms over PCIe): an entry on the host
  // tier promoted to HBM; each layer is checked as soon as wait_segments says it landed,
  // by a kernel on another stream, while the later layers are still being copied.
  constexpr std::int64_t big_page = 2 << 20, layers = 8, pages_per_layer = 16;
  const std::vector<tier_config> t2{{.kind = tier_kind::hbm, .capacity_bytes = layers * pages_per_layer * big_page},
                                    {.kind = tier_kind::host, .capacity_bytes = layers * pages_per_layer * big_page}};
  tiered_store<> s(t2, big_page);
  tiered::copy_engine e(t2, big_page, {.measure_bandwidth = false});
  REQUIRE(s.insert(entry_id{1}, layers * pages_per_layer * big_page, tier_id{1}, {}, false, layers).has_value());
  const auto row = s.find(entry_id{1});
  const std::int64_t layer_bytes = pages_per_layer * big_page;
  std::int64_t i = 0;
  row->copies.front().pages.for_each_page([&](std::uint32_t p) {  // layer l's pages hold the byte l + 1
    std::memset(e.base(tier_id{1}) + static_cast<std::int64_t>(p) * big_page, static_cast<int>(i++ / pages_per_layer + 1),
                static_cast<std::size_t>(big_page));
  });
  auto t = s.prepare_move(entry_id{1}, hbm_tier);
  REQUIRE(t);
  REQUIRE(t->segments == layers);
  cudaStream_t compute = nullptr;
  HYBRIDCACHE_CUDA_TRY(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  int* bad = nullptr;
  HYBRIDCACHE_CUDA_TRY(cudaMalloc(&bad, sizeof(int)));
  HYBRIDCACHE_CUDA_TRY(cudaMemset(bad, 0, sizeof(int)));
  std::vector<std::uint32_t> dst_pages;
  t->dst_pages.for_each_page([&](std::uint32_t p) { dst_pages.push_back(p); });
  const auto start = std::chrono::steady_clock::now();
  const auto ev = e.submit(*t);
  REQUIRE(ev);
  CHECK(ev->segments == layers);
  std::vector<double> landed_ms;
  std::int32_t incomplete_at_first_layer = -1;
  for (std::int32_t l = 0; l < layers; ++l) {
    REQUIRE(e.wait_segments(*ev, l + 1).has_value());
    landed_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    if (l == 0) incomplete_at_first_layer = e.query(*ev) ? 0 : 1;
    CHECK(e.landed_segments(*ev) >= l + 1);
    for (std::int64_t k = 0; k < pages_per_layer; ++k)
      check_layer<<<64, 256, 0, compute>>>(reinterpret_cast<const std::uint8_t*>(
                                               e.base(hbm_tier) + static_cast<std::int64_t>(dst_pages[static_cast<std::size_t>(l * pages_per_layer + k)]) * big_page),
                                           big_page, static_cast<std::uint8_t>(l + 1), bad);
  }
  REQUIRE(e.wait(*ev).has_value());
  REQUIRE(s.complete_move(*t, true).has_value());
  HYBRIDCACHE_CUDA_TRY(cudaStreamSynchronize(compute));
  int bad_host = -1;
  HYBRIDCACHE_CUDA_TRY(cudaMemcpy(&bad_host, bad, sizeof(int), cudaMemcpyDeviceToHost));
  CHECK(bad_host == 0);
  MESSAGE("layer landed at (ms): " << landed_ms[0] << ", " << landed_ms[1] << ", ..., " << landed_ms.back()
                                   << "; the copy was still running when layer 0 landed: " << incomplete_at_first_layer
                                   << " (" << layer_bytes * layers / 1e9 / (landed_ms.back() / 1e3) << " GB/s)");
  CHECK(landed_ms[0] < landed_ms.back());
  HYBRIDCACHE_CUDA_TRY(cudaFree(bad));
  HYBRIDCACHE_CUDA_TRY(cudaStreamDestroy(compute));
}

TEST_CASE("cuda copy engine: a group lands layer 0 of every entry first (submit_group), per-entry submits do not") {
  // Two entries of 8 layers x 16 MiB on the host tier, loaded into HBM twice: as one group
  // (layer-major across the two) and as two submits (entry A whole, then B). With the group,
  // B's layer 0 lands after about 2 of the 16 layer copies; without it, after 9.
  constexpr std::int64_t big_page = 2 << 20, layers = 8, pages_per_layer = 8;
  constexpr std::int64_t entry_bytes = layers * pages_per_layer * big_page;
  const std::vector<tier_config> t2{{.kind = tier_kind::hbm, .capacity_bytes = 2 * entry_bytes},
                                    {.kind = tier_kind::host, .capacity_bytes = 2 * entry_bytes}};
  tiered_store<> s(t2, big_page);
  tiered::copy_engine e(t2, big_page, {.measure_bandwidth = false});
  for (std::uint64_t id : {1u, 2u}) {
    REQUIRE(s.insert(entry_id{id}, entry_bytes, tier_id{1}, {}, false, layers).has_value());
    std::int64_t i = 0;
    s.find(entry_id{id})->copies.front().pages.for_each_page([&](std::uint32_t p) {  // entry id, layer l: byte 16 id + l
      std::memset(e.base(tier_id{1}) + static_cast<std::int64_t>(p) * big_page,
                  static_cast<int>(16 * id + static_cast<std::uint64_t>(i++ / pages_per_layer)), static_cast<std::size_t>(big_page));
    });
  }
  auto bytes_ok = [&](entry_id id) {  // the entry's HBM pages hold its bytes
    std::vector<std::uint8_t> host(static_cast<std::size_t>(big_page));
    std::int64_t i = 0;
    bool ok = true;
    s.find(id)->in(hbm_tier)->pages.for_each_page([&](std::uint32_t p) {
      HYBRIDCACHE_CUDA_TRY(cudaMemcpy(host.data(), e.base(hbm_tier) + static_cast<std::int64_t>(p) * big_page,
                                      static_cast<std::size_t>(big_page), cudaMemcpyDeviceToHost));
      const auto want = static_cast<std::uint8_t>(16 * to_underlying(id) + static_cast<std::uint64_t>(i++ / pages_per_layer));
      for (const std::uint8_t b : host) ok = ok && b == want;
    });
    return ok;
  };
  auto run = [&](bool grouped) {
    auto a = s.prepare_move(entry_id{1}, hbm_tier);
    auto b = s.prepare_move(entry_id{2}, hbm_tier);
    REQUIRE(a);
    REQUIRE(b);
    std::vector<copy_event> ev(2);
    const auto start = std::chrono::steady_clock::now();
    if (grouped) {
      const std::vector<move_ticket> group{*a, *b};
      REQUIRE(e.submit_group(group, ev).has_value());
    } else {
      ev[0] = *e.submit(*a);
      ev[1] = *e.submit(*b);
    }
    REQUIRE(e.wait_segments(ev[1], 1).has_value());
    const double b0 = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    const bool a_done_at_b0 = e.query(ev[0]);
    REQUIRE(e.wait(ev[0]).has_value());
    const double a_done = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    REQUIRE(e.wait(ev[1]).has_value());
    const double all = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    REQUIRE(s.complete_move(*a, true).has_value());
    REQUIRE(s.complete_move(*b, true).has_value());
    CHECK(bytes_ok(entry_id{1}));
    CHECK(bytes_ok(entry_id{2}));
    MESSAGE((grouped ? "group" : "two submits") << ": B's layer 0 after " << b0 << " ms, A whole after " << a_done
                                                << " ms, both after " << all << " ms; A complete when B's layer 0 landed: "
                                                << a_done_at_b0);
    for (std::uint64_t id : {1u, 2u}) REQUIRE(move_entry(s, e, entry_id{id}, tier_id{1}).has_value());  // back down
    return std::pair<double, bool>{b0 / all, a_done_at_b0};
  };
  (void)run(false);  // warm-up
  const auto [separate_share, separate_a_done] = run(false);
  const auto [group_share, group_a_done] = run(true);
  CHECK(separate_a_done);     // one job per entry: B starts only after A is whole
  CHECK_FALSE(group_a_done);  // the group: B's layer 0 comes with A's
  CHECK(group_share < separate_share);
  MESSAGE("B's layer 0 at " << group_share << " of the load's time grouped, " << separate_share << " with two submits");
}
