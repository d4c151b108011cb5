// tools/hcbench/tier_directories.hpp
//
// `new_directories_guard`: the strong guarantee of `hcbench replay --tiers` for the disk
// tiers' directories. The disk probe (sim/disk_probe.hpp) and the --real-bytes backends
// create a disk tier's directory, with any missing parents, when they first touch it, and a
// later step can still fail: a redis tier that cannot be reached, a policy the tiers cannot
// run, a second backend. So the guard notes, before any of that, which of those directories
// do not exist yet, and when its scope is left by an exception removes them again, deepest
// first and only while empty (rmdir): bad input leaves the file system as it found it, and a
// file someone else put there meanwhile is never deleted. A run that succeeds keeps them.
// What the probe and the backends put inside is theirs to remove (they do, on failure too).
#pragma once

#include <unistd.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <iterator>
#include <system_error>
#include <vector>

#include <hybridcache/tiered/tier.hpp>

namespace hcbench {

class new_directories_guard {
 public:
  /// Notes the directories of the disk tiers of `tiers` that do not exist, and their missing
  /// parents. O(tiers * path depth) stat calls; never throws for a path it cannot stat.
  explicit new_directories_guard(const std::vector<hybridcache::tiered::tier_config>& tiers)
      : exceptions_(std::uncaught_exceptions()) {
    namespace fs = std::filesystem;
    for (const auto& t : tiers) {
      if (t.kind != hybridcache::tiered::tier_kind::disk || t.location.empty()) continue;
      fs::path p = fs::path(t.location).lexically_normal();
      if (!p.has_filename()) p = p.parent_path();  // "dir/" is "dir"
      for (; !p.empty(); p = p.parent_path()) {
        // symlink_status: a dangling link exists and is not ours. A path through a regular
        // file reads as not_found (ENOTDIR); nothing can be created there, and rmdir of it fails.
        std::error_code ec;
        if (fs::symlink_status(p, ec).type() != fs::file_type::not_found) break;
        if (std::find(missing_.begin(), missing_.end(), p) == missing_.end()) missing_.push_back(p);
        if (p == p.parent_path()) break;
      }
    }
    // Deepest first, so that a directory is removed before its parent.
    std::stable_sort(missing_.begin(), missing_.end(), [](const fs::path& a, const fs::path& b) {
      return std::distance(a.begin(), a.end()) > std::distance(b.begin(), b.end());
    });
  }

  /// Removes the noted directories when an exception leaves the scope; keeps them otherwise.
  ~new_directories_guard() {
    if (std::uncaught_exceptions() <= exceptions_) return;
    for (const auto& p : missing_) (void)::rmdir(p.c_str());  // fails, harmlessly, where it is not an empty directory
  }

  new_directories_guard(const new_directories_guard&) = delete;
  new_directories_guard& operator=(const new_directories_guard&) = delete;

 private:
  int exceptions_;
  std::vector<std::filesystem::path> missing_;
};

}  // namespace hcbench
