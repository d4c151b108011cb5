// The library's CUDA host code — VMM backing, device backing, copy engine, layer event ring,
// KVBuffer device table — run against a host model of the runtime and driver
// (tests/support/fake_cuda: lazy streams, VMM mappings, pinned memory, injected failures)
// that records every access to an unmapped range and every unmap of a range queued work
// still uses. What a GPU would do with a missing dependency (a fault, a stale read) shows
// up here as a recorded violation or wrong bytes.
#include <doctest/doctest.h>

#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <span>
#include <thread>
#include <vector>

#include "hybridcache/attention/cuda/kv_buffer_device.cuh"
#include "hybridcache/memory/asymmetric_pool.hpp"
#include "hybridcache/memory/cuda/device_backing.cuh"
#include "hybridcache/memory/cuda/vmm_backing.cuh"
#include "hybridcache/tiered/cuda/copy_engine.cuh"
#include "hybridcache/tiered/tiered_store.hpp"

namespace la = hybridcache::attention;
namespace tr = hybridcache::tiered;
namespace mem = hybridcache::memory;
using fake_cuda::gpu;

namespace {

constexpr std::uint64_t MiB = std::uint64_t{1} << 20;

template <class Backing>
using device_pool =
    mem::asymmetric_pool<mem::unit_handle_table, mem::kv_pages_store<Backing>, mem::ssm_blocks_store<Backing>,
                         mem::threshold_rebalancer>;

// A "kernel" on `s` that fills the unit at `p` with `value` (queued: it runs when the device
// is made to catch up).
void fill_later(cudaStream_t s, std::byte* p, std::size_t bytes, std::uint8_t value) {
  gpu::get().launch(s, {{p, bytes}}, [p, bytes, value](const auto& at) {
    std::byte* h = at(p);
    if (h != nullptr) std::memset(h, value, bytes);
  });
}

// Compaction under kernels still in flight: 16 KV pages (two 2 MiB chunks) are written by
// kernels queued on a compute stream, 11 are freed, then the SSM pool asks for a chunk: the
// KV pool empties its sparsest chunk by copying its live pages into the other one and unmaps
// it. Returns the pool so the test can read the live pages after the device caught up.
template <class Backing>
void compaction_under_load(bool name_the_stream) {
  gpu::get().reset();
  cudaStream_t compute = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking) == cudaSuccess);
  {
    device_pool<Backing> pool({.capacity_bytes = 4 * 2 * MiB, .kv_page_bytes = 256 * 1024, .ssm_block_bytes = MiB,
                               .ssm_fraction = 0.5, .compaction = true});
    if (name_the_stream) pool.arena().set_ordering({.copy_stream = nullptr, .users = {compute}});
    std::vector<hybridcache::packed_handle> live;
    std::vector<std::uint8_t> value;
    for (int i = 0; i < 16; ++i) {
      auto h = pool.allocate_kv();
      REQUIRE(h.has_value());
      live.push_back(*h);
      value.push_back(static_cast<std::uint8_t>(i + 1));
      fill_later(compute, *pool.resolve(*h), 256 * 1024, value.back());
    }
    // One chunk keeps 2 pages, the other 3: neither is empty, the first is the sparsest.
    const std::uint32_t upc = pool.region(hybridcache::pool_kind::kv).units_per_chunk();
    std::vector<int> kept, seen_in(2, 0);
    std::uint32_t first_slot = *pool.unit_of(live[0]) / upc;
    for (int i = 0; i < 16; ++i) {
      const int group = *pool.unit_of(live[static_cast<std::size_t>(i)]) / upc == first_slot ? 0 : 1;
      if (seen_in[static_cast<std::size_t>(group)]++ < (group == 0 ? 2 : 3)) kept.push_back(i);
      else REQUIRE(pool.free(live[static_cast<std::size_t>(i)]).has_value());
    }
    REQUIRE(kept.size() == 5);
    REQUIRE(pool.rebalance(hybridcache::pool_kind::ssm, 2) == 1);
    CHECK(pool.counters().compactions == 1);
    CHECK(pool.counters().units_moved == 2);
    gpu::get().run_all();
    for (int i : kept) {
      CAPTURE(i);
      const std::byte* h = gpu::get().bytes_at(*pool.resolve(live[static_cast<std::size_t>(i)]));
      REQUIRE(h != nullptr);
      std::vector<std::uint8_t> got(256 * 1024);
      std::memcpy(got.data(), h, got.size());
      CHECK(got == std::vector<std::uint8_t>(got.size(), value[static_cast<std::size_t>(i)]));
    }
    // The new SSM chunk is usable at once.
    auto s = pool.allocate_ssm();
    CHECK(s.has_value());
  }
  CHECK(cudaStreamDestroy(compute) == cudaSuccess);
  const auto& v = gpu::get().violations();
  for (const auto& line : v) MESSAGE(line);
  CHECK(v.empty());
}

}  // namespace

