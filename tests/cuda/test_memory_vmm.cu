// Device tests of the memory layer's CUDA backings (run where a GPU exists; the device test
// main exits 77 -> "skipped" elsewhere): VMM capacity moves by remapping with data intact,
// reserved physical memory equals the budget, kernels address units through vmm_unit_ref,
// compaction copies on the device, device_backing is one cudaMalloc per pool, and failed
// CUDA calls raise cuda_error naming the call.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include <hybridcache/memory/cuda/device_backing.cuh>
#include <hybridcache/memory/cuda/vmm_backing.cuh>
#include <hybridcache/memory/asymmetric_pool.hpp>
#include <hybridcache/memory/fixed_dual_pool.hpp>

using namespace hybridcache;
using namespace hybridcache::memory;

namespace {

using vmm_pool = asymmetric_pool<unit_handle_table, kv_pages_store<memory::vmm_backing>,
                                 ssm_blocks_store<memory::vmm_backing>, threshold_rebalancer>;

__global__ void stamp_units(memory::vmm_unit_ref ref, const std::uint32_t* units, std::uint32_t n, std::uint32_t seed) {
  const std::uint32_t i = blockIdx.x;
  if (i >= n) return;
  auto* p = reinterpret_cast<std::uint32_t*>(ref.address(units[i]));
  for (std::uint64_t w = threadIdx.x; w < ref.unit_bytes / 4; w += blockDim.x) p[w] = seed ^ (i * 2654435761u);
}

std::uint32_t first_word(const vmm_pool& pool, packed_handle h) {
  std::uint32_t v = 0;
  HYBRIDCACHE_CUDA_TRY(cudaMemcpy(&v, pool.resolve(h).value(), sizeof v, cudaMemcpyDeviceToHost));
  return v;
}

}  // namespace

TEST_CASE("vmm_backing: remapping moves capacity, data stays, reserved = budget") {
  const hybridcache::byte_count g = memory::vmm_granularity(0);
  REQUIRE(g > 0);
  const hybridcache::byte_count budget = 32 * g;
  vmm_pool pool({.capacity_bytes = budget, .kv_page_bytes = 65536, .ssm_block_bytes = 262144, .ssm_fraction = 0.5,
                 .granularity_bytes = g, .compaction = true},
                threshold_rebalancer({.threshold_low = 0.0, .threshold_high = 0.01, .migration_batch_size = 4,
                                      .min_rebalance_interval_ops = 0}));
  CHECK(pool.reserved_bytes() == budget);
  // Fill the KV pool past its share: the rebalancer remaps SSM chunks into it.
  std::vector<packed_handle> kv;
  const std::uint64_t kv_share = pool.stats(pool_kind::kv).total_units;
  for (std::uint64_t i = 0; i < kv_share + 2 * (g / 65536); ++i) kv.push_back(pool.allocate_kv().value());
  CHECK(pool.counters().rebalances >= 1);
  CHECK(pool.reserved_bytes() == budget);
  // Every unit is reachable from a kernel through the contiguous VA formula.
  std::vector<std::uint32_t> units;
  for (auto h : kv) units.push_back(pool.unit_of(h).value());
  std::uint32_t* d_units = nullptr;
  HYBRIDCACHE_CUDA_TRY(cudaMalloc(&d_units, units.size() * sizeof(std::uint32_t)));
  HYBRIDCACHE_CUDA_TRY(cudaMemcpy(d_units, units.data(), units.size() * 4, cudaMemcpyHostToDevice));
  const auto ref = memory::make_unit_ref(pool.kv_store());
  stamp_units<<<static_cast<unsigned>(units.size()), 128>>>(ref, d_units, static_cast<std::uint32_t>(units.size()), 77);
  HYBRIDCACHE_CUDA_TRY(cudaGetLastError());
  HYBRIDCACHE_CUDA_TRY(cudaDeviceSynchronize());
  for (std::size_t i = 0; i < kv.size(); ++i) {
    CHECK(ref.address(units[i]) == pool.resolve(kv[i]).value());
    CHECK(first_word(pool, kv[i]) == (77u ^ (static_cast<std::uint32_t>(i) * 2654435761u)));
  }
  // Free every other chunk's worth, move capacity back (compaction copies on the device).
  std::vector<packed_handle> keep;
  for (std::size_t i = 0; i < kv.size(); ++i)
    if (i % 2 == 0) keep.push_back(kv[i]);
    else REQUIRE(pool.free(kv[i]).has_value());
  const auto moved = pool.rebalance(pool_kind::ssm, 2 * (g / 65536));
  CHECK(moved == 2);
  CHECK(pool.counters().units_moved > 0);
  for (std::size_t i = 0; i < kv.size(); i += 2)
    CHECK(first_word(pool, kv[i]) == (77u ^ (static_cast<std::uint32_t>(i) * 2654435761u)));
  for (auto h : keep) CHECK(pool.free(h).has_value());
  HYBRIDCACHE_CUDA_TRY(cudaFree(d_units));
}

TEST_CASE("vmm_backing: bad chunk size is rejected, device errors name the call") {
  const hybridcache::byte_count g = memory::vmm_granularity(0);
  CHECK_THROWS_AS(memory::vmm_backing::arena(2, g + 4096), invalid_argument);
  CHECK_THROWS_WITH_AS(memory::device_backing::arena(1, std::uint64_t{1} << 52), doctest::Contains("cudaMalloc"),
                       cuda_error);
  CHECK_THROWS_WITH_AS(memory::vmm_backing::arena(1, g << 20), doctest::Contains("cuMemCreate"), cuda_error);  // 2 TiB
}

TEST_CASE("device_backing: fixed_dual_pool is one cudaMalloc per pool, units are writable") {
  fixed_dual_pool<memory::device_backing> pool(
      {.capacity_bytes = 64u << 20, .kv_page_bytes = 65536, .ssm_block_bytes = 262144, .ssm_ratio = 0.5});
  CHECK(pool.reserved_bytes() == (64u << 20));
  auto k = pool.allocate(pool_kind::kv).value();
  auto s = pool.allocate(pool_kind::ssm).value();
  HYBRIDCACHE_CUDA_TRY(cudaMemset(pool.resolve(k).value(), 0x5a, 65536));
  HYBRIDCACHE_CUDA_TRY(cudaMemset(pool.resolve(s).value(), 0xa5, 262144));
  unsigned char a = 0, b = 0;
  HYBRIDCACHE_CUDA_TRY(cudaMemcpy(&a, pool.resolve(k).value() + 65535, 1, cudaMemcpyDeviceToHost));
  HYBRIDCACHE_CUDA_TRY(cudaMemcpy(&b, pool.resolve(s).value() + 262143, 1, cudaMemcpyDeviceToHost));
  CHECK(a == 0x5a);
  CHECK(b == 0xa5);
  CHECK(pool.free(k).has_value());
  CHECK(pool.free(s).has_value());
}
