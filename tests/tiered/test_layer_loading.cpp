// Layer-wise loading driven, not only modelled: the host copy engine lands a multi-layer
// copy segment by segment (`layered_copy_engine`: landed_segments / wait_segments), and the
// tiered store and the request lifecycle let a runtime wait for one layer of a hit
// (`tiered_state_store::layer_loaded` / `wait_layer`, `request_lifecycle::wait_layer_loaded`)
// while later layers are still being copied. The copies are held at a layer boundary by the
// engine's fault hook, so every check is deterministic.
#include <doctest/doctest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <thread>
#include <vector>

#include "hybridcache/model/presets.hpp"
#include "hybridcache/prefix/admission.hpp"
#include "hybridcache/prefix/lifecycle.hpp"
#include "hybridcache/prefix/lru_scorer.hpp"
#include "hybridcache/prefix/prefix_cache.hpp"
#include "hybridcache/stores/tiered_state_store.hpp"
#include "hybridcache/tiered/host_copy_engine.hpp"
#include "hybridcache/tiered/tiered_store.hpp"

#include "tiered_bytes_support.hpp"

using namespace hybridcache;
using namespace hybridcache::tiered;
using namespace hybridcache::stores;

namespace {

static_assert(layered_copy_engine<host_copy_engine>);
static_assert(layered_copy_engine<metadata_only_copies>);

/// Holds every copy span whose destination lies in a layer segment >= `open` (by the
/// segment map of the destination pages it is told), or fails the spans of segment `fail`.
/// Spans of pages it does not know run at once.
struct layer_gate {
  std::mutex m;
  std::condition_variable cv;
  std::map<std::int64_t, std::int32_t> segment_of_page;  // destination page -> segment
  std::int64_t page = 1;
  std::int32_t open = 0;
  std::int32_t fail = -1;

  void map_pages(const move_ticket& t) {
    std::lock_guard l(m);
    const std::int64_t per = static_cast<std::int64_t>(t.dst_pages.size()) / t.segments;
    std::int64_t i = 0;
    t.dst_pages.for_each_page([&](std::uint32_t p) { segment_of_page[p] = static_cast<std::int32_t>(i++ / per); });
  }
  void set_open(std::int32_t n) {
    {
      std::lock_guard l(m);
      open = n;
    }
    cv.notify_all();
  }
  bool operator()(const copy_span& c) {
    std::unique_lock l(m);
    const auto it = segment_of_page.find(c.dst_offset / page);
    if (it == segment_of_page.end()) return false;
    const std::int32_t seg = it->second;
    cv.wait(l, [&] { return seg < open || seg == fail; });
    return seg == fail;
  }
};

std::vector<tier_config> two_tiers(std::int64_t page, std::int64_t pages) {
  return {{.kind = tier_kind::hbm, .capacity_bytes = pages * page}, {.kind = tier_kind::host, .capacity_bytes = pages * page}};
}

std::byte byte_of(std::int64_t i) { return static_cast<std::byte>((i * 37 + 11) & 0xff); }

/// Polls `pred` for up to ten seconds (a loaded machine under a sanitizer schedules the
/// copy worker late; a pass returns at once).
template <class Pred>
bool eventually(Pred&& pred) {
  for (int i = 0; i < 10000; ++i) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return pred();
}

}  // namespace

TEST_SUITE_BEGIN("layer_loading");

