// Issue #13, "what to build" 5: the pool store's host tier in the request lifecycle. The
// cache's evicted leaves are demoted to host memory; a later begin whose prompt continues
// into them loads their KV into the request's reserved pages and their checkpoint into a
// reserved slot. A runtime that writes a signature into every token's KV slot (position,
// token, layer) and every captured state (the content of the prefix it follows) must read
// back, through the block table and resume_checkpoint, exactly the bytes an earlier request
// wrote, whether they stayed in the pool or came back from the host tier.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include "hybridcache/core/hash.hpp"
#include "hybridcache/memory/asymmetric_pool.hpp"
#include "hybridcache/memory/units.hpp"
#include "hybridcache/prefix/lifecycle.hpp"
#include "hybridcache/prefix/lru_scorer.hpp"
#include "hybridcache/prefix/prefix_cache.hpp"
#include "hybridcache/stores/pool_state_store.hpp"
#include "hybridcache/tiered/disk_backend.hpp"
#include "../support/random_tokens.hpp"
#include "../support/temp_dir.hpp"
#include "../support/tiny_hybrid_model.hpp"

using namespace hybridcache;
using namespace hybridcache::prefix;
using namespace hybridcache::memory;
using namespace hybridcache::stores;

namespace {

using hybridcache::test::random_tokens;

std::uint64_t kv_sig(std::int64_t pos, token_id t, std::int64_t layer) {
  return splitmix64_mix((static_cast<std::uint64_t>(pos) << 32) ^ static_cast<std::uint32_t>(t) ^
                        (static_cast<std::uint64_t>(layer) << 56));
}
/// The state after `prefix`, in recurrent layer `layer`: a hash of its content.
std::uint64_t state_sig(std::span<const token_id> prefix, std::int64_t layer) {
  std::uint64_t h = 0x243f6a8885a308d3ull ^ static_cast<std::uint64_t>(layer);
  for (token_id t : prefix) h = splitmix64_mix(h ^ static_cast<std::uint32_t>(t));
  return h;
}

}  // namespace

/// The three runs of the byte-for-byte case: one tenant; two tenants; one tenant with a
/// small host tier over a disk tier (what the host tier evicts moves down, and lookups bring
/// it back up through the copy engine).
struct one_tenant {
  static constexpr bool value = false, disk = false;
};
struct two_tenants {
  static constexpr bool value = true, disk = false;
};
struct host_over_disk {
  static constexpr bool value = false, disk = true;
};

