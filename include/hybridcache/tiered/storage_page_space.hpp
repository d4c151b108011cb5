// hybridcache/tiered/storage_page_space.hpp
//
// `storage_page_space`: the pages of one storage tier (a disk directory, a Redis server)
// over its `storage_tier_io`. A `tiered_store` addresses every tier in pages, a storage tier
// included; a storage backend holds whole values by key. A copy into the tier `put`s one
// value holding the bytes of its destination pages in page-list order, and this map
// remembers, run by run, which value (and which page of it) each tier page's bytes are in,
// so a later copy out of the tier finds them by page whatever the store did in between:
// split an entry into two ids over the same pages, extract some pages of every layer
// segment, drop a copy and hand its pages to another.
//
// Values: one per put, keyed `storage_key{model, value ^ key_salt, 1, kv}` where `value` is
// the caller's number for it (the simulator's engine uses entry ids; the host copy engine a
// serial). A value none of whose pages still maps to it is dead (the store reused its pages
// for a later put; it does not tell the engine about drops) and is removed from the backend
// then, so the backend never holds more than the tier's pages' worth of values. `read`
// checks the bytes it got against the CRC-32C recorded at the put, besides the backend's own
// check, so a backend that hands back other bytes fails the read instead of landing them.
//
// Thread safety: every call may come from any thread; the map is under one mutex and the
// backend calls run outside it (a put and a read of the same pages must be ordered by the
// caller: the copy engines' page hazards do that).
// Costs (m = runs mapped, k = runs a put overlaps): locate O(log m); put = the backend's put
// + O(runs of the page list · log m + k), removes of dead values after it; read = the
// backend's get + O(bytes) CRC. Maps allocate their nodes; values are read into the caller's
// buffer.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "hybridcache/concepts/storage_backend.hpp"
#include "hybridcache/core/crc32c.hpp"
#include "hybridcache/core/error.hpp"
#include "hybridcache/core/expected.hpp"
#include "hybridcache/tiered/storage_tier_io.hpp"

namespace hybridcache::tiered {

/// Where one storage-tier page's bytes are: page `index` of value `value`.
struct storage_page_home {
  std::uint64_t value = 0;
  std::int64_t index = 0;
};

/// What a storage page space did since construction.
struct storage_page_counters {
  std::int64_t puts = 0, put_failures = 0;   ///< values handed to the backend / refused or failed
  std::int64_t gets = 0, get_failures = 0;   ///< values read back / missing, short, corrupt, unreachable
  std::int64_t removes = 0;                  ///< dead values removed from the backend
};

/// The page map of one storage tier (see the file comment).
class storage_page_space {
 public:
  /// @param io        the tier's backend calls (all four set)
  /// @param model     `storage_key::model` of every value
  /// @param key_salt  xor-ed into every value's key (keeps two users of one backend apart)
  /// @throws invalid_argument when `io` lacks a call.
  storage_page_space(storage_tier_io io, std::uint64_t model, std::uint64_t key_salt = 0)
      : io_(std::move(io)), model_(model), salt_(key_salt) {
    HYBRIDCACHE_EXPECTS(io_.complete(), invalid_argument, "storage_page_space: the storage_tier_io lacks put, get, wait or remove");
  }

  storage_page_space(const storage_page_space&) = delete;
  storage_page_space& operator=(const storage_page_space&) = delete;

  /// The key value `value` is stored under.
  [[nodiscard]] storage_key key_of(std::uint64_t value) const noexcept { return {model_, value ^ salt_, 1, value_kind::kv}; }

