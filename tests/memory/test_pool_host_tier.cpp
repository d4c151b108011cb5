// The pool store's lower tiers (stores/detail/pool_host_tier.hpp: a host tier and storage
// tiers below it, kept in one tiered::tiered_store over a host_copy_engine) against a naive
// model: a list of entries, each with its tier and the logical time of its last use. Random
// demotions (fresh keys and keys already present), pins, touches and bring-ups must agree
// with the model after every step: which keys are found and where, the host room in pages
// and blocks, the storage tier's bytes, the counters, and the bytes each entry holds (also
// after a round trip through the storage tier). Then the failure paths: bytes a storage
// tier gives back altered, entries too large, bad configurations.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "hybridcache/stores/detail/pool_host_tier.hpp"
#include "../support/memory_storage_backend.hpp"

using namespace hybridcache;
using namespace hybridcache::stores;
using tier_t = stores::detail::pool_host_tier;

namespace {

constexpr std::int64_t kPage = 64, kBlock = 32, kUnit = 32;  // gcd(64, 32)
const tier_id host{1}, disk{2};

struct model_entry {
  std::uint64_t key = 0;
  int tier = 1;  // 1 host, 2 storage
  std::int64_t pages = 0, blocks = 0;
  std::uint32_t pins = 0;
  std::uint64_t last = 0;  // logical time of the last use
  std::uint8_t fill = 0;   // the byte its bytes were filled with
  [[nodiscard]] std::int64_t units() const { return (pages * kPage + blocks * kBlock) / kUnit; }
};

/// The naive model: entries in a vector; victims by the smallest `last` (scans).
struct model {
  std::int64_t kv_slots = 0, ssm_slots = 0, disk_units = 0;  // disk_units 0: no storage tier
  std::vector<model_entry> es;
  std::uint64_t clock = 0;
  host_tier_counters c;

