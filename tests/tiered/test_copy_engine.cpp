// Host copy engine: data integrity, coalescing, hazards between the two streams, injected
// failures at every step of a move, and the randomized offload/load race test (suite
// "concurrency", run under TSan in CI).
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "hybridcache/tiered/host_copy_engine.hpp"
#include "hybridcache/model/presets.hpp"
#include "hybridcache/tiered/offload_engine.hpp"
#include "hybridcache/tiered/tiered_store.hpp"

using namespace hybridcache;
using namespace hybridcache::tiered;

namespace {
constexpr std::int64_t page = 4096;

std::vector<tier_config> tiers(std::int64_t hbm_pages, std::int64_t host_pages) {
  return {{.kind = tier_kind::hbm, .capacity_bytes = hbm_pages * page},
          {.kind = tier_kind::host, .capacity_bytes = host_pages * page, .numa_node = 0}};
}

std::byte pattern(entry_id id, std::int64_t i) { return static_cast<std::byte>((to_underlying(id) * 131 + static_cast<std::uint64_t>(i) * 7 + 3) & 0xff); }

/// The entry ids first, first + 1, ..., last.
std::vector<entry_id> id_range(std::uint64_t first, std::uint64_t last) {
  std::vector<entry_id> v;
  for (std::uint64_t n = first; n <= last; ++n) v.push_back(make_entry_id(n));
  return v;
}

/// Writes the entry's pattern into its (first) copy: valid or still being written.
template <class Store>
void fill(Store& s, host_copy_engine& e, entry_id id) {
  const auto row = s.find(id);
  REQUIRE(row);
  const tier_copy& c = row->copies.front();
  for (std::int64_t i = 0; i < c.bytes; ++i)
    e.base(c.tier)[static_cast<std::int64_t>(c.pages.page(i / page)) * page + i % page] = pattern(id, i);
}

/// Every valid copy of the entry (only the one in `only`, when given) holds its pattern.
/// Under concurrency, pass the tier the caller pinned: an unpinned copy may be dropped and
/// its pages refilled by another entry while it is read.
template <class Store>
bool intact(const Store& s, host_copy_engine& e, entry_id id, std::optional<tier_id> only = std::nullopt) {
  const auto row = s.find(id);
  if (!row || row->home() == nullptr) return false;
  for (const tier_copy& c : row->copies) {
    if (c.state != copy_state::valid || (only && c.tier != *only)) continue;
    for (std::int64_t i = 0; i < c.bytes; ++i)
      if (e.base(c.tier)[static_cast<std::int64_t>(c.pages.page(i / page)) * page + i % page] != pattern(id, i))
        return false;
  }
  return true;
}
}  // namespace

TEST_CASE("host copy engine: a demotion and a promotion carry the bytes, coalesced") {
  tiered_store<> s(tiers(16, 32), page);
  host_copy_engine e(tiers(16, 32), page, {.probe_bytes = 64 * 1024});
  CHECK(e.measured_gbps(tier_id{1}, copy_stream::offload) > 0.0);
  CHECK(e.measured_gbps(tier_id{1}, copy_stream::onboard) > 0.0);
  CHECK(e.measured_gbps(hbm_tier, copy_stream::offload) == 0.0);
  // Binding to node 0 is requested; containers may forbid mbind (seccomp), so only report it.
  MESSAGE("NUMA binding available: " << numa_binding_available() << ", host tier bound: " << e.numa_bound(tier_id{1}));
  CHECK_FALSE(e.numa_bound(hbm_tier));
  REQUIRE(s.insert(entry_id{1}, 5 * page - 17).has_value());
  fill(s, e, entry_id{1});
  (void)e.take_stats();
  REQUIRE(move_entry(s, e, entry_id{1}, tier_id{1}).has_value());
  CHECK(s.find(entry_id{1})->tier() == tier_id{1});
  CHECK(intact(s, e, entry_id{1}));
  auto st = e.take_stats();
  CHECK(st.jobs == 1);
  CHECK(st.transfers == 1);  // five adjacent pages in both tiers: one copy
  CHECK(st.bytes == 5 * page - 17);
  REQUIRE(move_entry(s, e, entry_id{1}, hbm_tier).has_value());
  CHECK(intact(s, e, entry_id{1}));
  CHECK(s.check_invariants().empty());
}