TEST_CASE_TEMPLATE("host tier: evicted leaves come back into the reservation byte for byte, through block tables and the resumed state",
                   Salted, one_tenant, two_tenants, host_over_disk) {
  const cost_model m(test::tiny_gdn_spec("host_tier_test"));
  using pool_t = host_asymmetric_pool<threshold_rebalancer>;
  using store_t = pool_state_store<pool_t>;
  using cache_type = prefix_cache<cost_model, judicious_admission, lru_scorer, store_t>;
  constexpr std::int64_t tpp = 16;
  pool_t pool({.capacity_bytes = std::uint64_t{1} << 20, .kv_page_bytes = kv_page_bytes(m, tpp),
               .ssm_block_bytes = checkpoint_block_bytes(m), .granularity_bytes = 32 << 10},
              threshold_rebalancer({.threshold_low = 0.02, .threshold_high = 0.10, .migration_batch_size = 8,
                                    .min_rebalance_interval_ops = 0, .size_to_demand = true}));
  const std::int64_t layers = m.attention_layers(), rec = m.recurrent_layers();
  const std::uint64_t slot_bytes = kv_page_bytes(m, tpp) / tpp;
  std::int64_t finished = 0, host_loads = 0, loaded_tokens_read = 0, resumed = 0, cross_salt = 0;
  test::temp_dir dir("hc_host_disk");
  tiered::disk_backend<> disk({.directory = dir.path().string(), .capacity_bytes = std::int64_t{64} << 20, .io_threads = 2});
  {
    host_tier_config host{.kv_pages = 256, .checkpoint_blocks = 64};
    if (Salted::disk) {  // a host tier a quarter the size, over a disk tier that holds the rest
      host = {.kv_pages = 64,
              .checkpoint_blocks = 16,
              .storage_tiers = {{.kind = tiered::tier_kind::disk, .capacity_bytes = std::int64_t{4} << 20, .location = dir.path().string()}},
              .storage_io = {tiered::storage_io_of(disk)}};
    }
    cache_type c(m, store_t(pool, tpp, layers, rec, std::move(host)), lru_scorer{});
    request_lifecycle<cache_type> requests(c);
    std::mt19937 rng(Salted::value ? 17 : 11);
    std::vector<std::vector<token_id>> done;
    std::vector<cache_salt> done_salt;
    std::vector<packed_handle> table;
    for (int step = 0; step < 300; ++step) {
      std::vector<token_id> prompt;
      cache_salt salt = std::nullopt;
      if (Salted::value) salt = static_cast<std::uint64_t>(rng() % 2);
      if (!done.empty() && rng() % 4 != 0) {
        const std::size_t k = rng() % std::min<std::size_t>(done.size(), 12);
        const auto& base = done[done.size() - 1 - k];  // mostly recent conversations, some old
        // A tenant sometimes sends another tenant's conversation: it must never hit its entries.
        if (Salted::value && rng() % 3 == 0) salt = done_salt[done.size() - 1 - k];
        prompt.assign(base.begin(), base.begin() + static_cast<std::ptrdiff_t>(1 + rng() % base.size()));
      }
      // Two draws in one call are unsequenced (g++ draws the right-hand argument first, clang++
      // the left): drawn in g++'s order, so both compilers replay the same requests.
      const auto suffix_seed = static_cast<std::uint32_t>(rng());
      const auto suffix = random_tokens(10 + rng() % 60, suffix_seed);
      prompt.insert(prompt.end(), suffix.begin(), suffix.end());
      auto t = requests.begin(prompt, {.output_tokens = 8, .salt = salt});
      if (!t) {
        REQUIRE(t.error() == errc::out_of_capacity);
        continue;
      }
      const auto* s = *requests.state(*t);
      const std::int64_t from = s->plan.prefill_start;
      if (s->loaded_at > 0) {
        ++host_loads;
        CHECK(from == s->loaded_at);
        CHECK(s->kv_from <= s->loaded_at);
      }
      auto seq = prompt;
      const auto out_seed = static_cast<std::uint32_t>(rng());
      const auto out = random_tokens(1 + rng() % 8, out_seed);
      seq.insert(seq.end(), out.begin(), out.end());
      const auto len = static_cast<std::int64_t>(seq.size());
      // Every token before prefill_start reads back its signature through the block table:
      // the pool's own pages before kv_from, the host tier's copies from there to loaded_at.
      for (std::int64_t l = 0; l < layers; ++l) {
        REQUIRE(requests.block_table(*t, l, table));
        REQUIRE(static_cast<std::int64_t>(table.size()) * tpp >= len);
        auto at = [&](std::int64_t p) {
          return *pool.resolve(table[static_cast<std::size_t>(p / tpp)]) + static_cast<std::uint64_t>(p % tpp) * slot_bytes;
        };
        for (std::int64_t p = 0; p < from; ++p) {
          std::uint64_t v = 0;
          std::memcpy(&v, at(p), sizeof v);
          REQUIRE_MESSAGE(v == kv_sig(p, seq[static_cast<std::size_t>(p)], l),
                          "step " << step << " position " << p << " layer " << l << " (kv_from " << s->kv_from
                                  << ", loaded_at " << s->loaded_at << ")");
          if (p >= s->kv_from) ++loaded_tokens_read;
        }
        for (std::int64_t p = std::max(from, s->kv_from); p < len; ++p) {  // the runtime writes its tokens
          const std::uint64_t v = kv_sig(p, seq[static_cast<std::size_t>(p)], l);
          std::memcpy(at(p), &v, sizeof v);
        }
      }
      // The state prefill resumes from is the state after prompt[0, from).
      if (from > 0) {
        const auto* resume = *requests.resume_checkpoint(*t);
        REQUIRE(resume != nullptr);
        for (std::int64_t r = 0; r < rec; ++r) {
          std::uint64_t v = 0;
          std::memcpy(&v, *pool.resolve(resume->blocks[static_cast<std::size_t>(r)]), sizeof v);
          REQUIRE(v == state_sig(std::span<const token_id>(seq).first(static_cast<std::size_t>(from)), r));
        }
        ++resumed;
      }
      // Capture every planned site and the end, as prefill and decode would.
      std::vector<std::int64_t> captured;
      for (std::size_t i = 0; i <= s->plan.sites.size(); ++i) {
        const auto& slot = s->checkpoints[i];
        const std::int64_t p = i < s->plan.sites.size() ? slot.position : len;
        for (std::int64_t r = 0; r < rec; ++r) {
          const std::uint64_t v = state_sig(std::span<const token_id>(seq).first(static_cast<std::size_t>(p)), r);
          std::memcpy(*pool.resolve(slot.handle.blocks[static_cast<std::size_t>(r)]), &v, sizeof v);
        }
        captured.push_back(p);
      }
      std::sort(captured.begin(), captured.end());
      captured.erase(std::unique(captured.begin(), captured.end()), captured.end());
      const auto f = requests.finish(*t, seq, captured);
      REQUIRE_MESSAGE(f, "finish: " << hybridcache::to_string(f.error()) << " at step " << step);
      ++finished;
      done.push_back(seq);
      done_salt.push_back(salt);
      // Every cached node holds its own tokens' signatures and, if it has one, its state.
      for (std::size_t d = 0; d < done.size(); ++d) {
        const auto& sq = done[d];
        std::vector<node_id> path;
        (void)c.tree().walk(sq, path, c.tree().namespace_of(done_salt[d]));
        for (node_id n : path) {
          const auto& nd = c.tree().at(n);
          for (std::int64_t i = 0; i < nd.edge(); ++i) {
            const std::int64_t p = nd.begin() + i, at = nd.kv.offset + i;
            for (std::int64_t l = 0; l < layers; ++l) {
              std::uint64_t v = 0;
              const auto h = nd.kv.pages[static_cast<std::size_t>((at / tpp) * layers + l)];
              std::memcpy(&v, *pool.resolve(h) + static_cast<std::uint64_t>(at % tpp) * slot_bytes, sizeof v);
              REQUIRE(v == kv_sig(p, sq[static_cast<std::size_t>(p)], l));
            }
          }
          if (nd.has_checkpoint)
            for (std::int64_t r = 0; r < rec; ++r) {
              std::uint64_t v = 0;
              std::memcpy(&v, *pool.resolve(nd.checkpoint.blocks[static_cast<std::size_t>(r)]), sizeof v);
              REQUIRE(v == state_sig(std::span<const token_id>(sq).first(static_cast<std::size_t>(nd.end)), r));
            }
        }
      }
      // Across tenants: a request never reuses more than its own tenant has committed.
      if (Salted::value) {
        std::int64_t own = 0;
        for (std::size_t d = 0; d + 1 < done.size(); ++d) {
          if (done_salt[d] != salt) continue;
          const auto& sq = done[d];
          std::int64_t k = 0;
          while (k < static_cast<std::int64_t>(std::min(sq.size(), prompt.size())) &&
                 sq[static_cast<std::size_t>(k)] == prompt[static_cast<std::size_t>(k)])
            ++k;
          own = std::max(own, k);
        }
        cross_salt += from > own ? 1 : 0;
      }
    }
    const auto& hc = c.store().host_counters();
    CHECK(c.counters().evictions > 50);
    CHECK(hc.demotions > 50);
    CHECK(hc.loads == host_loads);
    CHECK(host_loads > 10);
    CHECK(loaded_tokens_read > 100);
    CHECK(cross_salt == 0);
    if (Salted::disk) {  // the disk tier was used both ways, and nothing it held came back damaged
      CHECK(hc.moved_down > 20);
      CHECK(hc.brought_up > 2);
      CHECK(hc.corrupt_dropped == 0);
    } else {
      CHECK(hc.moved_down == 0);
    }
    MESSAGE(finished << " requests, " << c.counters().evictions << " evictions, " << hc.demotions << " demotions ("
                     << hc.demotions_dropped << " dropped, " << hc.host_evictions << " host evictions, " << hc.moved_down
                     << " moved to disk, " << hc.brought_up << " brought up), " << host_loads << " host loads, "
                     << hc.tokens_loaded << " tokens loaded, " << resumed << " resumed states checked");
  }
  CHECK(pool.live_handles() == 0);
}

