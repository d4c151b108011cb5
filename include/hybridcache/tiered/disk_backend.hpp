// hybridcache/tiered/disk_backend.hpp
//
// `disk_backend<Scorer>`: the local-disk tier, a `storage_backend`
// (concepts/storage_backend.hpp). One file per value, written with pwrite and read by a
// pool of worker threads behind a bounded queue (tiered/io_queue.hpp; a caller waiting on
// an operation no worker has started runs it itself).
//
// On disk, under `directory`:
//   LOCK                      flock'ed by the one backend that owns the directory
//   v1/<2 hex>/<32 hex>.hcv   one value: the 64-byte header (tiered/storage_format.hpp),
//                             then the payload; the name is the key's storage name (the
//                             256 folders are made as values arrive)
//   tmp/                      values being written; renamed into v1/ when complete
//
// Reads: values of 1 MiB and more are mapped and copied into the caller's buffer with the
// CRC computed in the same pass (core/crc32c.hpp `crc32c_copy`); smaller ones are pread.
//
// Why one file per value and not an append-only segment + index (measured,
// docs/results/storage.md "One file per value, or a segment?"): from 1 MiB up a value
// costs the same either way (the bytes dominate; the values here are KV extents and
// checkpoints of MBs), and in exchange the tier evicts exactly the entry its scorer picks
// (one unlink, no segment compaction rewriting live data), a torn or corrupt file costs
// only itself, and recovery needs no index file. Below 1 MiB the file system's per-file
// cost dominates: offload small KV grouped into larger values. Plain threads, not
// io_uring: a cold load of an MB-sized value is already bound by the file system's
// bandwidth (docs/results/storage.md compares it with dd).
//
// The directory is the tier's alone (LOCK): deleting a file is a miss; truncating one
// while the tier maps it would raise SIGBUS (the tier itself only renames and unlinks).
//
// Guarantees:
//   - a value appears only when complete: written to tmp/, then renamed (atomic within a
//     file system). `sync_writes` adds fdatasync before the rename (survives power loss);
//     without it a crash can leave a short or zero-filled file, which the checks catch;
//   - restart: the constructor rebuilds the index from v1/ (header + file size checked for
//     every file; recency from modification times), removes what is in tmp/ (writes a
//     crash interrupted) and every file whose header is bad or whose size is not the
//     header's (`dropped_at_recovery`); a flipped payload byte is caught by the CRC on get.
//     Every write and every hit sets the file's modification time to a strictly increasing
//     instant, so the LRU order comes back too;
//   - get verifies header, key, length and CRC; a value that fails is a miss (`corrupt`),
//     counted, and its file removed;
//   - disk full (ENOSPC / EDQUOT on write): the partial file is removed, `no_space` is
//     counted, the scorer's victims are evicted until `need` bytes of the tier's own are
//     freed and the write is retried once; if it still fails the put ends `no_space` with
//     nothing stored. From then on the tier's capacity is what the file system can hold
//     (the bytes it holds plus statvfs's free bytes, never more than configured), re-read
//     before every put, so it grows back when the file system frees up;
//   - capacity counts files (header + payload); a put evicts the scorer's victims first.
//
// Costs: put/get O(bytes) I/O plus O(log n) index work; exists answers from the in-memory
// index at submit (O(keys), no I/O); a get of an absent key answers at once (no I/O);
// remove O(log n) + one unlink. Recovery O(files). Thread-safe.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "hybridcache/concepts/demotion.hpp"
#include "hybridcache/concepts/storage_backend.hpp"
#include "hybridcache/core/error.hpp"
#include "hybridcache/tiered/backend_base.hpp"
#include "hybridcache/tiered/backend_index.hpp"
#include "hybridcache/tiered/demotion_policy.hpp"
#include "hybridcache/tiered/io_queue.hpp"
#include "hybridcache/tiered/storage_format.hpp"

