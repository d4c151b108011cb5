// hybridcache/sim/real_bytes_copy_engine.hpp
//
// `real_bytes_copy_engine`: the copy engine of the timed replay's real-bytes validation
// mode (`hcbench replay --tiers ... --real-bytes`). It is a `timed_copy_engine` (the
// modelled time still decides when every copy lands, so the cache decides exactly as in
// the modelled run) that also moves real bytes for every copy it is handed:
//
//   - memory tiers (hbm, host, cxl: by the tier order, always the first tiers) are the
//     arenas of a `host_copy_engine` (tier 0 stands in for HBM), copied page by page;
//   - a storage tier (disk, redis) is a `storage_backend` (tiered/disk_backend.hpp,
//     tiered/redis/redis_backend.hpp) behind a `tiered::storage_tier_io`
//     (tiered/storage_tier_io.hpp), its pages a `tiered::storage_page_space`
//     (tiered/storage_page_space.hpp, the runtime's, shared with host_copy_engine): one
//     value per entry copy, put when a copy lands there, got when one is read from there.
//
// Keys: a value is keyed by the id of the entry whose copy put it (`storage_key{model, entry
// id, 1, kv}`), not by the content key: a move ticket names entries, and the tiered state
// store never reuses an id (a counter), so one key names one copy's bytes for the whole run.
// A read finds its bytes by page (the storage tier's page space, as the store addresses it),
// since the store may split an entry into two ids over the same pages without a copy.
// (Sharing between nodes, which needs content keys, is the backends' own test:
// test_cross_node.)
//
// Bytes and checks: when an entry's HBM copy is first read (it was computed there), the
// engine writes a pattern derived from the entry id into its pages (the prefill kernel's
// stand-in; never zeros) and records the CRC-32C of its bytes. Every later copy that reads
// a whole entry (a write-back, a cascade, a load into HBM staging under a new id) checks
// the bytes it read against that CRC (`verified_copies`), and every copy into HBM checks
// the bytes that landed, so a request never loads a wrong byte: a failed check, or a
// backend that answers not_found / corrupt / unavailable, fails the copy (`wait` returns
// an error, as an injected fault does) and is counted. A copy of part of an entry (an
// extract of some layers' pages: `partial_copies`) is checked by the backend's own CRC
// only, and records the CRC of the bytes it produced for the new entry. Whatever lands in HBM
// is read back and compared with the bytes read from the source.
//
// Time: the real copy runs inside `submit`, so it has finished when the modelled copy
// lands; `real_bytes_stats` reports the wall time spent in real copies and how much of it
// exceeded the modelled duration of the same copies (what a run paced by the model would
// have waited for).
//
// Costs: submit O(bytes of the copy) plus the backend calls; query O(1); wait O(1).
// Single-threaded, like the replay.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "hybridcache/concepts/storage_backend.hpp"
#include "hybridcache/core/crc32c.hpp"
#include "hybridcache/core/error.hpp"
#include "hybridcache/core/hash.hpp"
#include "hybridcache/sim/timed_copy_engine.hpp"
#include "hybridcache/sim/tiered_replay_options.hpp"
#include "hybridcache/tiered/host_copy_engine.hpp"
#include "hybridcache/tiered/storage_format.hpp"
#include "hybridcache/tiered/storage_page_space.hpp"
#include "hybridcache/tiered/storage_tier_io.hpp"

namespace hybridcache::sim {

/// Options of the real-bytes engine. Aggregate with defaults.
struct real_bytes_engine_options {
  /// Write the pattern of an entry into its HBM pages when the entry is first read there
  /// (the replay computes nothing); false when the caller wrote its bytes (a runtime, a
  /// test): then the bytes found at the first read are the entry's.
  bool write_computed_bytes = true;
  /// Test hook: every value read from a storage tier passes through it after the backend's
  /// own check (a test flips a byte to see the copy fail).
  std::function<void(std::span<std::byte>)> read_hook{};
};

class real_bytes_copy_engine : public timed_copy_engine {
 public:
  /// @param tiers    the store's tiers (HBM first; the memory tiers first by tier order)
  /// @param storage  one `tiered::storage_tier_io` per disk/redis tier, in tier order
  /// @param model_id the `storage_key::model` of every value
  /// @throws invalid_argument for a bad tier list or a storage count that does not match.
  real_bytes_copy_engine(std::vector<tiered::tier_config> tiers, std::int64_t page_bytes, timed_copy_options o,
                         std::vector<tiered::storage_tier_io> storage, std::uint64_t model_id,
                         real_bytes_engine_options options = {})
      : timed_copy_engine(tiers, page_bytes, o), model_(model_id), page_(page_bytes), options_(std::move(options)) {
    std::size_t memory = 0;
    while (memory < tiers.size() && !tiered::is_storage(tiers[memory].kind)) ++memory;
    HYBRIDCACHE_EXPECTS(storage.size() == tiers.size() - memory, invalid_argument,
                        "real_bytes_copy_engine: " + std::to_string(tiers.size() - memory) +
                            " storage tiers need as many storage_tier_io, got " + std::to_string(storage.size()));
    for (const auto& s : storage)
      HYBRIDCACHE_EXPECTS(s.complete(), invalid_argument,
                          "real_bytes_copy_engine: a storage_tier_io lacks put, get, wait or remove");
    for (auto& s : storage) spaces_.push_back(std::make_unique<tiered::storage_page_space>(std::move(s), model_id));
    memory_tiers_ = memory;
    memory_ = std::make_unique<tiered::host_copy_engine>(
        std::vector<tiered::tier_config>(tiers.begin(), tiers.begin() + static_cast<std::ptrdiff_t>(memory)),
        page_bytes, tiered::host_copy_engine_options{.measure_bandwidth = false});
  }