  model_entry* find(std::uint64_t key) {
    for (auto& e : es)
      if (e.key == key) return &e;
    return nullptr;
  }
  std::int64_t used(int tier, bool blocks) const {
    std::int64_t n = 0;
    for (const auto& e : es)
      if (e.tier == tier) n += blocks ? e.blocks : e.pages;
    return n;
  }
  std::int64_t pinned(bool blocks) const {
    std::int64_t n = 0;
    for (const auto& e : es)
      if (e.pins > 0) n += blocks ? e.blocks : e.pages;
    return n;
  }
  std::int64_t disk_used() const {
    std::int64_t n = 0;
    for (const auto& e : es)
      if (e.tier == 2) n += e.units();
    return n;
  }
  model_entry* victim(int tier, std::uint64_t except) {
    model_entry* v = nullptr;
    for (auto& e : es)
      if (e.tier == tier && e.pins == 0 && e.key != except && (v == nullptr || e.last < v->last)) v = &e;
    return v;
  }
  void erase(std::uint64_t key) {
    es.erase(std::find_if(es.begin(), es.end(), [&](const model_entry& e) { return e.key == key; }));
  }
  /// Host victims go down (disk victims dropped for room) or are dropped. `except`: a disk
  /// entry being brought up (pinned where it is).
  void make_host_room(std::int64_t p, std::int64_t b, std::uint64_t except) {
    while (used(1, false) + p > kv_slots || used(1, true) + b > ssm_slots) {
      model_entry* v = victim(1, except);
      REQUIRE(v != nullptr);
      ++c.host_evictions;
      bool moved = false;
      if (disk_units > 0 && v->units() <= disk_units) {
        moved = true;
        while (disk_used() + v->units() > disk_units) {
          model_entry* w = victim(2, except);
          if (w == nullptr) {
            moved = false;
            break;
          }
          ++c.storage_dropped;
          const std::uint64_t vk = v->key;
          erase(w->key);
          v = find(vk);
        }
      }
      if (moved) {
        v->tier = 2;
        ++c.moved_down;
      } else {
        erase(v->key);
      }
    }
  }
  bool make(std::uint64_t key, std::int64_t p, std::int64_t b, std::uint8_t fill) {
    model_entry* old = find(key);
    if (p > kv_slots - pinned(false) || b > ssm_slots - pinned(true) || (old != nullptr && old->pins > 0)) {
      ++c.demotions_dropped;
      return false;
    }
    if (old != nullptr) erase(key);
    make_host_room(p, b, ~0ull);
    es.push_back({key, 1, p, b, 0, ++clock, fill});
    ++c.demotions;
    return true;
  }
  /// tier_t::bring results, as ints: 0 ready, 1 no room.
  int bring(std::uint64_t key) {
    model_entry* e = find(key);
    if (e->tier == 1) return 0;
    if (e->pages > kv_slots - pinned(false) || e->blocks > ssm_slots - pinned(true)) return 1;
    make_host_room(e->pages, e->blocks, key);
    e = find(key);
    e->tier = 1;
    e->last = ++clock;
    ++c.brought_up;
    return 0;
  }
};

/// Reads (or fills) an entry's bytes through the tier's pieces.
std::vector<std::byte> bytes_of(tier_t& t, std::uint64_t key) {
  const auto& e = t.at(key);
  std::vector<std::byte> out(static_cast<std::size_t>(t.block_offset(e, e.blocks)));
  t.for_each_piece(key, 0, static_cast<std::int64_t>(out.size()), [&](std::byte* p, std::int64_t n, std::int64_t done) {
    std::memcpy(out.data() + done, p, static_cast<std::size_t>(n));
  });
  return out;
}
void fill(tier_t& t, std::uint64_t key, std::uint8_t v) {
  const auto& e = t.at(key);
  t.for_each_piece(key, 0, t.block_offset(e, e.blocks), [&](std::byte* p, std::int64_t n, std::int64_t done) {
    for (std::int64_t i = 0; i < n; ++i) p[i] = static_cast<std::byte>(v + static_cast<std::uint8_t>((done + i) % 7));
  });
}
bool filled_with(const std::vector<std::byte>& b, std::uint8_t v) {
  for (std::size_t i = 0; i < b.size(); ++i)
    if (b[i] != static_cast<std::byte>(v + static_cast<std::uint8_t>(i % 7))) return false;
  return true;
}

void run_against_model(std::uint32_t seed, std::int64_t disk_units) {
  constexpr std::int64_t kPages = 40, kBlocks = 12;
  test::memory_storage_backend backend(std::int64_t{64} << 20);
  host_tier_config cfg{.kv_pages = kPages, .checkpoint_blocks = kBlocks};
  if (disk_units > 0) {
    cfg.storage_tiers = {{.kind = tiered::tier_kind::disk, .capacity_bytes = disk_units * kUnit, .location = "model"}};
    cfg.storage_io = {tiered::storage_io_of(backend)};
  }
  tier_t tier(cfg, kPage, kBlock);
  model m{kPages, kBlocks, disk_units, {}, 0, {}};
  std::mt19937 rng(seed);
  for (int step = 0; step < 3000; ++step) {
    const std::uint64_t key = 1 + rng() % 97;  // few keys: many replacements of a key present
    const int op = static_cast<int>(rng() % 10);
    model_entry* in_model = m.find(key);
    if (op < 5) {  // demote
      const auto pages = static_cast<std::int64_t>(1 + rng() % 6), blocks = static_cast<std::int64_t>(rng() % 3 == 0 ? 0 : 1 + rng() % 3);
      const std::vector<std::int32_t> tokens(1 + rng() % 5, static_cast<std::int32_t>(key));
      const auto v = static_cast<std::uint8_t>(rng());
      const bool made = tier.make_entry(key, 0, 0, tokens, static_cast<std::size_t>(pages), static_cast<std::size_t>(blocks));
      REQUIRE(made == m.make(key, pages, blocks, v));
      if (made) {
        fill(tier, key, v);
        tier.publish(key);
      }
    } else if (op < 7 && in_model != nullptr) {  // bring up, then pin or unpin
      const auto got = tier.bring_to_host(key);
      REQUIRE(got != tier_t::bring::dropped);
      REQUIRE(static_cast<int>(got == tier_t::bring::no_room) == m.bring(key));
      in_model = m.find(key);
      if (got == tier_t::bring::ready) {
        if (in_model->pins > 0 && rng() % 2 == 0) {
          tier.unpin(key);
          --in_model->pins;
        } else if (in_model->pins < 2) {
          tier.pin(key);
          ++in_model->pins;
          in_model->last = ++m.clock;  // a pin is a use
        }
      }
    } else if (in_model != nullptr && in_model->tier == 1) {  // touch: most recently used
      tier.touch(key);
      in_model->last = ++m.clock;
    }
    // After every step: the same keys, in the same tiers, holding their bytes, and the same room.
    REQUIRE(tier.free_pages() == kPages - m.used(1, false));
    REQUIRE(tier.free_blocks() == kBlocks - m.used(1, true));
    REQUIRE(tier.live_entries() == static_cast<std::int64_t>(m.es.size()));
    if (disk_units > 0) REQUIRE(tier.table().usage(disk).used_bytes == m.disk_used() * kUnit);
    REQUIRE(tier.counters().host_evictions == m.c.host_evictions);
    REQUIRE(tier.counters().moved_down == m.c.moved_down);
    REQUIRE(tier.counters().storage_dropped == m.c.storage_dropped);
    REQUIRE(tier.counters().brought_up == m.c.brought_up);
    REQUIRE(tier.counters().demotions == m.c.demotions);
    REQUIRE(tier.counters().demotions_dropped == m.c.demotions_dropped);
    for (std::uint64_t k = 1; k <= 97; ++k) {
      const model_entry* e = m.find(k);
      const auto* got = tier.find(k);
      REQUIRE((got != nullptr) == (e != nullptr));
      if (e == nullptr) continue;
      REQUIRE(tier.tier_of(k).value == e->tier);
      REQUIRE(static_cast<std::int64_t>(got->pages) == e->pages);
      REQUIRE(static_cast<std::int64_t>(got->blocks) == e->blocks);
      if (e->tier != 1) continue;
      const auto all = bytes_of(tier, k);
      REQUIRE(filled_with(all, e->fill));
      // A range that starts and ends anywhere (a load reads one layer's rows of one page)
      // reads the same bytes as the whole entry there.
      const auto first = static_cast<std::int64_t>(rng() % all.size());
      const auto len = static_cast<std::int64_t>(1 + rng() % (all.size() - static_cast<std::size_t>(first)));
      std::vector<std::byte> part(static_cast<std::size_t>(len));
      tier.for_each_piece(k, first, len, [&](std::byte* p, std::int64_t n, std::int64_t done) {
        std::memcpy(part.data() + done, p, static_cast<std::size_t>(n));
      });
      REQUIRE(std::equal(part.begin(), part.end(), all.begin() + first));
    }
  }
  CHECK(m.c.host_evictions > 100);
  if (disk_units > 0) {
    CHECK(m.c.moved_down > 100);
    CHECK(m.c.brought_up > 20);
    CHECK(m.c.storage_dropped > 20);
  }
  CHECK(tier.table().check_invariants().empty());
}

}  // namespace

