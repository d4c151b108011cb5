// shared_prefix_store over a disk tier: pairs (KV of [0, b), state after b) published by one
// store are found by another over the same backend (the deepest candidate, byte for byte),
// never across cache salts or models; a damaged value is a counted miss and the next
// position down is used; bad input changes nothing; and random publishes and lookups agree
// with a naive model (a list of what was published).
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <random>
#include <vector>

#include "hybridcache/tiered/disk_backend.hpp"
#include "hybridcache/tiered/shared_prefix_store.hpp"

#include "../support/damage_file.hpp"
#include "../support/temp_dir.hpp"

using namespace hybridcache;
using namespace hybridcache::tiered;

namespace {
constexpr std::int64_t kv_row = 64, state_size = 1000;

shared_prefix_config config(std::uint64_t model = 77) {
  return {.model = model, .kv_bytes_per_token = kv_row, .state_bytes = state_size, .kv_layers = 4, .state_layers = 3,
          .max_pending = 3};
}

// What a runtime computed for `tokens`: KV row bytes of token p and the state after b - 1 are
// functions of the prefix (never zeros).
std::uint64_t prefix_hash(std::span<const token_id> t, std::int64_t n, cache_salt salt) {
  std::uint64_t h = 0x1234 ^ (salt ? *salt * 31 : 0);
  for (std::int64_t i = 0; i < n; ++i) h = splitmix64_mix(h ^ static_cast<std::uint64_t>(t[static_cast<std::size_t>(i)] + 5));
  return h;
}
void fill_kv(std::span<const token_id> t, cache_salt salt, std::span<std::byte> out) {
  for (std::size_t i = 0; i < out.size(); ++i) {
    const auto p = static_cast<std::int64_t>(i) / kv_row;
    out[i] = static_cast<std::byte>(splitmix64_mix(prefix_hash(t, p + 1, salt) + i % kv_row) | 1);
  }
}
void fill_state(std::span<const token_id> t, std::int64_t b, cache_salt salt, std::span<std::byte> out) {
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::byte>(splitmix64_mix(~prefix_hash(t, b, salt) + i) | 1);
}

bool publish(shared_prefix_store<disk_backend<>>& s, std::span<const token_id> t, cache_salt salt, std::int64_t b) {
  return s.publish(t, salt, b, [&](std::span<std::byte> o) { fill_kv(t, salt, o); },
                   [&](std::span<std::byte> o) { fill_state(t, b, salt, o); });
}

// Whether kv/state are the bytes of position b of `t`.
bool right_bytes(std::span<const token_id> t, cache_salt salt, std::int64_t b, const std::vector<std::byte>& kv,
                 const std::vector<std::byte>& state) {
  std::vector<std::byte> k(static_cast<std::size_t>(b * kv_row)), s(static_cast<std::size_t>(state_size));
  fill_kv(t, salt, k);
  fill_state(t, b, salt, s);
  return k == kv && s == state;
}

std::vector<token_id> prompt_of(std::uint32_t seed, std::size_t n) {
  std::vector<token_id> p(n);
  std::mt19937 rng(seed);
  for (auto& x : p) x = static_cast<token_id>(rng() % 1000);
  return p;
}
}  // namespace

