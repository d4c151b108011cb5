// hybridcache/stores/counting_store.hpp
//
// `counting_store`: a `state_store` that holds no data and counts bytes, for simulation
// and trace replay (the Marconi reference's memory model: one byte budget shared by KV and
// SSM checkpoints).
//
// Costs: every call O(1), allocation-free, noexcept.
#pragma once

#include <cstdint>
#include <string>

#include "hybridcache/core/error.hpp"
#include "hybridcache/core/expected.hpp"
#include "hybridcache/concepts/state_store.hpp"

namespace hybridcache::stores {

/// Byte-counting store. KV costs `kv_bytes_per_token` per token, a checkpoint
/// `checkpoint_bytes`; allocation fails with `errc::out_of_capacity` when it would exceed
/// `capacity_bytes`. The handles carry only their size so a double free cannot go unseen
/// by the byte count (the tree frees each extent exactly once).
class counting_store {
 public:
  /// KV of a run of tokens: only its length.
  struct kv_extent {
    std::int64_t tokens = 0;
  };
  /// An SSM checkpoint: empty marker (true when it stands for an allocated state).
  struct checkpoint_handle {
    bool held = false;
  };
  /// Whether `h` stands for an allocated checkpoint (`state_store::holds`). O(1).
  [[nodiscard]] static bool holds(const checkpoint_handle& h) noexcept { return h.held; }

  /// @throws invalid_argument when a size is negative or the capacity is not positive;
  /// @throws capacity_error when one checkpoint alone does not fit in the capacity.
  counting_store(std::int64_t capacity_bytes, std::int64_t kv_bytes_per_token, std::int64_t checkpoint_bytes)
      : capacity_(capacity_bytes), kv_per_token_(kv_bytes_per_token), checkpoint_(checkpoint_bytes) {
    HYBRIDCACHE_EXPECTS(capacity_bytes > 0, invalid_argument, "counting_store: capacity_bytes must be > 0");
    HYBRIDCACHE_EXPECTS(kv_bytes_per_token >= 0, invalid_argument,
                        "counting_store: kv_bytes_per_token must be >= 0");
    HYBRIDCACHE_EXPECTS(checkpoint_bytes >= 0, invalid_argument, "counting_store: checkpoint_bytes must be >= 0");
    HYBRIDCACHE_EXPECTS(kv_bytes_per_token > 0 || checkpoint_bytes > 0, invalid_argument,
                        "counting_store: kv_bytes_per_token and checkpoint_bytes are both 0");
    if (checkpoint_bytes > capacity_bytes)
      throw capacity_error("counting_store: capacity " + std::to_string(capacity_bytes) +
                           " B is smaller than one SSM checkpoint (" + std::to_string(checkpoint_bytes) + " B)");
  }

  [[nodiscard]] expected<kv_extent> allocate_kv(std::int64_t tokens) noexcept {
    if (tokens <= 0) return unexpected(errc::invalid_argument);
    if (refuse()) return unexpected(errc::out_of_capacity);
    // tokens * kv_per_token_ cannot overflow once tokens <= (2^62 / kv_per_token_).
    if (kv_per_token_ > 0 && tokens > (std::int64_t{1} << 62) / kv_per_token_) return unexpected(errc::out_of_capacity);
    const std::int64_t b = tokens * kv_per_token_;
    if (b > capacity_ - used_ && !allow_overflow_) return unexpected(errc::out_of_capacity);
    used_ += b;
    return kv_extent{tokens};
  }
  void free_kv(kv_extent&& e) noexcept {
    used_ -= e.tokens * kv_per_token_;
    e.tokens = 0;
  }
  [[nodiscard]] expected<kv_extent> split_kv(kv_extent& whole, std::int64_t head) noexcept {
    if (head <= 0 || head >= whole.tokens) return unexpected(errc::invalid_argument);
    whole.tokens -= head;
    return kv_extent{head};
  }
  [[nodiscard]] expected<void> join_kv(kv_extent& front, kv_extent&& back) noexcept {
    front.tokens += back.tokens;
    back.tokens = 0;
    return {};
  }
  [[nodiscard]] expected<checkpoint_handle> allocate_checkpoint() noexcept {
    if (refuse()) return unexpected(errc::out_of_capacity);
    if (checkpoint_ > capacity_ - used_ && !allow_overflow_) return unexpected(errc::out_of_capacity);
    used_ += checkpoint_;
    return checkpoint_handle{true};
  }
  void free_checkpoint(checkpoint_handle&& h) noexcept {
    if (h.held) used_ -= checkpoint_;
    h.held = false;
  }

  [[nodiscard]] std::int64_t kv_bytes(std::int64_t tokens) const noexcept { return tokens * kv_per_token_; }
  [[nodiscard]] std::int64_t checkpoint_bytes() const noexcept { return checkpoint_; }
  [[nodiscard]] std::int64_t used_bytes() const noexcept { return used_; }
  [[nodiscard]] std::int64_t capacity_bytes() const noexcept { return capacity_; }

  /// Simulation switch: let allocations exceed capacity (reproduces the Marconi reference,
  /// whose buggy eviction accounting lets its tree grow past capacity). Off by default.
  void allow_overflow(bool on) noexcept { allow_overflow_ = on; }
  /// Fail the next `n` allocations (tests: a store that refuses allocation).
  void fail_next(int n) noexcept { fail_next_ = n; }

 private:
  bool refuse() noexcept {
    if (fail_next_ <= 0) return false;
    --fail_next_;
    return true;
  }

  std::int64_t capacity_;
  std::int64_t kv_per_token_;
  std::int64_t checkpoint_;
  std::int64_t used_ = 0;
  bool allow_overflow_ = false;
  int fail_next_ = 0;
};

static_assert(state_store<counting_store>);
static_assert(!paged_state_store<counting_store> && !side_placing_store<counting_store>);

}  // namespace hybridcache::stores