TEST_CASE("host copy engine: a multi-layer copy lands layer by layer (landed_segments, wait_segments)") {
  constexpr std::int64_t page = 256;
  tiered_store<> s(two_tiers(page, 64), page);
  host_copy_engine e(two_tiers(page, 64), page, {.measure_bandwidth = false});
  layer_gate gate;
  gate.page = page;
  e.set_fault_hook([&](const copy_span& c) { return gate(c); });
  struct open_at_exit {  // a failed REQUIRE must not leave a copy held (the engine's stop waits for it)
    layer_gate& g;
    ~open_at_exit() { g.set_open(1 << 20); }
  } opener{gate};
  // Two entries on the host tier, 4 layer segments of 3 pages each; a padding entry in HBM so
  // that the destination pages are not the source offsets.
  REQUIRE(s.insert(entry_id{9}, 5 * page).has_value());
  for (std::uint64_t id : {1u, 2u}) {
    REQUIRE(s.insert(entry_id{id}, 12 * page, tier_id{1}, {}, false, 4).has_value());
    const auto row = s.find(entry_id{id});
    std::int64_t i = 0;
    row->copies.front().pages.for_each_page([&](std::uint32_t p) {
      for (std::int64_t b = 0; b < page; ++b) e.base(tier_id{1})[p * page + b] = byte_of(i * page + b + static_cast<std::int64_t>(id));
      ++i;
    });
  }
  auto hbm_bytes_ok = [&](entry_id id, std::int32_t segments) {  // the first `segments` layers in HBM
    const auto row = s.find(id);
    const tier_copy* c = row->in(hbm_tier);
    std::int64_t i = 0;
    bool ok = true;
    c->pages.for_each_page([&](std::uint32_t p) {
      if (i < segments * 3)
        for (std::int64_t b = 0; b < page; ++b)
          ok = ok && e.base(hbm_tier)[p * page + b] == byte_of(i * page + b + static_cast<std::int64_t>(to_underlying(id)));
      ++i;
    });
    return ok;
  };

  SUBCASE("segments land in order, each before the job completes") {
    auto t = s.prepare_move(entry_id{1}, hbm_tier);
    REQUIRE(t);
    REQUIRE(t->segments == 4);
    gate.map_pages(*t);
    gate.set_open(1);
    auto ev = e.submit(*t);
    REQUIRE(ev);
    CHECK(ev->segments == 4);
    REQUIRE(eventually([&] { return e.landed_segments(*ev) >= 1; }));  // while layers 1-3 are held
    REQUIRE(e.wait_segments(*ev, 1).has_value());
    CHECK(e.landed_segments(*ev) == 1);
    CHECK_FALSE(e.query(*ev));
    CHECK(hbm_bytes_ok(entry_id{1}, 1));
    gate.set_open(3);
    REQUIRE(eventually([&] { return e.landed_segments(*ev) >= 3; }));
    REQUIRE(e.wait_segments(*ev, 3).has_value());
    CHECK(e.landed_segments(*ev) == 3);
    CHECK_FALSE(e.query(*ev));
    CHECK(hbm_bytes_ok(entry_id{1}, 3));
    CHECK(e.wait_segments(*ev, 5).error() == errc::invalid_argument);
    CHECK(e.wait_segments(*ev, -1).error() == errc::invalid_argument);
    CHECK(e.wait_segments(*ev, 0).has_value());
    gate.set_open(4);
    REQUIRE(e.wait(*ev).has_value());
    CHECK(e.landed_segments(*ev) == 4);
    REQUIRE(s.complete_move(*t, true).has_value());
    CHECK(hbm_bytes_ok(entry_id{1}, 4));
  }
  SUBCASE("a failure at layer 2: layers 0-1 landed, later ones never, and wait reports it") {
    auto t = s.prepare_move(entry_id{2}, hbm_tier);
    REQUIRE(t);
    gate.map_pages(*t);
    gate.fail = 2;
    gate.set_open(2);
    auto ev = e.submit(*t);
    REQUIRE(ev);
    REQUIRE(eventually([&] { return e.query(*ev); }));  // it fails at layer 2
    REQUIRE(e.wait_segments(*ev, 2).has_value());
    CHECK(e.wait_segments(*ev, 3).error() == errc::busy);
    CHECK(e.landed_segments(*ev) == 2);  // the failure is still the job's (wait consumes it)
    CHECK(e.query(*ev));
    CHECK(e.wait(*ev).error() == errc::busy);
    REQUIRE(s.complete_move(*t, false).has_value());
    CHECK(s.find(entry_id{2})->tier() == tier_id{1});
  }
  SUBCASE("a group lands layer-major across its tickets, each ticket its own event") {
    auto a = s.prepare_move(entry_id{1}, hbm_tier);
    auto b = s.prepare_move(entry_id{2}, hbm_tier);
    REQUIRE(a);
    REQUIRE(b);
    gate.map_pages(*a);
    gate.map_pages(*b);
    gate.set_open(1);
    const std::vector<move_ticket> group{*a, *b};
    std::vector<copy_event> ev(2);
    REQUIRE(e.submit_group(group, ev).has_value());
    CHECK(ev[0].segments == 4);
    CHECK(ev[1].segments == 4);
    // Layer 0 of both while layer 1 of the first is held: one job per ticket, in order, would
    // hold the second entirely behind the first.
    REQUIRE(eventually([&] { return e.landed_segments(ev[1]) >= 1; }));
    CHECK(e.landed_segments(ev[0]) == 1);
    CHECK(e.landed_segments(ev[1]) == 1);
    CHECK(hbm_bytes_ok(entry_id{1}, 1));
    CHECK(hbm_bytes_ok(entry_id{2}, 1));
    CHECK_FALSE(e.query(ev[0]));
    gate.set_open(3);
    REQUIRE(e.wait_segments(ev[1], 3).has_value());
    CHECK(e.landed_segments(ev[0]) >= 3);
    {  // the last layer fails: both tickets fail, each reported by its own wait
      std::lock_guard l(gate.m);
      gate.fail = 3;
    }
    gate.set_open(3);
    CHECK(e.wait_segments(ev[0], 4).error() == errc::busy);
    CHECK(e.landed_segments(ev[0]) == 3);
    CHECK(e.landed_segments(ev[1]) == 3);
    CHECK(e.wait(ev[0]).error() == errc::busy);
    CHECK(e.wait(ev[1]).error() == errc::busy);
    REQUIRE(s.complete_move(*a, false).has_value());
    REQUIRE(s.complete_move(*b, false).has_value());
    CHECK(s.find(entry_id{1})->tier() == tier_id{1});
    // Refused (tickets of both directions): nothing submitted, the events untouched.
    REQUIRE(s.insert(entry_id{3}, 4 * page, hbm_tier, {}, false, 4).has_value());
    auto up = s.prepare_move(entry_id{1}, hbm_tier);
    auto down = s.prepare_move(entry_id{3}, tier_id{1});
    REQUIRE(up);
    REQUIRE(down);
    const auto jobs = e.take_stats().jobs;
    CHECK(jobs == 2);
    const std::vector<move_ticket> mixed{*up, *down};
    std::vector<copy_event> untouched(2, copy_event{copy_stream::offload, 77, 9});
    CHECK(e.submit_group(mixed, untouched).error() == errc::invalid_argument);
    CHECK(e.submit_group(mixed, std::span<copy_event>(untouched).first(1)).error() == errc::invalid_argument);
    CHECK(untouched[0].seq == 77);
    CHECK(untouched[1].segments == 9);
    CHECK(e.take_stats().jobs == 0);
    REQUIRE(s.complete_move(*up, false).has_value());
    REQUIRE(s.complete_move(*down, false).has_value());
  }
  SUBCASE("a copy that is not segment-aligned lands all its segments at once") {
    auto t = s.prepare_move(entry_id{1}, hbm_tier, 7 * page + 5);  // sparsified: fewer bytes
    REQUIRE(t);
    gate.map_pages(*t);  // (its destination pages, one segment map as if full)
    gate.set_open(0);
    auto ev = e.submit(*t);
    REQUIRE(ev);
    CHECK(ev->segments == 4);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    CHECK(e.landed_segments(*ev) == 0);
    gate.set_open(4);
    REQUIRE(e.wait_segments(*ev, 1).has_value());
    CHECK(e.query(*ev));  // layer 0 was reported only with the whole copy
    CHECK(e.landed_segments(*ev) == 4);
    REQUIRE(e.wait(*ev).has_value());
    REQUIRE(s.complete_move(*t, true).has_value());
  }
  e.set_fault_hook({});
}

