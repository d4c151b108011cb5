// Generation-checked handles, expected<T>, the logical clock.
#include <doctest/doctest.h>

#include <random>
#include <vector>

#include <hybridcache/core/expected.hpp>
#include <hybridcache/core/handle.hpp>
#include <hybridcache/core/logical_clock.hpp>

using namespace hybridcache;

TEST_CASE("packed_handle round-trips its fields") {
  const auto h = packed_handle::make(7, 123456, 0xabcdef);
  CHECK(h.pool_tag() == 7);
  CHECK(h.index() == 123456);
  CHECK(h.generation() == 0xabcdef);
  CHECK_FALSE(h.is_null());
  CHECK(packed_handle{}.is_null());
  CHECK(packed_handle::from_bits(h.bits()) == h);
}

TEST_CASE("generation_table detects stale handles, double frees and foreign handles") {
  generation_table t(3, 4);
  auto a = t.acquire();
  REQUIRE(a);
  CHECK(a->pool_tag() == 3);
  CHECK(t.validate(*a) == errc::ok);
  CHECK(t.live_count() == 1);
  REQUIRE(t.release(*a));
  CHECK(t.release(*a).error() == errc::double_free);  // freed twice
  auto b = t.acquire();  // LIFO: reuses the slot with a new generation
  REQUIRE(b);
  CHECK(b->index() == a->index());
  CHECK(b->generation() != a->generation());
  CHECK(t.validate(*a) == errc::stale_handle);
  CHECK(t.validate(packed_handle::make(4, b->index(), b->generation())) == errc::foreign_handle);
  CHECK(t.validate(packed_handle::make(3, 99, 1)) == errc::foreign_handle);
  CHECK(t.validate(packed_handle{}) == errc::foreign_handle);
  // A handle with the current generation of a free slot is a double free.
  generation_table u(0, 2);
  auto c = u.acquire();
  REQUIRE(c);
  CHECK(u.validate(packed_handle::make(0, 1, 1)) == errc::double_free);
  // Failed releases change nothing.
  const auto live = t.live_count();
  CHECK_FALSE(t.release(*a));
  CHECK(t.live_count() == live);
}

TEST_CASE("generation_table runs out and reports it") {
  generation_table t(0, 2);
  REQUIRE(t.acquire());
  REQUIRE(t.acquire());
  auto c = t.acquire();
  CHECK_FALSE(c);
  CHECK(c.error() == errc::out_of_capacity);
  CHECK_THROWS_AS((void)c.value(), capacity_error);
  CHECK_THROWS_AS(generation_table(256), invalid_argument);
}

TEST_CASE("generation_table against a naive model on random operations") {
  std::mt19937_64 rng(42);
  generation_table t(1, 64);
  std::vector<packed_handle> live, dead;
  for (int step = 0; step < 20000; ++step) {
    const int op = static_cast<int>(rng() % 3);
    if (op == 0) {
      auto h = t.acquire();
      CHECK(h.has_value() == (live.size() < 64));
      if (h) live.push_back(*h);
    } else if (op == 1 && !live.empty()) {
      const auto i = rng() % live.size();
      REQUIRE(t.release(live[i]));
      dead.push_back(live[i]);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    } else if (!dead.empty()) {
      CHECK_FALSE(t.release(dead[rng() % dead.size()]));  // every dead handle stays dead
    }
    REQUIRE(t.live_count() == live.size());
  }
  for (auto h : live) CHECK(t.validate(h) == errc::ok);
}

TEST_CASE("expected and the logical clock") {
  expected<int> ok = 5;
  expected<int> bad = unexpected(errc::stale_handle);
  CHECK(*ok == 5);
  CHECK(bad.error() == errc::stale_handle);
  CHECK_THROWS_AS((void)bad.value(), handle_error);
  CHECK(bad.value_or(9) == 9);
  CHECK(to_string(errc::double_free) == "double_free");
  static_assert(to_string(errc::ok) == "ok" && to_string(errc::busy) == "busy");  // constexpr, both ends
  CHECK(to_string(static_cast<errc>(8)) == "unknown");  // past the table
  CHECK(to_string(static_cast<errc>(255)) == "unknown");
  logical_clock c;
  CHECK(c.now() == 0);
  CHECK(c.tick() == 1);
  CHECK(c.advance(5) == 6);
}
