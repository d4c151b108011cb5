// The reference model of `storage_backend` (concepts/storage_backend.hpp): small enough to
// be obviously right, and the oracle the real backends are checked against on random
// operation sequences (tests/conformance/storage_backend_laws.hpp).
//
// - Values live in a plain list, most recently used at the back; a get or a put moves the
//   key to the back; eviction pops from the front until the new value fits (LRU, the same
//   order `lru_demotion` gives the real backends). Stored bytes count like the real ones
//   (64-byte header + payload).
// - Every call completes synchronously; a ticket is (slot, generation) over `depth` slots,
//   so stale and forged tickets and a full queue behave as the contract says.
// - The payload's CRC is computed one bit at a time at put and checked at get, so a test
//   that flips a stored byte (`corrupt`) must see `corrupt`, counted, and the value gone.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <list>
#include <span>
#include <vector>

#include "hybridcache/concepts/storage_backend.hpp"
#include "hybridcache/core/crc32c.hpp"
#include "hybridcache/core/expected.hpp"

namespace hybridcache::test {

class memory_storage_backend {
 public:
  explicit memory_storage_backend(std::int64_t capacity_bytes, std::int32_t depth = 64)
      : capacity_(capacity_bytes), slots_(static_cast<std::size_t>(depth)) {}

  expected<io_ticket> put(const storage_key& k, const value_meta& m,
                                  std::span<const std::byte> payload) {
    using hybridcache::io_status;
    if (!key_ok(k) || !meta_ok(k, m)) return unexpected(errc::invalid_argument);
    if (!has_free_slot()) return busy();
    const std::int64_t need = 64 + static_cast<std::int64_t>(payload.size());
    if (need > capacity_) {
      counters_.put_failures += 1;
      return issue({io_status::too_large, 0, {}});
    }
    erase(k);
    while (used_ + need > capacity_) {
      used_ -= 64 + static_cast<std::int64_t>(values_.front().bytes.size());
      counters_.evictions += 1;
      counters_.evicted_bytes += 64 + static_cast<std::int64_t>(values_.front().bytes.size());
      values_.pop_front();
    }
    values_.push_back({k, m, std::vector<std::byte>(payload.begin(), payload.end()), crc32c_bitwise(payload)});
    used_ += need;
    counters_.puts += 1;
    counters_.put_bytes += static_cast<std::int64_t>(payload.size());
    return issue({io_status::ok, static_cast<std::int64_t>(payload.size()), {}});
  }

  expected<io_ticket> get(const storage_key& k, std::span<std::byte> into) {
    using hybridcache::io_status;
    if (!key_ok(k)) return unexpected(errc::invalid_argument);
    if (!has_free_slot()) return busy();
    counters_.gets += 1;
    const auto it = find(k);
    if (it == values_.end()) {
      counters_.misses += 1;
      return issue({io_status::not_found, 0, {}});
    }
    values_.splice(values_.end(), values_, it);  // most recently used
    const auto n = static_cast<std::int64_t>(it->bytes.size());
    if (n > static_cast<std::int64_t>(into.size())) return issue({io_status::too_large, n, {}});
    std::copy(it->bytes.begin(), it->bytes.end(), into.begin());
    if (crc32c_bitwise(it->bytes) != it->crc) {
      counters_.corrupt += 1;
      erase(k);
      return issue({io_status::corrupt, 0, {}});
    }
    counters_.hits += 1;
    counters_.hit_bytes += n;
    return issue({io_status::ok, n, it->meta});
  }

  expected<io_ticket> exists(std::span<const storage_key> keys, std::span<std::uint8_t> found) {
    if (keys.size() != found.size()) return unexpected(errc::invalid_argument);
    if (!has_free_slot()) return busy();
    std::int64_t n = 0;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      found[i] = find(keys[i]) != values_.end() ? 1 : 0;
      n += found[i];
    }
    counters_.exists_calls += 1;
    counters_.exists_keys += static_cast<std::int64_t>(keys.size());
    counters_.exists_found += n;
    return issue({io_status::ok, n, {}});
  }