namespace hybridcache::tiered {

/// Configuration of a disk tier. Aggregate: designated initializers.
struct disk_backend_config {
  std::string directory;            ///< created when missing; owned by one backend at a time
  std::int64_t capacity_bytes = 0;  ///< bytes of files (header + payload) the tier may hold
  int io_threads = 2;               ///< pread/pwrite workers (requests in flight)
  std::int32_t queue_depth = 64;    ///< operations outstanding at most (submit is busy beyond)
  std::int64_t io_block_bytes = std::int64_t{1} << 20;  ///< bytes per pread/pwrite call
  bool sync_writes = false;         ///< fdatasync each value before it becomes visible
};

namespace detail {
/// One queued operation of the disk tier.
struct disk_job {
  enum class kind_t : std::uint8_t { none, put, get, remove };
  kind_t kind = kind_t::none;
  storage_key key{};
  value_meta meta{};
  std::span<const std::byte> src{};
  std::span<std::byte> dst{};
};
}  // namespace detail

template <demotion_scorer Scorer = lru_demotion>
class disk_backend : public backend_base<detail::disk_job, Scorer> {
 public:
  /// Test hook: called before every pwrite with the file offset and size; a nonzero return
  /// is taken as that call's errno (e.g. ENOSPC), as if the kernel had returned it.
  using write_fault_hook = std::function<int(std::int64_t offset, std::int64_t bytes)>;

  /// Opens (or creates) the directory, takes its lock, rebuilds the index from what is
  /// there, starts the workers.
  /// @throws invalid_argument for an empty directory name, capacity <= 0, io_threads < 1,
  /// queue_depth < 1, io_block_bytes < 4096, a directory that cannot be created or is
  /// locked by another backend (the message names the field or the path).
  explicit disk_backend(disk_backend_config config, Scorer scorer = Scorer{})
      : base(config.capacity_bytes, std::move(scorer)), config_(std::move(config)) {
    HYBRIDCACHE_EXPECTS(!config_.directory.empty(), invalid_argument, "disk_backend: field 'directory' is empty");
    HYBRIDCACHE_EXPECTS(config_.capacity_bytes > 0, invalid_argument,
                        "disk_backend: field 'capacity_bytes' must be > 0, got " + std::to_string(config_.capacity_bytes));
    HYBRIDCACHE_EXPECTS(config_.io_block_bytes >= 4096, invalid_argument,
                        "disk_backend: field 'io_block_bytes' must be >= 4096, got " + std::to_string(config_.io_block_bytes));
    HYBRIDCACHE_EXPECTS(config_.io_threads >= 1, invalid_argument,
                        "disk_backend: field 'io_threads' must be >= 1, got " + std::to_string(config_.io_threads));
    HYBRIDCACHE_EXPECTS(config_.queue_depth >= 1, invalid_argument,
                        "disk_backend: field 'queue_depth' must be >= 1, got " + std::to_string(config_.queue_depth));
    open_directory();
    recover();
    this->start(config_.queue_depth, config_.io_threads, [this](job& j, std::size_t) { return run(j); },
                /*helpers=*/config_.queue_depth);  // any thread may run a disk job
  }
  ~disk_backend() {
    this->stop();  // queued jobs run first: they point into caller buffers
    if (lock_fd_ >= 0) ::close(lock_fd_);
  }

  // --- storage_backend -----------------------------------------------------------------

  /// Stores `payload` under `key` (replacing a value already there). `payload` must stay
  /// valid until the ticket is waited on. invalid_argument: bad key or meta; busy: queue full.
  [[nodiscard]] expected<io_ticket> put(const storage_key& key, const value_meta& meta,
                                        std::span<const std::byte> payload) {
    if (!valid_key(key) || !valid_meta(key, meta)) return unexpected(errc::invalid_argument);
    const std::int64_t need = static_cast<std::int64_t>(value_header_bytes + payload.size());
    {
      std::lock_guard lock(mu_);
      if (need > config_.capacity_bytes) {
        auto t = complete_now({io_status::too_large, 0, {}});
        if (t) counters_.put_failures += 1;
        return t;
      }
    }
    return submit(job{job_kind::put, key, meta, payload, {}});
  }