TEST_CASE("plan_copies merges only runs adjacent on both sides") {
  move_ticket t;
  t.src_bytes = t.dst_bytes = 5 * page;
  for (std::uint32_t p : {0, 1, 2, 7, 8}) t.src_pages.push_back({p, 1});
  for (std::uint32_t p : {3, 4, 9, 10, 11}) t.dst_pages.push_back({p, 1});
  const auto c = plan_copies(t, page);
  REQUIRE(c.size() == 3);
  CHECK(c[0].src_offset == 0);
  CHECK(c[0].dst_offset == 3 * page);
  CHECK(c[0].bytes == 2 * page);
  CHECK(c[1].src_offset == 2 * page);
  CHECK(c[1].bytes == page);
  CHECK(c[2].src_offset == 7 * page);
  CHECK(c[2].dst_offset == 10 * page);
  CHECK(c[2].bytes == 2 * page);
  CHECK(transfer_seconds(c, 50.0, 6e-6) == doctest::Approx(3 * 6e-6 + 5.0 * page / 50e9));
  t.dst_bytes = page + 5;  // sparsified: copies a compacted prefix
  const auto d = plan_copies(t, page);
  REQUIRE(d.size() == 1);  // pages 0,1 -> 3,4 are adjacent: one copy of the compacted prefix
  CHECK(d[0].bytes == page + 5);
  t.dst_pages.clear();
  t.dst_pages.push_back({5, 1});
  t.dst_pages.push_back({4, 1});
  CHECK(plan_copies(t, page).size() == 2);
}

TEST_CASE("host copy engine: jobs on the two streams respect read/write hazards per page") {
  // Random jobs between two arenas on both streams; the result must equal applying them in
  // submission order on a shadow copy (RAW, WAR and WAW across streams).
  const std::int64_t pages = 16;
  host_copy_engine e(tiers(pages, pages), page, {.measure_bandwidth = false});
  std::vector<std::vector<std::byte>> shadow(2, std::vector<std::byte>(static_cast<std::size_t>(pages * page)));
  std::mt19937_64 rng(7);
  for (std::uint8_t t = 0; t < 2; ++t)
    for (std::int64_t i = 0; i < pages * page; ++i) {
      const auto b = static_cast<std::byte>(rng() & 0xff);
      e.base(tier_id{t})[i] = b;
      shadow[t][static_cast<std::size_t>(i)] = b;
    }
  std::vector<copy_event> events;
  for (int j = 0; j < 400; ++j) {
    const tier_id src{static_cast<std::uint8_t>(rng() % 2)};
    const tier_id dst{static_cast<std::uint8_t>(1 - src.value)};
    const std::int64_t sp = static_cast<std::int64_t>(rng() % pages), dp = static_cast<std::int64_t>(rng() % pages);
    const std::int64_t n = 1 + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(std::min(pages - sp, pages - dp)));
    const copy_stream s = (rng() & 1) ? copy_stream::offload : copy_stream::onboard;
    auto ev = e.submit(src, dst, {{sp * page, dp * page, n * page}}, s);
    REQUIRE(ev.has_value());
    events.push_back(*ev);
    std::memmove(shadow[dst.value].data() + dp * page, shadow[src.value].data() + sp * page, static_cast<std::size_t>(n * page));
  }
  for (auto ev : events) CHECK(e.wait(ev).has_value());
  e.synchronize();
  for (std::uint8_t t = 0; t < 2; ++t) CHECK(std::memcmp(e.base(tier_id{t}), shadow[t].data(), shadow[t].size()) == 0);
  CHECK(e.submit(hbm_tier, tier_id{1}, {{0, pages * page, page}}, copy_stream::offload).error() == errc::invalid_argument);
  CHECK(e.submit(hbm_tier, tier_id{3}, {}, copy_stream::offload).error() == errc::invalid_argument);
}

