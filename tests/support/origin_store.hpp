// A test `state_store` that remembers, for every cached token, which allocation wrote it.
//
// Each allocate_kv(n) draws a new serial and tags its n tokens with it; split and join move
// the tags with their tokens. So after a commit, a test can ask "which allocation holds
// the KV of position p?" and tell a token the runtime computed before (an old serial) from
// one the cache re-inserted into fresh pages that nobody filled (a serial drawn during the
// commit). Bytes are counted exactly like counting_store (same capacity rule), so it is a
// drop-in for the cache's fidelity behaviour; live_kv()/live_checkpoints() count handles so
// that a test can see a leak after the cache is gone.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "hybridcache/concepts/state_store.hpp"
#include "hybridcache/core/expected.hpp"

namespace hybridcache::test {

class origin_store {
 public:
  struct kv_extent {
    std::vector<std::uint64_t> origin;  ///< allocation serial of each token, in order
  };
  struct checkpoint_handle {
    std::uint64_t serial = 0;  ///< 0 = empty
  };
  [[nodiscard]] static bool holds(const checkpoint_handle& h) noexcept { return h.serial != 0; }

  origin_store(std::int64_t capacity, std::int64_t kv_per_token, std::int64_t checkpoint)
      : capacity_(capacity), kv_(kv_per_token), ck_(checkpoint) {}

  expected<kv_extent> allocate_kv(std::int64_t n) noexcept {
    if (n <= 0) return unexpected(errc::invalid_argument);
    if (n * kv_ > capacity_ - used_) return unexpected(errc::out_of_capacity);
    try {
      kv_extent e{std::vector<std::uint64_t>(static_cast<std::size_t>(n), ++serial_)};
      used_ += n * kv_;
      ++live_kv_;
      return e;
    } catch (...) {
      return unexpected(errc::out_of_capacity);
    }
  }
  void free_kv(kv_extent&& e) noexcept {
    if (e.origin.empty()) return;
    used_ -= static_cast<std::int64_t>(e.origin.size()) * kv_;
    e.origin.clear();
    --live_kv_;
  }
  expected<kv_extent> split_kv(kv_extent& whole, std::int64_t head) noexcept {
    const auto n = static_cast<std::int64_t>(whole.origin.size());
    if (head <= 0 || head >= n) return unexpected(errc::invalid_argument);
    try {
      kv_extent front{std::vector<std::uint64_t>(whole.origin.begin(), whole.origin.begin() + head)};
      whole.origin.erase(whole.origin.begin(), whole.origin.begin() + head);
      ++live_kv_;
      return front;
    } catch (...) {
      return unexpected(errc::out_of_capacity);
    }
  }
  expected<void> join_kv(kv_extent& front, kv_extent&& back) noexcept {
    try {
      front.origin.insert(front.origin.end(), back.origin.begin(), back.origin.end());
    } catch (...) {
      return unexpected(errc::out_of_capacity);
    }
    if (!back.origin.empty()) --live_kv_;
    back.origin.clear();
    return {};
  }
  expected<checkpoint_handle> allocate_checkpoint() noexcept {
    if (ck_ > capacity_ - used_) return unexpected(errc::out_of_capacity);
    used_ += ck_;
    ++live_ck_;
    return checkpoint_handle{++serial_};
  }
  void free_checkpoint(checkpoint_handle&& h) noexcept {
    if (h.serial == 0) return;
    used_ -= ck_;
    h.serial = 0;
    --live_ck_;
  }
  [[nodiscard]] std::int64_t kv_bytes(std::int64_t n) const noexcept { return n * kv_; }
  [[nodiscard]] std::int64_t checkpoint_bytes() const noexcept { return ck_; }
  [[nodiscard]] std::int64_t used_bytes() const noexcept { return used_; }
  [[nodiscard]] std::int64_t capacity_bytes() const noexcept { return capacity_; }

  /// The last serial drawn: every token allocated after this call has a larger one.
  [[nodiscard]] std::uint64_t serial() const noexcept { return serial_; }
  /// Handles allocated and not yet freed (shared across moved-from copies: the cache owns one).
  [[nodiscard]] std::int64_t live_kv() const noexcept { return live_kv_; }
  [[nodiscard]] std::int64_t live_checkpoints() const noexcept { return live_ck_; }

 private:
  std::int64_t capacity_, kv_, ck_;
  std::int64_t used_ = 0;
  std::uint64_t serial_ = 0;
  std::int64_t live_kv_ = 0, live_ck_ = 0;
};
static_assert(state_store<origin_store>);

}  // namespace hybridcache::test