TEST_CASE("host tier: a stored byte flipped is detected and the tokens recomputed, never loaded") {
  const cost_model m(test::tiny_gdn_spec("host_tier_test"));
  using pool_t = host_asymmetric_pool<threshold_rebalancer>;
  using store_t = stores::pool_state_store<pool_t>;
  using cache_type = prefix_cache<cost_model, judicious_admission, lru_scorer, store_t>;
  constexpr std::int64_t tpp = 16;
  pool_t pool({.capacity_bytes = std::uint64_t{256} << 10, .kv_page_bytes = kv_page_bytes(m, tpp),
               .ssm_block_bytes = checkpoint_block_bytes(m), .granularity_bytes = 32 << 10},
              threshold_rebalancer({.threshold_low = 0.02, .threshold_high = 0.10, .migration_batch_size = 8,
                                    .min_rebalance_interval_ops = 0, .size_to_demand = true}));
  for (const bool flip : {false, true}) {
    CAPTURE(flip);
    cache_type c(m, store_t(pool, m, {.tokens_per_page = tpp, .host_tier = {.kv_pages = 64, .checkpoint_blocks = 16}}), lru_scorer{});
    request_lifecycle<cache_type> requests(c);
    // One conversation, then enough others to push it out of the pool into the host tier.
    const auto a = random_tokens(70, 1);
    auto commit = [&](const std::vector<token_id>& prompt) {
      auto t = requests.begin(prompt, {.output_tokens = 2});
      REQUIRE_MESSAGE(t, t.message());
      auto seq = prompt;
      seq.push_back(9);
      const std::vector<std::int64_t> end{static_cast<std::int64_t>(seq.size())};
      REQUIRE(requests.finish(*t, seq, end));
      return seq;
    };
    const auto a_seq = commit(a);
    for (std::uint32_t i = 0; i < 40 && c.peek(a_seq).reusable_tokens > 0; ++i) (void)commit(random_tokens(90, 100 + i));
    REQUIRE(c.peek(a_seq).reusable_tokens == 0);  // no longer in the pool: demoted (LRU: it went first)
    REQUIRE(c.store().host_counters().demotions > 0);
    if (flip) {
      // Flip one byte of every page and block the host tier holds: whatever entry the next
      // lookup finds has changed at rest.
      auto mem = c.store().host_memory();
      const std::size_t unit = std::gcd(pool.stats(pool_kind::kv).unit_bytes, pool.stats(pool_kind::ssm).unit_bytes);
      for (std::size_t at = 5; at < mem.size(); at += unit) mem[at] ^= std::byte{0x40};
    }
    auto prompt = a_seq;
    prompt.push_back(11);
    prompt.push_back(12);
    auto t = requests.begin(prompt, {.output_tokens = 2});
    REQUIRE(t);
    const auto* s = *requests.state(*t);
    if (!flip) {
      CHECK(s->loaded_at == static_cast<std::int64_t>(a_seq.size()));  // the host hit is loaded
      CHECK(c.store().host_counters().corrupt_dropped == 0);
    } else {
      CHECK(s->loaded_at == 0);                 // never loaded
      CHECK(s->plan.prefill_start == 0);        // recomputed from the start
      CHECK(c.store().host_counters().loads == 0);
      CHECK(c.store().host_counters().corrupt_dropped > 0);
    }
    REQUIRE(requests.abort(*t));
  }
  CHECK(pool.live_handles() == 0);
}