TEST_CASE("host copy engine: stop runs every queued job, and a wait after it reports the real outcome (issue #15)") {
  // Before: the destructor stopped the workers with jobs still queued, and a thread blocked
  // in wait() returned success for a job that never ran (its bytes never copied).
  host_copy_engine e(tiers(8, 8), page, {.measure_bandwidth = false});
  for (std::int64_t i = 0; i < 8 * page; ++i) e.base(hbm_tier)[i] = static_cast<std::byte>((i * 13 + 5) & 0xff);
  e.set_fault_hook([](const copy_span&) {  // slow spans: jobs are still queued at stop()
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return false;
  });
  std::vector<copy_event> events;
  for (std::int64_t p = 0; p < 8; ++p) {
    auto ev = e.submit(hbm_tier, tier_id{1}, {{p * page, p * page, page}}, copy_stream::offload);
    REQUIRE(ev.has_value());
    events.push_back(*ev);
  }
  std::atomic<bool> waited_ok{false};
  std::thread waiter([&] { waited_ok = e.wait(events.back()).has_value(); });
  e.stop();
  waiter.join();
  CHECK(waited_ok.load());
  for (const auto ev : events) CHECK(e.wait(ev).has_value());
  CHECK(std::memcmp(e.base(hbm_tier), e.base(tier_id{1}), static_cast<std::size_t>(8 * page)) == 0);  // every job ran
  CHECK(e.submit(hbm_tier, tier_id{1}, {{0, 0, page}}, copy_stream::offload).error() == errc::busy);
  CHECK(e.wait(copy_event{copy_stream::onboard, 99}).error() == errc::busy);  // never issued: never runs
}

TEST_CASE("injected failures at every step of a move leave no entry half-moved") {
  // Steps of a move: prepare (destination full), submit (bad ticket), every copy span of
  // the job, and the success path. After each the entry is in exactly one tier, resident,
  // its bytes intact, and no page is lost or owned twice.
  for (int fail_at = -2; fail_at <= 3; ++fail_at) {
    CAPTURE(fail_at);
    tiered_store<> s(tiers(16, 8), page);
    host_copy_engine e(tiers(16, 8), page, {.measure_bandwidth = false});
    // Entry 1: 6 pages, laid out so its copy has 3 spans (pages 0,1 | 3,4 | 6,7 hold it).
    REQUIRE(s.insert(entry_id{10}, page).has_value());
    REQUIRE(s.insert(entry_id{1}, 2 * page).has_value());
    REQUIRE(s.insert(entry_id{11}, page).has_value());
    REQUIRE(s.insert(entry_id{12}, 2 * page).has_value());
    REQUIRE(s.insert(entry_id{13}, page).has_value());
    REQUIRE(s.insert(entry_id{14}, 2 * page).has_value());
    REQUIRE(s.erase(entry_id{1}).has_value());
    REQUIRE(s.erase(entry_id{12}).has_value());
    REQUIRE(s.erase(entry_id{14}).has_value());
    REQUIRE(s.insert(entry_id{15}, 7 * page).has_value());  // the tail: only the three holes stay free
    REQUIRE(s.insert(entry_id{1}, 6 * page).has_value());
    REQUIRE(s.find(entry_id{1})->home()->pages.runs().size() == 3);
    fill(s, e, entry_id{1});
    const auto spans_before = s.find(entry_id{1})->home()->pages;
    if (fail_at == -2) REQUIRE(s.insert(entry_id{99}, 4 * page, tier_id{1}).has_value());  // host too full
    int span = 0;
    e.set_fault_hook([&](const copy_span&) { return span++ == fail_at; });
    auto r = fail_at == -1 ? [&] {
      // submit fails: a ticket naming pages outside the arena.
      auto t = s.prepare_move(entry_id{1}, tier_id{1});
      REQUIRE(t.has_value());
      auto bad = *t;
      bad.dst_pages = bad.dst_pages.slice(0, bad.dst_pages.size() - 1);
      bad.dst_pages.push_back({1000, 1});
      auto ev = e.submit(bad);
      CHECK(ev.error() == errc::invalid_argument);
      return s.complete_move(*t, false).has_value() ? expected<void>(unexpected(errc::invalid_argument)) : expected<void>{};
    }()
                           : move_entry(s, e, entry_id{1}, tier_id{1});
    const bool should_succeed = fail_at == 3;
    CHECK(r.has_value() == should_succeed);
    const auto row = s.find(entry_id{1});
    REQUIRE(row);
    CHECK(row->copies.size() == 1);
    CHECK(row->copies.front().idle());
    CHECK(row->tier() == (should_succeed ? tier_id{1} : hbm_tier));
    if (!should_succeed) CHECK(row->home()->pages == spans_before);
    CHECK(intact(s, e, entry_id{1}));
    CHECK(s.check_invariants().empty());
    CHECK(s.usage(tier_id{1}).used_bytes == (should_succeed ? 6 : 0) * page + (fail_at == -2 ? 4 * page : 0));
    // And the entry can still move afterwards.
    e.set_fault_hook({});
    if (!should_succeed && fail_at != -2) {
      REQUIRE(move_entry(s, e, entry_id{1}, tier_id{1}).has_value());
      CHECK(intact(s, e, entry_id{1}));
    }
  }
}

