// Host copy engine with storage tiers (a disk directory under the memory tiers): a storage
// tier has no arena, its pages are values in the backend (storage_page_space), copies in and
// out carry the bytes, an altered or missing value fails the copy and leaves the source, dead
// values are removed, two engines on one backend never read each other's values, and a
// random sequence of moves, copies, extracts, splits and erases over hbm / host / disk matches a
// reference model of every entry's bytes.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <optional>
#include <random>
#include <vector>

#include "hybridcache/tiered/disk_backend.hpp"
#include "hybridcache/tiered/host_copy_engine.hpp"
#include "hybridcache/tiered/storage_page_space.hpp"
#include "hybridcache/tiered/tiered_store.hpp"

#include "../support/damage_file.hpp"
#include "../support/temp_dir.hpp"

using namespace hybridcache;
using namespace hybridcache::tiered;

namespace {
constexpr std::int64_t page = 512;
const tier_id host{1}, disk{2};

std::vector<tier_config> three_tiers(const std::string& dir, std::int64_t hbm_pages, std::int64_t host_pages,
                                     std::int64_t disk_bytes) {
  return {{.kind = tier_kind::hbm, .capacity_bytes = hbm_pages * page},
          {.kind = tier_kind::host, .capacity_bytes = host_pages * page},
          {.kind = tier_kind::disk, .capacity_bytes = disk_bytes, .location = dir}};
}

disk_backend_config disk_config(const std::string& dir) {
  return {.directory = dir, .capacity_bytes = std::int64_t{64} << 20, .io_threads = 2};
}

std::byte pattern(std::uint64_t seed, std::int64_t i) {
  return static_cast<std::byte>((seed * 0x9e3779b97f4a7c15ULL + static_cast<std::uint64_t>(i) * 0x2545f491) >> 56);
}

// The bytes of `id`'s copy in `t`: an arena's pages, or (read from the backend directly, so
// the engine's counters see only its own reads) the storage values its pages are in.
disk_backend<>* g_backend = nullptr;
std::vector<std::byte> bytes_of(const tiered_store<>& s, host_copy_engine& e, entry_id id, tier_id t) {
  const auto row = s.find(id);
  REQUIRE(row);
  const tier_copy* c = nullptr;
  for (const auto& x : row->copies)
    if (x.tier == t) c = &x;
  REQUIRE(c != nullptr);
  std::vector<std::byte> out(static_cast<std::size_t>(c->bytes));
  std::vector<std::byte> value;
  std::optional<storage_page_home> home;
  for (std::int64_t i = 0; i < c->bytes; ++i) {
    const std::uint32_t pg = c->pages.page(i / page);
    if (e.storage_pages(t) == nullptr) {
      out[static_cast<std::size_t>(i)] = e.base(t)[static_cast<std::int64_t>(pg) * page + i % page];
      continue;
    }
    if (i % page == 0) {
      home = e.storage_pages(t)->locate(pg);
      REQUIRE(home);
      value.assign(std::size_t{1} << 16, std::byte{0});
      REQUIRE(g_backend != nullptr);
      const auto tk = g_backend->get(e.storage_pages(t)->key_of(home->value), value);
      REQUIRE(tk);
      const auto r = g_backend->wait(*tk);
      REQUIRE(r);
      REQUIRE(r->status == io_status::ok);
      value.resize(static_cast<std::size_t>(r->bytes));
    }
    out[static_cast<std::size_t>(i)] = value.at(static_cast<std::size_t>(home->index * page + i % page));
  }
  return out;
}

void fill(tiered_store<>& s, host_copy_engine& e, entry_id id, std::uint64_t seed) {
  const auto row = s.find(id);
  REQUIRE(row);
  const tier_copy& c = row->copies.front();
  for (std::int64_t i = 0; i < c.bytes; ++i) e.base(c.tier)[static_cast<std::int64_t>(c.pages.page(i / page)) * page + i % page] = pattern(seed, i);
}

bool holds(const tiered_store<>& s, host_copy_engine& e, entry_id id, tier_id t, std::uint64_t seed, std::int64_t from = 0) {
  const auto b = bytes_of(s, e, id, t);
  for (std::size_t i = 0; i < b.size(); ++i)
    if (b[i] != pattern(seed, from + static_cast<std::int64_t>(i))) return false;
  return true;
}

/// A storage_tier_io over `backend` whose gets flip one byte while `flip` is set.
storage_tier_io flipping_io(disk_backend<>& backend, const std::atomic<bool>& flip) {
  storage_tier_io io = storage_io_of(backend);
  auto get = io.get;
  auto wait = io.wait;
  // The flip happens when the get's bytes are there: after wait. The buffer is the last
  // one handed to get, kept here.
  auto last = std::make_shared<std::span<std::byte>>();
  io.get = [get, last](const storage_key& k, std::span<std::byte> into) {
    *last = into;
    return get(k, into);
  };
  io.wait = [wait, last, &flip](io_ticket t) {
    auto r = wait(t);
    if (r && r->status == io_status::ok && flip.load() && !last->empty()) {
      (*last)[last->size() / 2] ^= std::byte{0x10};
      *last = {};
    }
    return r;
  };
  return io;
}
}  // namespace