TEST_CASE("vmm_backing: compaction copies after the kernels that wrote the units, unmaps after both") {
  SUBCASE("the compute stream named in the ordering") { compaction_under_load<mem::vmm_backing>(true); }
  SUBCASE("no stream named: the whole device") { compaction_under_load<mem::vmm_backing>(false); }
}

TEST_CASE("device_backing: compaction copies after the kernels that wrote the units") {
  SUBCASE("the compute stream named in the ordering") { compaction_under_load<mem::device_backing>(true); }
  SUBCASE("no stream named: the whole device") { compaction_under_load<mem::device_backing>(false); }
}

TEST_CASE("vmm_backing: a 6 MiB chunk (80 fp32 value heads of 128 x 128) reserves, maps and moves") {
  gpu::get().reset();
  const std::uint64_t block = 80ull * 128 * 128 * 4;  // 5 MiB: chunks round up to 6 MiB
  device_pool<mem::vmm_backing> pool({.capacity_bytes = 4 * 6 * MiB, .kv_page_bytes = 64 * 1024, .ssm_block_bytes = block,
                                     .ssm_fraction = 0.5});
  CHECK(pool.chunk_bytes() == 6 * MiB);
  auto a = pool.allocate_ssm(), b = pool.allocate_ssm();
  REQUIRE(a.has_value());
  REQUIRE(b.has_value());
  const auto pa = reinterpret_cast<std::uintptr_t>(*pool.resolve(*a));
  const auto pb = reinterpret_cast<std::uintptr_t>(*pool.resolve(*b));
  CHECK(pa % (2 * MiB) == 0);  // chunk starts on the granularity
  CHECK((pa > pb ? pa - pb : pb - pa) == 6 * MiB);
  CHECK(pool.rebalance(hybridcache::pool_kind::ssm, 1) == 1);  // a KV chunk moves over (unmap + map)
  CHECK(pool.allocate_ssm().has_value());
  CHECK(gpu::get().violations().empty());
}

namespace {
constexpr std::int64_t page = 64 * 1024;
std::vector<tr::tier_config> two_tiers() {
  using tr::tier_kind;
  return {{.kind = tier_kind::hbm, .capacity_bytes = 8 * page}, {.kind = tier_kind::host, .capacity_bytes = 8 * page}};
}
}  // namespace

TEST_CASE("copy engine: the caller's current device is left as it was; events live on the engine's device") {
  gpu::get().reset(2);
  REQUIRE(cudaSetDevice(1) == cudaSuccess);
  {
    tr::copy_engine e(two_tiers(), page, {.device = 0, .measure_bandwidth = true, .probe_bytes = page});
    CHECK(gpu::get().current_device() == 1);
    // A move made while device 1 is current: its event is created on device 0 (else the
    // record on device 0's stream fails).
    const auto ev = e.submit(hybridcache::tier_id{0}, hybridcache::tier_id{1}, {{0, 0, page}},
                             tr::copy_stream::offload);
    REQUIRE(ev.has_value());
    CHECK(e.wait(*ev).has_value());
    CHECK(gpu::get().current_device() == 1);
  }
  CHECK(gpu::get().current_device() == 1);
  // A constructor that throws gives the device back too.
  gpu::get().fail_next("cudaHostAlloc", cudaErrorMemoryAllocation);
  CHECK_THROWS_AS(tr::copy_engine(two_tiers(), page, {.device = 0}), hybridcache::cuda_error);
  CHECK(gpu::get().current_device() == 1);
}