namespace {
using namespace hybridcache::test::tiered_bytes;
using hybridcache::token_id;
using locked_cache =
    prefix::prefix_cache<cost_model, prefix::judicious_admission, prefix::lru_scorer, store_t, prefix::mutex_lock>;

/// The tiny hybrid model over HBM for ~300 tokens (+ 4 checkpoints), a 4000-token host and
/// staging as large as HBM: 4 attention and 2 recurrent layer segments.
tiered_state_store_config tiny_two_tiers() {
  const std::int64_t kv = tiny().kv_bytes_per_token(), ck = tiny().ssm_checkpoint_bytes();
  return {.capacity_bytes = 300 * kv + 4 * ck,
          .host_capacity_bytes = 4000 * kv,
          .kv_bytes_per_token = kv,
          .checkpoint_bytes = ck,
          .staging_bytes = 300 * kv + 4 * ck,
          .attention_layers = 4,
          .recurrent_layers = 2};
}

/// Holds the onboard worker's spans: all of them until `arm` maps the staged entries' HBM
/// pages, then those of KV segment >= open_kv (or failing KV segment `fail_kv`); other
/// pages (the checkpoint's) pass. The offload worker is never held (write-backs run).
struct onboard_gate {
  std::mutex m;
  std::condition_variable cv;
  std::thread::id onboard{};
  bool mapped = false;
  std::map<std::int64_t, std::int32_t> kv_segment_of_page;
  std::int64_t page = 1;
  std::int32_t open_kv = 0, fail_kv = -1;

  bool operator()(const copy_span& c) {
    std::unique_lock l(m);
    if (std::this_thread::get_id() != onboard) return false;
    auto held = [&] {
      if (!mapped) return true;
      const auto it = kv_segment_of_page.find(c.dst_offset / page);
      return it != kv_segment_of_page.end() && it->second >= open_kv && it->second != fail_kv;
    };
    cv.wait(l, [&] { return !held(); });
    const auto it = kv_segment_of_page.find(c.dst_offset / page);
    return it != kv_segment_of_page.end() && it->second == fail_kv;
  }
  void set(std::int32_t open, std::int32_t fail = -1) {
    {
      std::lock_guard l(m);
      open_kv = open;
      fail_kv = fail;
      mapped = true;
    }
    cv.notify_all();
  }
};

}  // namespace

