// Conformance suite of `hybridcache::tier_copy_engine` (tiered/copy_plan.hpp):
// every engine carries the tickets of a real `tiered_store` (three tiers: HBM, host, CXL)
// through the two-phase move protocol. Laws:
//
//   - a ticket from `prepare_move` is accepted by `submit`, and `wait` on its event reports
//     success; `complete_move(ticket, true)` then makes the destination the entry's home;
//   - an engine that holds bytes carries them: after any sequence of moves every entry's
//     bytes, read through its current pages, are the ones written at insert;
//   - several tickets submitted before any wait, then waited in any order, all complete;
//   - an engine that can fail (fault injection) reports the failure from `wait`, and the
//     entry stays where it was with its bytes (`complete_move(ticket, false)`).
//
// Engines: metadata_only_copies, host_copy_engine, and the timed replay's real-bytes engine
// (sim/real_bytes_copy_engine.hpp). A new engine is covered by adding a fixture (traits has_bytes / can_fail, `base(tier)`
// for byte access, `fail_copies(bool)`) and naming it in TEST_CASE_TEMPLATE_INVOKE.
//
// The CUDA engine (tiered/cuda/copy_engine.cuh) models the same concept, but its HBM arena
// is device memory (bytes are read back with cudaMemcpy) and it needs a GPU and nvcc: it is
// not in this host-only suite. tests/cuda/test_copy_engine.cu checks its byte integrity and
// failure handling on a device; a CUDA fixture for this suite would read and write arenas
// through cudaMemcpy and otherwise reuse these laws unchanged.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "hybridcache/sim/real_bytes_copy_engine.hpp"
#include "hybridcache/tiered/copy_plan.hpp"
#include "hybridcache/tiered/host_copy_engine.hpp"
#include "hybridcache/tiered/tiered_store.hpp"

using namespace hybridcache;
using namespace hybridcache::tiered;

