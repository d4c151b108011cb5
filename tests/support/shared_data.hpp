// Tests that read the reference data folder (../shared: traces, fixtures), which a checkout
// may not have. Such a test must be seen to be skipped, never pass silently:
//
//   TEST_CASE("..." * doctest::test_suite("shared_data")) {
//     const auto path = hybridcache::test::shared_path("data/traces/x.jsonl");
//     if (!hybridcache::test::shared_available(path)) return;
//     ...
//   }
//
// `shared_available` prints "SKIPPED: <path> missing" and counts the skip; the test main
// (tests/doctest_main.cpp) then exits with 77 when nothing failed. tests/CMakeLists.txt
// runs every part's "shared_data" suite as its own ctest entry `<part>.shared_data` with
// SKIP_RETURN_CODE 77 (and excludes it from the `<part>` entry), so ctest reports exactly
// the data-dependent cases as skipped and the rest of the part as passed.
//
// The folder is HYBRIDCACHE_SHARED_DIR (a compile definition: <source>/../shared); the
// environment variable of the same name overrides it at run time, e.g. to check the skip
// path: HYBRIDCACHE_SHARED_DIR=/nonexistent ctest -L shared_data.
#pragma once

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string_view>

namespace hybridcache::test {

/// Skips recorded by `shared_available` in this process (one counter per executable).
inline std::atomic<int>& shared_skips() noexcept {
  static std::atomic<int> n{0};
  return n;
}

/// The shared data folder: $HYBRIDCACHE_SHARED_DIR if set, else the compile-time default.
inline std::filesystem::path shared_dir() {
  if (const char* env = std::getenv("HYBRIDCACHE_SHARED_DIR"); env != nullptr && *env != '\0') return env;
#ifdef HYBRIDCACHE_SHARED_DIR
  return HYBRIDCACHE_SHARED_DIR;
#else
  return "shared";
#endif
}

/// `relative` inside the shared data folder.
inline std::filesystem::path shared_path(std::string_view relative) { return shared_dir() / relative; }

/// True when `path` exists; otherwise reports the skip (see the file comment) and returns
/// false, and the calling test case returns at once.
inline bool shared_available(const std::filesystem::path& path) {
  std::error_code ec;
  if (std::filesystem::exists(path, ec)) return true;
  std::cout << "SKIPPED: " << path.string() << " missing" << std::endl;
  shared_skips().fetch_add(1, std::memory_order_relaxed);
  return false;
}

}  // namespace hybridcache::test
