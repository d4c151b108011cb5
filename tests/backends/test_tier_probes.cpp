// The disk probe of the tier spec (sim/disk_probe.hpp): what `hcbench replay --tiers
// ...,disk@DIR=SIZE` measures at start-up when the spec gives no :gbps= / :lat_us=.
// (The Redis probe's test is in test_redis_backend.cpp: it needs a server.)
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "hybridcache/sim/disk_probe.hpp"
#include "../support/temp_dir.hpp"

using namespace hybridcache;

TEST_CASE("disk probe: measures write, read and latency of the directory, and leaves nothing behind") {
  const test::temp_dir dir("hc_disk_probe");
  const std::string where = (dir.path() / "made" / "by-probe").string();  // created when missing
  const auto r = sim::probe_disk(where, {.bytes = 8 << 20, .block_bytes = 1 << 20, .latency_reads = 8});
  CHECK(r.write_gbps > 0.0);
  CHECK(r.read_gbps > 0.0);
  CHECK(r.latency_us > 0.0);
  CHECK(r.bytes == 8 << 20);
  CHECK((r.method == "O_DIRECT" || r.method == "buffered+fdatasync+fadvise(DONTNEED)"));
  CHECK(std::filesystem::is_directory(where));
  CHECK(std::filesystem::is_empty(where));  // the scratch file is removed
  // Buffered mode (what a file system without O_DIRECT gets) measures too.
  const auto b = sim::probe_disk(where, {.bytes = 4 << 20, .block_bytes = 1 << 20, .latency_reads = 4, .direct = false});
  CHECK(b.method == "buffered+fdatasync+fadvise(DONTNEED)");
  CHECK((b.write_gbps > 0.0 && b.read_gbps > 0.0 && b.latency_us > 0.0));
}

TEST_CASE("disk probe: a directory that cannot be made, or bad options, is a clear error") {
  const test::temp_dir dir("hc_disk_probe");
  const std::string file = (dir.path() / "plain-file").string();
  std::ofstream(file) << "x";
  const std::string expected = "disk probe of '" + file + "/sub': cannot create the directory";
  CHECK_THROWS_WITH_AS((void)sim::probe_disk(file + "/sub"), doctest::Contains(expected.c_str()), error);
  CHECK_THROWS_AS((void)sim::probe_disk(dir.str(), {.bytes = 1000}), invalid_argument);
  CHECK_THROWS_AS((void)sim::probe_disk(dir.str(), {.bytes = 3 << 20, .block_bytes = 2 << 20}), invalid_argument);
  CHECK_THROWS_AS((void)sim::probe_disk(dir.str(), {.latency_reads = 0}), invalid_argument);
}