  /// Reads the value under `key` into `into` (which must stay valid until the ticket is
  /// waited on). An absent key answers `not_found` at once.
  [[nodiscard]] expected<io_ticket> get(const storage_key& key, std::span<std::byte> into) {
    if (!valid_key(key)) return unexpected(errc::invalid_argument);
    {
      std::lock_guard lock(mu_);
      if (!index_.contains(key)) {
        auto t = complete_now({io_status::not_found, 0, {}});
        if (t) {
          counters_.gets += 1;
          counters_.misses += 1;
        }
        return t;
      }
    }
    auto t = submit(job{job_kind::get, key, {}, {}, into});
    if (t) {
      std::lock_guard lock(mu_);
      counters_.gets += 1;
      index_.touch(key);  // LRU: a read is a use
    }
    return t;
  }

  /// found[i] = 1 when a value is held under keys[i], else 0; answered from the index at
  /// once (no I/O). invalid_argument when the spans differ in length.
  [[nodiscard]] expected<io_ticket> exists(std::span<const storage_key> keys, std::span<std::uint8_t> found) {
    if (keys.size() != found.size()) return unexpected(errc::invalid_argument);
    std::lock_guard lock(mu_);
    std::int64_t n = 0;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      found[i] = index_.contains(keys[i]) ? 1 : 0;
      n += found[i];
    }
    auto t = complete_now({io_status::ok, n, {}});
    if (t) {
      counters_.exists_calls += 1;
      counters_.exists_keys += static_cast<std::int64_t>(keys.size());
      counters_.exists_found += n;
    }
    return t;
  }

  /// Removes the value under `key` (its file is unlinked by a worker).
  [[nodiscard]] expected<io_ticket> remove(const storage_key& key) {
    if (!valid_key(key)) return unexpected(errc::invalid_argument);
    {
      std::lock_guard lock(mu_);
      if (!index_.contains(key)) return complete_now({io_status::not_found, 0, {}});
    }
    return submit(job{job_kind::remove, key, {}, {}, {}});
  }

  // poll, wait, wait_for, counters, used_bytes, entries, set_score: backend_base.
  // capacity_bytes() is the configured capacity, or less after the disk reported full.

  // --- beyond the concept ----------------------------------------------------------------

  /// The file that holds `key`'s value (whether or not it exists): for tools and tests.
  [[nodiscard]] std::string path_of(const storage_key& key) const {
    path_buffer p;
    return std::string(value_path(name_of(key), p));
  }
  [[nodiscard]] const disk_backend_config& config() const noexcept { return config_; }
  /// Installs (or clears with {}) the write fault hook. Not while puts are in flight.
  void set_write_fault(write_fault_hook hook) {
    std::lock_guard lock(mu_);
    fault_ = std::move(hook);
  }

 private:
  using base = backend_base<detail::disk_job, Scorer>;
  using base::complete_now, base::counters_, base::index_, base::mu_, base::submit, base::writing_bytes_;
  using job = detail::disk_job;
  using job_kind = detail::disk_job::kind_t;
  using path_buffer = std::array<char, 4096>;

  /// Appends pieces into a path buffer (no allocation; truncates at the buffer's end).
  struct path_writer {
    path_buffer& out;
    std::size_t len = 0;
    void append(std::string_view s) noexcept {
      const std::size_t k = std::min(s.size(), out.size() - 1 - len);
      std::memcpy(out.data() + len, s.data(), k);
      len += k;
    }
    std::string_view done() noexcept {
      out[len] = '\0';
      return {out.data(), len};
    }
  };

  // --- paths ---------------------------------------------------------------------------