TEST_CASE("host copy engine with a disk tier: hbm -> host -> disk -> hbm carries the bytes; the disk tier has no arena") {
  test::temp_dir dir("hc_engine_disk");
  disk_backend<> backend(disk_config(dir.path().string()));
  g_backend = &backend;
  {
    // A 1 TiB disk tier: before, the engine allocated (and zeroed) an arena of its capacity.
    const host_copy_engine big(three_tiers(dir.path().string(), 16, 16, std::int64_t{1} << 40), page,
                               {.measure_bandwidth = false}, {storage_io_of(backend)});
    CHECK(big.arena_bytes(disk) == 0);
  }
  const auto t = three_tiers(dir.path().string(), 16, 16, 256 * page);
  tiered_store<> s(t, page);
  host_copy_engine e(t, page, {.measure_bandwidth = false}, {storage_io_of(backend)});
  CHECK(e.arena_bytes(disk) == 0);
  CHECK(e.base(disk) == nullptr);
  CHECK(e.storage_pages(disk) != nullptr);
  CHECK(e.storage_pages(host) == nullptr);

  REQUIRE(s.insert(entry_id{1}, 5 * page - 17).has_value());
  fill(s, e, entry_id{1}, 1);
  REQUIRE(move_entry(s, e, entry_id{1}, host).has_value());
  REQUIRE(move_entry(s, e, entry_id{1}, disk).has_value());
  CHECK(s.find(entry_id{1})->tier() == disk);
  CHECK(backend.counters().puts == 1);
  CHECK(e.storage_pages(disk)->values() == 1);
  CHECK(holds(s, e, entry_id{1}, disk, 1));
  // Straight back into HBM (a load from disk), then back to disk and up to host.
  REQUIRE(move_entry(s, e, entry_id{1}, hbm_tier).has_value());
  CHECK(holds(s, e, entry_id{1}, hbm_tier, 1));
  REQUIRE(move_entry(s, e, entry_id{1}, disk).has_value());
  REQUIRE(move_entry(s, e, entry_id{1}, host).has_value());
  CHECK(holds(s, e, entry_id{1}, host, 1));
  CHECK(e.storage_pages(disk)->counters().gets == 2);
  CHECK(e.storage_pages(disk)->counters().get_failures == 0);
  CHECK(s.check_invariants().empty());
  // Stopping removes every value the engine put.
  e.stop();
  CHECK(e.storage_pages(disk)->values() == 0);
  CHECK(backend.counters().removes >= 1);
}