TEST_CASE("offload engine: watermarks with hysteresis, victims by score, cascade and drop") {
  tiered_store<car_score_demotion> s(tiers(10, 4), page);
  host_copy_engine e(tiers(10, 4), page, {.measure_bandwidth = false});
  offload_engine off(s, e, {.high = 0.9, .low = 0.5});
  for (const entry_id id : id_range(1, 8)) {
    REQUIRE(s.insert(id, page).has_value());
    REQUIRE(s.add_score(id, static_cast<double>(10 - to_underlying(id))).has_value());  // id 8 has the lowest score
    fill(s, e, id);
  }
  CHECK(off.run_once() == 0);  // 80 % < 90 %
  REQUIRE(s.insert(entry_id{9}, page).has_value());
  fill(s, e, entry_id{9});
  REQUIRE(s.add_score(entry_id{9}, 100).has_value());
  CHECK(off.above_high());
  CHECK(off.run_once() == 4 * page);  // 9 pages -> 5 pages (50 %)
  for (const entry_id id : id_range(5, 8)) CHECK(s.find(id)->tier() == tier_id{1});
  for (const entry_id id : id_range(1, 4)) CHECK(s.find(id)->tier() == hbm_tier);
  // Host is full now (4 pages): the next pass drops host victims (LRU-free: lowest score).
  for (const entry_id id : id_range(20, 23)) {
    REQUIRE(s.insert(id, page).has_value());
    fill(s, e, id);
  }
  CHECK(off.run_once() > 0);
  CHECK(off.stats().dropped_entries > 0);
  CHECK(s.check_invariants().empty());
  std::vector<entry_id> ids;
  s.for_each([&](const cache_entry& row) { ids.push_back(row.id); });
  for (auto id : ids) CHECK(intact(s, e, id));
  CHECK_THROWS_AS((offload_engine<tiered_store<car_score_demotion>, host_copy_engine>(s, e, {.high = 0.5, .low = 0.6})),
                  invalid_argument);
}

TEST_CASE("offload engine with sparsify_on_demotion stores fewer bytes; checkpoints kept whole") {
  const cost_model m(presets::jamba_1_5_mini());
  const std::int64_t pg = 1 << 20, tokens = 2048;
  const std::int64_t full = m.kv_bytes(tokens) + m.ssm_checkpoint_bytes();
  const std::int64_t hbm_pages = 4 * ((full + pg - 1) / pg);
  const std::vector<tier_config> t = {{.kind = tier_kind::hbm, .capacity_bytes = hbm_pages * pg},
                                      {.kind = tier_kind::host, .capacity_bytes = 8 * hbm_pages * pg}};
  tiered_store<> s(t, pg);
  host_copy_engine e(t, pg, {.measure_bandwidth = false});
  const sparsify_on_demotion sizer(m, sparsity_profile::car_linear(m.attention_layers()));
  offload_engine off(s, e, {.high = 0.7, .low = 0.3}, sizer);
  for (const entry_id id : id_range(1, 3)) REQUIRE(s.insert(id, full, hbm_tier, {.prefix_begin = 0, .prefix_end = tokens, .has_checkpoint = true}).has_value());
  CHECK(off.run_once() > 0);
  const auto st = off.stats();
  CHECK(st.demoted_entries >= 2);
  const std::int64_t keep = sparsified_node_bytes(m, sparsity_profile::car_linear(m.attention_layers()), tokens, true);
  CHECK(keep < full);
  CHECK(keep > m.ssm_checkpoint_bytes());
  CHECK(st.demoted_bytes == st.demoted_entries * keep);
  CHECK(st.sparsified_bytes == st.demoted_entries * (full - keep));
  s.for_each([&](const cache_entry& row) { CHECK(row.bytes() == (row.tier() == hbm_tier ? full : keep)); });
  CHECK(s.check_invariants().empty());
  cache_entry small;
  small.copies.push_back(tier_copy{.bytes = 10});
  small.info = {0, tokens, true};
  CHECK(sizer.stored_bytes(small) == 10);  // never grows
  CHECK(keep_size{}.stored_bytes(small) == 10);
  CHECK_THROWS_AS(sparsify_on_demotion(m, sparsity_profile::car_linear(2)), invalid_argument);
}

