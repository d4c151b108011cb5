// The asymmetric pool as the prefix cache's state store: split/join/copy-on-split of paged
// KV extents, and the fixture trace (synth-v1 chat, seed 7) through
// prefix_cache<..., pool_state_store<asymmetric_pool>> against the byte-counting store.
#include <doctest/doctest.h>

#include <cstring>
#include <vector>

#include <hybridcache/model/presets.hpp>
#include <hybridcache/memory/asymmetric_pool.hpp>
#include <hybridcache/stores/pool_state_store.hpp>
#include <hybridcache/stores/tiered_state_store.hpp>
#include <hybridcache/stores/counting_store.hpp>
#include <hybridcache/prefix/prefix_cache.hpp>
#include <hybridcache/sim/synth_v1.hpp>

using namespace hybridcache;
using namespace hybridcache::memory;
using namespace hybridcache::stores;

namespace {

constexpr std::uint64_t GiB = std::uint64_t{1} << 30;

const std::vector<sim::synth_request>& trace() {
  static const auto t = sim::generate_synth_v1(
      {.profile = sim::synth_profile::chat, .seed = 7, .sessions = 12, .session_gap_ms = 1000});
  return t;
}

asymmetric_pool_config pool_for(const cost_model& m, byte_count budget) {
  return {.capacity_bytes = budget, .kv_page_bytes = kv_page_bytes(m), .ssm_block_bytes = checkpoint_block_bytes(m)};
}

template <class Cache>
std::vector<std::int64_t> replay(Cache& c) {
  std::vector<std::int64_t> skipped;
  for (const auto& r : trace()) {
    std::vector<token_id> seq = r.input;
    seq.insert(seq.end(), r.output.begin(), r.output.end());
    auto m = c.match(r.input);
    REQUIRE(m);
    skipped.push_back(m->reusable_tokens);
    auto cr = c.commit(seq, static_cast<std::int64_t>(r.input.size()), &*m);
    REQUIRE(cr);
  }
  return skipped;
}

}  // namespace