TEST_CASE("host copy engine with a disk tier: an extract of some pages of every segment reads them from disk") {
  test::temp_dir dir("hc_engine_disk");
  disk_backend<> backend(disk_config(dir.path().string()));
  g_backend = &backend;
  const auto t = three_tiers(dir.path().string(), 32, 32, 64 * page);
  tiered_store<> s(t, page);
  host_copy_engine e(t, page, {.measure_bandwidth = false}, {storage_io_of(backend)});
  // 4 segments of 3 pages (layer-major); pages 1..2 of each segment are tokens a request needs.
  REQUIRE(s.insert(entry_id{7}, 12 * page, hbm_tier, {}, false, 4).has_value());
  fill(s, e, entry_id{7}, 7);
  REQUIRE(move_entry(s, e, entry_id{7}, disk).has_value());
  auto tk = s.prepare_extract(entry_id{7}, disk, {1, 2}, entry_id{8}, hbm_tier);
  REQUIRE(tk);
  auto ev = e.submit(*tk);
  REQUIRE(ev);
  REQUIRE(e.wait(*ev).has_value());
  REQUIRE(s.complete_move(*tk, true).has_value());
  const auto b = bytes_of(s, e, entry_id{8}, hbm_tier);
  REQUIRE(b.size() == static_cast<std::size_t>(8 * page));
  for (std::int64_t seg = 0; seg < 4; ++seg)
    for (std::int64_t i = 0; i < 2 * page; ++i)
      REQUIRE(b[static_cast<std::size_t>(seg * 2 * page + i)] == pattern(7, seg * 3 * page + page + i));
  CHECK(e.storage_pages(disk)->counters().gets == 1);  // one value, read once for the whole job
}

TEST_CASE("host copy engine with a disk tier: bytes altered at rest fail the copy; the entry stays where it was") {
  test::temp_dir dir("hc_engine_disk");
  disk_backend<> backend(disk_config(dir.path().string()));
  g_backend = &backend;
  std::atomic<bool> flip{false};
  const auto t = three_tiers(dir.path().string(), 16, 16, 64 * page);
  tiered_store<> s(t, page);
  host_copy_engine e(t, page, {.measure_bandwidth = false}, {flipping_io(backend, flip)});
  REQUIRE(s.insert(entry_id{1}, 3 * page).has_value());
  fill(s, e, entry_id{1}, 3);
  REQUIRE(move_entry(s, e, entry_id{1}, disk).has_value());
  flip = true;  // the backend hands back other bytes than were put (its own check passed)
  const auto r = move_entry(s, e, entry_id{1}, hbm_tier);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error() == errc::busy);
  CHECK(s.find(entry_id{1})->tier() == disk);  // the source copy stays, valid
  CHECK(e.storage_pages(disk)->counters().get_failures == 1);
  CHECK(s.usage(hbm_tier).used_bytes == 0);  // the failed destination's pages went back
  flip = false;
  REQUIRE(move_entry(s, e, entry_id{1}, hbm_tier).has_value());
  CHECK(holds(s, e, entry_id{1}, hbm_tier, 3));

  // A value file damaged on disk: the backend's own CRC sees it, the copy fails.
  REQUIRE(move_entry(s, e, entry_id{1}, disk).has_value());
  REQUIRE(test::flip_byte_in_largest_file(dir.path(), 10, 0x01) > static_cast<std::uintmax_t>(3 * page));
  CHECK_FALSE(move_entry(s, e, entry_id{1}, hbm_tier).has_value());
  CHECK(backend.counters().corrupt == 1);
  CHECK(s.find(entry_id{1})->tier() == disk);
}

TEST_CASE("host copy engine with a disk tier: a put over reused pages removes the dead value") {
  test::temp_dir dir("hc_engine_disk");
  disk_backend<> backend(disk_config(dir.path().string()));
  g_backend = &backend;
  const auto t = three_tiers(dir.path().string(), 16, 16, 4 * page);
  tiered_store<> s(t, page);
  host_copy_engine e(t, page, {.measure_bandwidth = false}, {storage_io_of(backend)});
  REQUIRE(s.insert(entry_id{1}, 4 * page).has_value());
  fill(s, e, entry_id{1}, 1);
  REQUIRE(move_entry(s, e, entry_id{1}, disk).has_value());
  REQUIRE(s.erase(entry_id{1}).has_value());  // the store frees the pages; the engine is not told
  CHECK(e.storage_pages(disk)->values() == 1);
  REQUIRE(s.insert(entry_id{2}, 4 * page).has_value());
  fill(s, e, entry_id{2}, 2);
  REQUIRE(move_entry(s, e, entry_id{2}, disk).has_value());  // the disk tier's only 4 pages again
  CHECK(e.storage_pages(disk)->values() == 1);
  CHECK(e.storage_pages(disk)->counters().removes == 1);
  CHECK(backend.counters().removes == 1);
  CHECK(holds(s, e, entry_id{2}, disk, 2));
}