  /// Puts `bytes` as value `value`, page k of it being tier page pages[k] (bytes beyond the
  /// last whole page are the last page's start), and maps those pages to it. A value
  /// already put under the same number is replaced. On a failed put nothing is mapped and
  /// the pages keep what they had. Errors: `out_of_capacity` (the backend is full: no_space),
  /// `invalid_argument` (too_large for it, or a page list shorter than the bytes), `busy`
  /// (unreachable, or the backend refused the call).
  [[nodiscard]] expected<void> put(std::uint64_t value, std::span<const std::uint32_t> pages, std::int64_t page_bytes,
                                   std::span<const std::byte> bytes) {
    if (page_bytes <= 0 || static_cast<std::int64_t>(pages.size()) * page_bytes < static_cast<std::int64_t>(bytes.size()))
      return unexpected(errc::invalid_argument);
    const auto t = io_.put(key_of(value), value_meta{}, bytes);
    const auto r = t ? io_.wait(*t) : expected<io_result>(unexpected(t.error()));
    std::vector<std::uint64_t> dead;
    {
      std::lock_guard lock(mu_);
      if (!r || r->status != io_status::ok) {
        counters_.put_failures += 1;
        return unexpected(!r ? r.error() : error_of(r->status));
      }
      counters_.puts += 1;
      if (const auto old = values_.find(value); old != values_.end()) {  // put again under this number
        const auto runs = old->second.runs;
        for (const auto& [first, count] : runs) unmap(first, count, value, dead, value);
      }
      value_record& v = values_[value];
      v = {static_cast<std::int64_t>(bytes.size()), crc32c(bytes), 0, {}};
      // Consecutive pages at consecutive indices are one run.
      std::size_t k = 0;
      while (k < pages.size()) {
        std::size_t e = k + 1;
        while (e < pages.size() && pages[e] == pages[e - 1] + 1) ++e;
        const auto count = static_cast<std::uint32_t>(e - k);
        unmap(pages[k], count, std::nullopt, dead, value);
        runs_[pages[k]] = run{count, value, static_cast<std::int64_t>(k)};
        v.runs.emplace_back(pages[k], count);
        v.live += count;
        k = e;
      }
    }
    for (const auto d : dead) remove(d);
    return {};
  }

  /// The value and index holding tier page `page`'s bytes; nullopt when no put covered it.
  [[nodiscard]] std::optional<storage_page_home> locate(std::uint32_t page) const {
    std::lock_guard lock(mu_);
    auto it = runs_.upper_bound(page);
    if (it == runs_.begin()) return std::nullopt;
    --it;
    if (page - it->first >= it->second.count) return std::nullopt;
    return storage_page_home{it->second.value, it->second.index + (page - it->first)};
  }

  /// Reads value `value` whole into `into` (resized to its length): the backend's get, then
  /// its length and the CRC-32C recorded at the put. Errors: `not_found` for a value never
  /// put (or dead), `busy` when the backend answers a miss (not_found, corrupt, unavailable)
  /// or the bytes are not the ones put.
  [[nodiscard]] expected<void> read(std::uint64_t value, std::vector<std::byte>& into) {
    std::int64_t bytes = 0;
    std::uint32_t crc = 0;
    {
      std::lock_guard lock(mu_);
      const auto v = values_.find(value);
      if (v == values_.end()) return unexpected(errc::not_found);
      bytes = v->second.bytes;
      crc = v->second.crc;
    }
    into.resize(static_cast<std::size_t>(bytes));
    const auto t = io_.get(key_of(value), into);
    const auto r = t ? io_.wait(*t) : expected<io_result>(unexpected(t.error()));
    const bool ok = r && r->status == io_status::ok && r->bytes == bytes && crc32c(into) == crc;
    std::lock_guard lock(mu_);
    counters_.gets += 1;
    if (!ok) {
      counters_.get_failures += 1;
      return unexpected(errc::busy);
    }
    return {};
  }

  /// Removes every value still recorded from the backend (an engine shutting down leaves
  /// nothing behind) and forgets the map. Failures to remove are ignored: the values are
  /// unreachable either way.
  void remove_all() {
    std::vector<std::uint64_t> all;
    {
      std::lock_guard lock(mu_);
      for (const auto& [v, rec] : values_) all.push_back(v);
      values_.clear();
      runs_.clear();
    }
    for (const auto v : all) remove(v);
  }

