// The storage_backend conformance suite (storage_backend_laws.hpp) over the reference model
// and the disk tier. The Redis tier runs the same suite in tests/backends (it needs a
// server and hiredis).
#include <doctest/doctest.h>

#include <cstdint>
#include <fstream>

#include "hybridcache/tiered/disk_backend.hpp"
#include "../support/memory_storage_backend.hpp"
#include "../support/temp_dir.hpp"
#include "storage_backend_laws.hpp"

namespace {

using namespace hybridcache;
using namespace hybridcache::tiered;

struct memory_fixture {
  using backend_type = test::memory_storage_backend;
  static constexpr const char* name = "memory reference";
  memory_fixture(std::int64_t capacity, std::int32_t depth) : b(capacity, depth) {}
  backend_type& backend() { return b; }
  bool corrupt(const storage_key& k) { return b.corrupt(k); }
  backend_type b;
};

struct disk_fixture {
  using backend_type = disk_backend<>;
  static constexpr const char* name = "disk";
  disk_fixture(std::int64_t capacity, std::int32_t depth)
      : b({.directory = dir.str(), .capacity_bytes = capacity, .io_threads = 2, .queue_depth = depth,
           .io_block_bytes = 256 * 1024}) {}
  backend_type& backend() { return b; }
  /// Flips one payload byte in the value's file.
  bool corrupt(const storage_key& k) {
    std::fstream f(b.path_of(k), std::ios::in | std::ios::out | std::ios::binary);
    if (!f) return false;
    f.seekg(0, std::ios::end);
    const auto size = static_cast<std::int64_t>(f.tellg());
    if (size <= static_cast<std::int64_t>(value_header_bytes)) return false;
    const std::int64_t at = static_cast<std::int64_t>(value_header_bytes) + (size - static_cast<std::int64_t>(value_header_bytes)) / 2;
    f.seekg(at);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x20);
    f.seekp(at);
    f.write(&c, 1);
    return static_cast<bool>(f);
  }
  test::temp_dir dir{"hc_disk_conf"};
  backend_type b;
};

}  // namespace

TEST_CASE_TEMPLATE_INVOKE(storage_backend_conformance, memory_fixture, disk_fixture);