TEST_CASE("pool host tier: LRU eviction, pins and the room agree with a list model on random demotions") {
  for (std::uint32_t seed : {1u, 2u, 3u}) {
    CAPTURE(seed);
    run_against_model(seed, 0);
  }
}

TEST_CASE("pool host tier over a storage tier: entries move down, come back up byte for byte, and agree with the model") {
  for (std::uint32_t seed : {4u, 5u, 6u}) {
    CAPTURE(seed);
    run_against_model(seed, 96);  // about a third more than the host tier
  }
}

TEST_CASE("pool host tier over a storage tier: bytes the storage tier gives back altered are never loaded") {
  test::memory_storage_backend backend(std::int64_t{1} << 20);
  bool damage = false;
  tiered::storage_tier_io io = tiered::storage_io_of(backend);
  const auto get = io.get;
  io.get = [&, get](const storage_key& k, std::span<std::byte> into) {
    auto t = get(k, into);  // the reference backend reads at once
    if (damage && !into.empty()) into[into.size() / 2] ^= std::byte{0x08};
    return t;
  };
  tier_t tier({.kv_pages = 4,
               .checkpoint_blocks = 2,
               .storage_tiers = {{.kind = tiered::tier_kind::disk, .capacity_bytes = 64 * kUnit, .location = "damaged"}},
               .storage_io = {io}},
              kPage, kBlock);
  const std::vector<std::int32_t> tokens{1, 2, 3};
  for (std::uint64_t key = 1; key <= 4; ++key) {  // 2 pages + 1 block each: the host tier holds two
    REQUIRE(tier.make_entry(key, 0, 0, tokens, 2, 1));
    fill(tier, key, static_cast<std::uint8_t>(key));
    tier.publish(key);
  }
  REQUIRE(tier.tier_of(1) == disk);
  REQUIRE(tier.tier_of(2) == disk);
  REQUIRE(tier.bring_to_host(1) == tier_t::bring::ready);  // intact: back with its bytes
  CHECK(filled_with(bytes_of(tier, 1), 1));
  damage = true;
  CHECK(tier.bring_to_host(2) == tier_t::bring::dropped);
  CHECK(tier.find(2) == nullptr);
  CHECK(tier.counters().corrupt_dropped == 1);
  // A host entry whose bytes changed at rest is dropped by the CRC check.
  REQUIRE(tier.tier_of(1) == host);
  REQUIRE(tier.verify_or_drop(1));
  tier.for_each_piece(1, 70, 1, [](std::byte* p, std::int64_t, std::int64_t) { *p ^= std::byte{1}; });
  CHECK_FALSE(tier.verify_or_drop(1));
  CHECK(tier.find(1) == nullptr);
  CHECK(tier.counters().corrupt_dropped == 2);
  CHECK(tier.table().check_invariants().empty());
}

