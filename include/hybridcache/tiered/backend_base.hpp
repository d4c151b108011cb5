// hybridcache/tiered/backend_base.hpp
//
// `backend_base<Job, Scorer>`: what every storage backend (disk_backend, redis_backend)
// has in common: the bounded queue and its tickets (io_queue.hpp), the index of what it
// holds with capacity and eviction order (backend_index.hpp), the counters, and the calls
// of the `storage_backend` concept that only touch those (poll, wait, wait_for, counters,
// capacity_bytes, used_bytes). A backend derives from it, adds put / get / exists /
// remove, and calls `start` at the end of its constructor and `stop` first in its
// destructor (the workers run the derived class's handler).
//
// Thread safety: `mu_` guards the index, the counters and `writing_bytes_`; `complete_now`
// is called with it held. Costs: O(1) per call here, O(log n) for the index.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>

#include "hybridcache/concepts/demotion.hpp"
#include "hybridcache/concepts/storage_backend.hpp"
#include "hybridcache/core/expected.hpp"
#include "hybridcache/tiered/backend_index.hpp"
#include "hybridcache/tiered/io_queue.hpp"

namespace hybridcache::tiered {

template <class Job, demotion_scorer Scorer>
class backend_base {
 public:
  backend_base(const backend_base&) = delete;
  backend_base& operator=(const backend_base&) = delete;

  /// true when the operation finished; stale_handle for a ticket that is not live.
  [[nodiscard]] expected<bool> poll(io_ticket t) const { return queue_->poll(t); }
  /// Blocks until the operation finished (running it on this thread when no worker has
  /// started it yet) and consumes the ticket.
  [[nodiscard]] expected<io_result> wait(io_ticket t) { return queue_->wait(t); }
  /// As `wait`, at most `timeout`; then the status is `pending` and the ticket stays live.
  [[nodiscard]] expected<io_result> wait_for(io_ticket t, std::chrono::nanoseconds timeout) {
    return queue_->wait_for(t, timeout);
  }
  [[nodiscard]] backend_counters counters() const {
    std::lock_guard lock(mu_);
    return counters_;
  }
  /// Bytes the tier may hold (header + payload).
  [[nodiscard]] std::int64_t capacity_bytes() const {
    std::lock_guard lock(mu_);
    return index_.capacity_bytes();
  }
  /// Bytes held (header + payload), plus those being written.
  [[nodiscard]] std::int64_t used_bytes() const {
    std::lock_guard lock(mu_);
    return index_.used_bytes() + writing_bytes_;
  }
  /// Values held (for the Redis tier: written by this node and still counted).
  [[nodiscard]] std::int64_t entries() const {
    std::lock_guard lock(mu_);
    return static_cast<std::int64_t>(index_.size());
  }
  /// Sets a value's score (read by `car_score_demotion`). No-op for a key not held.
  void set_score(const storage_key& key, double score) {
    std::lock_guard lock(mu_);
    index_.set_score(key, score);
  }

 protected:
  backend_base(std::int64_t capacity_bytes, Scorer scorer) : index_(capacity_bytes, std::move(scorer)) {}
  ~backend_base() = default;

  /// Starts the workers (the derived constructor's last step).
  void start(std::int32_t depth, int workers, typename io_queue<Job>::handler h, int helpers) {
    queue_ = std::make_unique<io_queue<Job>>(depth, workers, std::move(h), helpers);
  }
  /// Runs what is queued (it points into caller buffers) and stops the workers (the derived
  /// destructor's first step).
  void stop() noexcept {
    if (queue_) queue_->shutdown();
  }

  expected<io_ticket> submit(Job&& j) {
    auto t = queue_->submit(std::move(j));
    if (!t) {
      std::lock_guard lock(mu_);
      counters_.rejected_busy += 1;
    }
    return t;
  }
  /// A ticket already done with `r`. Called with mu_ held.
  expected<io_ticket> complete_now(const io_result& r) {
    auto t = queue_->complete_now(r);
    if (!t) counters_.rejected_busy += 1;
    return t;
  }

  mutable std::mutex mu_;
  backend_index<Scorer> index_;
  std::int64_t writing_bytes_ = 0;  ///< reserved by puts in flight
  backend_counters counters_;
  std::unique_ptr<io_queue<Job>> queue_;
};

}  // namespace hybridcache::tiered