TEST_CASE("layer-wise loading through the store and the lifecycle: layer 0 of a host hit is readable while later "
          "layers are still being copied") {
  const std::int64_t kv = tiny().kv_bytes_per_token();
  const tiered_state_store_config cfg = tiny_two_tiers();
  for (const std::int32_t fail_at : {-1, 2}) {
  CAPTURE(fail_at);
  engine_t engine(store_t::tiers_for(cfg), store_t::page_bytes_for(cfg), {.measure_bandwidth = false});
  onboard_gate gate;
  gate.page = store_t::page_bytes_for(cfg);
  {  // which worker thread is the onboard one: a copy inside HBM runs there
    engine.set_fault_hook([&](const copy_span&) {
      std::lock_guard l(gate.m);
      gate.onboard = std::this_thread::get_id();
      return false;
    });
    auto ev = engine.submit(hbm_tier, hbm_tier, {{0, gate.page, gate.page}}, copy_stream::onboard);
    REQUIRE(ev);
    REQUIRE(engine.wait(*ev).has_value());
  }
  engine.set_fault_hook([&](const copy_span& c) { return gate(c); });
  locked_cache c(tiny(), store_t(cfg, engine), prefix::lru_scorer{});
  prefix::request_lifecycle<locked_cache> requests(c);
  struct open_at_exit {  // a failed REQUIRE must not leave a copy held: the store and the
    onboard_gate& g;     // engine wait for their copies when destroyed, which run after this
    ~open_at_exit() { g.set(1 << 20); }
  } opener{gate};
  auto run = [&](const std::vector<token_id>& prompt, std::int64_t out, token_id out_token) {
    auto t = requests.begin(prompt, {.output_tokens = out});
    REQUIRE(t);
    REQUIRE(requests.wait_loaded(*t).has_value());
    std::vector<token_id> seq = prompt;
    for (std::int64_t k = 0; k < out; ++k) seq.push_back(out_token);
    const std::vector<std::int64_t> captured{static_cast<std::int64_t>(seq.size())};
    REQUIRE(requests.finish(*t, seq, captured));
    return seq;
  };
  // A: 160 tokens, written with known bytes once committed; B then evicts it to the host.
  std::vector<token_id> a(150), b(150);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<token_id>(i % 3), b[i] = static_cast<token_id>(3 + i % 3);
  const auto seq_a = run(a, 10, 1);
  const std::int64_t layer_bytes = static_cast<std::int64_t>(seq_a.size()) * kv / cfg.attention_layers;
  c.with_store([&](store_t& st) {
    std::vector<node_id> path;
    (void)c.tree().walk(seq_a, path);
    REQUIRE(path.size() == 1);
    const bytes_view view{engine, st};
    const auto kvb = view(c.tree().at(path[0]).kv.id);
    for (std::int64_t i = 0; i < static_cast<std::int64_t>(seq_a.size()) * kv; ++i) kvb[i] = byte_of(i);
  });
  (void)run(b, 10, 4);
  c.with_store([](store_t& st) { st.drain(); });
  REQUIRE(c.store().counters().demoted_entries > 0);

  // The request that reuses A from the host tier: its load is held until the gate maps it.
  std::vector<token_id> prompt = seq_a;
  for (int k = 0; k < 5; ++k) prompt.push_back(2);
  auto t = requests.begin(prompt, {.output_tokens = 3});
  REQUIRE(t);
  const auto* s = *requests.state(*t);
  REQUIRE(s->loaded_at == static_cast<std::int64_t>(seq_a.size()));
  entry_id staged_kv = no_entry;
  c.with_store([&](store_t& st) {
    std::lock_guard l(gate.m);
    for (const staged_entry& x : st.staged(s->host_hit)) {
      if (x.checkpoint) continue;
      REQUIRE(staged_kv == no_entry);  // one KV entry: A's whole extent
      staged_kv = x.id;
      const auto row = st.table().find(x.id);
      REQUIRE(row->segments == cfg.attention_layers);
      const auto pages = bytes_view::pages_of(row->in(hbm_tier)->pages);
      for (std::size_t i = 0; i < pages.size(); ++i)
        gate.kv_segment_of_page[pages[i]] = static_cast<std::int32_t>(i / (pages.size() / 4));
    }
  });
  REQUIRE(staged_kv != no_entry);
  // "yes", "no" or the error's name.
  auto layer_loaded = [&](layer_kind k, std::int32_t l) {
    expected<bool> r = unexpected(errc::invalid_argument);
    c.with_store([&](store_t& st) { r = st.layer_loaded(s->host_hit, k, l); });
    return r ? std::string(*r ? "yes" : "no") : std::string(to_string(r.error()));
  };
  CHECK(layer_loaded(layer_kind::attention, 0) == "no");  // nothing copied yet
  gate.set(2);  // layers 0-1 run, 2-3 wait
  REQUIRE(eventually([&] { return layer_loaded(layer_kind::attention, 1) == "yes"; }));
  CHECK(layer_loaded(layer_kind::attention, 0) == "yes");
  // The hit's copies went as one group, layer-major across its entries: the checkpoint's
  // first half (recurrent layer 0, 1/2 of it) came with KV layers 0-1 (1/4, 2/4), its second
  // (2/2) comes after KV layer 2 (3/4), still held. One job per entry, in submission order,
  // would have landed the checkpoint whole or not at all.
  CHECK(layer_loaded(layer_kind::recurrent, 0) == "yes");
  CHECK(layer_loaded(layer_kind::recurrent, 1) == "no");
  REQUIRE(requests.wait_layer_loaded(*t, layer_kind::attention, 1).has_value());
  c.with_store([&](store_t& st) {
    REQUIRE(st.wait_layer(s->host_hit, layer_kind::attention, 0).has_value());
    const auto row = st.table().find(staged_kv);
    REQUIRE(row->in(hbm_tier) != nullptr);
    CHECK(row->in(hbm_tier)->state == copy_state::filling);  // the copy is still running
    const auto pages = bytes_view::pages_of(row->in(hbm_tier)->pages);
    const std::int64_t pg = st.page_bytes();
    for (std::int64_t i = 0; i < 2 * layer_bytes; ++i)
      if (engine.base(hbm_tier)[static_cast<std::int64_t>(pages[static_cast<std::size_t>(i / pg)]) * pg + i % pg] != byte_of(i))
        FAIL("layer " << i / layer_bytes << " byte " << i % layer_bytes << " is not A's");
  });
  // Bad input changes nothing: the copies in flight, the hits, what the hit staged.
  auto snapshot = [&] {
    return c.with_store([&](store_t& st) {
      return std::vector<std::int64_t>{static_cast<std::int64_t>(st.inflight_copies()),
                                       static_cast<std::int64_t>(st.outstanding_hits()),
                                       static_cast<std::int64_t>(st.staged(s->host_hit).size()), st.staged_bytes(),
                                       st.counters().copy_failures, st.counters().staged_bytes};
    });
  };
  const auto before = snapshot();
  CHECK(requests.wait_layer_loaded(*t, layer_kind::attention, 4).error() == errc::invalid_argument);
  CHECK(requests.wait_layer_loaded(*t, layer_kind::recurrent, -1).error() == errc::invalid_argument);
  CHECK(layer_loaded(layer_kind::recurrent, 2) == to_string(errc::invalid_argument));
  CHECK(layer_loaded(layer_kind::mlp, 0) == to_string(errc::invalid_argument));
  CHECK(c.with_store([&](store_t& st) { return st.wait_layer(tiered_hit{}, layer_kind::attention, 0).error(); }) ==
        errc::stale_handle);
  CHECK(snapshot() == before);
  if (fail_at < 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    CHECK(layer_loaded(layer_kind::attention, 2) == "no");  // still held
    gate.set(4);
    REQUIRE(requests.wait_layer_loaded(*t, layer_kind::attention, 3).has_value());
    REQUIRE(requests.wait_loaded(*t).has_value());
    std::vector<token_id> seq = prompt;
    seq.insert(seq.end(), {0, 0, 0});
    const std::vector<std::int64_t> captured{static_cast<std::int64_t>(seq.size())};
    REQUIRE(requests.finish(*t, seq, captured));
  } else {
    gate.set(2, fail_at);  // layer 2's copy fails: the hit is lost, every layer of it is busy
    REQUIRE(eventually([&] { return layer_loaded(layer_kind::attention, 2) != "no"; }));
    CHECK(layer_loaded(layer_kind::attention, 2) == to_string(errc::busy));
    CHECK(layer_loaded(layer_kind::attention, 0) == to_string(errc::busy));
    CHECK(requests.wait_layer_loaded(*t, layer_kind::attention, 3).error() == errc::busy);
    CHECK(requests.wait_loaded(*t).error() == errc::busy);  // releases the hit
    REQUIRE(requests.abort(*t));
  }
  gate.set(4);
  c.with_store([](store_t& st) { st.drain(); });
  CHECK(c.store().outstanding_hits() == 0);
  const std::string bad = c.store().check_invariants(c.tree());
  CHECK_MESSAGE(bad.empty(), bad);
  engine.set_fault_hook({});
  }
}

