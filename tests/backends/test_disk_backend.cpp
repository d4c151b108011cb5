// The disk tier beyond the conformance suite: restart over an existing directory, torn and
// corrupt files, a full file system (a real 1 MiB tmpfs when this process may mount one,
// and always the write fault hook), the directory lock, configuration errors, the scorer,
// and many threads at once (suite `concurrency`, also run under ThreadSanitizer).
#include <doctest/doctest.h>

#include <sys/mount.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>
#include <vector>

#include "hybridcache/tiered/disk_backend.hpp"
#include "../support/storage_ops.hpp"
#include "../support/temp_dir.hpp"

using namespace hybridcache;
using namespace hybridcache::tiered;
namespace fs = std::filesystem;

namespace {

constexpr std::int64_t mib = std::int64_t{1} << 20;

/// Deterministic bytes for (key, version): the first 8 bytes are the version, so a reader
/// can tell which write it got.
std::vector<std::byte> value_bytes(const storage_key& k, std::uint64_t version, std::size_t n) {
  std::vector<std::byte> v(n);
  std::mt19937_64 rng(k.prefix ^ (version * 0x9e3779b97f4a7c15ULL));
  for (auto& b : v) b = static_cast<std::byte>(rng());
  for (std::size_t i = 0; i < std::min<std::size_t>(8, n); ++i) v[i] = static_cast<std::byte>((version >> (8 * i)) & 0xffu);
  return v;
}

storage_key key_n(std::uint64_t i, value_kind kind = value_kind::kv) { return {42, 1000 + i, static_cast<std::int64_t>(i + 1), kind}; }

using test::storage_ops::get;
using test::storage_ops::put;

std::size_t files_under(const fs::path& dir) {
  std::size_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file() && e.path().filename() != "LOCK") ++n;
  return n;
}

disk_backend_config config_for(const test::temp_dir& d, std::int64_t capacity) {
  return {.directory = d.str(), .capacity_bytes = capacity, .io_threads = 2, .queue_depth = 32,
          .io_block_bytes = 64 * 1024};
}

}  // namespace

TEST_CASE("disk tier: a restart over the directory brings every value back, oldest first out") {
  test::temp_dir d("hc_disk_restart");
  std::vector<std::vector<std::byte>> values;
  {
    disk_backend<> b(config_for(d, 64 * mib));
    for (std::uint64_t i = 0; i < 12; ++i) {
      values.push_back(value_bytes(key_n(i), 1, 100000 + i * 3));
      REQUIRE(put(b, key_n(i), {static_cast<std::int64_t>(i), {layer_order::layer_major, 7}}, values.back()).status ==
              io_status::ok);
    }
  }
  {
    disk_backend<> b(config_for(d, 64 * mib));
    CHECK(b.entries() == 12);
    CHECK(b.counters().recovered == 12);
    CHECK(b.counters().dropped_at_recovery == 0);
    for (std::uint64_t i = 0; i < 12; ++i) {
      std::vector<std::byte> into(values[i].size());
      const io_result r = get(b, key_n(i), into);
      REQUIRE(r.status == io_status::ok);
      CHECK(into == values[i]);
      CHECK(r.meta == value_meta{static_cast<std::int64_t>(i), {layer_order::layer_major, 7}});
    }
  }
  // The second run read them in order 0 .. 11, so 0 .. 3 are the least recently used:
  // reopened with room for 8 values, those 4 leave.
  const std::int64_t per = static_cast<std::int64_t>(value_header_bytes) + 100000 + 33;
  disk_backend<> b(config_for(d, 8 * per));
  CHECK(b.entries() == 8);
  CHECK(b.counters().evictions == 4);
  std::vector<storage_key> keys;
  for (std::uint64_t i = 0; i < 12; ++i) keys.push_back(key_n(i));
  std::vector<std::uint8_t> found(keys.size());
  REQUIRE(b.wait(*b.exists(keys, found)));
  CHECK(found == std::vector<std::uint8_t>{0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1});
  CHECK(b.used_bytes() <= b.capacity_bytes());
  CHECK(files_under(d.path()) == 8);
}