TEST_CASE("host copy engine: two engines on one backend never read each other's values") {
  test::temp_dir dir("hc_engine_disk");
  disk_backend<> backend(disk_config(dir.path().string()));
  g_backend = &backend;
  const auto t = three_tiers(dir.path().string(), 16, 16, 16 * page);
  tiered_store<> s1(t, page), s2(t, page);
  host_copy_engine e1(t, page, {.measure_bandwidth = false}, {storage_io_of(backend)});
  host_copy_engine e2(t, page, {.measure_bandwidth = false}, {storage_io_of(backend)});
  // Both put value 1 over disk page 0..2: the keys differ by the engines' salts.
  REQUIRE(s1.insert(entry_id{1}, 3 * page).has_value());
  REQUIRE(s2.insert(entry_id{1}, 3 * page).has_value());
  fill(s1, e1, entry_id{1}, 11);
  fill(s2, e2, entry_id{1}, 22);
  REQUIRE(move_entry(s1, e1, entry_id{1}, disk).has_value());
  REQUIRE(move_entry(s2, e2, entry_id{1}, disk).has_value());
  CHECK(backend.counters().puts == 2);
  REQUIRE(move_entry(s1, e1, entry_id{1}, hbm_tier).has_value());
  REQUIRE(move_entry(s2, e2, entry_id{1}, hbm_tier).has_value());
  CHECK(holds(s1, e1, entry_id{1}, hbm_tier, 11));
  CHECK(holds(s2, e2, entry_id{1}, hbm_tier, 22));
}

TEST_CASE("host copy engine: storage tiers and their calls must match") {
  test::temp_dir dir("hc_engine_disk");
  disk_backend<> backend(disk_config(dir.path().string()));
  g_backend = &backend;
  const auto t = three_tiers(dir.path().string(), 4, 4, 4 * page);
  CHECK_THROWS_WITH_AS(host_copy_engine(t, page, {.measure_bandwidth = false}),
                       doctest::Contains("1 storage tier(s) need as many storage_tier_io, got 0"), invalid_argument);
  const std::vector<tier_config> memory(t.begin(), t.begin() + 2);
  CHECK_THROWS_WITH_AS(host_copy_engine(memory, page, {.measure_bandwidth = false}, {storage_io_of(backend)}),
                       doctest::Contains("0 storage tier(s) need as many storage_tier_io, got 1"), invalid_argument);
  storage_tier_io partial = storage_io_of(backend);
  partial.remove = nullptr;
  CHECK_THROWS_WITH_AS(host_copy_engine(t, page, {.measure_bandwidth = false}, {partial}),
                       doctest::Contains("lacks put, get, wait or remove"), invalid_argument);
}

