// Device test (skips without a GPU): the prefix cache over `tiered_state_store<lru_demotion,
// tiered::copy_engine>`. A conversation evicted from HBM is copied D2H into pinned host memory,
// its host hit is loaded H2D into the staging room by `load`, and `settle` gives the staged
// device pages to the tree: the bytes the runtime wrote come back, byte for byte. The same
// flow runs on the host engine in tests/tiered/test_prefix_tiered_bytes.cpp.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include <hybridcache/model/cost_model.hpp>
#include <hybridcache/tiered/cuda/copy_engine.cuh>
#include <hybridcache/prefix/lru_scorer.hpp>
#include <hybridcache/prefix/prefix_cache.hpp>
#include "hybridcache/stores/counting_store.hpp"
#include <hybridcache/stores/tiered_state_store.hpp>

#include "../support/tiny_hybrid_model.hpp"

using namespace hybridcache;

namespace {

using store_t = stores::tiered_state_store<tiered::lru_demotion, tiered::copy_engine>;

/// Copies an entry's logical bytes out of (or into) its tier's arena, page by page.
std::vector<std::uint8_t> read_entry(const tiered::copy_engine& e, const store_t& s, entry_id id) {
  const auto row = s.table().find(id);
  REQUIRE(row.has_value());
  REQUIRE(row->home() != nullptr);
  const std::int64_t page = s.table().page_bytes();
  std::vector<std::uint8_t> out(static_cast<std::size_t>(row->bytes()));
  for (std::int64_t i = 0; i < row->home()->pages.size(); ++i) {
    const std::byte* src = e.base(row->tier()) + static_cast<std::int64_t>(row->home()->pages.page(i)) * page;
    HYBRIDCACHE_CUDA_TRY(cudaMemcpy(out.data() + static_cast<std::int64_t>(i) * page, src,
                                    static_cast<std::size_t>(page), cudaMemcpyDefault));
  }
  return out;
}
void write_entry(const tiered::copy_engine& e, const store_t& s, entry_id id, const std::vector<std::uint8_t>& v) {
  const auto row = s.table().find(id);
  REQUIRE(row.has_value());
  REQUIRE(row->home() != nullptr);
  REQUIRE(static_cast<std::int64_t>(v.size()) == row->bytes());
  const std::int64_t page = s.table().page_bytes();
  for (std::int64_t i = 0; i < row->home()->pages.size(); ++i)
    HYBRIDCACHE_CUDA_TRY(cudaMemcpy(e.base(row->tier()) + static_cast<std::int64_t>(row->home()->pages.page(i)) * page,
                                    v.data() + static_cast<std::int64_t>(i) * page, static_cast<std::size_t>(page),
                                    cudaMemcpyDefault));
}
std::vector<std::uint8_t> fill(std::size_t n, std::uint8_t seed) {
  std::vector<std::uint8_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::uint8_t>(seed * 31 + i * 7);
  return v;
}

}  // namespace

TEST_CASE("cuda: a conversation demoted D2H, loaded H2D into staging and adopted by the tree keeps its bytes") {
  const cost_model m(test::tiny_hybrid_spec());
  const std::int64_t kv = m.kv_bytes_per_token(), ck = m.ssm_checkpoint_bytes();
  const stores::tiered_state_store_config cfg{.capacity_bytes = 40 * kv + 2 * ck,
                                              .host_capacity_bytes = 400 * kv,
                                              .kv_bytes_per_token = kv,
                                              .checkpoint_bytes = ck,
                                              .staging_bytes = 40 * kv + 2 * ck};
  tiered::copy_engine engine(store_t::tiers_for(cfg), store_t::page_bytes_for(cfg), {.measure_bandwidth = false});
  prefix::prefix_cache<cost_model, prefix::judicious_admission, prefix::lru_scorer, store_t> c(
      m, store_t(cfg, engine), prefix::lru_scorer{});
  const std::vector<token_id> a(30, 1), b(30, 2);

  // a: one node of 30 tokens with a checkpoint at its end; the runtime writes its bytes.
  auto ma = c.match(a);
  REQUIRE(ma);
  REQUIRE(c.commit(a, 30, &*ma));
  c.store().settle(c.tree(), a);
  std::vector<node_id> path;
  (void)c.tree().walk(a, path);
  REQUIRE(path.size() == 1);
  const auto a_kv = fill(static_cast<std::size_t>(30 * kv), 1), a_ck = fill(static_cast<std::size_t>(ck), 2);
  write_entry(engine, c.store(), c.tree().at(path[0]).kv.id, a_kv);
  write_entry(engine, c.store(), c.tree().at(path[0]).checkpoint.id, a_ck);

  // b evicts a: its KV and checkpoint are copied device -> pinned host.
  auto mb = c.match(b);
  REQUIRE(mb);
  REQUIRE(c.commit(b, 30, &*mb));
  c.store().settle(c.tree(), b);
  REQUIRE(c.store().host_entries() == 2);

  // a again (+1 token): a host hit of 30 tokens, loaded into the HBM staging room.
  std::vector<token_id> again = a;
  again.push_back(3);
  auto mt = c.match(again);
  REQUIRE(mt);
  const auto h = c.store().lookup(again, *mt);
  REQUIRE(h.host_tokens == 30);
  REQUIRE(c.store().load(h).has_value());
  REQUIRE(c.store().wait_loaded(h).has_value());  // the copies are asynchronous
  for (const auto& s : c.store().staged(h)) {
    CHECK(c.store().table().locate(s.id)->first == hbm_tier);
    CHECK(read_entry(engine, c.store(), s.id) == (s.checkpoint ? a_ck : a_kv));
  }
  REQUIRE(c.commit(again, 31, &*mt));
  c.store().settle(c.tree(), again, h);
  CHECK(c.store().counters().adopted_entries >= 1);
  (void)c.tree().walk(again, path);
  // The node covering tokens [0, 30) holds a's KV again, on the device, without a recompute.
  const auto& first = c.tree().at(path[0]);
  REQUIRE(first.end >= 30);
  const auto got = read_entry(engine, c.store(), first.kv.id);
  CHECK(std::memcmp(got.data(), a_kv.data(), a_kv.size()) == 0);
  CHECK(c.store().check_invariants(c.tree()).empty());
}