TEST_CASE("a load whose group the engine refuses rolls every staged entry back; the request goes on from HBM") {
  const tiered_state_store_config cfg = tiny_two_tiers();
  engine_t engine(store_t::tiers_for(cfg), store_t::page_bytes_for(cfg), {.measure_bandwidth = false});
  locked_cache c(tiny(), store_t(cfg, engine), prefix::lru_scorer{});
  prefix::request_lifecycle<locked_cache> requests(c);
  auto run = [&](const std::vector<token_id>& prompt, token_id out_token) {
    auto t = requests.begin(prompt, {.output_tokens = 10});
    REQUIRE(t);
    REQUIRE(requests.wait_loaded(*t).has_value());
    std::vector<token_id> seq = prompt;
    seq.insert(seq.end(), 10, out_token);
    const std::vector<std::int64_t> captured{static_cast<std::int64_t>(seq.size())};
    REQUIRE(requests.finish(*t, seq, captured));
    return seq;
  };
  std::vector<token_id> a(150), b(150);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<token_id>(i % 3), b[i] = static_cast<token_id>(3 + i % 3);
  const auto seq_a = run(a, 1);
  (void)run(b, 4);
  c.with_store([](store_t& st) { st.drain(); });
  REQUIRE(c.store().counters().demoted_entries > 0);
  engine.stop();  // every submit (and so every group) is refused from now on
  const auto before = c.store().counters();
  std::vector<token_id> prompt = seq_a;
  prompt.insert(prompt.end(), 5, 2);
  auto t = requests.begin(prompt, {.output_tokens = 3});
  REQUIRE(t);
  const auto* s = *requests.state(*t);
  CHECK(s->loaded_at == 0);  // the host hit was given up: prefill starts from the HBM hit
  const auto after = c.store().counters();
  CHECK(after.host_hits == before.host_hits + 1);      // it was found ...
  CHECK(after.copy_failures >= before.copy_failures + 2);  // ... its group (KV + checkpoint) refused
  CHECK(after.staged_entries == before.staged_entries);  // ... and every staged entry rolled back
  CHECK(after.staged_bytes == before.staged_bytes);
  CHECK(c.store().staged_bytes() == 0);
  CHECK(c.store().inflight_copies() == 0);
  REQUIRE(requests.abort(*t));
  CHECK(c.store().outstanding_hits() == 0);
  const std::string bad = c.store().check_invariants(c.tree());
  CHECK_MESSAGE(bad.empty(), bad);
}