namespace {
// Copies complete at once, except those of the entries in `failing`, which always fail.
struct failing_copies {
  std::set<entry_id> failing;
  std::vector<entry_id> attempts;
  expected<entry_id> submit(const move_ticket& t) {
    attempts.push_back(t.id);
    return t.id;
  }
  [[nodiscard]] bool query(entry_id) const { return true; }
  expected<void> wait(entry_id id) {
    if (failing.count(id)) return unexpected(errc::busy);
    return {};
  }
  [[nodiscard]] std::int64_t tries(entry_id id) const { return std::count(attempts.begin(), attempts.end(), id); }
};
}  // namespace

TEST_CASE("offload engine: a victim whose copy keeps failing is skipped; the pass demotes the next ones") {
  // HBM 10 pages, 100 % full with 1-page entries; entry 1 is the first victim (LRU) and
  // its copy always fails. The pass must try it once and demote 2 and 3 (down to 80 %).
  tiered_store<> s(tiers(10, 100), page);
  failing_copies e;
  e.failing = {entry_id{1}};
  offload_engine off(s, e);
  for (const entry_id id : id_range(1, 10)) REQUIRE(s.insert(id, page).has_value());
  CHECK(off.run_once() == 2 * page);
  CHECK(e.tries(entry_id{1}) == 1);
  CHECK(s.usage(hbm_tier).used_bytes == 8 * page);
  CHECK(s.find(entry_id{1})->tier() == hbm_tier);
  CHECK(s.find(entry_id{1})->copies.size() == 1);
  CHECK(s.find(entry_id{2})->tier() == tier_id{1});
  CHECK(s.find(entry_id{3})->tier() == tier_id{1});
  CHECK(off.stats().failed_moves == 1);
  CHECK(off.stats().demoted_entries == 2);
  // The next pass (above the high watermark again) starts afresh: 1 is retried once, and
  // still does not block the others.
  REQUIRE(s.insert(entry_id{11}, page).has_value());
  REQUIRE(s.insert(entry_id{12}, page).has_value());
  CHECK(off.run_once() == 2 * page);
  CHECK(e.tries(entry_id{1}) == 2);
  CHECK(s.find(entry_id{4})->tier() == tier_id{1});
  CHECK(s.find(entry_id{5})->tier() == tier_id{1});
  CHECK(s.check_invariants().empty());
}

TEST_CASE("offload engine: nothing is dropped from the host tier for a victim it cannot take") {
  failing_copies e;
  SUBCASE("the victim is larger than the whole host tier") {
    // Host: 20 pages holding 5 one-page entries. HBM: entry 1 (30 pages, the first
    // victim) then 60 one-page entries: 90 %. Entry 1 can never go down; the pass skips it
    // and demotes ten one-page entries into the free host pages.
    tiered_store<> s(tiers(100, 20), page);
    offload_engine off(s, e);
    for (const entry_id id : id_range(100, 104)) REQUIRE(s.insert(id, page, tier_id{1}).has_value());
    REQUIRE(s.insert(entry_id{1}, 30 * page).has_value());
    for (const entry_id id : id_range(2, 61)) REQUIRE(s.insert(id, page).has_value());
    CHECK(off.run_once() == 10 * page);
    CHECK(off.stats().dropped_entries == 0);
    for (const entry_id id : id_range(100, 104)) CHECK(s.contains(id));
    CHECK(s.find(entry_id{1})->tier() == hbm_tier);
    CHECK(e.tries(entry_id{1}) == 0);
    CHECK(s.usage(hbm_tier).used_bytes == 80 * page);
    CHECK(s.check_invariants().empty());
  }
  SUBCASE("the host tier's other entries are pinned") {
    // Host: 10 pages, full: entry 100 (6 pages, pinned by a request) and four evictable
    // one-page entries. Every HBM victim needs 5 pages; dropping all four evictable host
    // entries would still leave only 4: nothing may be dropped and nothing moves.
    tiered_store<> s(tiers(100, 10), page);
    offload_engine off(s, e);
    REQUIRE(s.insert(entry_id{100}, 6 * page, tier_id{1}).has_value());
    REQUIRE(s.pin(entry_id{100}).has_value());
    for (const entry_id id : id_range(101, 104)) REQUIRE(s.insert(id, page, tier_id{1}).has_value());
    for (const entry_id id : id_range(1, 18)) REQUIRE(s.insert(id, 5 * page).has_value());  // 90 %
    CHECK(off.run_once() == 0);
    CHECK(off.stats().dropped_entries == 0);
    for (const entry_id id : id_range(100, 104)) CHECK(s.contains(id));
    CHECK(e.attempts.empty());
    CHECK(s.usage(hbm_tier).used_bytes == 90 * page);
    CHECK(s.check_invariants().empty());
  }
}