TEST_CASE("host tier: accept shortens a hit to an earlier checkpoint of its chain, and exactly that prefix is loaded") {
  const cost_model m(test::tiny_gdn_spec("host_tier_test"));
  using pool_t = host_asymmetric_pool<no_rebalancer>;
  using store_t = stores::pool_state_store<pool_t>;
  using cache_type = prefix_cache<cost_model, judicious_admission, lru_scorer, store_t>;
  constexpr std::int64_t tpp = 16;
  pool_t pool({.capacity_bytes = std::uint64_t{256} << 10, .kv_page_bytes = kv_page_bytes(m, tpp),
               .ssm_block_bytes = checkpoint_block_bytes(m), .granularity_bytes = 32 << 10});
  const std::int64_t layers = m.attention_layers(), rec = m.recurrent_layers();
  const std::uint64_t slot_bytes = kv_page_bytes(m, tpp) / tpp;
  // accept's answer -> where prefill must start: 40 (an entry boundary with a checkpoint:
  // shortened), 30 (inside an entry: declined, nothing loaded), true (the whole hit).
  struct answer {
    std::int64_t position;  // 0: accept everything
    std::int64_t start;
  };
  for (const answer want : {answer{40, 40}, answer{30, 0}, answer{0, 91}}) {
    CAPTURE(want.position);
    cache_type c(m, store_t(pool, m, {.tokens_per_page = tpp, .host_tier = {.kv_pages = 128, .checkpoint_blocks = 32}}),
                 lru_scorer{});
    request_lifecycle<cache_type> requests(c);
    std::vector<packed_handle> table;
    // Runs one request: writes every token's KV signature and the state at each captured
    // position (as prefill would), returns the sequence.
    auto run = [&](const std::vector<token_id>& prompt, std::vector<std::int64_t> extra) {
      auto t = requests.begin(prompt, {.output_tokens = 1, .extra_checkpoints = extra});
      REQUIRE_MESSAGE(t, t.message());
      const auto* s = *requests.state(*t);
      auto seq = prompt;
      seq.push_back(9);
      const auto len = static_cast<std::int64_t>(seq.size());
      for (std::int64_t l = 0; l < layers; ++l) {
        REQUIRE(requests.block_table(*t, l, table));
        for (std::int64_t p = s->kv_from; p < len; ++p) {
          const std::uint64_t v = kv_sig(p, seq[static_cast<std::size_t>(p)], l);
          std::memcpy(*pool.resolve(table[static_cast<std::size_t>(p / tpp)]) + static_cast<std::uint64_t>(p % tpp) * slot_bytes,
                      &v, sizeof v);
        }
      }
      std::vector<std::int64_t> captured;
      for (std::size_t i = 0; i <= s->plan.sites.size(); ++i) {
        const std::int64_t p = i < s->plan.sites.size() ? s->checkpoints[i].position : len;
        for (std::int64_t r = 0; r < rec; ++r) {
          const std::uint64_t v = state_sig(std::span<const token_id>(seq).first(static_cast<std::size_t>(p)), r);
          std::memcpy(*pool.resolve(s->checkpoints[i].handle.blocks[static_cast<std::size_t>(r)]), &v, sizeof v);
        }
        captured.push_back(p);
      }
      std::sort(captured.begin(), captured.end());
      REQUIRE(requests.finish(*t, seq, captured));
      return seq;
    };
    // A conversation with a state at 40 and at its end (91): two nodes, two host entries
    // once other conversations push it out of the pool.
    const auto a_seq = run(random_tokens(90, 1), {40});
    for (std::uint32_t i = 0; i < 60 && (c.peek(a_seq).reusable_tokens > 0 || c.tree().size() > 0); ++i) {
      if (c.peek(a_seq).common_prefix == 0) break;
      (void)run(random_tokens(90, 100 + i), {});
    }
    REQUIRE(c.peek(a_seq).common_prefix == 0);  // none of it left in the pool
    auto prompt = a_seq;
    prompt.push_back(11);
    prompt.push_back(12);
    std::int64_t offered = 0;
    auto accept = [&](const auto& hit) -> std::int64_t {
      offered = hit.reusable_tokens;
      return want.position == 0 ? hit.reusable_tokens : want.position;
    };
    auto t = requests.begin(prompt, {.output_tokens = 1}, accept);
    REQUIRE(t);
    CHECK(offered == 91);  // the whole chain was found
    const auto* s = *requests.state(*t);
    CHECK(s->plan.prefill_start == want.start);
    CHECK(s->loaded_at == want.start);
    // What was loaded reads back: every token before prefill_start, and the resumed state.
    for (std::int64_t l = 0; l < layers; ++l) {
      REQUIRE(requests.block_table(*t, l, table));
      for (std::int64_t p = 0; p < want.start; ++p) {
        std::uint64_t v = 0;
        std::memcpy(&v, *pool.resolve(table[static_cast<std::size_t>(p / tpp)]) + static_cast<std::uint64_t>(p % tpp) * slot_bytes,
                    sizeof v);
        REQUIRE(v == kv_sig(p, prompt[static_cast<std::size_t>(p)], l));
      }
    }
    if (want.start > 0) {
      const auto* resume = *requests.resume_checkpoint(*t);
      REQUIRE(resume != nullptr);
      for (std::int64_t r = 0; r < rec; ++r) {
        std::uint64_t v = 0;
        std::memcpy(&v, *pool.resolve(resume->blocks[static_cast<std::size_t>(r)]), sizeof v);
        CHECK(v == state_sig(std::span<const token_id>(prompt).first(static_cast<std::size_t>(want.start)), r));
      }
    }
    CHECK(c.store().host_counters().loads == (want.start > 0 ? 1 : 0));
    CHECK(c.store().host_counters().tokens_loaded == want.start);
    REQUIRE(requests.abort(*t));
    CHECK(c.store().outstanding_hits() == 0);
  }
  CHECK(pool.live_handles() == 0);
}