TEST_CASE("host copy engine with a disk tier: random moves, copies, extracts, splits and erases match a model of the bytes") {
  // The model: each entry's logical bytes are pattern(seed, offset + i). Every valid copy of
  // every entry, in any tier, must hold them after each step.
  for (const std::uint64_t seed : {1u, 2u, 3u}) {
    INFO("seed " << seed);
    test::temp_dir dir("hc_engine_disk");
    disk_backend<> backend(disk_config(dir.path().string()));
    g_backend = &backend;
    const auto t = three_tiers(dir.path().string(), 40, 24, 48 * page);
    tiered_store<> s(t, page);
    host_copy_engine e(t, page, {.measure_bandwidth = false}, {storage_io_of(backend)});
    std::mt19937_64 rng(seed);
    struct model_entry {
      std::uint64_t seed;
      std::int64_t from;  // its bytes are pattern(seed, from + i)
    };
    std::map<std::uint64_t, model_entry> model;
    std::uint64_t next = 1;
    int moves = 0;
    for (int step = 0; step < 500; ++step) {
      const int op = static_cast<int>(rng() % 10);
      if (op < 2 || model.empty()) {  // a new entry computed in HBM
        const std::int64_t pages = 1 + static_cast<std::int64_t>(rng() % 4);
        const std::int64_t bytes = pages * page - static_cast<std::int64_t>(rng() % 2) * 37;
        if (!s.insert(make_entry_id(next), bytes, hbm_tier, {}, false, 1)) continue;
        fill(s, e, make_entry_id(next), next);
        model[next] = {next, 0};
        ++next;
        continue;
      }
      auto it = model.begin();
      std::advance(it, static_cast<long>(rng() % model.size()));
      const entry_id id = make_entry_id(it->first);
      if (op == 2 || (op == 3 && model.size() > 12)) {  // erase
        if (s.erase(id)) model.erase(it);
        continue;
      }
      const tier_id dst{static_cast<std::uint8_t>(rng() % 3)};
      if (op == 3 && model.size() <= 12) {  // a split: two ids over the same pages, in every tier
        const auto row = s.find(id);
        const std::int64_t pages = (row->copies.front().bytes + page - 1) / page;
        if (pages < 2) continue;
        const std::int64_t head = (1 + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(pages - 1))) * page;
        if (!s.split(id, make_entry_id(next), head)) continue;
        model[next] = it->second;       // the head keeps the first bytes
        it->second.from += head;        // the tail starts `head` bytes in
        ++next;
        continue;
      }
      if (op == 4) {  // an extract of its whole copy in some tier into a new entry
        const auto row = s.find(id);
        const tier_id src = row->copies[rng() % row->copies.size()].tier;
        auto tk = s.prepare_extract(id, src, {0, -1}, make_entry_id(next), dst);
        if (!tk) continue;
        auto ev = e.submit(*tk);
        REQUIRE(ev);
        const bool ok = e.wait(*ev).has_value();
        REQUIRE(ok);
        REQUIRE(s.complete_move(*tk, ok).has_value());
        model[next] = it->second;
        ++next;
        continue;
      }
      // A move, or a replica of its home copy. The store may refuse (no room, a copy already
      // there); once prepared, the engine's copy must succeed.
      const tier_id src = s.find(id)->tier();
      auto tk = op < 7 ? s.prepare_move(id, dst) : s.prepare_copy(id, src, dst);
      if (!tk) continue;
      auto ev = e.submit(*tk);
      REQUIRE(ev);
      const bool ok = e.wait(*ev).has_value();
      REQUIRE_MESSAGE(ok, "a copy from tier " << int(src.value) << " to " << int(dst.value) << " failed");
      REQUIRE(s.complete_move(*tk, ok).has_value());
      ++moves;
      // Every valid copy of every entry holds its bytes.
      for (const auto& entry : model) {  // not a structured binding: clang 14 cannot capture one in REQUIRE_MESSAGE
        const std::uint64_t n = entry.first;
        const auto row = s.find(make_entry_id(n));
        REQUIRE(row);
        for (const auto& c : row->copies)
          if (c.state == copy_state::valid)
            REQUIRE_MESSAGE(holds(s, e, make_entry_id(n), c.tier, entry.second.seed, entry.second.from),
                            "entry " << n << " in tier " << int(c.tier.value));
      }
      REQUIRE(s.check_invariants().empty());
      const std::string bad = e.storage_pages(disk)->check_invariants();
      REQUIRE_MESSAGE(bad.empty(), bad);
    }
    const auto pc = e.storage_pages(disk)->counters();
    MESSAGE(moves << " moves/copies, " << pc.puts << " disk puts, " << pc.gets << " disk gets, " << pc.removes << " removes");
    CHECK(pc.puts > 30);
    CHECK(pc.gets > 15);
    CHECK(pc.get_failures == 0);
    CHECK(pc.removes > 0);
    // The backend holds no more values than the engine still maps.
    CHECK(backend.counters().puts - backend.counters().removes == static_cast<std::int64_t>(e.storage_pages(disk)->values()));
  }
}