namespace {

constexpr std::int64_t page = 4096;

std::vector<tier_config> three_tiers() {
  return {{.kind = tier_kind::hbm, .capacity_bytes = 24 * page},
          {.kind = tier_kind::host, .capacity_bytes = 32 * page},
          {.kind = tier_kind::cxl, .capacity_bytes = 32 * page}};
}

struct metadata_fixture {
  static constexpr bool has_bytes = false;
  static constexpr bool can_fail = false;
  metadata_only_copies engine;
  std::byte* base(tier_id) { return nullptr; }
  void fail_copies(bool) {}
};

struct host_fixture {
  static constexpr bool has_bytes = true;
  static constexpr bool can_fail = true;
  host_copy_engine engine{three_tiers(), page, {.measure_bandwidth = false}};
  std::byte* base(tier_id t) { return engine.base(t); }
  void fail_copies(bool on) {
    if (on) engine.set_fault_hook([](const copy_span&) { return true; });
    else engine.set_fault_hook({});
  }
};

// The timed replay's real-bytes engine (sim/real_bytes_copy_engine.hpp) over memory tiers
// only (its storage tiers are checked against the backends in tests/tiered/test_real_bytes.cpp):
// the bytes the test writes at insert are the entries' (write_computed_bytes = false).
struct real_bytes_fixture {
  static constexpr bool has_bytes = true;
  static constexpr bool can_fail = true;
  sim::real_bytes_copy_engine engine{three_tiers(), page, {}, {}, 42, {.write_computed_bytes = false}};
  std::byte* base(tier_id t) { return engine.base(t); }
  void fail_copies(bool on) {
    if (on) engine.set_fault([](const move_ticket&) { return true; });
    else engine.set_fault({});
  }
};

std::byte pattern(entry_id id, std::int64_t i) {
  return static_cast<std::byte>((to_underlying(id) * 167 + static_cast<std::uint64_t>(i) * 13 + 5) & 0xff);
}

template <class F, class Store>
void write_entry(F& f, const Store& s, entry_id id) {
  if constexpr (F::has_bytes) {
    const auto row = s.find(id);
    REQUIRE(row);
    REQUIRE(row->home() != nullptr);
    std::byte* b = f.base(row->tier());
    for (std::int64_t i = 0; i < row->bytes(); ++i)
      b[static_cast<std::int64_t>(row->home()->pages.page(i / page)) * page + i % page] = pattern(id, i);
  }
}

template <class F, class Store>
bool entry_intact(F& f, const Store& s, entry_id id) {
  if constexpr (F::has_bytes) {
    const auto row = s.find(id);
    if (!row || row->home() == nullptr) return false;
    const std::byte* b = f.base(row->tier());
    for (std::int64_t i = 0; i < row->bytes(); ++i)
      if (b[static_cast<std::int64_t>(row->home()->pages.page(i / page)) * page + i % page] != pattern(id, i))
        return false;
  }
  return true;
}

/// Inserts entries of random sizes into HBM until it is about half full; returns their ids.
template <class F, class Store>
std::vector<entry_id> populate(F& f, Store& s, std::mt19937_64& rng) {
  std::vector<entry_id> ids;
  for (std::uint64_t n = 1; s.usage(hbm_tier).used_bytes < 12 * page; ++n) {
    const entry_id id = make_entry_id(n);
    const auto bytes = static_cast<std::int64_t>(1 + rng() % (3 * page));
    if (!s.insert(id, bytes)) break;
    write_entry(f, s, id);
    ids.push_back(id);
  }
  return ids;
}

tier_id other_tier(std::mt19937_64& rng, tier_id from) {
  return tier_id{static_cast<std::uint8_t>((from.value + 1 + rng() % 2) % 3)};
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("tier_copy_engine conformance", F, tier_copy_engine_conformance) {
  static_assert(tier_copy_engine<decltype(F::engine)>);

  SUBCASE("a prepared ticket submits, waits successfully and completes at its destination") {
    for (std::uint64_t seed = 1; seed <= 8; ++seed) {
      CAPTURE(seed);
      F f;
      tiered_store<> s(three_tiers(), page);
      std::mt19937_64 rng(seed);
      const auto ids = populate(f, s, rng);
      REQUIRE(ids.size() >= 4);
      int moves = 0;
      for (int op = 0; op < 120; ++op) {
        const entry_id id = ids[rng() % ids.size()];
        const tier_id dst = other_tier(rng, s.find(id)->tier());
        auto t = s.prepare_move(id, dst);
        if (!t) {  // the destination is full: not the engine's business
          CHECK(t.error() == errc::out_of_capacity);
          continue;
        }
        CHECK(t->id == id);
        CHECK(t->dst == dst);
        auto ev = f.engine.submit(*t);
        REQUIRE(ev.has_value());
        CHECK(f.engine.wait(*ev).has_value());
        REQUIRE(s.complete_move(*t, true));
        const auto row = s.find(id);
        CHECK(row->tier() == dst);
        CHECK(row->copies.size() == 1);
        CHECK(row->copies.front().idle());
        CHECK(entry_intact(f, s, id));
        ++moves;
      }
      CHECK(moves > 60);
      for (entry_id id : ids) CHECK(entry_intact(f, s, id));
      CHECK(s.check_invariants().empty());
    }
  }

  SUBCASE("tickets submitted together complete in any wait order with their bytes") {
    for (std::uint64_t seed = 1; seed <= 8; ++seed) {
      CAPTURE(seed);
      F f;
      tiered_store<> s(three_tiers(), page);
      std::mt19937_64 rng(seed + 100);
      const auto ids = populate(f, s, rng);
      for (int round = 0; round < 15; ++round) {
        std::vector<move_ticket> tickets;
        using event_t = std::remove_cvref_t<decltype(*f.engine.submit(std::declval<const move_ticket&>()))>;
        std::vector<event_t> events;
        for (entry_id id : ids) {
          if (rng() % 2 == 0) continue;
          auto t = s.prepare_move(id, other_tier(rng, s.find(id)->tier()));
          if (!t) continue;
          auto ev = f.engine.submit(*t);
          REQUIRE(ev.has_value());
          tickets.push_back(*t);
          events.push_back(*ev);
        }
        std::vector<std::size_t> order(tickets.size());
        for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
        std::shuffle(order.begin(), order.end(), rng);
        for (std::size_t i : order) {
          CHECK(f.engine.wait(events[i]).has_value());
          REQUIRE(s.complete_move(tickets[i], true));
          CHECK(s.find(tickets[i].id)->tier() == tickets[i].dst);
        }
        for (entry_id id : ids) CHECK(entry_intact(f, s, id));
      }
      CHECK(s.check_invariants().empty());
    }
  }

  SUBCASE("move_entry (prepare, submit, wait, complete) keeps every entry intact") {
    F f;
    tiered_store<> s(three_tiers(), page);
    std::mt19937_64 rng(7);
    const auto ids = populate(f, s, rng);
    for (int op = 0; op < 200; ++op) {
      const entry_id id = ids[rng() % ids.size()];
      const tier_id from = s.find(id)->tier(), dst = other_tier(rng, from);
      const auto r = move_entry(s, f.engine, id, dst);
      CHECK(s.find(id)->tier() == (r ? dst : from));
      if (!r) CHECK(r.error() == errc::out_of_capacity);
    }
    for (entry_id id : ids) CHECK(entry_intact(f, s, id));
    CHECK(s.check_invariants().empty());
  }

  if constexpr (F::can_fail) {
    SUBCASE("a failed copy is reported by wait and the entry stays at its source, intact") {
      F f;
      tiered_store<> s(three_tiers(), page);
      std::mt19937_64 rng(9);
      const auto ids = populate(f, s, rng);
      for (entry_id id : ids) {
        const tier_id from = s.find(id)->tier(), dst = other_tier(rng, from);
        auto t = s.prepare_move(id, dst);
        REQUIRE(t);
        f.fail_copies(true);
        auto ev = f.engine.submit(*t);
        REQUIRE(ev.has_value());
        CHECK_FALSE(f.engine.wait(*ev).has_value());
        f.fail_copies(false);
        REQUIRE(s.complete_move(*t, false));
        CHECK(s.find(id)->tier() == from);
        CHECK(s.find(id)->copies.size() == 1);
        CHECK(entry_intact(f, s, id));
        // ...and the same move then succeeds.
        REQUIRE(move_entry(s, f.engine, id, dst));
        CHECK(entry_intact(f, s, id));
      }
      CHECK(s.check_invariants().empty());
    }
  }
}

TEST_CASE_TEMPLATE_INVOKE(tier_copy_engine_conformance, metadata_fixture, host_fixture, real_bytes_fixture);

// Layer by layer (`layered_copy_engine`): multi-layer entries moved between random tiers count
// every segment once the job ran, carry their bytes, refuse a count outside [0, segments], and
// a copy that fails never counts all its segments.
TEST_CASE_TEMPLATE_DEFINE("layered_copy_engine conformance", F, layered_copy_engine_conformance) {
  static_assert(layered_copy_engine<decltype(F::engine)>);
  F f;
  tiered_store<> s(three_tiers(), page);
  std::mt19937_64 rng(17);
  for (std::uint64_t n = 1; n <= 40; ++n) {
    CAPTURE(n);
    const entry_id id = make_entry_id(n);
    const auto segments = static_cast<std::int32_t>(1 + rng() % 4);
    const auto pages = static_cast<std::int64_t>(segments) * static_cast<std::int64_t>(1 + rng() % 2);
    const tier_id from{static_cast<std::uint8_t>(rng() % 3)};
    REQUIRE(s.insert(id, pages * page, from, {}, false, segments).has_value());
    write_entry(f, s, id);
    const tier_id to = other_tier(rng, from);
    auto t = s.prepare_move(id, to);
    REQUIRE(t);
    CHECK(t->segments == segments);
    const bool fail = F::can_fail && n % 5 == 0;
    f.fail_copies(fail);
    auto ev = f.engine.submit(*t);
    REQUIRE(ev);
    CHECK(f.engine.wait_segments(*ev, 0).has_value());
    CHECK(f.engine.wait_segments(*ev, -1).error() == errc::invalid_argument);
    CHECK(f.engine.wait_segments(*ev, segments + 1).error() == errc::invalid_argument);
    if (fail) {
      CHECK(f.engine.wait_segments(*ev, segments).error() == errc::busy);
      CHECK(f.engine.landed_segments(*ev) < segments);
      CHECK_FALSE(f.engine.wait(*ev).has_value());
      REQUIRE(s.complete_move(*t, false).has_value());
      f.fail_copies(false);
    } else {
      REQUIRE(f.engine.wait_segments(*ev, segments).has_value());
      CHECK(f.engine.landed_segments(*ev) == segments);
      REQUIRE(f.engine.wait(*ev).has_value());
      REQUIRE(s.complete_move(*t, true).has_value());
      CHECK(s.find(id)->tier() == to);
    }
    CHECK(entry_intact(f, s, id));
    REQUIRE(s.erase(id).has_value());
  }
  CHECK(s.check_invariants().empty());
}
TEST_CASE_TEMPLATE_INVOKE(layered_copy_engine_conformance, metadata_fixture, host_fixture);

// A group (`grouped_copy_engine`): 1-4 multi-layer entries from the lower tiers into HBM,
// submitted together, each carried whole with its own event (every segment counted, bytes
// intact); a group that fails fails every ticket not yet wholly landed, each reported by its
// own wait; a group with tickets of both directions, or events of the wrong count, is
// refused with nothing submitted and the events untouched.
TEST_CASE_TEMPLATE_DEFINE("grouped_copy_engine conformance", F, grouped_copy_engine_conformance) {
  using event = std::remove_cvref_t<decltype(*std::declval<decltype(F::engine)&>().submit(std::declval<const move_ticket&>()))>;
  static_assert(grouped_copy_engine<decltype(F::engine)>);
  F f;
  tiered_store<> s(three_tiers(), page);
  std::mt19937_64 rng(23);
  std::uint64_t next = 1;
  for (int round = 0; round < 30; ++round) {
    CAPTURE(round);
    const auto n = static_cast<std::size_t>(1 + rng() % 4);
    std::vector<entry_id> ids;
    std::vector<move_ticket> tickets;
    for (std::size_t k = 0; k < n; ++k) {
      const entry_id id = make_entry_id(next++);
      const auto segments = static_cast<std::int32_t>(1 + rng() % 4);
      const tier_id from{static_cast<std::uint8_t>(1 + rng() % 2)};
      REQUIRE(s.insert(id, static_cast<std::int64_t>(segments) * page, from, {}, false, segments).has_value());
      write_entry(f, s, id);
      auto t = s.prepare_move(id, hbm_tier);
      REQUIRE(t);
      ids.push_back(id);
      tickets.push_back(std::move(*t));
    }
    const bool fail = F::can_fail && round % 4 == 3;
    f.fail_copies(fail);
    std::vector<event> events(n);
    REQUIRE(f.engine.submit_group(std::span<const move_ticket>(tickets), std::span<event>(events)).has_value());
    for (std::size_t k = 0; k < n; ++k) {
      CAPTURE(k);
      const std::int32_t segments = tickets[k].segments;
      if (fail) {
        CHECK(f.engine.wait_segments(events[k], segments).error() == errc::busy);
        CHECK(f.engine.landed_segments(events[k]) < segments);
        CHECK_FALSE(f.engine.wait(events[k]).has_value());
        REQUIRE(s.complete_move(tickets[k], false).has_value());
      } else {
        REQUIRE(f.engine.wait_segments(events[k], segments).has_value());
        CHECK(f.engine.landed_segments(events[k]) == segments);
        REQUIRE(f.engine.wait(events[k]).has_value());
        REQUIRE(s.complete_move(tickets[k], true).has_value());
        CHECK(s.find(ids[k])->tier() == hbm_tier);
      }
      CHECK(entry_intact(f, s, ids[k]));
    }
    f.fail_copies(false);
    for (const entry_id id : ids) REQUIRE(s.erase(id).has_value());
  }
  // Refused groups change nothing.
  const entry_id up = make_entry_id(next++), down = make_entry_id(next++);
  REQUIRE(s.insert(up, 2 * page, tier_id{1}, {}, false, 2).has_value());
  REQUIRE(s.insert(down, 2 * page, hbm_tier, {}, false, 2).has_value());
  auto t_up = s.prepare_move(up, hbm_tier);
  auto t_down = s.prepare_move(down, tier_id{2});
  REQUIRE(t_up);
  REQUIRE(t_down);
  const std::vector<move_ticket> mixed{*t_up, *t_down};
  std::vector<event> events(2);
  const auto before = events;
  CHECK(f.engine.submit_group(std::span<const move_ticket>(mixed), std::span<event>(events)).error() == errc::invalid_argument);
  std::vector<event> one(1);
  CHECK(f.engine.submit_group(std::span<const move_ticket>(mixed), std::span<event>(one)).error() == errc::invalid_argument);
  CHECK(std::equal(events.begin(), events.end(), before.begin(), [](const event& a, const event& b) {
    if constexpr (requires { a.seq; }) return a.seq == b.seq && a.stream == b.stream && a.segments == b.segments;
    else return a.segments == b.segments;
  }));
  REQUIRE(s.complete_move(*t_up, false).has_value());
  REQUIRE(s.complete_move(*t_down, false).has_value());
  CHECK(s.check_invariants().empty());
}
TEST_CASE_TEMPLATE_INVOKE(grouped_copy_engine_conformance, metadata_fixture, host_fixture);

// --- negative cases ------------------------------------------------------------------------

namespace {

struct no_wait {
  struct event {};
  expected<event> submit(const move_ticket&) noexcept { return event{}; }
  bool query(event) const noexcept { return true; }
};
// query must say, without blocking, whether a job ran (the store completes copies by polling).
struct no_query {
  struct event {};
  expected<event> submit(const move_ticket&) noexcept { return event{}; }
  expected<void> wait(event) noexcept { return {}; }
};
// wait must report a failed copy, not swallow it.
struct wait_returns_void {
  struct event {};
  expected<event> submit(const move_ticket&) noexcept { return event{}; }
  bool query(event) const noexcept { return true; }
  void wait(event) noexcept {}
};
// submit must be able to refuse a ticket (bad pages) without throwing.
struct submit_returns_event {
  struct event {};
  event submit(const move_ticket&) noexcept { return {}; }
  bool query(event) const noexcept { return true; }
  expected<void> wait(event) noexcept { return {}; }
};
// wait must take what submit returned.
struct mismatched_event {
  struct event {};
  struct other {};
  expected<event> submit(const move_ticket&) noexcept { return event{}; }
  bool query(event) const noexcept { return true; }
  expected<void> wait(other) noexcept { return {}; }
};

}  // namespace

static_assert(!tier_copy_engine<no_wait>);
static_assert(!tier_copy_engine<no_query>);
static_assert(!tier_copy_engine<wait_returns_void>);
static_assert(!tier_copy_engine<submit_returns_event>);
static_assert(!tier_copy_engine<mismatched_event>);

namespace {
// Layer by layer needs both the non-blocking count and the blocking wait, over its own events.
struct count_only {
  struct event {};
  expected<event> submit(const move_ticket&) noexcept { return event{}; }
  bool query(event) const noexcept { return true; }
  expected<void> wait(event) noexcept { return {}; }
  std::int32_t landed_segments(event) const noexcept { return 1; }
};
struct wait_segments_void {
  struct event {};
  expected<event> submit(const move_ticket&) noexcept { return event{}; }
  bool query(event) const noexcept { return true; }
  expected<void> wait(event) noexcept { return {}; }
  std::int32_t landed_segments(event) const noexcept { return 1; }
  void wait_segments(event, std::int32_t) noexcept {}
};
}  // namespace
static_assert(!layered_copy_engine<count_only>);
static_assert(!layered_copy_engine<wait_segments_void>);
static_assert(tier_copy_engine<count_only> && !layered_copy_engine<no_wait>);

namespace {
// A group needs events of the engine's own type, written into the caller's span.
struct group_returns_events {
  struct event {};
  expected<event> submit(const move_ticket&) noexcept { return event{}; }
  bool query(event) const noexcept { return true; }
  expected<void> wait(event) noexcept { return {}; }
  std::int32_t landed_segments(event) const noexcept { return 1; }
  expected<void> wait_segments(event, std::int32_t) noexcept { return {}; }
  std::vector<event> submit_group(std::span<const move_ticket>) { return {}; }
};
}  // namespace
static_assert(layered_copy_engine<group_returns_events> && !grouped_copy_engine<group_returns_events>);
static_assert(!grouped_copy_engine<count_only>);
