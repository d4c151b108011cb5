// Tiers, the page-state machine, the cache table and the demotion scorers.
#include <doctest/doctest.h>

#include <algorithm>
#include <limits>
#include <map>
#include <random>
#include <set>

#include "hybridcache/model/presets.hpp"
#include "hybridcache/tiered/demotion_policy.hpp"
#include "hybridcache/tiered/page_state.hpp"
#include "hybridcache/tiered/scheduler.hpp"
#include "hybridcache/tiered/tier.hpp"
#include "hybridcache/tiered/tiered_store.hpp"

using namespace hybridcache;
using namespace hybridcache::tiered;

namespace {
std::vector<tier_config> two_tiers(std::int64_t hbm, std::int64_t host) {
  return {{.kind = tier_kind::hbm, .capacity_bytes = hbm}, {.kind = tier_kind::host, .capacity_bytes = host}};
}
}  // namespace

TEST_CASE("parse_tiers reads kinds, units, NUMA nodes and link bandwidth") {
  const auto t = parse_tiers("hbm=16GiB,host@1=64GB,cxl=1.5TiB", 4096, 25.0);
  REQUIRE(t.size() == 3);
  CHECK(t[0].kind == tier_kind::hbm);
  CHECK(t[0].capacity_bytes == std::int64_t{16} << 30);
  CHECK(t[1].kind == tier_kind::host);
  CHECK(t[1].capacity_bytes == 64'000'000'000);
  CHECK(t[1].numa_node == 1);
  CHECK(t[1].link_gbps == 25.0);
  CHECK(t[2].kind == tier_kind::cxl);
  CHECK(t[2].capacity_bytes == static_cast<std::int64_t>(1.5 * 1099511627776.0));
  CHECK(parse_tiers("hbm=8192", 4096).size() == 1);
  CHECK(parse_tiers("hbm=4KB,host=2MiB", 4000)[0].capacity_bytes == 4000);
  CHECK(parse_tiers("hbm=1e9,host=2.5e9", 4096)[1].capacity_bytes == 2'500'000'000);  // the one grammar
}

TEST_CASE("parse_tiers rejects bad input with clear errors") {
  auto msg = [](auto&& f) {
    try {
      f();
    } catch (const invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(msg([] { (void)parse_tiers("hbm=0,host=1GiB", 4096); }).find("must be > 0") != std::string::npos);
  CHECK(msg([] { (void)parse_tiers("hbm=1GiB,host=0", 4096); }).find("tier 1 (host)") != std::string::npos);
  CHECK(msg([] { (void)parse_tiers("hbm=1GiB,host=100", 4096); }).find("smaller than one page") != std::string::npos);
  CHECK(msg([] { (void)parse_tiers("hbm=1GiB,host=1GiB", 4096, 0.0); }).find("bandwidth") != std::string::npos);
  CHECK(msg([] { (void)parse_tiers("host=1GiB", 4096); }).find("first tier must be hbm") != std::string::npos);
  CHECK(msg([] { (void)parse_tiers("hbm=1GiB,hbm=1GiB", 4096); }).find("only the first") != std::string::npos);
  CHECK(msg([] { (void)parse_tiers("hbm=1GiB,tape=1GiB", 4096); }).find("unknown tier kind") != std::string::npos);
  CHECK(msg([] { (void)parse_tiers("hbm=1XB", 4096); }).find("unknown unit") != std::string::npos);
  CHECK(msg([] { (void)parse_tiers("hbm=GiB", 4096); }).find("not a size") != std::string::npos);
  CHECK(msg([] { (void)parse_tiers("", 4096); }).find("kind=SIZE") != std::string::npos);
  CHECK(msg([] { (void)parse_tiers("hbm=1GiB,", 4096); }).find("kind=SIZE") != std::string::npos);
  CHECK(msg([] { (void)parse_tiers("hbm@0=1GiB", 4096); }).find("NUMA") != std::string::npos);
  CHECK_THROWS_AS((void)parse_tiers("hbm=99999999TiB", 4096), overflow_error);
  CHECK_THROWS_AS(tiered_store<>(two_tiers(4096, 0), 4096), invalid_argument);
  CHECK_THROWS_AS(tiered_store<>(two_tiers(4096, 8192), 0), invalid_argument);
  auto t = two_tiers(1 << 20, 1 << 20);
  t[1].link_gbps = 0.0;
  CHECK_THROWS_AS(tiered_store<>(t, 4096), invalid_argument);
}

TEST_CASE("parse_tiers: sizes are exact, in the one byte-size grammar (core/byte_size.hpp)") {
  // A binary double holds neither 4.1 nor 2.45: the product was truncated one byte short.
  auto size = [](const char* spec) { return parse_tiers(spec, 1)[0].capacity_bytes; };
  CHECK(size("hbm=4.1GB") == 4'100'000'000);
  CHECK(size("hbm=2.45KB") == 2450);
  CHECK(size("hbm=1.001KB") == 1001);
  CHECK(size("hbm=2.097152MB") == 2'097'152);
  CHECK(size("hbm=1.5TiB") == (std::int64_t{3} << 39));
  CHECK(size("hbm=.5KB") == 500);
  CHECK(size("hbm=3.") == 3);
  CHECK(size("hbm=9223372036854775807") == std::numeric_limits<std::int64_t>::max());
  CHECK(size("hbm=8388607.75TiB") == (std::int64_t{8388607} << 40) + (std::int64_t{3} << 38));
  CHECK_THROWS_AS((void)size("hbm=9223372036854775808"), overflow_error);
  CHECK_THROWS_AS((void)size("hbm=8388608TiB"), overflow_error);  // 2^63
  CHECK_THROWS_AS((void)size("hbm=99999999999999999999999"), overflow_error);
  // What the old tier parser rounded to the nearest byte, or read as a bare K, is an error.
  for (const char* spec : {"hbm=1.0005KB", "hbm=1.0004999KB", "hbm=0.000000000000000000000001GiB",
                           "hbm=1.999999999999999999999999KiB", "hbm=8388607.999999TiB", "hbm=0.29K", "hbm=.5K",
                           "hbm=4K", "hbm=64Gi"}) {
    CAPTURE(spec);
    CHECK_THROWS_AS((void)size(spec), invalid_argument);
  }
  auto msg = [](const char* spec) {
    try {
      (void)parse_tiers(spec, 1);
    } catch (const invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(msg("hbm=1.0005KB").find("tiers: item 0 'hbm=1.0005KB': size '1.0005KB': not a whole number of bytes") !=
        std::string::npos);
  CHECK(msg("hbm=4K").find("write KB (10^3) or KiB (2^10)") != std::string::npos);
  CHECK(parse_tiers("hbm=4.1GB,host=2.45TB", 4096)[1].capacity_bytes == 2'450'000'000'000);
  CHECK_THROWS_AS((void)parse_tiers("hbm=1.2.3GB", 4096), invalid_argument);
  CHECK_THROWS_AS((void)parse_tiers("hbm=.", 4096), invalid_argument);
}

TEST_CASE("copy state machine: exactly the documented transitions are allowed") {
  using S = copy_state;
  using E = page_event;
  const std::set<std::tuple<S, E, S>> allowed = {
      {S::valid, E::pin, S::valid},           {S::valid, E::unpin, S::valid},
      {S::valid, E::read_begin, S::valid},    {S::valid, E::read_end, S::valid},
      {S::valid, E::drop, S::valid},          {S::filling, E::complete_ok, S::valid},
      {S::filling, E::complete_fail, S::filling}, {S::writing, E::publish, S::valid},
      {S::writing, E::drop, S::writing},
  };
  int n_allowed = 0;
  for (auto s : {S::valid, S::filling, S::writing})
    for (auto e : {E::pin, E::unpin, E::read_begin, E::read_end, E::complete_ok, E::complete_fail, E::drop, E::publish}) {
      const auto t = next_state(s, e);
      CAPTURE(to_string(s));
      CAPTURE(to_string(e));
      bool listed = false;
      for (const auto& [a, b, c] : allowed)
        if (a == s && b == e) {
          listed = true;
          CHECK(t.to == c);
        }
      CHECK(t.allowed == listed);
      n_allowed += t.allowed;
    }
  CHECK(n_allowed == 9);
  tier_copy c;
  CHECK(c.idle());
  c.pins = 1;
  CHECK_FALSE(c.idle());
  c.pins = 0;
  c.readers = 1;
  CHECK_FALSE(c.idle());
  c.readers = 0;
  c.state = S::filling;
  CHECK_FALSE(c.idle());
}

TEST_CASE("store: a writing entry is invisible to readers and movers until published") {
  tiered_store<> s(two_tiers(8 * 4096, 8 * 4096), 4096);
  REQUIRE(s.insert(entry_id{1}, 4096, hbm_tier, {}, true).has_value());
  CHECK(s.find(entry_id{1})->copies.front().state == copy_state::writing);
  CHECK(s.pin(entry_id{1}).error() == errc::busy);
  CHECK(s.pin_in(entry_id{1}, hbm_tier).error() == errc::busy);
  CHECK(s.prepare_move(entry_id{1}, tier_id{1}).error() == errc::busy);
  CHECK(s.prepare_copy(entry_id{1}, hbm_tier, tier_id{1}).error() == errc::busy);
  CHECK_FALSE(s.victim(hbm_tier).has_value());
  CHECK(s.usage(hbm_tier).evictable_bytes == 0);
  CHECK(s.check_invariants().empty());
  REQUIRE(s.publish(entry_id{1}).has_value());
  CHECK(s.publish(entry_id{1}).error() == errc::invalid_argument);
  CHECK(s.victim(hbm_tier) == entry_id{1});
  REQUIRE(s.insert(entry_id{2}, 4096, hbm_tier, {}, true).has_value());
  REQUIRE(s.erase(entry_id{2}).has_value());  // the writer aborts
  CHECK(s.check_invariants().empty());
}

TEST_CASE("store: a copy in flight leaves its source readable and its destination invisible (issue #15)") {
  // Before: a moving entry could not be pinned, so a hit on an entry being offloaded was
  // lost. Now the source stays valid and pinnable; only its drop waits for the copy.
  tiered_store<> s(two_tiers(8 * 4096, 16 * 4096), 4096);
  REQUIRE(s.insert(entry_id{1}, 3 * 4096).has_value());
  REQUIRE(s.insert(entry_id{2}, 4096).has_value());
  auto t = s.prepare_move(entry_id{1}, tier_id{1});
  REQUIRE(t.has_value());
  CHECK(t->src_pages.size() == 3);
  CHECK(t->dst_pages.size() == 3);
  CHECK(t->drop_source);
  CHECK(s.find(entry_id{1})->valid_in_gpu());                   // readable
  REQUIRE(s.pin_in(entry_id{1}, hbm_tier).has_value());         // a hit reads it meanwhile
  CHECK(s.pin_in(entry_id{1}, tier_id{1}).error() == errc::busy);  // the destination is invisible
  CHECK(s.erase(entry_id{1}).error() == errc::busy);
  CHECK(s.prepare_move(entry_id{1}, tier_id{1}).error() == errc::busy);  // one copy per tier
  CHECK(s.victim(hbm_tier) == entry_id{2});
  CHECK(s.usage(hbm_tier).used_bytes == 4 * 4096);  // source still held while copying
  CHECK(s.usage(tier_id{1}).used_bytes == 3 * 4096);
  CHECK(s.check_invariants().empty());
  // A forged ticket is refused; the real one completes.
  auto forged = *t;
  forged.seq += 1;
  CHECK(s.complete_move(forged, true).error() == errc::stale_handle);
  REQUIRE(s.complete_move(*t, true).has_value());
  CHECK(s.complete_move(*t, true).error() == errc::stale_handle);  // twice
  // The pinned source stayed: a clean replica above the new home.
  auto row = s.find(entry_id{1});
  REQUIRE(row->copies.size() == 2);
  CHECK(row->tier() == hbm_tier);
  CHECK(row->clean_below(hbm_tier));
  REQUIRE(s.unpin_in(entry_id{1}, hbm_tier).has_value());
  REQUIRE(s.drop_copy(entry_id{1}, hbm_tier).has_value());  // free: a valid copy is below
  CHECK(s.find(entry_id{1})->tier() == tier_id{1});
  CHECK(s.usage(hbm_tier).used_bytes == 4096);
  CHECK(s.check_invariants().empty());
  // Failed move: stays put, destination released.
  auto back = s.prepare_move(entry_id{1}, hbm_tier);
  REQUIRE(back.has_value());
  REQUIRE(s.complete_move(*back, false).has_value());
  CHECK(s.find(entry_id{1})->tier() == tier_id{1});
  CHECK(s.find(entry_id{1})->copies.size() == 1);
  CHECK(s.usage(hbm_tier).used_bytes == 4096);
  CHECK(s.check_invariants().empty());
  // An unpinned move drops its source when it lands.
  auto down = s.prepare_move(entry_id{2}, tier_id{1});
  REQUIRE(down.has_value());
  REQUIRE(s.complete_move(*down, true).has_value());
  CHECK(s.find(entry_id{2})->copies.size() == 1);
  CHECK(s.find(entry_id{2})->tier() == tier_id{1});
  // Pins: counted per copy.
  REQUIRE(s.pin(entry_id{2}).has_value());
  REQUIRE(s.pin(entry_id{2}).has_value());
  CHECK_FALSE(s.victim(tier_id{1}) == entry_id{2});
  REQUIRE(s.unpin(entry_id{2}).has_value());
  CHECK(s.find(entry_id{2})->copies.front().pins == 1);
  REQUIRE(s.unpin(entry_id{2}).has_value());
  CHECK(s.unpin(entry_id{2}).error() == errc::invalid_argument);
  CHECK(s.check_invariants().empty());
}

TEST_CASE("store: pin_in pins the copy of one tier atomically, never a copy elsewhere (issue #15)") {
  // Before: pin() took any tier, so a caller that located an entry in HBM and then pinned it
  // pinned the host copy the offloader had just moved it to, and read freed HBM pages.
  tiered_store<> s(two_tiers(8 * 4096, 8 * 4096), 4096);
  REQUIRE(s.insert(entry_id{1}, 2 * 4096).has_value());
  const auto where = s.locate(entry_id{1});
  REQUIRE(where->first == hbm_tier);
  auto t = s.prepare_move(entry_id{1}, tier_id{1});  // the offloader, between locate and pin
  REQUIRE(s.complete_move(*t, true).has_value());
  CHECK(s.pin_in(entry_id{1}, where->first).error() == errc::busy);  // not in HBM any more
  CHECK(s.find(entry_id{1})->copies.front().pins == 0);
  REQUIRE(s.pin_in(entry_id{1}, tier_id{1}).has_value());
  CHECK(s.prepare_move(entry_id{1}, hbm_tier).has_value());  // readable (and copyable) while pinned
  CHECK(s.pin_in(entry_id{9}, hbm_tier).error() == errc::not_found);
}

TEST_CASE("store: a promoted entry is recent, not the next HBM victim (issue #15)") {
  tiered_store<> s(two_tiers(8 * 4096, 8 * 4096), 4096);
  REQUIRE(s.insert(entry_id{1}, 4096, tier_id{1}).has_value());  // old, in host
  REQUIRE(s.insert(entry_id{2}, 4096).has_value());
  REQUIRE(s.insert(entry_id{3}, 4096).has_value());
  auto up = s.prepare_move(entry_id{1}, hbm_tier);
  REQUIRE(s.complete_move(*up, true).has_value());
  CHECK(s.victim(hbm_tier) == entry_id{2});  // before the fix: 1, promoted with its old recency
}

TEST_CASE("store: clean replicas, drops and extracts") {
  tiered_store<> s(two_tiers(16 * 4096, 16 * 4096), 4096);
  // An entry of 3 layer segments of 2 pages each.
  REQUIRE(s.insert(entry_id{1}, 6 * 4096, hbm_tier, {0, 6, false}, false, 3).has_value());
  CHECK(s.insert(entry_id{2}, 5 * 4096, hbm_tier, {}, false, 3).error() == errc::invalid_argument);
  auto r = s.prepare_copy(entry_id{1}, hbm_tier, tier_id{1});
  REQUIRE(r.has_value());
  CHECK_FALSE(r->drop_source);
  CHECK(s.drop_copy(entry_id{1}, hbm_tier).error() == errc::busy);  // read by the copy
  REQUIRE(s.complete_move(*r, true).has_value());
  auto row = s.find(entry_id{1});
  REQUIRE(row->copies.size() == 2);
  CHECK(row->clean_below(hbm_tier));
  CHECK_FALSE(row->clean_below(tier_id{1}));
  CHECK(s.usage(tier_id{1}).evictable_bytes == 6 * 4096);
  // Extract the second page of every segment from the host copy into a new HBM entry.
  auto x = s.prepare_extract(entry_id{1}, tier_id{1}, {1, 1}, entry_id{5}, hbm_tier);
  REQUIRE(x.has_value());
  CHECK(x->segments == 3);
  CHECK(x->src_pages.size() == 3);
  const auto host = row->in(tier_id{1})->pages;
  CHECK(x->src_pages.page(0) == host.page(1));
  CHECK(x->src_pages.page(1) == host.page(3));
  CHECK(x->src_pages.page(2) == host.page(5));
  CHECK(s.pin_in(entry_id{5}, hbm_tier).error() == errc::busy);  // filling
  CHECK(s.drop_copy(entry_id{1}, tier_id{1}).error() == errc::busy);  // read by the extract
  CHECK(s.check_invariants().empty());
  REQUIRE(s.complete_move(*x, true).has_value());
  CHECK(s.find(entry_id{5})->bytes() == 3 * 4096);
  CHECK(s.prepare_extract(entry_id{1}, tier_id{1}, {1, 2}, entry_id{6}, hbm_tier).error() == errc::invalid_argument);
  CHECK(s.prepare_extract(entry_id{1}, tier_id{1}, {0, 1}, entry_id{5}, hbm_tier).error() == errc::invalid_argument);
  // A failed extract leaves no entry behind.
  auto y = s.prepare_extract(entry_id{1}, hbm_tier, {0, 2}, entry_id{7}, tier_id{1});
  REQUIRE(y.has_value());
  REQUIRE(s.complete_move(*y, false).has_value());
  CHECK_FALSE(s.contains(entry_id{7}));
  // Dropping copies: the entry goes with its last.
  REQUIRE(s.drop_copy(entry_id{1}, hbm_tier).has_value());
  REQUIRE(s.drop_copy(entry_id{1}, tier_id{1}).has_value());
  CHECK_FALSE(s.contains(entry_id{1}));
  CHECK(s.drop_copy(entry_id{1}, tier_id{1}).error() == errc::not_found);
  CHECK(s.check_invariants().empty());
}

TEST_CASE("store: bad calls leave the table unchanged") {
  tiered_store<> s(two_tiers(4 * 4096, 4 * 4096), 4096);
  REQUIRE(s.insert(entry_id{7}, 2 * 4096).has_value());
  const auto before = s.usage(hbm_tier);
  CHECK(s.insert(entry_id{7}, 4096).error() == errc::invalid_argument);         // duplicate
  CHECK(s.insert(entry_id{8}, 0).error() == errc::invalid_argument);            // empty
  CHECK(s.insert(entry_id{8}, 4096, tier_id{5}).error() == errc::invalid_argument);
  CHECK(s.insert(entry_id{8}, 3 * 4096).error() == errc::out_of_capacity);      // does not evict
  CHECK(s.prepare_move(entry_id{7}, hbm_tier).error() == errc::invalid_argument);
  CHECK(s.prepare_move(entry_id{7}, tier_id{1}, 3 * 4096).error() == errc::invalid_argument);
  CHECK(s.prepare_move(entry_id{99}, tier_id{1}).error() == errc::not_found);
  CHECK(s.erase(entry_id{99}).error() == errc::not_found);
  CHECK(s.usage(hbm_tier).used_bytes == before.used_bytes);
  CHECK(s.size() == 1);
  CHECK(s.check_invariants().empty());
  // Dry run: fits after evicting 7, not beyond capacity; nothing changes.
  CHECK(s.would_fit(hbm_tier, 4 * 4096));
  CHECK_FALSE(s.would_fit(hbm_tier, 5 * 4096));
  REQUIRE(s.pin(entry_id{7}).has_value());
  CHECK_FALSE(s.would_fit(hbm_tier, 3 * 4096));
  CHECK(s.would_fit(hbm_tier, 2 * 4096));
  CHECK(s.find(entry_id{7})->copies.front().pins == 1);
}

TEST_CASE("store: sizes up to INT64_MAX are refused without overflow; nothing changes") {
  constexpr std::int64_t max = std::numeric_limits<std::int64_t>::max();
  tiered_store<> s(two_tiers(10 * 4096, 100 * 4096), 4096);
  CHECK(s.pages_for(max) == max / 4096 + 1);
  CHECK(s.pages_for(max - 100) == (max - 100) / 4096 + 1);
  CHECK(s.pages_for(4096) == 1);
  CHECK(s.pages_for(4097) == 2);
  CHECK(s.pages_for(0) == 0);
  CHECK(s.pages_for(-5) == 0);
  REQUIRE(s.insert(entry_id{7}, 2 * 4096).has_value());
  CHECK(s.insert(entry_id{1}, max).error() == errc::out_of_capacity);
  CHECK(s.insert(entry_id{1}, max - 100).error() == errc::out_of_capacity);
  CHECK(s.insert(entry_id{1}, max, tier_id{1}).error() == errc::out_of_capacity);
  CHECK(s.insert(entry_id{1}, -1).error() == errc::invalid_argument);
  CHECK(s.insert(entry_id{1}, std::numeric_limits<std::int64_t>::min()).error() == errc::invalid_argument);
  CHECK(s.prepare_move(entry_id{7}, tier_id{1}, max).error() == errc::invalid_argument);
  CHECK(s.prepare_move(entry_id{7}, tier_id{1}, -1).error() == errc::invalid_argument);
  CHECK_FALSE(s.would_fit(hbm_tier, max));
  CHECK_FALSE(s.would_fit(tier_id{1}, max));
  CHECK_FALSE(s.would_fit(hbm_tier, -1));
  CHECK(s.would_fit(hbm_tier, 10 * 4096));
  // The scheduling dry run sizes requests with pages_for.
  CHECK(dry_run(s, max, {}) == fit_result::never_fits);
  CHECK(dry_run(s, max - 100, {}) == fit_result::never_fits);
  CHECK_THROWS_AS(require_fits(s, max, {}), capacity_error);
  CHECK(s.size() == 1);
  CHECK(s.usage(hbm_tier).used_bytes == 2 * 4096);
  CHECK(s.usage(tier_id{1}).used_bytes == 0);
  CHECK(s.check_invariants().empty());
}

TEST_CASE("store: sparsified demotion stores fewer bytes") {
  tiered_store<> s(two_tiers(8 * 4096, 8 * 4096), 4096);
  REQUIRE(s.insert(entry_id{1}, 4 * 4096).has_value());
  auto t = s.prepare_move(entry_id{1}, tier_id{1}, 4096 + 1);
  REQUIRE(t.has_value());
  CHECK(t->dst_pages.size() == 2);
  REQUIRE(s.complete_move(*t, true).has_value());
  CHECK(s.find(entry_id{1})->bytes() == 4097);
  CHECK(s.usage(tier_id{1}).used_bytes == 2 * 4096);
}

// Reference model: a list of (id, tier, bytes, pins, key inputs); victims by a linear scan.
TEST_CASE("store matches a naive list model on thousands of random operations (all scorers)") {
  const cost_model cm(presets::marconi_7b());
  for (int which = 0; which < 3; ++which) {
    CAPTURE(which);
    auto body = [&](auto scorer) {
      using Scorer = decltype(scorer);
      tiered_store<Scorer> s(two_tiers(64 * 1024, 128 * 1024), 1024, scorer);
      struct ref_entry {
        tier_id tier;
        std::int64_t bytes;
        int pins;
        cache_entry row;  // score, last_access, info mirror
      };
      std::map<entry_id, ref_entry> ref;
      std::uint64_t clock = 0;
      std::mt19937_64 rng(42 + which);
      std::vector<std::int64_t> used(2, 0);
      auto pages = [](std::int64_t b) { return (b + 1023) / 1024; };
      for (int op = 0; op < 6000; ++op) {
        const entry_id id = make_entry_id(rng() % 48);
        const int kind = static_cast<int>(rng() % 8);
        auto it = ref.find(id);
        if (kind == 0) {
          const std::int64_t bytes = 1 + static_cast<std::int64_t>(rng() % 6000);
          const tier_id t{static_cast<std::uint8_t>(rng() % 2)};
          const node_info info{static_cast<std::int64_t>(rng() % 500), 0, (rng() & 1) != 0};
          node_info inf = info;
          inf.prefix_end = inf.prefix_begin + 1 + static_cast<std::int64_t>(rng() % 700);
          const auto r = s.insert(id, bytes, t, inf);
          const std::int64_t cap = t.value == 0 ? 64 : 128;
          if (it != ref.end()) {
            CHECK(r.error() == errc::invalid_argument);
          } else if (used[t.value] + pages(bytes) > cap) {
            CHECK(r.error() == errc::out_of_capacity);
          } else {
            REQUIRE(r.has_value());
            cache_entry row;
            row.id = id;
            row.info = inf;
            row.last_access = ++clock;
            ref[id] = {t, bytes, 0, row};
            used[t.value] += pages(bytes);
          }
        } else if (kind == 1 && it != ref.end()) {
          REQUIRE(s.pin(id).has_value());
          it->second.pins += 1;
          it->second.row.last_access = ++clock;
        } else if (kind == 2 && it != ref.end()) {
          const auto r = s.unpin(id);
          if (it->second.pins == 0) {
            CHECK(r.error() == errc::invalid_argument);
          } else {
            REQUIRE(r.has_value());
            it->second.pins -= 1;
          }
        } else if (kind == 3 && it != ref.end()) {
          REQUIRE(s.touch(id).has_value());
          it->second.row.last_access = ++clock;
        } else if (kind == 4 && it != ref.end()) {
          const double d = static_cast<double>(static_cast<int>(rng() % 5) - 2);
          REQUIRE(s.add_score(id, d).has_value());
          it->second.row.score += d;
        } else if (kind == 5 && it != ref.end()) {
          const tier_id dst{static_cast<std::uint8_t>(1 - it->second.tier.value)};
          const bool ok = (rng() % 4) != 0;
          const std::int64_t cap = dst.value == 0 ? 64 : 128;
          // A pinned source would stay as a replica (tested above); the model has one tier per entry.
          const auto t = it->second.pins > 0 ? expected<move_ticket>(unexpected(errc::busy)) : s.prepare_move(id, dst);
          if (it->second.pins > 0) {
            CHECK(t.error() == errc::busy);
          } else if (used[dst.value] + pages(it->second.bytes) > cap) {
            CHECK(t.error() == errc::out_of_capacity);
          } else {
            REQUIRE(t.has_value());
            CHECK(s.check_invariants().empty());
            REQUIRE(s.complete_move(*t, ok).has_value());
            if (ok) {
              used[it->second.tier.value] -= pages(it->second.bytes);
              used[dst.value] += pages(it->second.bytes);
              if (dst < it->second.tier) it->second.row.last_access = ++clock;  // a promotion touches
              it->second.tier = dst;
            }
          }
        } else if (kind == 6 && it != ref.end()) {
          const auto r = s.erase(id);
          if (it->second.pins > 0) {
            CHECK(r.error() == errc::busy);
          } else {
            REQUIRE(r.has_value());
            used[it->second.tier.value] -= pages(it->second.bytes);
            ref.erase(it);
          }
        } else if (kind == 7) {
          for (std::uint8_t t = 0; t < 2; ++t) {
            std::optional<entry_id> best;
            demotion_key bk;
            for (auto& [rid, re] : ref) {
              if (re.tier.value != t || re.pins > 0) continue;
              const auto k = s.find(rid) ? scorer.key(re.row) : demotion_key{};
              if (!best || k < bk || (k == bk && rid < *best)) {
                best = rid;
                bk = k;
              }
            }
            CHECK(s.victim(tier_id{t}) == best);
          }
        }
        if (op % 500 == 0) REQUIRE(s.check_invariants().empty());
        CHECK(s.usage(hbm_tier).used_bytes == used[0] * 1024);
        CHECK(s.usage(tier_id{1}).used_bytes == used[1] * 1024);
      }
      CHECK(s.size() == ref.size());
      CHECK(s.check_invariants().empty());
    };
    if (which == 0) body(lru_demotion{});
    if (which == 1) body(car_score_demotion{});
    if (which == 2) body(flop_aware_demotion{cm});
  }
}

TEST_CASE("scorers: keys follow LRU, CaR score and FLOP efficiency") {
  cache_entry a, b;
  a.last_access = 5;
  b.last_access = 9;
  CHECK(lru_demotion{}.key(a) < lru_demotion{}.key(b));
  a.score = car_score::enter_window + car_score::dispatch;  // 2
  b.score = car_score::enter_window + car_score::dispatch + car_score::complete;  // 0
  CHECK(b.score == 0.0);
  CHECK(car_score_demotion{}.key(b) < car_score_demotion{}.key(a));
  b.score = a.score;
  CHECK(car_score_demotion{}.key(a) < car_score_demotion{}.key(b));  // LRU tie-break
  const cost_model cm(presets::marconi_7b());
  flop_aware_demotion f(cm);
  a.info = {0, 64, true};      // short node with a checkpoint: poor FLOPs per byte
  b.info = {4000, 8000, true};  // long node deep in the context: attention FLOPs dominate
  CHECK(f.key(a).primary == doctest::Approx(cm.node_flop_efficiency(0, 64, true)));
  CHECK(f.key(a) < f.key(b));
  cache_entry empty;
  CHECK(f.key(empty).primary == 0.0);
}

TEST_CASE("tiered_store: split, join and exchange_pages re-partition pages without copying; bad calls change nothing") {
  constexpr std::int64_t page = 4096;
  tiered_store<> s(two_tiers(16 * page, 8 * page), page);
  REQUIRE(s.insert(entry_id{1}, 6 * page));
  REQUIRE(s.insert(entry_id{2}, 3 * page));
  REQUIRE(s.insert(entry_id{3}, 2 * page, tier_id{1}));
  const auto expand = [](const page_list& l) {
    std::vector<std::uint32_t> v;
    l.for_each_page([&](std::uint32_t p) { v.push_back(p); });
    return v;
  };
  const auto pages_of = [&](entry_id id) { return expand(s.find(id)->home()->pages); };
  const auto p1 = pages_of(entry_id{1}), p2 = pages_of(entry_id{2});
  const auto snapshot = [&] {
    std::map<entry_id, std::vector<std::uint32_t>> m;
    s.for_each([&](const cache_entry& e) { m[e.id] = expand(e.copies.front().pages); });
    return m;
  };

  SUBCASE("split: the head takes the first pages, the entry keeps the rest") {
    REQUIRE(s.split(entry_id{1}, entry_id{10}, 2 * page));
    CHECK(pages_of(entry_id{10}) == std::vector<std::uint32_t>(p1.begin(), p1.begin() + 2));
    CHECK(pages_of(entry_id{1}) == std::vector<std::uint32_t>(p1.begin() + 2, p1.end()));
    CHECK(s.find(entry_id{10})->bytes() == 2 * page);
    CHECK(s.find(entry_id{1})->bytes() == 4 * page);
    CHECK(s.usage(hbm_tier).entries == 3);
    CHECK(s.check_invariants().empty());
    // join puts it back in the same order: front's pages, then back's
    REQUIRE(s.join(entry_id{10}, entry_id{1}));
    CHECK(pages_of(entry_id{10}) == p1);
    CHECK_FALSE(s.contains(entry_id{1}));
    CHECK(s.usage(hbm_tier).entries == 2);
    CHECK(s.check_invariants().empty());
    // a join of two unrelated entries keeps logical order even when pages are not ascending
    REQUIRE(s.join(entry_id{2}, entry_id{10}));
    auto want = p2;
    want.insert(want.end(), p1.begin(), p1.end());
    CHECK(pages_of(entry_id{2}) == want);
    CHECK(s.check_invariants().empty());
  }
  SUBCASE("exchange_pages swaps page ranges between two entries of a tier") {
    REQUIRE(s.pin(entry_id{2}));  // pinned entries may exchange (a loaded, pinned staging entry)
    REQUIRE(s.exchange_pages(entry_id{1}, 3, entry_id{2}, 1, 2));
    auto w1 = p1, w2 = p2;
    std::swap_ranges(w1.begin() + 3, w1.begin() + 5, w2.begin() + 1);
    CHECK(pages_of(entry_id{1}) == w1);
    CHECK(pages_of(entry_id{2}) == w2);
    CHECK(s.check_invariants().empty());
  }
  SUBCASE("bad calls are refused and leave the table as it was") {
    const auto before = snapshot();
    CHECK(s.split(entry_id{9}, entry_id{11}, page).error() == errc::not_found);
    CHECK(s.split(entry_id{1}, entry_id{11}, 0).error() == errc::invalid_argument);
    CHECK(s.split(entry_id{1}, entry_id{11}, 6 * page).error() == errc::invalid_argument);  // not smaller than the entry
    CHECK(s.split(entry_id{1}, entry_id{11}, page + 1).error() == errc::invalid_argument);  // not whole pages
    CHECK(s.split(entry_id{1}, entry_id{2}, page).error() == errc::invalid_argument);       // head id taken
    CHECK(s.join(entry_id{1}, entry_id{1}).error() == errc::invalid_argument);
    CHECK(s.join(entry_id{1}, entry_id{3}).error() == errc::invalid_argument);  // different tiers
    CHECK(s.join(entry_id{1}, entry_id{9}).error() == errc::not_found);
    CHECK(s.exchange_pages(entry_id{1}, 0, entry_id{3}, 0, 1).error() == errc::invalid_argument);  // different tiers
    CHECK(s.exchange_pages(entry_id{1}, 5, entry_id{2}, 0, 2).error() == errc::invalid_argument);  // past entry 1
    CHECK(s.exchange_pages(entry_id{1}, 0, entry_id{2}, 2, 2).error() == errc::invalid_argument);  // past entry 2
    CHECK(s.exchange_pages(entry_id{1}, 0, entry_id{1}, 3, 1).error() == errc::invalid_argument);  // same entry
    REQUIRE(s.pin(entry_id{1}));
    CHECK(s.split(entry_id{1}, entry_id{11}, page).error() == errc::busy);
    CHECK(s.join(entry_id{1}, entry_id{2}).error() == errc::busy);
    CHECK(s.join(entry_id{2}, entry_id{1}).error() == errc::busy);
    REQUIRE(s.unpin(entry_id{1}));
    auto t = s.prepare_move(entry_id{2}, tier_id{1});
    REQUIRE(t);
    CHECK(s.exchange_pages(entry_id{1}, 0, entry_id{2}, 0, 1).error() == errc::busy);  // being read by a copy
    CHECK(s.join(entry_id{1}, entry_id{2}).error() == errc::invalid_argument);  // 2 has a copy in flight below: other tiers
    REQUIRE(s.complete_move(*t, false));
    REQUIRE(s.insert(entry_id{4}, page, hbm_tier, {}, /*writing=*/true));
    CHECK(s.exchange_pages(entry_id{1}, 0, entry_id{4}, 0, 1).error() == errc::busy);  // being written
    CHECK(s.split(entry_id{4}, entry_id{11}, page).error() == errc::invalid_argument);
    REQUIRE(s.erase(entry_id{4}));
    CHECK(snapshot() == before);
    CHECK(s.check_invariants().empty());
  }
}
