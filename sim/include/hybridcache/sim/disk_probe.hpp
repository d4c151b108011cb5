// hybridcache/sim/disk_probe.hpp
//
// `probe_disk`: measures, at start-up, the link numbers of a disk tier (tiered/tier.hpp
// `disk@PATH`) that its spec did not give: sequential write and read GB/s of that
// directory's file system and the latency of one small read. The timed replay then models
// the tier with them (sim/timed_copy_engine.hpp).
//
// How, honestly: a scratch file of `bytes` in the directory is written in `block_bytes`
// calls and read back. With O_DIRECT (the default, when the file system takes it) both
// bypass the page cache, so the numbers are the device's; the write is followed by
// fdatasync. Where O_DIRECT is refused (tmpfs, some overlay file systems) the file is
// written with buffered pwrite + fdatasync, its cached pages are dropped with
// posix_fadvise(DONTNEED) (clean pages of one file only: no root, no global drop) and it is
// read back; `method` says which was used. Latency: the median of `latency_reads` 4 KiB
// reads at spread offsets (page cache dropped first in the buffered method). The file is
// removed afterwards.
//
// Costs: writes and reads `bytes` once (64 MiB by default: a fraction of a second on NVMe).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "hybridcache/core/error.hpp"

namespace hybridcache::sim {

/// Options of `probe_disk`. Aggregate with defaults.
struct disk_probe_options {
  std::int64_t bytes = std::int64_t{64} << 20;        ///< scratch file size
  std::int64_t block_bytes = std::int64_t{1} << 20;   ///< bytes per pwrite/pread call
  int latency_reads = 32;                             ///< 4 KiB reads for the latency median
  bool direct = true;                                 ///< try O_DIRECT first
};

/// What `probe_disk` measured.
struct disk_probe_result {
  double write_gbps = 0.0;   ///< sequential write, fdatasync included, GB/s
  double read_gbps = 0.0;    ///< sequential read, page cache bypassed or dropped, GB/s
  double latency_us = 0.0;   ///< median of one 4 KiB read
  std::int64_t bytes = 0;    ///< bytes written and read
  std::string method;        ///< "O_DIRECT" or "buffered+fdatasync+fadvise(DONTNEED)"
};

namespace detail {

struct fd_closer {
  int fd = -1;
  ~fd_closer() {
    if (fd >= 0) ::close(fd);
  }
};

inline std::string errno_text(int e) { return std::string(std::strerror(e)); }

}  // namespace detail

/// Measures the disk tier in `directory` (created when missing).
/// @throws invalid_argument for bad options; error (naming the directory and the
///         call) when the directory cannot be made or the file written or read.
[[nodiscard]] inline disk_probe_result probe_disk(const std::string& directory, disk_probe_options o = {}) {
  constexpr std::int64_t align = 4096;
  HYBRIDCACHE_EXPECTS(o.block_bytes >= align && o.block_bytes % align == 0 && o.bytes >= o.block_bytes &&
                          o.bytes % o.block_bytes == 0 && o.latency_reads >= 1,
                      invalid_argument, "probe_disk: bytes must be a multiple of block_bytes (a multiple of 4096)");
  const std::string who = "disk probe of '" + directory + "'";
  std::error_code ec;
  std::filesystem::create_directories(directory, ec);
  if (ec) throw error(who + ": cannot create the directory: " + ec.message());
  const std::string path = (std::filesystem::path(directory) / ".hybridcache_probe.tmp").string();
  struct remover {
    std::string p;
    ~remover() { ::unlink(p.c_str()); }
  } rm{path};

  void* raw = nullptr;
  if (::posix_memalign(&raw, align, static_cast<std::size_t>(o.block_bytes)) != 0)
    throw error(who + ": cannot allocate the I/O buffer");
  std::unique_ptr<std::byte, decltype(&std::free)> buf(static_cast<std::byte*>(raw), &std::free);
  // Not zeros (a compressing file system would skip them): a byte pattern.
  for (std::int64_t i = 0; i < o.block_bytes; ++i) buf.get()[i] = static_cast<std::byte>((i * 131 + 7) & 0xff);

  disk_probe_result r;
  r.bytes = o.bytes;
  bool direct = false;
  detail::fd_closer f;
#ifdef O_DIRECT
  if (o.direct) {
    f.fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_RDWR | O_DIRECT, 0600);
    direct = f.fd >= 0;
  }
#endif
  if (!direct) f.fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_RDWR, 0600);
  if (f.fd < 0) throw error(who + ": open: " + detail::errno_text(errno));
  r.method = direct ? "O_DIRECT" : "buffered+fdatasync+fadvise(DONTNEED)";

  using clock = std::chrono::steady_clock;
  const auto seconds = [](clock::time_point a, clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  const auto io = [&](bool write, std::int64_t off, std::int64_t n) {
    const ssize_t got = write ? ::pwrite(f.fd, buf.get(), static_cast<std::size_t>(n), off)
                              : ::pread(f.fd, buf.get(), static_cast<std::size_t>(n), off);
    if (got != static_cast<ssize_t>(n))
      throw error(who + (write ? ": pwrite: " : ": pread: ") +
                          (got < 0 ? detail::errno_text(errno) : std::string("short transfer")));
  };
  const auto drop_cache = [&] {
    if (direct) return;
    if (::fdatasync(f.fd) != 0) throw error(who + ": fdatasync: " + detail::errno_text(errno));
    (void)::posix_fadvise(f.fd, 0, 0, POSIX_FADV_DONTNEED);
  };

  auto t0 = clock::now();
  for (std::int64_t off = 0; off < o.bytes; off += o.block_bytes) io(true, off, o.block_bytes);
  if (::fdatasync(f.fd) != 0) throw error(who + ": fdatasync: " + detail::errno_text(errno));
  auto t1 = clock::now();
  r.write_gbps = static_cast<double>(o.bytes) / std::max(seconds(t0, t1), 1e-9) / 1e9;

  drop_cache();
  t0 = clock::now();
  for (std::int64_t off = 0; off < o.bytes; off += o.block_bytes) io(false, off, o.block_bytes);
  t1 = clock::now();
  r.read_gbps = static_cast<double>(o.bytes) / std::max(seconds(t0, t1), 1e-9) / 1e9;

  drop_cache();
  std::vector<double> lat;
  const std::int64_t slots = o.bytes / align;
  for (int k = 0; k < o.latency_reads; ++k) {
    // Spread offsets (a stride coprime with the slot count), so no read-ahead serves them.
    const std::int64_t off = (static_cast<std::int64_t>(k) * 7919 % slots) * align;
    t0 = clock::now();
    io(false, off, align);
    lat.push_back(seconds(t0, clock::now()) * 1e6);
  }
  std::nth_element(lat.begin(), lat.begin() + static_cast<std::ptrdiff_t>(lat.size() / 2), lat.end());
  r.latency_us = lat[lat.size() / 2];
  return r;
}

}  // namespace hybridcache::sim
