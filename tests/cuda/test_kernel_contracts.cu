// Device tests of what the emulated tests (tests/emulated) prove on the host and only a GPU
// can confirm for nvcc's code (run where a GPU exists; skipped elsewhere): KVBuffer decode
// with B = 1 is bit-identical to recurrent decode (the explicit FMAs hold under nvcc too),
// g = -inf resets the state in the chunked prefill, a commit of more than 65,535 entries
// launches, and a VMM compaction under kernels still queued on a non-blocking stream keeps
// the bytes (the remap waits for them).
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "hybridcache/attention/cuda/linear_attention_kernels.cuh"
#include "hybridcache/memory/asymmetric_pool.hpp"
#include "hybridcache/memory/cuda/vmm_backing.cuh"
#include "reference.hpp"

namespace hc = hybridcache::attention;

namespace {

template <class T>
hybridcache::device_array<T> upload(const std::vector<T>& host) {
  hybridcache::device_array<T> d(host.size());
  HYBRIDCACHE_CUDA_TRY(cudaMemcpy(d.data(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}
template <class T>
std::vector<T> download(const hybridcache::device_array<T>& d) {
  std::vector<T> host(d.size());
  HYBRIDCACHE_CUDA_TRY(cudaMemcpy(host.data(), d.data(), d.size() * sizeof(T), cudaMemcpyDeviceToHost));
  return host;
}
std::vector<float> random_floats(std::size_t n, std::uint64_t seed, float lo, float hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> x(n);
  for (auto& e : x) e = u(rng);
  return x;
}

constexpr int DK = 128, DV = 128, H = 16, HV = 32;
constexpr auto V = hc::state_layout::v_major;
constexpr std::int64_t NS = static_cast<std::int64_t>(DK) * DV;
using bf16 = hc::bfloat16_t;

__global__ void fill_words(std::uint32_t* p, std::size_t words, std::uint32_t value, int spin) {
  // Slow on purpose (a long-running writer): the remap must wait for it.
  for (int r = 0; r < spin; ++r)
    for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < words; i += gridDim.x * blockDim.x) p[i] = value + r;
}

}  // namespace

TEST_CASE("device: KVBuffer decode with B = 1 is bit-identical to recurrent decode") {
  const hc::kv_buffer_config cfg{.num_slots = 2, .num_blocks = 4, .block_tokens = 1, .flush_interval = 1,
                                 .max_new_tokens = 1, .kv_only_crossover = 0};
  hc::kv_buffer_table table(cfg);
  REQUIRE(table.open(0, false));
  REQUIRE(table.open(1, false));
  const std::vector<std::int32_t> slots{1, 0};
  auto states = random_floats(2 * HV * NS, 3, -0.3f, 0.3f);
  auto d_rec = upload(states), d_kvb = upload(states);
  hc::device_kv_buffer_table d_table(table);
  hc::device_kv_buffer_pool<bf16, float> buf(table, H, HV, DK, DV);
  for (int step = 0; step < 4; ++step) {
    auto q = hctest::to_io<bf16>(random_floats(2 * H * DK, 10 + step, -1, 1));
    auto k = hctest::to_io<bf16>(random_floats(2 * H * DK, 20 + step, -1, 1));
    auto v = hctest::to_io<bf16>(random_floats(2 * HV * DV, 30 + step, -1, 1));
    auto g = random_floats(2 * HV, 40 + step, -2, 0);
    auto beta = random_floats(2 * HV, 50 + step, 0.05f, 0.95f);
    auto dq = upload(q), dk = upload(k), dv = upload(v);
    auto dg = upload(g), db = upload(beta);
    auto ds = upload(slots);
    hybridcache::device_array<float> o1(2 * HV * DV), o2(2 * HV * DV);
    const hc::step_io<bf16, float> a{ds.data(), 2, 1, H, HV, dq.data(), dk.data(), dv.data(), dg.data(), db.data(),
                                     o1.data(), d_rec.data(), hc::qwen3_next_qk(DK)};
    auto b = a;
    b.o = o2.data();
    b.states = d_kvb.data();
    hc::launch_recurrent_step<hc::delta_rule, V, DK, DV>(a, {d_rec.data(), 2, HV, DK, DV, V}, slots);
    d_table.upload(table);
    hc::launch_kv_decode<hc::delta_rule, V, DK, DV>(b, {d_kvb.data(), 2, HV, DK, DV, V}, slots, table, buf.ref(d_table));
    HYBRIDCACHE_CUDA_TRY(cudaDeviceSynchronize());
    for (int s : slots) table.advance(s, 1);
    const auto x = download(o1), y = download(o2);
    REQUIRE(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0);
    const auto sx = download(d_rec), sy = download(d_kvb);
    REQUIRE(std::memcmp(sx.data(), sy.data(), sx.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("device: chunked prefill with g = -inf resets matches the host programs") {
  const std::vector<std::int64_t> cu{0, 70}, starts{3};
  const std::vector<std::int32_t> slots{0};
  const std::int64_t tokens = 70;
  auto q = hctest::to_io<bf16>(random_floats(tokens * H * DK, 5, -1, 1));
  auto k = hctest::to_io<bf16>(random_floats(tokens * H * DK, 6, -1, 1));
  auto v = hctest::to_io<bf16>(random_floats(tokens * HV * DV, 7, -1, 1));
  auto g = random_floats(tokens * HV, 8, -1.0f, 0.0f);
  for (int t : {0, 9, 61})
    for (int hv = 0; hv < HV; hv += 3) g[static_cast<std::size_t>(t * HV + hv)] = -std::numeric_limits<float>::infinity();
  auto beta = random_floats(tokens * HV, 9, 0.05f, 0.95f);
  auto states = random_floats(HV * NS, 10, -0.3f, 0.3f);
  auto dq = upload(q), dk = upload(k), dv = upload(v);
  auto dg = upload(g), db = upload(beta), ds = upload(states);
  auto dcu = upload(cu), dst = upload(starts);
  auto dsl = upload(slots);
  hybridcache::device_array<float> d_o(tokens * HV * DV), d_ws(static_cast<std::size_t>(hc::prefill_workspace_floats(tokens, 1, HV, 64)));
  hc::prefill_io<bf16, float> io;
  io.num_seqs = 1;
  io.num_k_heads = H;
  io.num_v_heads = HV;
  io.chunk = 64;
  io.cu_seqlens = dcu.data();
  io.start_positions = dst.data();
  io.slots = dsl.data();
  io.q = dq.data();
  io.k = dk.data();
  io.v = dv.data();
  io.log_decay = dg.data();
  io.beta = db.data();
  io.o = d_o.data();
  io.workspace = d_ws.data();
  io.qk = hc::qwen3_next_qk(DK);
  hc::launch_chunked_prefill<hc::delta_rule, V, DK, DV>(io, {ds.data(), 1, HV, DK, DV, V}, {cu, starts, slots, {}, {}});
  HYBRIDCACHE_CUDA_TRY(cudaDeviceSynchronize());
  std::vector<float> o(tokens * HV * DV), h_states = states;
  auto hio = io;
  hio.cu_seqlens = cu.data();
  hio.start_positions = starts.data();
  hio.slots = slots.data();
  hio.q = q.data();
  hio.k = k.data();
  hio.v = v.data();
  hio.log_decay = g.data();
  hio.beta = beta.data();
  hio.o = o.data();
  hio.states = h_states.data();
  hio.workspace = nullptr;
  hc::chunked_prefill_host<hc::delta_rule, V, DK, DV>(hio);
  CHECK(hctest::rel_rms(download(d_o), o) <= 1e-5);
  CHECK(hctest::rel_rms(download(ds), h_states) <= 1e-5);
}

TEST_CASE("device: kv_commit launches for 70,000 entries (a 1-D grid past gridDim.y's 65,535)") {
  const hc::kv_buffer_config cfg{.num_slots = 2, .num_blocks = 8, .block_tokens = 4, .flush_interval = 4,
                                 .max_new_tokens = 4, .kv_only_crossover = 0};
  hc::kv_buffer_table table(cfg);
  REQUIRE(table.open(0, false));
  REQUIRE(table.open(1, false));
  std::vector<std::int32_t> slots(70000, -1), accepted(70000, 0);
  slots[69998] = 0;
  slots[69999] = 1;
  auto states = random_floats(2 * HV * NS, 3, -0.3f, 0.3f);
  auto d_states = upload(states);
  auto d_slots = upload(slots), d_acc = upload(accepted);
  hc::device_kv_buffer_table d_table(table);
  hc::device_kv_buffer_pool<bf16, float> buf(table, H, HV, DK, DV);
  d_table.upload(table);
  hc::launch_kv_commit<hc::delta_rule, V, DK, DV>(d_slots.data(), d_acc.data(), slots, accepted, H, HV,
                                                  {d_states.data(), 2, HV, DK, DV, V}, table, buf.ref(d_table),
                                                  hc::qwen3_next_qk(DK), 1);
  HYBRIDCACHE_CUDA_TRY(cudaDeviceSynchronize());
  CHECK(download(d_states) == states);  // nothing accepted: no fold, no write
}

TEST_CASE("device: VMM compaction waits for kernels still running on a non-blocking stream") {
  using pool_t = hybridcache::memory::asymmetric_pool<hybridcache::memory::unit_handle_table,
                                                      hybridcache::memory::kv_pages_store<hybridcache::memory::vmm_backing>,
                                                      hybridcache::memory::ssm_blocks_store<hybridcache::memory::vmm_backing>,
                                                      hybridcache::memory::threshold_rebalancer>;
  const hybridcache::byte_count g = hybridcache::memory::vmm_granularity(0);
  cudaStream_t compute = nullptr;
  HYBRIDCACHE_CUDA_TRY(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  {
    // 6 MiB-class chunks: 3 x the granularity (not a power of two).
    pool_t pool({.capacity_bytes = 4 * 3 * g, .kv_page_bytes = g / 2, .ssm_block_bytes = 3 * g - 4096,
                 .ssm_fraction = 0.5, .granularity_bytes = g, .compaction = true});
    pool.arena().set_ordering({.copy_stream = nullptr, .users = {compute}});
    std::vector<hybridcache::packed_handle> live;
    for (std::int64_t i = 0; i < pool.stats(hybridcache::pool_kind::kv).total_units; ++i) {
      live.push_back(pool.allocate_kv().value());
      fill_words<<<64, 256, 0, compute>>>(reinterpret_cast<std::uint32_t*>(pool.resolve(live.back()).value()),
                                          g / 2 / 4, static_cast<std::uint32_t>(1000 * (i + 1)), 200);
    }
    for (std::size_t i = 1; i < live.size(); i += 2) REQUIRE(pool.free(live[i]).has_value());
    REQUIRE(pool.rebalance(hybridcache::pool_kind::ssm, 1) == 1);
    HYBRIDCACHE_CUDA_TRY(cudaStreamSynchronize(compute));
    for (std::size_t i = 0; i < live.size(); i += 2) {
      std::uint32_t first = 0;
      HYBRIDCACHE_CUDA_TRY(cudaMemcpy(&first, pool.resolve(live[i]).value(), 4, cudaMemcpyDeviceToHost));
      CHECK(first == static_cast<std::uint32_t>(1000 * (i + 1) + 199));
    }
  }
  HYBRIDCACHE_CUDA_TRY(cudaStreamDestroy(compute));
}
