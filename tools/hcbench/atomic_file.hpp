// tools/hcbench/atomic_file.hpp
//
// Output files are written whole or not at all: the text goes to `PATH.tmp.<pid>` beside
// the target, every write, flush and close is checked, and the temporary is renamed over
// PATH at the end (rename is atomic on one file system). On any failure the temporary is
// removed and `hybridcache::invalid_argument` names the path and the errno text, so a full
// disk never leaves a truncated CSV or an empty SVG behind.
//
// A target that exists and is not a regular file (/dev/full, /dev/stdout, a FIFO) cannot be
// replaced by a rename; it is written in place, with the same checks.
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

#include <hybridcache/core/error.hpp>

namespace hcbench {

namespace detail {
[[noreturn]] inline void write_failed(const std::string& what, const std::string& path, int err) {
  throw hybridcache::invalid_argument(what + ": cannot write '" + path + "' (" + std::strerror(err) + ")");
}

inline void write_all_to(const std::string& path, std::string_view text, const std::string& what) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) write_failed(what, path, errno);
  errno = 0;
  const bool wrote = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  int err = errno;
  const bool flushed = wrote && std::fflush(f) == 0;
  if (wrote && !flushed) err = errno;
  const bool closed = std::fclose(f) == 0;
  if (wrote && flushed && !closed) err = errno;
  if (!wrote || !flushed || !closed) write_failed(what, path, err != 0 ? err : EIO);
}
}  // namespace detail

/// Writes `text` to `path` atomically (temporary + rename). `what` names the option or
/// file kind for the error message (e.g. "--per-request").
/// @throws hybridcache::invalid_argument when any step fails; `path` is then unchanged.
inline void write_file_atomic(const std::string& path, std::string_view text, const std::string& what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (!ec && fs::exists(st) && !fs::is_regular_file(st)) {
    if (fs::is_directory(st)) throw hybridcache::invalid_argument(what + ": '" + path + "' is a directory");
    detail::write_all_to(path, text, what);  // a device or FIFO: in place
    return;
  }
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  try {
    detail::write_all_to(tmp, text, what);
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    detail::write_failed(what, path, err);
  }
}

/// Several files that appear together or not at all: each is written to its temporary
/// first; only when every one succeeded are they renamed into place.
class atomic_file_set {
 public:
  void add(std::string path, std::string text) { files_.push_back({std::move(path), std::move(text)}); }
  /// @throws hybridcache::invalid_argument naming the first file that failed; no target is
  ///         replaced then.
  void commit(const std::string& what) {
    const std::string suffix = ".tmp." + std::to_string(::getpid());
    std::vector<std::string> written;
    try {
      for (const auto& f : files_) {
        detail::write_all_to(f.path + suffix, f.text, what);
        written.push_back(f.path + suffix);
      }
    } catch (...) {
      for (const auto& f : files_) std::remove((f.path + suffix).c_str());
      throw;
    }
    for (const auto& f : files_) {
      if (std::rename((f.path + suffix).c_str(), f.path.c_str()) != 0) {
        const int err = errno;
        for (const auto& g : files_) std::remove((g.path + suffix).c_str());
        detail::write_failed(what, f.path, err);
      }
    }
    files_.clear();
  }

 private:
  struct file {
    std::string path;
    std::string text;
  };
  std::vector<file> files_;
};

}  // namespace hcbench
