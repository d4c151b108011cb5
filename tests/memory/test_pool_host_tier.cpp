// The pool store's host tier storage (stores/detail/pool_host_tier.hpp) against a naive
// model: a list of entries in least-recently-used order. Random demotions (fresh keys and
// keys already present), pins, touches and lookups must agree with the model after every
// step: which keys are found, the free page and block counts, and what each entry holds.
// The index is open addressing with backward-shift deletion, so this also checks that no
// entry becomes unreachable after the many deletions eviction makes.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <list>
#include <random>
#include <vector>

#include "hybridcache/stores/detail/pool_host_tier.hpp"

using namespace hybridcache;
using namespace hybridcache::stores;

namespace {

struct model_entry {
  std::uint64_t key = 0;
  std::size_t pages = 0, blocks = 0;
  std::uint32_t pins = 0;
  std::uint32_t id = 0;
  std::uint8_t fill = 0;  // the byte its slots were filled with
};

}  // namespace

TEST_CASE("pool host tier: index, LRU eviction and pins agree with a list model on random demotions") {
  for (std::uint32_t seed : {1u, 2u, 3u}) {
    constexpr std::int64_t kPages = 40, kBlocks = 12;
    constexpr std::size_t kPage = 64, kBlock = 32;
    stores::detail::pool_host_tier tier({.kv_pages = kPages, .checkpoint_blocks = kBlocks}, kPage, kBlock);
    std::list<model_entry> lru;  // front = least recently used
    std::mt19937 rng(seed);
    std::int64_t free_pages = kPages, free_blocks = kBlocks;
    auto drop = [&](std::list<model_entry>::iterator it) {
      free_pages += static_cast<std::int64_t>(it->pages);
      free_blocks += static_cast<std::int64_t>(it->blocks);
      lru.erase(it);
    };
    for (int step = 0; step < 4000; ++step) {
      const std::uint64_t key = rng() % 97;  // few keys: many replacements of a key present
      const int op = static_cast<int>(rng() % 10);
      auto in_model = std::find_if(lru.begin(), lru.end(), [&](const model_entry& e) { return e.key == key; });
      if (op < 6) {  // demote
        const std::size_t pages = 1 + rng() % 6, blocks = rng() % 3 == 0 ? 0 : 1 + rng() % 3;
        const std::vector<std::int32_t> tokens(1 + rng() % 5, static_cast<std::int32_t>(key));
        // The model: a pinned entry with the same key refuses; else it goes, then the least
        // recently used unpinned entries go until the new one fits.
        bool fits = true;
        if (in_model != lru.end() && in_model->pins > 0) fits = false;
        std::int64_t fp = free_pages, fb = free_blocks;
        if (fits && in_model != lru.end()) {
          fp += static_cast<std::int64_t>(in_model->pages);
          fb += static_cast<std::int64_t>(in_model->blocks);
        }
        std::vector<std::uint64_t> victims;
        for (auto it = lru.begin(); fits && (fp < static_cast<std::int64_t>(pages) || fb < static_cast<std::int64_t>(blocks));
             ++it) {
          if (it == lru.end()) {
            fits = false;
            break;
          }
          if (it->pins > 0 || it == in_model) continue;
          fp += static_cast<std::int64_t>(it->pages);
          fb += static_cast<std::int64_t>(it->blocks);
          victims.push_back(it->key);
        }
        const std::uint32_t id = tier.make_entry(key, 0, 0, tokens, pages, blocks);
        REQUIRE((id != stores::detail::pool_host_tier::none) == fits);
        if (!fits) continue;
        if (in_model != lru.end()) drop(in_model);
        for (std::uint64_t v : victims)
          drop(std::find_if(lru.begin(), lru.end(), [&](const model_entry& e) { return e.key == v; }));
        const auto fill = static_cast<std::uint8_t>(rng());
        for (auto p : tier.at(id).pages) std::memset(tier.page(p), fill, kPage);
        for (auto b : tier.at(id).blocks) std::memset(tier.block(b), fill, kBlock);
        tier.publish(id);
        lru.push_back({key, pages, blocks, 0, id, fill});
        free_pages -= static_cast<std::int64_t>(pages);
        free_blocks -= static_cast<std::int64_t>(blocks);
      } else if (op < 8 && in_model != lru.end()) {  // pin or unpin
        if (in_model->pins > 0 && rng() % 2 == 0) {
          tier.unpin(in_model->id);
          --in_model->pins;
        } else if (in_model->pins < 2) {
          tier.pin(in_model->id);
          ++in_model->pins;
        }
      } else if (in_model != lru.end()) {  // touch: most recently used
        tier.touch(in_model->id);
        lru.splice(lru.end(), lru, in_model);
      }
      // After every step: the same keys are found, holding their bytes, and the same room.
      REQUIRE(tier.free_pages() == free_pages);
      REQUIRE(tier.free_blocks() == free_blocks);
      REQUIRE(tier.live_entries() == static_cast<std::int64_t>(lru.size()));
      for (std::uint64_t k = 0; k < 97; ++k) {
        const auto it = std::find_if(lru.begin(), lru.end(), [&](const model_entry& e) { return e.key == k; });
        const std::uint32_t id = tier.find(k);
        REQUIRE((id != stores::detail::pool_host_tier::none) == (it != lru.end()));
        if (it == lru.end()) continue;
        REQUIRE(id == it->id);
        REQUIRE(tier.at(id).pages.size() == it->pages);
        REQUIRE(tier.at(id).blocks.size() == it->blocks);
        for (auto p : tier.at(id).pages) REQUIRE(static_cast<std::uint8_t>(*tier.page(p)) == it->fill);
        for (auto b : tier.at(id).blocks) REQUIRE(static_cast<std::uint8_t>(*tier.block(b)) == it->fill);
      }
    }
    CHECK(tier.counters().host_evictions > 100);
  }
}

TEST_CASE("pool host tier: an entry larger than the tier is dropped, and a tier of size 0 keeps nothing") {
  stores::detail::pool_host_tier tier({.kv_pages = 4, .checkpoint_blocks = 2}, 64, 32);
  const std::vector<std::int32_t> tokens{1, 2, 3};
  CHECK(tier.make_entry(7, 0, 0, tokens, 5, 0) == stores::detail::pool_host_tier::none);
  CHECK(tier.make_entry(7, 0, 0, tokens, 1, 3) == stores::detail::pool_host_tier::none);
  CHECK(tier.counters().demotions_dropped == 2);
  stores::detail::pool_host_tier off({}, 64, 32);
  CHECK_FALSE(off.enabled());
  CHECK(off.make_entry(7, 0, 0, tokens, 1, 0) == stores::detail::pool_host_tier::none);
  CHECK(off.find(7) == stores::detail::pool_host_tier::none);
}