TEST_CASE("shorten_hit: a model without recurrent layers loads part of a hit (accept returns a position); bad input changes nothing") {
  // llama2_7b's shape (no recurrent layers: it resumes anywhere its KV reaches), metadata only.
  const cost_model m(presets::llama2_7b());
  const std::int64_t kv = m.kv_bytes_per_token();
  REQUIRE(m.ssm_checkpoint_bytes() == 0);
  const tiered_state_store_config cfg{.capacity_bytes = 400 * kv,
                                      .host_capacity_bytes = 4000 * kv,
                                      .kv_bytes_per_token = kv,
                                      .checkpoint_bytes = 0,
                                      .staging_bytes = 400 * kv,
                                      .attention_layers = 32,
                                      .recurrent_layers = 1};  // (no checkpoint bytes: segments of nothing)
  using meta_store = stores::tiered_state_store<>;
  using cache_t = prefix::prefix_cache<cost_model, prefix::judicious_admission, prefix::lru_scorer, meta_store>;
  cache_t c(m, meta_store(cfg), prefix::lru_scorer{});
  prefix::request_lifecycle<cache_t> requests(c);
  auto run = [&](const std::vector<token_id>& prompt, auto accept) {
    auto t = requests.begin(prompt, {.output_tokens = 10}, accept);
    REQUIRE(t);
    const std::int64_t at = (*requests.state(*t))->loaded_at;
    REQUIRE(requests.wait_loaded(*t).has_value());
    std::vector<token_id> seq = prompt;
    seq.insert(seq.end(), 10, 7);
    REQUIRE(requests.finish(*t, seq, std::vector<std::int64_t>{static_cast<std::int64_t>(seq.size())}));
    return at;
  };
  const auto all = [](const tiered_hit&) { return true; };
  std::vector<token_id> a(200), b(300);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<token_id>(i % 5);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<token_id>(5 + i % 5);
  (void)run(a, all);
  (void)run(b, all);  // A goes to the host
  c.store().drain();
  std::vector<token_id> prompt = a;
  prompt.insert(prompt.end(), 10, 7);
  prompt.insert(prompt.end(), 20, 3);

  SUBCASE("accept returns a position inside the hit: the KV up to it is loaded, the rest recomputed") {
    const auto before = c.store().counters();
    std::int64_t whole = 0, hbm = 0;
    const std::int64_t at = run(prompt, [&](const tiered_hit& h) {
      whole = h.reusable_tokens;
      hbm = h.hbm_tokens;
      return h.hbm_tokens + (h.reusable_tokens - h.hbm_tokens) / 2;
    });
    REQUIRE(whole > hbm + 1);
    CHECK(at == hbm + (whole - hbm) / 2);
    const auto after = c.store().counters();
    CHECK(after.host_hit_tokens - before.host_hit_tokens == at - hbm);    // counted as shortened
    CHECK(after.loaded_bytes - before.loaded_bytes == (at - hbm) * kv);  // only that KV moved
    CHECK(after.staged_bytes - before.staged_bytes == (at - hbm) * kv);
  }
  SUBCASE("a position at or below the HBM hit declines; at or past the hit loads it whole") {
    std::int64_t whole = 0;
    CHECK(run(prompt, [](const tiered_hit& h) { return h.hbm_tokens; }) == 0);
    CHECK(run(prompt, [&](const tiered_hit& h) {
            whole = h.reusable_tokens;
            return h.reusable_tokens + 1000;
          }) == whole);
  }
  SUBCASE("shorten_hit itself: bad positions, a stale hit, a loaded hit change nothing") {
    const auto m0 = c.match(prompt);
    REQUIRE(m0);
    tiered_hit h = c.store().lookup(prompt, *m0);
    REQUIRE(h.host_tokens > 1);
    const tiered_hit copy = h;
    const auto counters = c.store().counters();
    for (const std::int64_t bad : {h.hbm_tokens, h.hbm_tokens - 1, h.reusable_tokens + 1}) {
      CHECK(c.store().shorten_hit(h, bad).error() == errc::invalid_argument);
      CHECK(h.reusable_tokens == copy.reusable_tokens);
      CHECK(h.bytes_to_load == copy.bytes_to_load);
      CHECK(c.store().counters().host_hit_tokens == counters.host_hit_tokens);
    }
    tiered_hit stale = h;
    stale.ticket += 12345;
    CHECK(c.store().shorten_hit(stale, h.hbm_tokens + 1).error() == errc::stale_handle);
    REQUIRE(c.store().shorten_hit(h, h.reusable_tokens).has_value());  // no change
    CHECK(h.bytes_to_load == copy.bytes_to_load);
    REQUIRE(c.store().shorten_hit(h, h.hbm_tokens + 1).has_value());
    CHECK(h.reusable_tokens == copy.hbm_tokens + 1);
    CHECK(h.host_tokens == 1);
    CHECK(h.bytes_to_load == kv);
    REQUIRE(c.store().load(h).has_value());
    CHECK(c.store().shorten_hit(h, h.reusable_tokens).error() == errc::invalid_argument);  // loaded already
    REQUIRE(c.store().wait_loaded(h).has_value());
    c.store().release_hit(h);
    (void)c.release(*m0);
  }
  const std::string bad = c.store().check_invariants(c.tree());
  CHECK_MESSAGE(bad.empty(), bad);
  CHECK(c.store().outstanding_hits() == 0);
}