TEST_CASE("disk tier: torn writes, truncated and corrupt files are dropped at restart, caught at get") {
  test::temp_dir d("hc_disk_torn");
  std::vector<std::byte> v0 = value_bytes(key_n(0), 1, 50000), v1 = value_bytes(key_n(1), 1, 50000),
                         v2 = value_bytes(key_n(2), 1, 50000), v3 = value_bytes(key_n(3), 1, 50000);
  std::string p1, p2, p3;
  {
    disk_backend<> b(config_for(d, 16 * mib));
    for (std::uint64_t i = 0; i < 4; ++i) REQUIRE(put(b, key_n(i), value_bytes(key_n(i), 1, 50000)).status == io_status::ok);
    p1 = b.path_of(key_n(1));
    p2 = b.path_of(key_n(2));
    p3 = b.path_of(key_n(3));
  }
  // A crash mid-write leaves a file in tmp/; one value lost its tail; one has a damaged
  // header; one a flipped payload byte (only the CRC at get can see it); a stray file.
  { std::ofstream(d.path() / "tmp" / "0123.7.tmp") << "half a value"; }
  fs::resize_file(p1, 30000);
  {
    std::fstream f(p2, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(20);
    f.put('\x7f');
  }
  {
    std::fstream f(p3, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40000);
    f.put('\x01');
  }
  fs::create_directories(d.path() / "v1" / "ab");
  { std::ofstream(d.path() / "v1" / "ab" / "not-a-value.hcv") << "x"; }
  disk_backend<> b(config_for(d, 16 * mib));
  CHECK(b.counters().recovered == 2);
  CHECK(b.counters().dropped_at_recovery == 4);  // tmp file, truncated, bad header, stray
  CHECK_FALSE(fs::exists(p1));
  CHECK_FALSE(fs::exists(p2));
  CHECK(fs::is_empty(d.path() / "tmp"));
  std::vector<std::byte> into(50000);
  CHECK(get(b, key_n(0), into).status == io_status::ok);
  CHECK(into == v0);
  CHECK(get(b, key_n(1), into).status == io_status::not_found);
  CHECK(get(b, key_n(3), into).status == io_status::corrupt);  // caught by the CRC, never used
  CHECK(b.counters().corrupt == 1);
  CHECK_FALSE(fs::exists(p3));  // and removed

  // Truncated while the tier runs: a miss at the next get, not garbage.
  REQUIRE(put(b, key_n(5), value_bytes(key_n(5), 1, 70000)).status == io_status::ok);
  fs::resize_file(b.path_of(key_n(5)), 1000);
  std::vector<std::byte> big(70000);
  CHECK(get(b, key_n(5), big).status == io_status::corrupt);
  // Replaced behind its back by another key's file: the header's key gives it away.
  REQUIRE(put(b, key_n(6), value_bytes(key_n(6), 1, 70000)).status == io_status::ok);
  REQUIRE(put(b, key_n(7), value_bytes(key_n(7), 1, 70000)).status == io_status::ok);
  fs::copy_file(b.path_of(key_n(7)), b.path_of(key_n(6)), fs::copy_options::overwrite_existing);
  CHECK(get(b, key_n(6), big).status == io_status::corrupt);
  CHECK(get(b, key_n(7), big).status == io_status::ok);
  CHECK(b.counters().corrupt == 3);
  // Deleted behind its back: a miss, and the index forgets it.
  fs::remove(b.path_of(key_n(7)));
  CHECK(get(b, key_n(7), big).status == io_status::not_found);
  CHECK(b.entries() == 1);
}

TEST_CASE("disk tier: a full disk (write fault hook) stores nothing, leaves no file, and recovers") {
  test::temp_dir d("hc_disk_full_hook");
  disk_backend<> b(config_for(d, 16 * mib));
  const auto v = value_bytes(key_n(1), 1, 300000);
  REQUIRE(put(b, key_n(0), value_bytes(key_n(0), 1, 300000)).status == io_status::ok);
  std::atomic<int> calls{0};
  b.set_write_fault([&](std::int64_t offset, std::int64_t) {
    ++calls;
    return offset >= 100000 ? ENOSPC : 0;  // the disk fills part-way through every value
  });
  const io_result r = put(b, key_n(1), v);
  CHECK(r.status == io_status::no_space);
  CHECK(b.counters().no_space == 2);  // the write and its one retry
  CHECK(b.counters().put_failures == 1);
  CHECK(calls.load() > 2);
  // The retry evicted the scorer's victim to make room; nothing partial is left anywhere.
  CHECK(b.entries() == 0);
  CHECK(files_under(d.path()) == 0);
  std::vector<std::byte> into(v.size());
  CHECK(get(b, key_n(1), into).status == io_status::not_found);
  // Space comes back: puts work again and the capacity follows the file system.
  b.set_write_fault({});
  REQUIRE(put(b, key_n(1), v).status == io_status::ok);
  REQUIRE(get(b, key_n(1), into).status == io_status::ok);
  CHECK(into == v);
  CHECK(b.capacity_bytes() == 16 * mib);
  // An error other than a full disk is `unavailable`, not retried.
  b.set_write_fault([](std::int64_t, std::int64_t) { return EIO; });
  CHECK(put(b, key_n(2), v).status == io_status::unavailable);
  CHECK(b.counters().no_space == 2);
  b.set_write_fault({});
  CHECK(files_under(d.path()) == 1);
}

TEST_CASE("disk tier: a full disk (a real 1 MiB tmpfs, when this process may mount one)") {
  test::temp_dir d("hc_disk_full_tmpfs");
  if (::mount("tmpfs", d.str().c_str(), "tmpfs", 0, "size=1m") != 0) {
    MESSAGE("cannot mount a tmpfs here (" << std::strerror(errno) << "): the fault hook case covers ENOSPC");
    return;
  }
  struct unmount {
    std::string dir;
    ~unmount() { ::umount2(dir.c_str(), MNT_DETACH); }
  } guard{d.str()};
  std::vector<std::vector<std::byte>> stored;
  {
    disk_backend<> b(config_for(d, 64 * mib));  // configured far beyond the 1 MiB there is
    int no_space = 0;
    for (std::uint64_t i = 0; i < 12; ++i) {
      const auto v = value_bytes(key_n(i), 1, 200000);
      const io_result r = put(b, key_n(i), v);
      CHECK((r.status == io_status::ok || r.status == io_status::no_space));
      no_space += r.status == io_status::no_space;
    }
    CHECK(b.counters().no_space >= 1);  // the file system said so ...
    CHECK(b.capacity_bytes() < mib);     // ... and the tier now holds what fits
    CHECK(b.entries() >= 3);
    CHECK(fs::is_empty(d.path() / "tmp"));
    // Every value still held verifies; the latest puts won (LRU evicted the oldest).
    std::vector<std::byte> into(200000);
    int hits = 0;
    for (std::uint64_t i = 0; i < 12; ++i) {
      const io_result r = get(b, key_n(i), into);
      CHECK((r.status == io_status::ok || r.status == io_status::not_found));
      if (r.status == io_status::ok) {
        CHECK(into == value_bytes(key_n(i), 1, 200000));
        ++hits;
      }
    }
    CHECK(hits == b.entries());
    CHECK(get(b, key_n(11), into).status == io_status::ok);
    MESSAGE("1 MiB tmpfs: " << no_space << " of 12 puts ended no_space, " << hits << " values held");
  }
  disk_backend<> again(config_for(d, 64 * mib));  // and a restart on the full disk reads them back
  CHECK(again.counters().dropped_at_recovery == 0);
  CHECK(again.entries() >= 3);
}

TEST_CASE("disk tier: one backend per directory; bad configuration names the field") {
  test::temp_dir d("hc_disk_lock");
  {
    disk_backend<> a(config_for(d, mib));
    CHECK_THROWS_WITH_AS(disk_backend<>(config_for(d, mib)), doctest::Contains("in use by another disk_backend"),
                         invalid_argument);
  }
  disk_backend<> after(config_for(d, mib));  // the lock went with the first backend
  CHECK(after.entries() == 0);
  test::temp_dir e("hc_disk_cfg");
  auto bad = [&](auto edit, const char* field) {
    disk_backend_config c = config_for(e, mib);
    edit(c);
    CHECK_THROWS_WITH_AS(disk_backend<>{c}, doctest::Contains(field), invalid_argument);
  };
  bad([](disk_backend_config& c) { c.directory.clear(); }, "directory");
  bad([](disk_backend_config& c) { c.capacity_bytes = 0; }, "capacity_bytes");
  bad([](disk_backend_config& c) { c.io_threads = 0; }, "io_threads");
  bad([](disk_backend_config& c) { c.queue_depth = 0; }, "queue_depth");
  bad([](disk_backend_config& c) { c.io_block_bytes = 100; }, "io_block_bytes");
  bad([](disk_backend_config& c) { c.directory = "/proc/self/no/such/place"; }, "cannot create directory");
}

TEST_CASE("disk tier: eviction follows the tier's scorer (CaR's score, LRU among equals)") {
  test::temp_dir d("hc_disk_car");
  const std::int64_t per = static_cast<std::int64_t>(value_header_bytes) + 10000;
  disk_backend<car_score_demotion> b(config_for(d, 4 * per));
  for (std::uint64_t i = 0; i < 4; ++i) REQUIRE(put(b, key_n(i), value_bytes(key_n(i), 1, 10000)).status == io_status::ok);
  b.set_score(key_n(0), 3.0);  // in use by queued requests: keep
  b.set_score(key_n(1), 2.0);
  b.set_score(key_n(2), -2.0);  // completed: first to go
  REQUIRE(put(b, key_n(4), value_bytes(key_n(4), 1, 10000)).status == io_status::ok);
  REQUIRE(put(b, key_n(5), value_bytes(key_n(5), 1, 10000)).status == io_status::ok);
  std::vector<storage_key> keys{key_n(0), key_n(1), key_n(2), key_n(3), key_n(4), key_n(5)};
  std::vector<std::uint8_t> found(keys.size());
  REQUIRE(b.wait(*b.exists(keys, found)));
  // Victims: key 2 (score -2), then the oldest of the score-0 rows (key 3).
  CHECK(found == std::vector<std::uint8_t>{1, 1, 0, 0, 1, 1});
}

TEST_CASE("disk tier: many threads put, get, exist and remove at once" * doctest::test_suite("concurrency")) {
  test::temp_dir d("hc_disk_threads");
  const std::int64_t capacity = 3 * mib;
  std::atomic<std::uint64_t> version{1};
  std::atomic<int> hits{0}, wrong{0};
  {
    disk_backend<> b({.directory = d.str(), .capacity_bytes = capacity, .io_threads = 3, .queue_depth = 16,
                      .io_block_bytes = 16 * 1024});
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&, t] {
        std::mt19937_64 rng(static_cast<std::uint64_t>(t) + 1);
        std::vector<std::byte> into(120000);
        for (int op = 0; op < 150; ++op) {
          const storage_key k = key_n(rng() % 24);
          const int what = static_cast<int>(rng() % 10);
          if (what < 4) {
            const std::uint64_t ver = version.fetch_add(1);
            const auto v = value_bytes(k, ver, 20000 + (ver % 7) * 13000);
            auto tk = b.put(k, {0, {}}, v);
            if (!tk) continue;  // busy: the queue is full
            const auto r = b.wait(*tk);
            CHECK((r->status == io_status::ok || r->status == io_status::no_space));
          } else if (what < 8) {
            auto tk = b.get(k, into);
            if (!tk) continue;
            const auto r = b.wait(*tk);
            if (r->status == io_status::ok) {
              // Whatever version it read, the bytes are exactly that version's.
              std::uint64_t ver = 0;
              for (int i = 0; i < 8; ++i) ver |= static_cast<std::uint64_t>(into[static_cast<std::size_t>(i)]) << (8 * i);
              const auto want = value_bytes(k, ver, static_cast<std::size_t>(r->bytes));
              if (!std::equal(want.begin(), want.end(), into.begin())) ++wrong;
              ++hits;
            } else if (r->status != io_status::not_found) {
              ++wrong;
            }
          } else if (what < 9) {
            std::vector<storage_key> ks{key_n(1), key_n(2), k};
            std::vector<std::uint8_t> f(3);
            if (auto tk = b.exists(ks, f)) (void)b.wait(*tk);
          } else if (auto tk = b.remove(k)) {
            (void)b.wait(*tk);
          }
        }
      });
    for (auto& th : threads) th.join();
    CHECK(b.used_bytes() <= capacity);
    CHECK(b.counters().corrupt == 0);
    CHECK(fs::is_empty(d.path() / "tmp"));
  }
  CHECK(wrong.load() == 0);
  CHECK(hits.load() > 0);
  disk_backend<> again({.directory = d.str(), .capacity_bytes = capacity});
  CHECK(again.counters().dropped_at_recovery == 0);
}