  expected<io_ticket> remove(const storage_key& k) {
    if (!key_ok(k)) return unexpected(errc::invalid_argument);
    if (!has_free_slot()) return busy();
    if (!erase(k)) return issue({io_status::not_found, 0, {}});
    counters_.removes += 1;
    return issue({io_status::ok, 1, {}});
  }

  expected<bool> poll(io_ticket t) const {
    if (!live(t)) return unexpected(errc::stale_handle);
    return true;
  }
  expected<io_result> wait(io_ticket t) {
    if (!live(t)) return unexpected(errc::stale_handle);
    slot& s = slots_[t.slot];
    s.used = false;
    s.generation += 1;
    return s.result;
  }
  expected<io_result> wait_for(io_ticket t, std::chrono::nanoseconds) { return wait(t); }

  backend_counters counters() const { return counters_; }
  std::int64_t capacity_bytes() const { return capacity_; }
  std::int64_t used_bytes() const { return used_; }

  /// Flips one stored byte of `k`'s payload (a test's corruption); false when absent or empty.
  bool corrupt(const storage_key& k) {
    const auto it = find(k);
    if (it == values_.end() || it->bytes.empty()) return false;
    it->bytes[it->bytes.size() / 2] ^= std::byte{0x20};
    return true;
  }
  /// Keys held, least recently used first.
  std::vector<storage_key> keys() const {
    std::vector<storage_key> out;
    for (const auto& v : values_) out.push_back(v.key);
    return out;
  }

 private:
  struct value {
    storage_key key;
    value_meta meta;
    std::vector<std::byte> bytes;
    std::uint32_t crc;
  };
  struct slot {
    bool used = false;
    std::uint32_t generation = 1;
    io_result result;
  };

  static bool key_ok(const storage_key& k) {
    return k.tokens >= 0 && (k.kind == value_kind::kv || k.kind == value_kind::checkpoint);
  }
  static bool meta_ok(const storage_key& k, const value_meta& m) {
    const bool span = k.kind == value_kind::checkpoint ? m.span_begin == k.tokens
                                                               : m.span_begin >= 0 && m.span_begin <= k.tokens;
    return span && static_cast<int>(m.layout.order) <= 2;
  }
  std::list<value>::iterator find(const storage_key& k) {
    return std::find_if(values_.begin(), values_.end(), [&](const value& v) { return v.key == k; });
  }
  std::list<value>::const_iterator find(const storage_key& k) const {
    return std::find_if(values_.begin(), values_.end(), [&](const value& v) { return v.key == k; });
  }
  bool erase(const storage_key& k) {
    const auto it = find(k);
    if (it == values_.end()) return false;
    used_ -= 64 + static_cast<std::int64_t>(it->bytes.size());
    values_.erase(it);
    return true;
  }
  bool has_free_slot() const {
    return std::any_of(slots_.begin(), slots_.end(), [](const slot& s) { return !s.used; });
  }
  expected<io_ticket> busy() {
    counters_.rejected_busy += 1;
    return unexpected(errc::busy);
  }
  expected<io_ticket> issue(const io_result& r) {
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      if (slots_[i].used) continue;
      slots_[i].used = true;
      slots_[i].result = r;
      return io_ticket{static_cast<std::uint32_t>(i), slots_[i].generation};
    }
    return busy();
  }
  bool live(io_ticket t) const {
    return t.generation != 0 && t.slot < slots_.size() && slots_[t.slot].used && slots_[t.slot].generation == t.generation;
  }

  std::int64_t capacity_;
  std::int64_t used_ = 0;
  std::list<value> values_;  // least recently used first
  std::vector<slot> slots_;
  backend_counters counters_;
};

static_assert(storage_backend<memory_storage_backend>);

}  // namespace hybridcache::test