  /// "<dir>/v1/<2 hex>/<32 hex>.hcv" into `out` (no allocation).
  std::string_view value_path(const storage_name& n, path_buffer& out) const noexcept {
    path_writer w{out};
    w.append(values_dir_);
    w.append(std::string_view(n.data(), 2));
    w.append("/");
    w.append(std::string_view(n.data(), n.size()));
    w.append(".hcv");
    return w.done();
  }
  /// "<dir>/tmp/<32 hex>.<serial>.tmp" into `out`.
  std::string_view temp_path(const storage_name& n, std::uint64_t serial, path_buffer& out) const noexcept {
    path_writer w{out};
    w.append(temp_dir_);
    w.append(std::string_view(n.data(), n.size()));
    w.append(".");
    char digits[24];
    const auto end = std::to_chars(digits, digits + sizeof digits, serial).ptr;
    w.append(std::string_view(digits, static_cast<std::size_t>(end - digits)));
    w.append(".tmp");
    return w.done();
  }

  void open_directory() {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path root(config_.directory);
    fs::create_directories(root / "v1", ec);  // v1/<2 hex>/ are made by the first put into each
    if (!ec) fs::create_directories(root / "tmp", ec);
    if (ec)
      throw invalid_argument("disk_backend: cannot create directory '" + config_.directory + "': " + ec.message());
    const std::string lock_path = (root / "LOCK").string();
    lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lock_fd_ < 0)
      throw invalid_argument("disk_backend: cannot open '" + lock_path + "': " + std::strerror(errno));
    if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
      ::close(lock_fd_);
      lock_fd_ = -1;
      throw invalid_argument("disk_backend: directory '" + config_.directory +
                             "' is in use by another disk_backend (its LOCK is held)");
    }
    values_dir_ = (root / "v1").string() + "/";
    temp_dir_ = (root / "tmp").string() + "/";
  }

  /// Rebuilds the index from v1/: every file whose header verifies and whose size is the
  /// header's; recency in modification-time order. Removes tmp/ and everything else.
  void recover() {
    namespace fs = std::filesystem;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(temp_dir_, ec)) {
      std::error_code rm;
      fs::remove(e.path(), rm);
      counters_.dropped_at_recovery += 1;
    }
    struct found_value {
      std::int64_t mtime_ns;
      storage_key key;
      value_meta meta;
      std::int64_t bytes;
    };
    std::vector<found_value> found;
    for (const auto& sub : fs::directory_iterator(values_dir_, ec)) {
      std::error_code ec2;
      for (const auto& e : fs::directory_iterator(sub.path(), ec2)) {
        const std::string p = e.path().string();
        const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
        struct stat st {};
        std::array<std::byte, value_header_bytes> h{};
        bool ok = fd >= 0 && ::fstat(fd, &st) == 0 &&
                  ::pread(fd, h.data(), h.size(), 0) == static_cast<ssize_t>(h.size());
        if (fd >= 0) ::close(fd);
        expected<value_header> hdr = ok ? decode_header(h) : expected<value_header>(unexpected(errc::invalid_argument));
        ok = ok && hdr.has_value() && st.st_size == static_cast<off_t>(value_header_bytes) + hdr->length &&
             e.path().filename().string() == std::string(name_of(hdr->key).data(), 32) + ".hcv";
        if (!ok) {
          std::error_code rm;
          fs::remove(e.path(), rm);
          counters_.dropped_at_recovery += 1;
          continue;
        }
        found.push_back({static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec, hdr->key,
                         hdr->meta, static_cast<std::int64_t>(st.st_size)});
      }
    }
    std::sort(found.begin(), found.end(), [](const found_value& a, const found_value& b) { return a.mtime_ns < b.mtime_ns; });
    if (!found.empty()) last_stamp_ = found.back().mtime_ns;
    for (const found_value& f : found) index_.insert(f.key, f.meta, f.bytes);
    counters_.recovered = static_cast<std::int64_t>(found.size());
    path_buffer p;
    while (index_.used_bytes() > index_.capacity_bytes()) {  // the capacity was lowered since
      const auto v = index_.pop_victim();
      ::unlink(value_path(name_of(v->first), p).data());
      counters_.evictions += 1;
      counters_.evicted_bytes += v->second.stored_bytes;
      counters_.recovered -= 1;
    }
  }

  // --- the workers ---------------------------------------------------------------------

  io_result run(job& j) {
    switch (j.kind) {
      case job_kind::put: return run_put(j);
      case job_kind::get: return run_get(j);
      case job_kind::remove: return run_remove(j);
      case job_kind::none: break;
    }
    return {io_status::unavailable, 0, {}};
  }

  /// Evicts the scorer's victims until `need` more bytes fit, and reserves them. False when
  /// `need` exceeds the capacity. With nothing left to evict, other puts' reservations may
  /// overshoot the capacity until they finish.
  /// A value already under `key` is being replaced: its row and its file go first, so the
  /// rename never replaces a file (ext4 flushes the new file's data when a rename replaces
  /// one, auto_da_alloc: a slower put, docs/results/storage.md).
  bool make_room(const storage_key& key, std::int64_t need, bool refit) {
    std::unique_lock lock(mu_);
    if (limited_ && refit) fit_capacity_to_disk();
    if (need > config_.capacity_bytes) return false;
    path_buffer p;
    if (index_.erase(key)) {
      const std::string_view path = value_path(name_of(key), p);
      lock.unlock();
      ::unlink(path.data());
      lock.lock();
    }
    while (index_.used_bytes() + writing_bytes_ + need > index_.capacity_bytes()) {
      const auto v = index_.pop_victim();
      if (!v) break;
      counters_.evictions += 1;
      counters_.evicted_bytes += v->second.stored_bytes;
      const std::string_view path = value_path(name_of(v->first), p);
      lock.unlock();
      ::unlink(path.data());
      lock.lock();
    }
    writing_bytes_ += need;
    return true;
  }

  /// Capacity = min(configured, bytes held + bytes being written + the file system's free
  /// bytes). Called with mu_ held.
  void fit_capacity_to_disk() {
    struct statvfs fs {};
    if (::statvfs(values_dir_.c_str(), &fs) != 0) return;
    const auto free_bytes = static_cast<std::int64_t>(fs.f_bavail) * static_cast<std::int64_t>(fs.f_frsize);
    const std::int64_t fits = index_.used_bytes() + writing_bytes_ + free_bytes;
    index_.set_capacity(std::min(config_.capacity_bytes, fits));
    limited_ = fits < config_.capacity_bytes;
  }

  io_result run_put(job& j) {
    const std::int64_t need = static_cast<std::int64_t>(value_header_bytes + j.src.size());
    value_header h{j.key, j.meta, crc32c(j.src), 0, static_cast<std::int64_t>(j.src.size())};
    std::array<std::byte, value_header_bytes> head{};
    encode_header(h, head);
    for (int attempt = 0; attempt < 2; ++attempt) {
      if (!make_room(j.key, need, attempt == 0)) break;
      const int err = write_value(j.key, head, j.src);
      std::lock_guard lock(mu_);
      writing_bytes_ -= need;
      if (err == 0) {
        try {
          index_.insert(j.key, j.meta, need);
        } catch (...) {  // no memory for the row: the file stays unindexed; remove it
          path_buffer p;
          ::unlink(value_path(name_of(j.key), p).data());
          counters_.put_failures += 1;
          return {io_status::unavailable, 0, {}};
        }
        counters_.puts += 1;
        counters_.put_bytes += static_cast<std::int64_t>(j.src.size());
        return {io_status::ok, static_cast<std::int64_t>(j.src.size()), {}};
      }
      if (err != ENOSPC && err != EDQUOT) {
        counters_.put_failures += 1;
        return {io_status::unavailable, 0, {}};
      }
      // The file system holds less than configured: from now on hold no more than it can
      // (re-read before each later put), and for the retry free `need` bytes of our own.
      counters_.no_space += 1;
      fit_capacity_to_disk();
      limited_ = true;
      index_.set_capacity(std::min(index_.capacity_bytes(), index_.used_bytes() + writing_bytes_));
    }
    std::lock_guard lock(mu_);
    counters_.put_failures += 1;
    return {io_status::no_space, 0, {}};
  }

  /// Writes header + payload to a temporary file and renames it into place. 0 or an errno;
  /// on failure nothing is left behind.
  int write_value(const storage_key& key, std::span<const std::byte, value_header_bytes> head,
                  std::span<const std::byte> payload) {
    const storage_name n = name_of(key);
    path_buffer tmp, dst;
    const std::uint64_t serial = next_temp_.fetch_add(1, std::memory_order_relaxed);
    const char* tmp_path = temp_path(n, serial, tmp).data();
    const int fd = ::open(tmp_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return errno;
    int err = write_all(fd, head, 0);
    for (std::size_t off = 0; err == 0 && off < payload.size(); off += static_cast<std::size_t>(config_.io_block_bytes)) {
      const std::size_t len = std::min(payload.size() - off, static_cast<std::size_t>(config_.io_block_bytes));
      err = write_all(fd, payload.subspan(off, len), static_cast<std::int64_t>(value_header_bytes + off));
    }
    if (err == 0) stamp(fd);
    if (err == 0 && config_.sync_writes && ::fdatasync(fd) != 0) err = errno;
    if (::close(fd) != 0 && err == 0) err = errno;
    if (err == 0 && ::rename(tmp_path, value_path(n, dst).data()) != 0) {
      err = errno;
      if (err == ENOENT) {  // the first value of its v1/<2 hex>/ folder
        path_writer w{dst};
        w.append(values_dir_);
        w.append(std::string_view(n.data(), 2));
        const std::string_view folder = w.done();
        if (::mkdir(folder.data(), 0755) == 0 || errno == EEXIST)
          err = ::rename(tmp_path, value_path(n, dst).data()) == 0 ? 0 : errno;
      }
    }
    if (err != 0) ::unlink(tmp_path);
    return err;
  }
  /// Sets the file's modification time to a strictly increasing instant: recovery orders
  /// values by it, so the LRU order survives a restart (file-system clocks are coarser than
  /// the rate of puts).
  void stamp(int fd) {
    const auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::system_clock::now().time_since_epoch()).count();
    std::int64_t t = last_stamp_.load(std::memory_order_relaxed);
    std::int64_t next = 0;
    do {
      next = std::max<std::int64_t>(now, t + 1);
    } while (!last_stamp_.compare_exchange_weak(t, next, std::memory_order_relaxed));
    const timespec times[2] = {{0, UTIME_OMIT}, {static_cast<time_t>(next / 1000000000), static_cast<long>(next % 1000000000)}};
    (void)::futimens(fd, times);
  }

  int write_all(int fd, std::span<const std::byte> bytes, std::int64_t offset) {
    if (fault_) {
      const int injected = fault_(offset, static_cast<std::int64_t>(bytes.size()));
      if (injected != 0) return injected;
    }
    std::size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t w = ::pwrite(fd, bytes.data() + done, bytes.size() - done, static_cast<off_t>(offset + done));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) return errno;
      if (w == 0) return ENOSPC;
      done += static_cast<std::size_t>(w);
    }
    return 0;
  }

  io_result run_get(job& j) {
    path_buffer p;
    const int fd = ::open(value_path(name_of(j.key), p).data(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {  // evicted or removed since the submit (or deleted behind our back)
      std::lock_guard lock(mu_);
      (void)index_.erase(j.key);
      counters_.misses += 1;
      return {io_status::not_found, 0, {}};
    }
    const io_result r = read_value(fd, j);
    if (r.status == io_status::ok) stamp(fd);  // recency survives a restart
    ::close(fd);
    std::lock_guard lock(mu_);
    if (r.status == io_status::ok) {
      counters_.hits += 1;
      counters_.hit_bytes += r.bytes;
    } else if (r.status == io_status::corrupt) {
      counters_.corrupt += 1;
      if (index_.erase(j.key)) ::unlink(p.data());
    } else if (r.status == io_status::unavailable) {
      counters_.unavailable += 1;
    }
    return r;
  }

  /// Reads and checks one value. Large values are mapped and copied with the CRC computed
  /// on the way (`crc32c_copy`: each byte read once instead of twice, for pread + CRC;
  /// docs/results/storage.md, "CRC-32C"); small ones are pread block by block, each block's
  /// CRC computed while it is in cache.
  io_result read_value(int fd, job& j) {
    struct stat st {};
    std::array<std::byte, value_header_bytes> head{};
    if (::fstat(fd, &st) != 0) return {io_status::unavailable, 0, {}};
    if (read_all(fd, head, 0) != static_cast<std::int64_t>(head.size())) return {io_status::corrupt, 0, {}};
    const auto h = decode_header(head);
    if (!h || h->key != j.key || st.st_size != static_cast<off_t>(value_header_bytes) + h->length)
      return {io_status::corrupt, 0, {}};
    if (h->length > static_cast<std::int64_t>(j.dst.size())) return {io_status::too_large, h->length, {}};
    if (h->length >= mapped_read_bytes) {
      // Files are only ever replaced by rename and removed by unlink, never truncated, so
      // the mapping stays valid while it is read (another process truncating files in the
      // tier's directory would raise SIGBUS: the directory is the tier's alone, LOCK).
      const auto total = static_cast<std::size_t>(st.st_size);
      void* m = ::mmap(nullptr, total, PROT_READ, MAP_SHARED, fd, 0);
      if (m != MAP_FAILED) {
        (void)::madvise(m, total, MADV_SEQUENTIAL);
        const std::span<const std::byte> payload(static_cast<const std::byte*>(m) + value_header_bytes,
                                                 static_cast<std::size_t>(h->length));
        const std::uint32_t crc = crc32c_copy(j.dst, payload);
        ::munmap(m, total);
        if (crc != h->payload_crc) return {io_status::corrupt, 0, {}};
        return {io_status::ok, h->length, h->meta};
      }
    }
    std::uint32_t crc = 0;
    for (std::int64_t off = 0; off < h->length; off += config_.io_block_bytes) {
      const auto block = j.dst.subspan(static_cast<std::size_t>(off),
                                       static_cast<std::size_t>(std::min(config_.io_block_bytes, h->length - off)));
      const std::int64_t got = read_all(fd, block, static_cast<std::int64_t>(value_header_bytes) + off);
      if (got < 0) return {io_status::unavailable, 0, {}};
      if (got != static_cast<std::int64_t>(block.size())) return {io_status::corrupt, 0, {}};  // truncated meanwhile
      crc = crc32c(std::span<const std::byte>(block), crc);
    }
    if (crc != h->payload_crc) return {io_status::corrupt, 0, {}};
    return {io_status::ok, h->length, h->meta};
  }
  /// Bytes read (short at end of file), or -1 on an I/O error.
  static std::int64_t read_all(int fd, std::span<std::byte> into, std::int64_t offset) {
    std::size_t done = 0;
    while (done < into.size()) {
      const ssize_t r = ::pread(fd, into.data() + done, into.size() - done, static_cast<off_t>(offset + done));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return -1;
      if (r == 0) break;
      done += static_cast<std::size_t>(r);
    }
    return static_cast<std::int64_t>(done);
  }

  io_result run_remove(job& j) {
    std::lock_guard lock(mu_);
    if (!index_.erase(j.key)) return {io_status::not_found, 0, {}};
    path_buffer p;
    ::unlink(value_path(name_of(j.key), p).data());
    counters_.removes += 1;
    return {io_status::ok, 1, {}};
  }

  static constexpr std::int64_t mapped_read_bytes = std::int64_t{1} << 20;  // mmap + crc32c_copy from here

  disk_backend_config config_;
  std::string values_dir_, temp_dir_;
  int lock_fd_ = -1;
  bool limited_ = false;  // capacity lowered by a full file system (guarded by mu_)
  write_fault_hook fault_;
  std::atomic<std::uint64_t> next_temp_{0};
  std::atomic<std::int64_t> last_stamp_{0};  // the latest modification time given to a file
};

static_assert(storage_backend<disk_backend<>>);

}  // namespace hybridcache::tiered