TEST_CASE("shared prefix store: another store over the same backend finds the deepest published pair, byte for byte") {
  test::temp_dir dir("hc_shared_prefix");
  disk_backend<> disk({.directory = dir.path().string(), .capacity_bytes = 16 << 20});
  const auto prompt = prompt_of(1, 64);
  {
    shared_prefix_store<disk_backend<>> writer(disk, config());
    for (const std::int64_t b : {16, 32, 48}) CHECK(publish(writer, prompt, std::nullopt, b));
    CHECK_FALSE(publish(writer, prompt, std::nullopt, 32));  // already published by this store
    CHECK(writer.counters().skipped == 1);
    CHECK(writer.counters().publishes == 3);
  }  // drained: every value written
  CHECK(disk.counters().puts == 6);

  shared_prefix_store<disk_backend<>> reader(disk, config());
  std::vector<std::byte> kv, state;
  const std::vector<std::int64_t> all{16, 32, 48, 63};
  CHECK(reader.find(prompt, std::nullopt, all, 0, kv, state) == 48);
  CHECK(right_bytes(prompt, std::nullopt, 48, kv, state));
  CHECK(reader.find(prompt, std::nullopt, all, 48, kv, state) == 0);  // nothing above 48
  const std::vector<std::int64_t> no48{16, 32};
  CHECK(reader.find(prompt, std::nullopt, no48, 0, kv, state) == 32);
  CHECK(right_bytes(prompt, std::nullopt, 32, kv, state));
  // A prompt that leaves the published one at token 20: only 16 is its prefix.
  auto other = prompt;
  other[20] = 999;
  CHECK(reader.find(other, std::nullopt, all, 0, kv, state) == 16);
  CHECK(right_bytes(other, std::nullopt, 16, kv, state));
  CHECK(reader.counters().hits == 3);
  CHECK(reader.counters().dropped == 0);
}

TEST_CASE("shared prefix store: pairs never cross cache salts or models") {
  test::temp_dir dir("hc_shared_prefix");
  disk_backend<> disk({.directory = dir.path().string(), .capacity_bytes = 16 << 20});
  const auto prompt = prompt_of(2, 40);
  shared_prefix_store<disk_backend<>> a(disk, config());
  CHECK(publish(a, prompt, cache_salt{5}, 32));
  a.drain();
  std::vector<std::byte> kv, state;
  const std::vector<std::int64_t> at{32};
  shared_prefix_store<disk_backend<>> same(disk, config()), other_model(disk, config(78));
  CHECK(same.find(prompt, cache_salt{5}, at, 0, kv, state) == 32);
  CHECK(same.find(prompt, cache_salt{6}, at, 0, kv, state) == 0);
  CHECK(same.find(prompt, std::nullopt, at, 0, kv, state) == 0);
  CHECK(other_model.find(prompt, cache_salt{5}, at, 0, kv, state) == 0);
}

TEST_CASE("shared prefix store: a damaged value is a counted miss; the next position down is used") {
  test::temp_dir dir("hc_shared_prefix");
  disk_backend<> disk({.directory = dir.path().string(), .capacity_bytes = 16 << 20});
  const auto prompt = prompt_of(3, 64);
  {
    shared_prefix_store<disk_backend<>> w(disk, config());
    CHECK(publish(w, prompt, std::nullopt, 32));
    CHECK(publish(w, prompt, std::nullopt, 48));
  }
  // The largest file is the KV of 48 tokens (3,072 B): flip a payload byte.
  REQUIRE(test::flip_byte_in_largest_file(dir.path(), 7, 0x20) > static_cast<std::uintmax_t>(48 * kv_row));
  shared_prefix_store<disk_backend<>> r(disk, config());
  std::vector<std::byte> kv, state;
  const std::vector<std::int64_t> at{32, 48};
  CHECK(r.find(prompt, std::nullopt, at, 0, kv, state) == 32);
  CHECK(right_bytes(prompt, std::nullopt, 32, kv, state));
  CHECK(r.counters().dropped == 1);
  CHECK(disk.counters().corrupt == 1);
  // A reader whose sizes differ from the writer's (another layout) finds nothing usable.
  shared_prefix_config wrong = config();
  wrong.state_layers = 4;
  shared_prefix_store<disk_backend<>> w2(disk, wrong);
  CHECK(w2.find(prompt, std::nullopt, at, 0, kv, state) == 0);
  CHECK(w2.counters().dropped == 2);  // 48: its KV was removed as corrupt; 32: another layout
}