  /// Books the copy on its link (the timed engine) and moves its bytes now.
  [[nodiscard]] expected<event> submit(const move_ticket& t) {
    auto ev = timed_copy_engine::submit(t);
    if (!ev) return ev;
    const auto w0 = std::chrono::steady_clock::now();
    const bool ok = copy(t);
    const double wall = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - w0).count();
    const auto& j = at(*ev);
    stats_.copies += 1;
    stats_.real_copy_wall_ms += wall;
    stats_.modelled_copy_ms += j.done_ms - j.start_ms;
    stats_.late_ms += std::max(0.0, wall - (j.done_ms - j.start_ms));
    if (!ok) stats_.failed_copies += 1;
    if (failed_.size() <= ev->index) failed_.resize(ev->index + 1, false);
    failed_[ev->index] = !ok;
    return ev;
  }
  [[nodiscard]] bool query(event e) const noexcept { return timed_copy_engine::query(e); }
  /// The timed wait (the caller is taken to have waited until the copy landed), then the
  /// real copy's outcome.
  [[nodiscard]] expected<void> wait(event e) noexcept {
    auto r = timed_copy_engine::wait(e);
    if (!r) return r;
    if (e.index < failed_.size() && failed_[e.index]) return unexpected(errc::busy);
    return {};
  }

  [[nodiscard]] const sim::real_bytes_stats& real_stats() const noexcept { return stats_; }
  /// The arena of memory tier `t` (tests).
  [[nodiscard]] std::byte* base(tier_id t) { return memory_->base(t); }

 private:
  struct entry_sum {
    std::uint32_t crc = 0;
    std::int64_t bytes = 0;
  };
  [[nodiscard]] bool is_memory(tier_id t) const noexcept { return t.value < memory_tiers_; }
  static std::vector<std::uint32_t> pages_of(const page_list& l) {
    std::vector<std::uint32_t> v;
    l.for_each_page([&](std::uint32_t p) { v.push_back(p); });
    return v;
  }
  // Logical bytes [0, n) of `pages` in memory tier `t` into `out`, or `in` into them.
  void gather(tier_id t, const std::vector<std::uint32_t>& pages, std::int64_t n, std::byte* out) {
    std::byte* b = memory_->base(t);
    for (std::size_t k = 0; k < pages.size() && static_cast<std::int64_t>(k) * page_ < n; ++k) {
      const std::int64_t len = std::min(page_, n - static_cast<std::int64_t>(k) * page_);
      std::memcpy(out + static_cast<std::int64_t>(k) * page_, b + static_cast<std::int64_t>(pages[k]) * page_,
                  static_cast<std::size_t>(len));
    }
  }
  void scatter(tier_id t, const std::vector<std::uint32_t>& pages, std::int64_t n, const std::byte* in) {
    std::byte* b = memory_->base(t);
    for (std::size_t k = 0; k < pages.size() && static_cast<std::int64_t>(k) * page_ < n; ++k) {
      const std::int64_t len = std::min(page_, n - static_cast<std::int64_t>(k) * page_);
      std::memcpy(b + static_cast<std::int64_t>(pages[k]) * page_, in + static_cast<std::int64_t>(k) * page_,
                  static_cast<std::size_t>(len));
    }
  }
  // The bytes an entry is computed with: a function of its id and the byte's position.
  static void fill_pattern(entry_id id, std::span<std::byte> out) {
    const std::uint64_t seed = splitmix64_mix(to_underlying(id) * 0x9e3779b97f4a7c15ULL + 0x51);
    for (std::size_t i = 0; i < out.size(); i += 8) {
      const std::uint64_t w = splitmix64_mix(seed + i);
      for (std::size_t b = 0; b < 8 && i + b < out.size(); ++b) out[i + b] = static_cast<std::byte>((w >> (8 * b)) & 0xff);
    }
  }
  // The source bytes of `t` (n of them, the ticket's page order) into buf_. false: a miss.
  bool read_source(const move_ticket& t, std::int64_t n) {
    const auto src_pages = pages_of(t.src_pages);
    if (is_memory(t.src)) {
      if (options_.write_computed_bytes && t.src.value == 0 && t.id == t.src_id &&
          !sums_.count(to_underlying(t.src_id))) {
        // First read of an entry computed in HBM: write what the request computed.
        std::vector<std::byte> made(static_cast<std::size_t>(t.src_bytes));
        fill_pattern(t.src_id, made);
        scatter(t.src, src_pages, t.src_bytes, made.data());
        sums_[to_underlying(t.src_id)] = {crc32c(made), t.src_bytes};
        stats_.produced_entries += 1;
      }
      gather(t.src, src_pages, n, buf_.data());
      return true;
    }
    auto& space = *spaces_[t.src.value - memory_tiers_];
    std::uint64_t loaded = 0;
    bool have = false;
    for (std::size_t k = 0; k < src_pages.size() && static_cast<std::int64_t>(k) * page_ < n; ++k) {
      const auto home = space.locate(src_pages[k]);
      if (!home) return false;  // never written there: a miss
      if (!have || home->value != loaded) {
        const auto r = space.read(home->value, value_);
        if (!r && r.error() == errc::not_found) return false;  // no such value left
        stats_.storage_gets += 1;
        if (!r) {
          stats_.storage_misses += 1;
          return false;
        }
        if (options_.read_hook) options_.read_hook(value_);
        loaded = home->value;
        have = true;
      }
      const std::int64_t from = home->index * page_;
      const std::int64_t bytes = std::min({page_, n - static_cast<std::int64_t>(k) * page_,
                                           static_cast<std::int64_t>(value_.size()) - from});
      if (bytes <= 0) return false;
      std::memcpy(buf_.data() + static_cast<std::int64_t>(k) * page_, value_.data() + from,
                  static_cast<std::size_t>(bytes));
    }
    return true;
  }
  // Whether buf_[0, n), read for ticket `t`, are its source entry's bytes: checked when the
  // copy reads the whole source (its CRC is known); a partial read (an extract of some
  // layers' pages) is covered by the backend's own check only. Records the bytes of a new
  // entry (a staged copy or an extract has its own id) and of a source seen first.
  bool verify(const move_ticket& t, std::int64_t n) {
    const std::uint32_t crc = crc32c(std::span<const std::byte>(buf_.data(), static_cast<std::size_t>(n)));
    read_crc_ = crc;
    const auto src = sums_.find(to_underlying(t.src_id));
    if (src != sums_.end() && src->second.bytes == n) {
      if (src->second.crc != crc) return false;
      stats_.verified_copies += 1;
    } else if (src != sums_.end()) {
      stats_.partial_copies += 1;
    }
    if (t.id != t.src_id || src == sums_.end()) sums_[to_underlying(t.id)] = {crc, n};
    return true;
  }
  // Whether buf_[0, n) (what landed in HBM, read back) are the bytes read from the source.
  bool landed_ok(std::int64_t n) const {
    return read_crc_ == crc32c(std::span<const std::byte>(buf_.data(), static_cast<std::size_t>(n)));
  }

