// The id types of concepts/ids.hpp. `entry_id` is a strong type (a scoped enum over
// 64 bits): it must not convert implicitly from or to an integer or from `node_id`,
// so that a tree slot, a token count or a byte count cannot be passed where a cache-table
// row is meant (or the other way round). The checks below fail at compile time if it ever
// becomes a plain alias again. It must still key the standard containers the store and the
// replay use (std::unordered_map through std::hash, std::set/std::map through <).
#include <doctest/doctest.h>

#include <compare>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <type_traits>
#include <unordered_map>

#include "hybridcache/concepts/ids.hpp"

using hybridcache::node_id;
using hybridcache::entry_id;
using hybridcache::make_entry_id;
using hybridcache::no_entry;
using hybridcache::to_underlying;

// No implicit conversion either way, from any integer or from a tree slot.
static_assert(!std::is_convertible_v<entry_id, std::uint64_t>);
static_assert(!std::is_convertible_v<std::uint64_t, entry_id>);
static_assert(!std::is_convertible_v<int, entry_id>);
static_assert(!std::is_convertible_v<entry_id, int>);
static_assert(!std::is_convertible_v<node_id, entry_id>);
static_assert(!std::is_convertible_v<entry_id, node_id>);
static_assert(!std::is_same_v<entry_id, node_id>);
// Not even by assignment (a `tiered_state_store` handle's `id = 0` must be written `no_entry`).
static_assert(!std::is_assignable_v<entry_id&, std::uint64_t>);
static_assert(!std::is_assignable_v<entry_id&, node_id>);
// 64 bits, trivially copyable: the tables store it by value and tickets carry it.
static_assert(std::is_enum_v<entry_id> && std::is_same_v<std::underlying_type_t<entry_id>, std::uint64_t>);
static_assert(sizeof(entry_id) == sizeof(std::uint64_t) && std::is_trivially_copyable_v<entry_id>);
// The helpers round-trip every value, at compile time.
static_assert(to_underlying(make_entry_id(0)) == 0);
static_assert(to_underlying(make_entry_id(~std::uint64_t{0})) == ~std::uint64_t{0});
static_assert(make_entry_id(42) == entry_id{42});
static_assert(no_entry == entry_id{} && to_underlying(no_entry) == 0);
// Ordered like its value.
static_assert(entry_id{1} < entry_id{2} && entry_id{2} > entry_id{1} && entry_id{3} != entry_id{4});
static_assert((entry_id{1} <=> entry_id{2}) == std::strong_ordering::less);

TEST_CASE("entry_id: keys an unordered_map, a map and a set by its value") {
  std::unordered_map<entry_id, int> u;
  u[make_entry_id(7)] = 1;
  u[entry_id{1ULL << 40}] = 2;
  u[make_entry_id(7)] += 10;
  CHECK(u.size() == 2);
  CHECK(u.at(entry_id{7}) == 11);
  CHECK(u.at(make_entry_id(1ULL << 40)) == 2);
  CHECK_FALSE(u.contains(no_entry));
  // The hash is the standard one of the value: the store's and the replay's hash tables
  // keep the bucket layout (and iteration order) they had when the id was a plain uint64.
  CHECK(std::hash<entry_id>{}(entry_id{12345}) == std::hash<std::uint64_t>{}(12345));

  std::map<entry_id, int> m{{entry_id{3}, 3}, {entry_id{1}, 1}, {entry_id{2}, 2}};
  int want = 1;
  for (const auto& [id, v] : m) {
    CHECK(to_underlying(id) == static_cast<std::uint64_t>(want));
    CHECK(v == want++);
  }
  const std::set<entry_id> s{entry_id{5}, entry_id{5}, no_entry};
  CHECK(s.size() == 2);
  CHECK(*s.begin() == no_entry);
}

TEST_CASE("entry_id: to_string prints the value") {
  CHECK(to_string(entry_id{0}) == "0");
  CHECK(to_string(make_entry_id(18446744073709551615ULL)) == "18446744073709551615");
  CHECK("entry " + to_string(entry_id{42}) == "entry 42");
}