TEST_CASE("pool_state_store: extents split and join at and inside page boundaries, bytes preserved") {
  // 4 tokens per 512 B page (128 B per token), 2 attention layers, 3 recurrent layers.
  host_asymmetric_pool<no_rebalancer> pool({.capacity_bytes = 8 * 4096, .kv_page_bytes = 512, .ssm_block_bytes = 1024,
                                            .granularity_bytes = 4096});
  pool_state_store<host_asymmetric_pool<no_rebalancer>> store(pool, 4, 2, 3);
  auto e = store.allocate_kv(10).value();  // 3 blocks x 2 layers
  CHECK(e.pages.size() == 6);
  CHECK(store.kv_bytes(10) == 6 * 512);
  CHECK(store.used_bytes() == 6 * 512);
  // Token t of layer l holds byte (16 * l + t).
  auto stamp = [&](const auto& ext) {
    for (std::int64_t t = 0; t < ext.tokens; ++t)
      for (std::size_t l = 0; l < 2; ++l) {
        const std::int64_t pos = ext.offset + t;
        std::byte* p = pool.resolve(ext.pages[static_cast<std::size_t>(pos / 4) * 2 + l]).value();
        std::memset(p + (pos % 4) * 128, static_cast<int>(16 * l + t), 128);
      }
  };
  auto verify = [&](const auto& ext, std::int64_t first_token) {
    bool ok = true;
    for (std::int64_t t = 0; t < ext.tokens; ++t)
      for (std::size_t l = 0; l < 2; ++l) {
        const std::int64_t pos = ext.offset + t;
        const std::byte* p = pool.resolve(ext.pages[static_cast<std::size_t>(pos / 4) * 2 + l]).value();
        ok &= p[(pos % 4) * 128] == static_cast<std::byte>(16 * l + first_token + t) &&
              p[(pos % 4) * 128 + 127] == static_cast<std::byte>(16 * l + first_token + t);
      }
    return ok;
  };
  stamp(e);
  // Split at a block boundary: no new page.
  auto head = store.split_kv(e, 4).value();
  CHECK(head.tokens == 4);
  CHECK(head.pages.size() == 2);
  CHECK(e.tokens == 6);
  CHECK(e.offset == 0);
  CHECK(store.used_bytes() == 6 * 512);
  CHECK(verify(head, 0));
  CHECK(verify(e, 4));
  // Split inside a block: the tail gets a copy of the shared block.
  auto mid = store.split_kv(e, 3).value();  // tokens 4..6 | 7..9
  CHECK(mid.tokens == 3);
  CHECK(e.offset == 3);
  CHECK(store.used_bytes() == 8 * 512);
  CHECK(verify(mid, 4));
  CHECK(verify(e, 7));
  // Join undoes it (the copied block's pages are freed), then the block-aligned join.
  REQUIRE(store.join_kv(mid, std::move(e)).has_value());
  CHECK(mid.tokens == 6);
  CHECK(store.used_bytes() == 6 * 512);
  CHECK(verify(mid, 4));
  REQUIRE(store.join_kv(head, std::move(mid)).has_value());
  CHECK(head.tokens == 10);
  CHECK(verify(head, 0));
  // Misaligned join is refused, both unchanged.
  auto a = store.allocate_kv(3).value();
  auto b = store.allocate_kv(2).value();
  CHECK(store.join_kv(a, std::move(b)).error() == errc::busy);
  CHECK(a.tokens == 3);
  CHECK(b.tokens == 2);
  CHECK(store.split_kv(a, 0).error() == errc::invalid_argument);
  CHECK(store.split_kv(a, 3).error() == errc::invalid_argument);
  CHECK(store.allocate_kv(0).error() == errc::invalid_argument);
  auto ck = store.allocate_checkpoint().value();
  CHECK(ck.blocks.size() == 3);
  CHECK(store.checkpoint_bytes() == 3 * 1024);
  store.free_checkpoint(std::move(ck));
  store.free_kv(std::move(a));
  store.free_kv(std::move(b));
  store.free_kv(std::move(head));
  CHECK(pool.live_handles() == 0);
  CHECK(store.used_bytes() == 0);
  // Out of capacity: nothing allocated, nothing leaked.
  CHECK(store.allocate_kv(1000).error() == errc::out_of_capacity);
  CHECK(pool.live_handles() == 0);
  CHECK_THROWS_AS((pool_state_store<host_asymmetric_pool<no_rebalancer>>(pool, 0, 2, 3)), invalid_argument);
}