  bool copy(const move_ticket& t) {
    const std::int64_t n = std::min(t.src_bytes, t.dst_bytes);
    if (n <= 0) return false;
    if (static_cast<std::int64_t>(buf_.size()) < n) buf_.resize(static_cast<std::size_t>(n));
    if (!read_source(t, n)) return false;
    if (!verify(t, n)) {
      stats_.verify_failures += 1;
      return false;
    }
    const auto dst_pages = pages_of(t.dst_pages);
    if (is_memory(t.dst)) {
      // The bytes read (and checked) above, into the destination arena's pages. (Not the host
      // engine's own submit: its per-page hazard sets cost more than the copy on small pages,
      // and the copy here is synchronous, so there is no hazard to track.)
      scatter(t.dst, dst_pages, n, buf_.data());
      if (t.dst.value == 0) {  // what a request will read: check what landed
        gather(t.dst, dst_pages, n, buf_.data());
        if (!landed_ok(n)) {
          stats_.verify_failures += 1;
          return false;
        }
      }
      stats_.bytes += n;
      return true;
    }
    auto& space = *spaces_[t.dst.value - memory_tiers_];
    const auto r = space.put(to_underlying(t.id), dst_pages, page_, std::span<const std::byte>(buf_.data(), static_cast<std::size_t>(n)));
    stats_.storage_puts += 1;
    stats_.storage_removes = 0;
    for (const auto& sp : spaces_) stats_.storage_removes += sp->counters().removes;
    if (!r) {
      stats_.storage_put_failures += 1;
      return false;
    }
    stats_.bytes += n;
    return true;
  }

  std::uint64_t model_;
  std::int64_t page_;
  real_bytes_engine_options options_;
  std::size_t memory_tiers_ = 0;
  std::unique_ptr<tiered::host_copy_engine> memory_;
  std::vector<std::unique_ptr<tiered::storage_page_space>> spaces_;       // per storage tier
  std::uint32_t read_crc_ = 0;                                            // CRC of the last source read
  std::unordered_map<std::uint64_t, entry_sum> sums_;                     // by entry id
  std::vector<bool> failed_;                                              // by event index
  std::vector<std::byte> buf_, value_;
  sim::real_bytes_stats stats_;
};

static_assert(tier_copy_engine<real_bytes_copy_engine>);

}  // namespace hybridcache::sim