TEST_CASE("copy engine: a failure while measuring bandwidth leaks no event, stream or allocation") {
  for (const char* call : {"cudaEventElapsedTime", "cudaEventSynchronize", "cudaMemcpyAsync"}) {
    CAPTURE(call);
    gpu::get().reset();
    gpu::get().fail_next(call, cudaErrorLaunchFailure, 1);
    CHECK_THROWS_AS(tr::copy_engine(two_tiers(), page, {.probe_bytes = page}), hybridcache::cuda_error);
    CHECK(gpu::get().live_events() == 0);
    CHECK(gpu::get().live_streams() == 0);
  }
}

TEST_CASE("layer event ring: compute waits for the layer recorded in this use of the set") {
  // The loader thread records layer l after queuing its copies; the compute thread's wait
  // for l blocks until then. An event not recorded in this use still holds the previous
  // use's record (or none): a stream wait on it would let compute read the layer early.
  gpu::get().reset();
  cudaStream_t copy = nullptr, compute = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&copy, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking) == cudaSuccess);
  {
    tr::cuda_layer_event_ring ring(2, 1);
    const auto s = ring.begin();
    REQUIRE(s.has_value());
    ring.record(*s, 0, copy);
    CHECK_NOTHROW(ring.wait(*s, 0, compute));
    CHECK_FALSE(ring.query(*s, 1));  // never recorded: not complete, whatever the event says
    gpu::get().run_all();
    CHECK(ring.query(*s, 0));
    const auto again = ring.begin();  // the same set, reused
    REQUIRE(again.has_value());
    REQUIRE(*again == *s);
    CHECK_FALSE(ring.query(*again, 0));  // the previous use's record does not count
    std::atomic<bool> waited{false};
    std::thread compute_thread([&] {
      ring.wait(*again, 0, compute);
      waited = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK_FALSE(waited.load());  // blocked until the loader records this use
    ring.record(*again, 0, copy);
    compute_thread.join();
    CHECK(waited.load());
  }
  CHECK(cudaStreamDestroy(copy) == cudaSuccess);
  CHECK(cudaStreamDestroy(compute) == cudaSuccess);
}

TEST_CASE("device_kv_buffer_table: uploads from a pinned mirror, never rewritten under a queued copy") {
  gpu::get().reset();
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  {
    la::kv_buffer_table table({.num_slots = 4, .num_blocks = 12, .block_tokens = 4, .flush_interval = 4,
                               .max_new_tokens = 2, .kv_only_crossover = 6});
    REQUIRE(table.open(1, false));
    la::device_kv_buffer_table dev(table);
    const auto n = static_cast<std::size_t>(4 * table.max_blocks_per_slot());
    auto device_view = [&] {
      std::vector<std::int32_t> out(n + 8);
      std::memcpy(out.data(), gpu::get().bytes_at(dev.block_table()), n * sizeof(std::int32_t));
      std::memcpy(out.data() + n, gpu::get().bytes_at(dev.cursor()), 4 * sizeof(std::int32_t));
      std::memcpy(out.data() + n + 4, gpu::get().bytes_at(dev.state_valid()), 4 * sizeof(std::int32_t));
      return out;
    };
    auto host_view = [&] {
      std::vector<std::int32_t> out(table.block_table_data(), table.block_table_data() + n);
      out.insert(out.end(), table.cursor_data(), table.cursor_data() + 4);
      out.insert(out.end(), table.state_valid_data(), table.state_valid_data() + 4);
      return out;
    };
    dev.upload(table, s);
    const auto first = host_view();
    // A kernel queued after the first upload reads the table the first upload sent ...
    std::vector<std::int32_t> seen_by_kernel;
    gpu::get().launch(s, {{dev.block_table(), n * sizeof(std::int32_t)}}, [&](const auto&) { seen_by_kernel = device_view(); });
    // ... while the host changes the table and uploads again before the device ran anything.
    REQUIRE(table.open(3, true));
    table.advance(1, 1);
    dev.upload(table, s);
    gpu::get().run_all();
    CHECK(seen_by_kernel == first);
    CHECK(device_view() == host_view());
    CHECK(gpu::get().pageable_copies() == 0);
    CHECK(gpu::get().calls("cudaMemcpyAsync") == 2);  // one copy per upload
    dev.upload(table, s);  // unchanged: nothing sent
    CHECK(gpu::get().calls("cudaMemcpyAsync") == 2);
  }
  CHECK(cudaStreamDestroy(s) == cudaSuccess);
  CHECK(gpu::get().live_events() == 0);
}

TEST_CASE("copy engine: a multi-layer move lands layer by layer (an event per segment; layered_copy_engine)") {
  using namespace hybridcache;
  using namespace hybridcache::tiered;
  gpu::get().reset(1);
  tr::copy_engine e(two_tiers(), page, {.device = 0, .measure_bandwidth = false});
  // 4 layer segments of one page each, host pages 4..7 -> HBM pages 0..3 (not adjacent in
  // the ticket's order: HBM 3, 2, 1, 0, so no span crosses a segment either way).
  move_ticket t;
  t.src = tier_id{1};
  t.dst = hbm_tier;
  t.segments = 4;
  t.src_bytes = t.dst_bytes = 4 * page;
  for (std::uint32_t p : {4u, 5u, 6u, 7u}) t.src_pages.push_back({p, 1});
  for (std::uint32_t p : {3u, 2u, 1u, 0u}) t.dst_pages.push_back({p, 1});
  for (std::int64_t i = 0; i < 4 * page; ++i) e.base(tier_id{1})[4 * page + i] = static_cast<std::byte>((i * 7 + 1) & 0xff);
  std::memset(e.base(hbm_tier), 0, static_cast<std::size_t>(4 * page));
  auto layer_in_hbm = [&](std::int64_t g) {  // segment g's page holds its bytes
    const std::byte* hbm = e.base(hbm_tier) + (3 - g) * page;
    for (std::int64_t i = 0; i < page; ++i)
      if (hbm[i] != static_cast<std::byte>(((g * page + i) * 7 + 1) & 0xff)) return false;
    return true;
  };
  const auto ev = e.submit(t);
  REQUIRE(ev.has_value());
  CHECK(ev->segments == 4);
  CHECK(e.landed_segments(*ev) == 0);  // the fake device runs a stream only when the host waits
  REQUIRE(e.wait_segments(*ev, 2).has_value());
  CHECK(e.landed_segments(*ev) == 2);
  CHECK(layer_in_hbm(0));
  CHECK(layer_in_hbm(1));
  CHECK_FALSE(layer_in_hbm(2));  // not copied yet: the wait ran the stream only up to layer 1's event
  CHECK_FALSE(e.query(*ev));
  CHECK(e.wait_segments(*ev, 5).error() == hybridcache::errc::invalid_argument);
  REQUIRE(e.wait_segments(*ev, 4).has_value());  // the last segment is the job's own event
  CHECK(e.query(*ev));
  CHECK(e.landed_segments(*ev) == 4);
  for (std::int64_t g = 0; g < 4; ++g) CHECK(layer_in_hbm(g));
  // A sparsified copy (fewer bytes) is one job: its segments land together.
  move_ticket sparse = t;
  sparse.dst_bytes = 3 * page + 5;
  const auto ev2 = e.submit(sparse);
  REQUIRE(ev2.has_value());
  CHECK(ev2->segments == 4);
  REQUIRE(e.wait_segments(*ev2, 1).has_value());
  CHECK(e.query(*ev2));
  const auto st = e.take_stats();
  CHECK(st.transfers == 4 + 4);  // per segment (not adjacent), then the sparsified copy's runs
}

TEST_CASE("copy engine: a group's layer segments are issued layer-major across its tickets (grouped_copy_engine)") {
  using namespace hybridcache;
  using namespace hybridcache::tiered;
  gpu::get().reset(1);
  tr::copy_engine e(two_tiers(), page, {.device = 0, .measure_bandwidth = false});
  // Ticket A: 4 layers, host pages 0..3 -> HBM 0..3; ticket B: 2 layers, host 4..5 -> HBM 4..5.
  auto ticket = [](std::uint32_t src, std::uint32_t dst, std::int32_t layers) {
    move_ticket t;
    t.src = tier_id{1};
    t.dst = hbm_tier;
    t.segments = layers;
    t.src_bytes = t.dst_bytes = layers * page;
    for (std::int32_t g = 0; g < layers; ++g) {
      t.src_pages.push_back({src + static_cast<std::uint32_t>(g), 1});
      t.dst_pages.push_back({dst + static_cast<std::uint32_t>(g), 1});
    }
    return t;
  };
  const std::vector<move_ticket> group{ticket(0, 0, 4), ticket(4, 4, 2)};
  for (std::int64_t i = 0; i < 6 * page; ++i) e.base(tier_id{1})[i] = static_cast<std::byte>((i * 5 + 3) & 0xff);
  std::memset(e.base(hbm_tier), 0, static_cast<std::size_t>(6 * page));
  auto page_in_hbm = [&](std::int64_t p) {  // HBM page p holds host page p's bytes
    for (std::int64_t i = 0; i < page; ++i)
      if (e.base(hbm_tier)[p * page + i] != static_cast<std::byte>(((p * page + i) * 5 + 3) & 0xff)) return false;
    return true;
  };
  std::vector<copy_event> ev(2);
  REQUIRE(e.submit_group(group, ev).has_value());
  CHECK(ev[0].segments == 4);
  CHECK(ev[1].segments == 2);
  CHECK(ev[1].seq == ev[0].seq + 1);
  // B's first layer (1/2 of B) is issued after A's first two (1/4, 2/4 of A: ties go to the
  // earlier ticket): waiting for it runs the stream exactly that far.
  REQUIRE(e.wait_segments(ev[1], 1).has_value());
  CHECK(e.landed_segments(ev[0]) == 2);
  CHECK(e.landed_segments(ev[1]) == 1);
  CHECK(page_in_hbm(0));
  CHECK(page_in_hbm(1));
  CHECK(page_in_hbm(4));
  CHECK_FALSE(page_in_hbm(2));  // A's layer 2 comes next
  CHECK_FALSE(page_in_hbm(5));  // B's last layer comes after A's
  CHECK_FALSE(e.query(ev[0]));
  REQUIRE(e.wait(ev[0]).has_value());  // A's last layer: its own job event
  CHECK(page_in_hbm(3));
  CHECK_FALSE(page_in_hbm(5));
  CHECK_FALSE(e.query(ev[1]));
  REQUIRE(e.wait(ev[1]).has_value());
  for (std::int64_t p = 0; p < 6; ++p) CHECK(page_in_hbm(p));
  CHECK(e.take_stats().jobs == 2);
  // Refused: tickets of both directions, or events of the wrong count; nothing issued.
  move_ticket down = ticket(6, 6, 1);
  std::swap(down.src, down.dst);
  const std::vector<move_ticket> mixed{group[0], down};
  const auto copies = gpu::get().calls("cudaMemcpyAsync");
  CHECK(e.submit_group(mixed, ev).error() == hybridcache::errc::invalid_argument);
  CHECK(e.submit_group(group, std::span<copy_event>(ev).first(1)).error() == hybridcache::errc::invalid_argument);
  CHECK(gpu::get().calls("cudaMemcpyAsync") == copies);
  CHECK(e.take_stats().jobs == 0);
}