  [[nodiscard]] storage_page_counters counters() const {
    std::lock_guard lock(mu_);
    return counters_;
  }
  /// Values recorded (put and not yet dead).
  [[nodiscard]] std::size_t values() const {
    std::lock_guard lock(mu_);
    return values_.size();
  }

  /// Empty when the map is consistent: runs disjoint and non-empty, each run's value
  /// recorded, each value's live count the pages mapped to it and above 0. O(m). Tests.
  [[nodiscard]] std::string check_invariants() const {
    std::lock_guard lock(mu_);
    std::unordered_map<std::uint64_t, std::int64_t> mapped;
    std::uint64_t end = 0;
    for (const auto& [first, r] : runs_) {
      if (r.count == 0) return "an empty run at page " + std::to_string(first);
      if (first < end) return "runs overlap at page " + std::to_string(first);
      end = std::uint64_t{first} + r.count;
      if (!values_.count(r.value)) return "page " + std::to_string(first) + " maps to an unrecorded value";
      mapped[r.value] += r.count;
    }
    for (const auto& [v, rec] : values_)
      if (rec.live <= 0 || mapped[v] != rec.live)
        return "value " + std::to_string(v) + " counts " + std::to_string(rec.live) + " live pages, " +
               std::to_string(mapped[v]) + " map to it";
    return {};
  }

 private:
  struct run {
    std::uint32_t count = 0;
    std::uint64_t value = 0;
    std::int64_t index = 0;  // of the run's first page in its value
  };
  struct value_record {
    std::int64_t bytes = 0;
    std::uint32_t crc = 0;
    std::int64_t live = 0;                                     // pages still mapped to it
    std::vector<std::pair<std::uint32_t, std::uint32_t>> runs;  // (first page, count) as put
  };

  static errc error_of(io_status s) noexcept {
    switch (s) {
      case io_status::no_space: return errc::out_of_capacity;
      case io_status::too_large: return errc::invalid_argument;
      default: return errc::busy;
    }
  }

  // Unmaps pages [first, first + count) (only those mapped to `only`, when given); a value
  // left with no page is dead (pushed to `dead`, unless it is `keeping`: the value being put).
  void unmap(std::uint32_t first, std::uint32_t count, std::optional<std::uint64_t> only, std::vector<std::uint64_t>& dead,
             std::uint64_t keeping) {
    const std::uint64_t end = std::uint64_t{first} + count;
    auto it = runs_.upper_bound(first);
    if (it != runs_.begin() && std::uint64_t{std::prev(it)->first} + std::prev(it)->second.count > first) --it;
    while (it != runs_.end() && it->first < end) {
      const std::uint32_t f = it->first;
      const run r = it->second;
      if (only && r.value != *only) {
        ++it;
        continue;
      }
      const std::uint64_t rend = std::uint64_t{f} + r.count;
      const std::uint32_t lo = std::max(f, first);
      const auto hi = static_cast<std::uint32_t>(std::min(rend, end));
      it = runs_.erase(it);
      if (f < lo) runs_[f] = run{lo - f, r.value, r.index};
      if (rend > hi) it = runs_.emplace_hint(it, hi, run{static_cast<std::uint32_t>(rend - hi), r.value, r.index + (hi - f)});
      const auto v = values_.find(r.value);
      if (v == values_.end()) continue;
      v->second.live -= hi - lo;
      if (v->second.live <= 0) {
        if (r.value != keeping) dead.push_back(r.value);
        values_.erase(v);
      }
    }
  }

  void remove(std::uint64_t value) {
    if (const auto t = io_.remove(key_of(value))) (void)io_.wait(*t);
    std::lock_guard lock(mu_);
    counters_.removes += 1;
  }

  storage_tier_io io_;
  std::uint64_t model_, salt_;
  mutable std::mutex mu_;
  std::map<std::uint32_t, run> runs_;                      // by first page; disjoint
  std::unordered_map<std::uint64_t, value_record> values_;  // by the caller's number
  storage_page_counters counters_;
};

}  // namespace hybridcache::tiered