TEST_CASE("shorten_hit: a hybrid model resumes only at its checkpoint") {
  const tiered_state_store_config cfg = tiny_two_tiers();
  using meta_store = stores::tiered_state_store<>;
  using cache_t = prefix::prefix_cache<cost_model, prefix::judicious_admission, prefix::lru_scorer, meta_store>;
  cache_t c(tiny(), meta_store(cfg), prefix::lru_scorer{});
  prefix::request_lifecycle<cache_t> requests(c);
  auto run = [&](const std::vector<token_id>& prompt, auto accept) {
    auto t = requests.begin(prompt, {.output_tokens = 10}, accept);
    REQUIRE(t);
    const std::int64_t at = (*requests.state(*t))->loaded_at;
    std::vector<token_id> seq = prompt;
    seq.insert(seq.end(), 10, 1);
    REQUIRE(requests.finish(*t, seq, std::vector<std::int64_t>{static_cast<std::int64_t>(seq.size())}));
    return at;
  };
  std::vector<token_id> a(150), b(150);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<token_id>(i % 3), b[i] = static_cast<token_id>(3 + i % 3);
  (void)run(a, [](const tiered_hit&) { return true; });
  (void)run(b, [](const tiered_hit&) { return true; });
  c.store().drain();
  std::vector<token_id> prompt = a;
  prompt.insert(prompt.end(), 10, 1);
  prompt.insert(prompt.end(), 5, 2);
  const auto before = c.store().counters();
  // Half-way is no checkpoint: the hit is declined, not loaded in part.
  CHECK(run(prompt, [](const tiered_hit& h) { return h.hbm_tokens + (h.reusable_tokens - h.hbm_tokens) / 2; }) == 0);
  CHECK(c.store().counters().staged_bytes == before.staged_bytes);
  CHECK(c.store().outstanding_hits() == 0);
}