TEST_CASE("concurrency: entries are never lost or duplicated under concurrent offload and load threads" *
          doctest::test_suite("concurrency")) {
  tiered_store<> s(tiers(48, 96), page);
  host_copy_engine e(tiers(48, 96), page, {.measure_bandwidth = false});
  offload_engine off(s, e, {.high = 0.9, .low = 0.6});
  std::atomic<bool> go{true};
  std::atomic<std::int64_t> inserted{0}, erased{0}, loads{0};
  std::atomic<std::uint64_t> frontier{1};  // most recent id inserted: loaders look just behind it
    off.start(std::chrono::microseconds(200));
  auto inserter = [&](std::uint64_t first) {
    std::mt19937_64 rng(first);
    for (std::uint64_t n = first; go.load(); n += 4) {
      if (n > first + 4 * 3000) break;
      const entry_id id = make_entry_id(n);
      const std::int64_t bytes = page * (1 + static_cast<std::int64_t>(rng() % 3));
      if (s.insert(id, bytes, hbm_tier, {}, /*writing=*/true).has_value()) {
        // Inserted as writing: nobody reads or copies the bytes before they are published.
        fill(s, e, id);
        REQUIRE(s.publish(id).has_value());
        inserted += 1;
        frontier.store(n);
        off.notify();
      } else {
        off.notify();  // HBM full: back off and let the offloader make room
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      if (rng() % 5 == 0) {
        const entry_id victim = make_entry_id(first + 4 * (rng() % ((n - first) / 4 + 1)));
        if (s.erase(victim).has_value()) erased += 1;
      }
    }
  };
  auto loader = [&](std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    while (go.load()) {
      const std::uint64_t f = frontier.load(), back = rng() % 300;
      const entry_id id = make_entry_id(f > back ? f - back : 1);
      const auto where = s.locate(id);
      if (!where) {
        std::this_thread::yield();
        continue;
      }
      if (where->first == tier_id{1}) {
        if (move_entry(s, e, id, hbm_tier).has_value()) loads += 1;  // promotion
      } else if (s.pin_in(id, hbm_tier).has_value()) {  // a hit in HBM, pinned there atomically
        CHECK(intact(s, e, id, hbm_tier));
        (void)s.unpin_in(id, hbm_tier);
      }
    }
  };
  std::vector<std::thread> th;
  th.emplace_back(inserter, 1);
  th.emplace_back(inserter, 2);
  th.emplace_back(loader, 11);
  th.emplace_back(loader, 12);
  th[0].join();
  th[1].join();
  go = false;
  th[2].join();
  th[3].join();
  off.stop();
  e.synchronize();
  CHECK(s.check_invariants().empty());
  const auto dropped = off.stats().dropped_entries;
  CHECK(static_cast<std::int64_t>(s.size()) == inserted.load() - erased.load() - dropped);
  std::int64_t bad = 0;
  std::vector<entry_id> ids;
  s.for_each([&](const cache_entry& row) {
    for (const auto& c : row.copies) bad += !c.idle();
    ids.push_back(row.id);
  });
  for (auto id : ids) bad += !intact(s, e, id) ? 1 : 0;
  CHECK(bad == 0);
  CHECK(off.stats().demoted_entries > 0);
  MESSAGE("inserted " << inserted.load() << ", promotions " << loads.load() << ", demotions "
                      << off.stats().demoted_entries << ", dropped " << dropped);
}