TEST_CASE("fixture trace through prefix_cache<..., pool_state_store<asymmetric_pool>>") {
  const cost_model m(presets::jamba_1_5_mini());
  using pool_t = simulated_vmm_pool<threshold_rebalancer>;
  using store_t = pool_state_store<pool_t>;
  static_assert(state_store<store_t>);

  // Ample budget: nothing is evicted, so hits must equal the byte-counting store's.
  pool_t big(pool_for(m, 16 * GiB));
  prefix::prefix_cache<cost_model, prefix::judicious_admission, prefix::lru_scorer, store_t> pooled(
      m, store_t(big, 16, m.attention_layers(), m.recurrent_layers()), prefix::lru_scorer{});
  prefix::prefix_cache<cost_model, prefix::judicious_admission, prefix::lru_scorer, counting_store> counted(
      m, stores::counting_store(16 * static_cast<std::int64_t>(GiB), m.kv_bytes_per_token(), m.ssm_checkpoint_bytes()),
      prefix::lru_scorer{});
  const auto got = replay(pooled);
  const auto want = replay(counted);
  CHECK(got == want);
  std::int64_t hits = 0;
  for (auto s : got) hits += s;
  CHECK(hits > 0);
  CHECK(pooled.checkpoints_cached() == counted.checkpoints_cached());
  CHECK(pooled.tokens_cached() == counted.tokens_cached());
  // Every cached checkpoint is 28 live checkpoint blocks (SSM + conv state of one layer);
  // KV pages cover every cached token.
  CHECK(big.stats(pool_kind::ssm).used_units == static_cast<std::uint64_t>(pooled.checkpoints_cached() * 28));
  CHECK(big.stats(pool_kind::kv).used_units * 16 >= static_cast<std::uint64_t>(pooled.tokens_cached() * 4));

  // Tight budget: evictions and rebalancing happen, the store never exceeds its capacity.
  pool_t small(pool_for(m, GiB / 2),
               threshold_rebalancer({.threshold_low = 0.01, .threshold_high = 0.05, .migration_batch_size = 128,
                                     .min_rebalance_interval_ops = 0, .size_to_demand = true}));
  prefix::prefix_cache<cost_model, prefix::judicious_admission, prefix::lru_scorer, store_t> tight(
      m, store_t(small, 16, m.attention_layers(), m.recurrent_layers()), prefix::lru_scorer{});
  const auto tight_hits = replay(tight);
  CHECK(tight_hits.size() == trace().size());
  CHECK(tight.counters().evictions > 0);
  CHECK(tight.store().used_bytes() <= tight.store().capacity_bytes());
  CHECK(small.stats(pool_kind::ssm).used_units == static_cast<std::uint64_t>(tight.checkpoints_cached() * 28));
  MESSAGE("tight budget: rebalances " << small.counters().rebalances << ", KV/SSM chunks "
                                      << small.stats(pool_kind::kv).mapped_chunks << "/"
                                      << small.stats(pool_kind::ssm).mapped_chunks);
}

TEST_CASE("one checkpoint size: SSM + conv state, the same in the cost model, the pool store and the tiered store") {
  // Issue #13, break 7: the pool's checkpoints were the recurrent state alone (jamba:
  // 28 x 262,144 = 7,340,032 B) while the cost model counts the conv state too
  // (9,175,040 B). A pool for prefix-cache checkpoints uses checkpoint_block_bytes.
  for (const auto& spec : {presets::marconi_7b(), presets::jamba_1_5_mini(), presets::mamba2_1b3(),
                           presets::qwen3_next_80b_a3b(), presets::mamba2_1b3_pure()}) {
    const cost_model m(spec);
    if (m.recurrent_layers() == 0) continue;
    INFO(spec.name);
    CHECK(m.ssm_checkpoint_bytes() ==
          m.recurrent_layers() * (m.recurrent_state_bytes_per_layer() + m.conv_state_bytes_per_layer()));
    CHECK(checkpoint_block_bytes(m) == static_cast<std::uint64_t>(m.ssm_checkpoint_bytes_per_layer()));
    if (m.attention_layers() == 0) continue;  // the pool store pages KV per attention layer
    host_asymmetric_pool<no_rebalancer> pool({.capacity_bytes = std::uint64_t{1} << 30,
                                              .kv_page_bytes = kv_page_bytes(m),
                                              .ssm_block_bytes = checkpoint_block_bytes(m),
                                              .granularity_bytes = std::uint64_t{32} << 20});
    const pool_state_store<host_asymmetric_pool<no_rebalancer>> store(pool, 16, m.attention_layers(),
                                                                      m.recurrent_layers());
    CHECK(store.checkpoint_bytes() == m.ssm_checkpoint_bytes());
    const stores::tiered_state_store_config tc{.capacity_bytes = std::int64_t{1} << 30,
                                               .host_capacity_bytes = std::int64_t{1} << 30,
                                               .kv_bytes_per_token = m.kv_bytes_per_token(),
                                               .checkpoint_bytes = m.ssm_checkpoint_bytes()};
    const stores::tiered_state_store<> tiered_store(tc);
    CHECK(tiered_store.checkpoint_bytes() == m.ssm_checkpoint_bytes());
  }
  CHECK(cost_model(presets::jamba_1_5_mini()).ssm_checkpoint_bytes() == 9'175'040);
}