TEST_CASE("layer-wise loading over a cache without a lock: wait_layer_loaded blocks in the store") {
  // (The lock-free lifecycle calls tiered_state_store::wait_layer directly; without a hit it
  // returns at once, and a ticket no longer in flight is refused.)
  const std::int64_t kv = tiny().kv_bytes_per_token(), ck = tiny().ssm_checkpoint_bytes();
  const tiered_state_store_config cfg{.capacity_bytes = 300 * kv + 4 * ck,
                                      .host_capacity_bytes = 4000 * kv,
                                      .kv_bytes_per_token = kv,
                                      .checkpoint_bytes = ck,
                                      .attention_layers = 4,
                                      .recurrent_layers = 2};
  engine_t engine(store_t::tiers_for(cfg), store_t::page_bytes_for(cfg), {.measure_bandwidth = false});
  using plain_cache = prefix::prefix_cache<cost_model, prefix::judicious_admission, prefix::lru_scorer, store_t>;
  plain_cache c(tiny(), store_t(cfg, engine), prefix::lru_scorer{});
  prefix::request_lifecycle<plain_cache> requests(c);
  const std::vector<token_id> prompt(40, 1);
  auto t = requests.begin(prompt, {.output_tokens = 2});
  REQUIRE(t);
  CHECK(requests.wait_layer_loaded(*t, layer_kind::attention, 3).has_value());
  REQUIRE(requests.abort(*t));
  CHECK_FALSE(requests.wait_layer_loaded(*t, layer_kind::attention, 0).has_value());
}

TEST_CASE("interleave_segments: proportional layer-major order, each ticket's last segment in ticket order") {
  auto plan = [](std::size_t segments) {
    layered_copies p;
    for (std::size_t g = 0; g < segments; ++g) {
      p.spans.push_back({0, 0, 1});
      p.ends.push_back(p.spans.size());
    }
    if (segments == 1) p.ends.clear();  // not layered: one step
    return p;
  };
  auto order = [](const std::vector<layered_copies>& plans) {
    std::vector<std::pair<std::uint32_t, std::int32_t>> out;
    for (const group_step& g : interleave_segments(plans)) out.emplace_back(g.part, g.segment);
    return out;
  };
  using v = std::vector<std::pair<std::uint32_t, std::int32_t>>;
  CHECK(order({plan(2), plan(2)}) == v{{0, 0}, {1, 0}, {0, 1}, {1, 1}});
  // KV of 4 attention layers beside a checkpoint of 2 recurrent ones: in proportion.
  CHECK(order({plan(4), plan(2)}) == v{{0, 0}, {0, 1}, {1, 0}, {0, 2}, {0, 3}, {1, 1}});
  CHECK(order({plan(2), plan(4)}) == v{{1, 0}, {0, 0}, {1, 1}, {1, 2}, {0, 1}, {1, 3}});
  CHECK(order({plan(1), plan(3)}) == v{{1, 0}, {1, 1}, {0, 0}, {1, 2}});
  CHECK(order({}).empty());
  // Random groups: every step once, each ticket's segments in order, fractions never decrease.
  std::mt19937_64 rng(5);
  for (int round = 0; round < 200; ++round) {
    std::vector<layered_copies> plans;
    const auto n = 1 + rng() % 6;
    for (std::size_t k = 0; k < n; ++k) plans.push_back(plan(1 + rng() % 9));
    const auto o = interleave_segments(plans);
    std::vector<std::int32_t> next(n, 0);
    double last = 0.0;
    for (const group_step& g : o) {
      REQUIRE(g.segment == next[g.part]);
      ++next[g.part];
      const double f = static_cast<double>(g.segment + 1) / static_cast<double>(std::max<std::size_t>(plans[g.part].ends.size(), 1));
      CHECK(f >= last);
      last = f;
    }
    for (std::size_t k = 0; k < n; ++k) CHECK(next[k] == static_cast<std::int32_t>(std::max<std::size_t>(plans[k].ends.size(), 1)));
  }
}

TEST_SUITE_END();