TEST_CASE("pool host tier: an entry larger than the tier is dropped, and a tier of size 0 keeps nothing") {
  tier_t tier({.kv_pages = 4, .checkpoint_blocks = 2}, kPage, kBlock);
  const std::vector<std::int32_t> tokens{1, 2, 3};
  CHECK_FALSE(tier.make_entry(7, 0, 0, tokens, 5, 0));
  CHECK_FALSE(tier.make_entry(7, 0, 0, tokens, 1, 3));
  CHECK(tier.counters().demotions_dropped == 2);
  tier_t off({}, kPage, kBlock);
  CHECK_FALSE(off.enabled());
  CHECK_FALSE(off.make_entry(7, 0, 0, tokens, 1, 0));
  CHECK(off.find(7) == nullptr);
}

TEST_CASE("pool host tier: bad configurations are refused with a clear error") {
  test::memory_storage_backend backend(std::int64_t{1} << 20);
  const tiered::tier_config disk_tier{.kind = tiered::tier_kind::disk, .capacity_bytes = 1 << 16, .location = "d"};
  CHECK_THROWS_AS(tier_t({.kv_pages = -1}, kPage, kBlock), invalid_argument);
  // Storage tiers need a host tier above them.
  CHECK_THROWS_AS(tier_t({.storage_tiers = {disk_tier}, .storage_io = {tiered::storage_io_of(backend)}}, kPage, kBlock),
                  invalid_argument);
  // One set of storage calls per storage tier.
  CHECK_THROWS_AS(tier_t({.kv_pages = 4, .checkpoint_blocks = 2, .storage_tiers = {disk_tier}}, kPage, kBlock), invalid_argument);
  // Only storage tiers go below the host tier.
  CHECK_THROWS_AS(tier_t({.kv_pages = 4,
                          .checkpoint_blocks = 2,
                          .storage_tiers = {{.kind = tiered::tier_kind::host, .capacity_bytes = 1 << 16}},
                          .storage_io = {tiered::storage_io_of(backend)}},
                         kPage, kBlock),
                  invalid_argument);
}