TEST_CASE("shared prefix store: bad input is refused and publishes nothing") {
  test::temp_dir dir("hc_shared_prefix");
  disk_backend<> disk({.directory = dir.path().string(), .capacity_bytes = 16 << 20});
  shared_prefix_config c = config();
  c.kv_bytes_per_token = 0;
  CHECK_THROWS_AS(shared_prefix_store<disk_backend<>>(disk, c), invalid_argument);
  c = config();
  c.max_pending = 0;
  CHECK_THROWS_AS(shared_prefix_store<disk_backend<>>(disk, c), invalid_argument);
  shared_prefix_store<disk_backend<>> s(disk, config());
  const auto prompt = prompt_of(4, 10);
  CHECK_THROWS_WITH_AS(publish(s, prompt, std::nullopt, 0), doctest::Contains("position 0 outside [1, 10]"), invalid_argument);
  CHECK_THROWS_AS(publish(s, prompt, std::nullopt, 11), invalid_argument);
  // A fill that throws: nothing handed over, the position not remembered as published.
  CHECK_THROWS_AS(s.publish(prompt, std::nullopt, 5, [](std::span<std::byte>) { throw std::runtime_error("no bytes"); },
                            [](std::span<std::byte>) {}),
                  std::runtime_error);
  s.drain();
  CHECK(disk.counters().puts == 0);
  CHECK(s.counters().publishes == 0);
  CHECK(publish(s, prompt, std::nullopt, 5));
}

TEST_CASE("shared prefix store: random publishes and lookups agree with a list of what was published") {
  for (const std::uint32_t seed : {1u, 2u, 3u}) {
    INFO("seed " << seed);
    test::temp_dir dir("hc_shared_prefix");
    disk_backend<> disk({.directory = dir.path().string(), .capacity_bytes = 64 << 20});
    shared_prefix_store<disk_backend<>> writer(disk, config()), reader(disk, config());
    std::mt19937 rng(seed);
    // Conversations: 4 roots, each request a root or an earlier request extended.
    std::vector<std::vector<token_id>> seen{prompt_of(seed * 10, 24), prompt_of(seed * 10 + 1, 24), prompt_of(seed * 10 + 2, 8),
                                            prompt_of(seed * 10 + 3, 40)};
    struct published {
      std::vector<token_id> prefix;
      cache_salt salt;
    };
    std::vector<published> model;  // the naive reference: every (prefix, salt) published
    int hits = 0;
    for (int step = 0; step < 120; ++step) {
      std::vector<token_id> p = seen[rng() % seen.size()];
      p.resize(std::min<std::size_t>(p.size(), 1 + rng() % (p.size() + 4)));
      const auto more = rng() % 24;
      for (std::uint32_t i = 0; i < more; ++i) p.push_back(static_cast<token_id>(rng() % 6));
      if (p.size() < 2) continue;
      const cache_salt salt = rng() % 4 == 0 ? cache_salt{rng() % 2} : std::nullopt;
      // Candidates: every 8th position and the one before the end.
      std::vector<std::int64_t> cand;
      for (std::int64_t b = 8; b < static_cast<std::int64_t>(p.size()); b += 8) cand.push_back(b);
      if (cand.empty() || cand.back() != static_cast<std::int64_t>(p.size()) - 1) cand.push_back(static_cast<std::int64_t>(p.size()) - 1);
      const std::int64_t at_least = rng() % 3 == 0 ? 8 : 0;
      writer.drain();  // what the model lists is stored
      std::int64_t expect = 0;
      for (const std::int64_t b : cand) {
        if (b <= at_least) continue;
        for (const auto& m : model)
          if (m.salt == salt && static_cast<std::int64_t>(m.prefix.size()) == b && std::equal(m.prefix.begin(), m.prefix.end(), p.begin()))
            expect = b;
      }
      std::vector<std::byte> kv, state;
      const std::int64_t got = reader.find(p, salt, cand, at_least, kv, state);
      REQUIRE(got == expect);
      if (got > 0) {
        REQUIRE(right_bytes(p, salt, got, kv, state));
        ++hits;
      }
      // The runtime publishes the candidates its prefill passed.
      for (const std::int64_t b : cand)
        if (rng() % 2 == 0 && publish(writer, p, salt, b))
          model.push_back({std::vector<token_id>(p.begin(), p.begin() + b), salt});
      seen.push_back(p);
    }
    MESSAGE(hits << " hits, " << model.size() << " pairs published");
    CHECK(hits > 10);
    CHECK(reader.counters().dropped == 0);
  }
}
