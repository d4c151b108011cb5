// hybridcache/tiered/io_queue.hpp
//
// `io_queue<Job>`: the bounded submission queue and completion tickets behind every
// storage backend (concepts/storage_backend.hpp). A backend turns each call into a Job,
// `submit`s it, and a fixed pool of worker threads runs the backend's handler on it
// (pread/pwrite for the disk tier, one pooled Redis connection per worker for the Redis
// tier). The caller holds an `io_ticket` and waits with `poll` / `wait` / `wait_for`.
//
// Why bounded: an offload engine that produces faster than the storage drains must feel
// it (`errc::busy` at submit, nothing queued) instead of queueing unbounded memory of
// pinned buffers. `depth` slots hold every operation from submit until its ticket is
// consumed, so the queue never allocates after construction.
//
// Tickets carry a per-slot generation (bumped when the ticket is consumed), so a ticket
// used twice, or a forged one, is `errc::stale_handle`, never another operation's result.
// `complete_now` issues a ticket that is already done: backends answer from an in-memory
// index (a miss, an exists) without a worker.
//
// Shutdown (the destructor) runs every queued job before the workers exit, because queued
// jobs point into caller buffers the caller may still be waiting on.
//
// Helpers: a thread that calls `wait` on a job no worker has started yet takes it off the
// queue and runs it itself instead of sleeping until a worker wakes up: the same work, two
// context switches less (on a loaded machine a woken worker loses whole scheduling slices;
// docs/results/storage.md). There are `helpers`
// helper seats; a waiter takes a free one (else it waits as usual) and the handler gets
// `worker = workers + seat`, so a backend keeps per-seat state (the Redis tier: one pooled
// connection per seat) exactly as for its workers. `helpers = 0` turns this off. On Linux
// the workers run under SCHED_BATCH, which only drops wake-up preemption: a worker woken by
// `submit` no longer preempts the submitting thread on its own core, so a caller that
// waits at once gets to run its job itself (without it, on a loaded machine, workers take
// many such jobs away; docs/results/storage.md). Asynchronous jobs still start as soon as a
// core is free.
//
// Costs: submit, complete_now, poll O(1); wait blocks until the job ran; one mutex, two
// condition variables. Thread-safe: any thread may submit and wait (a ticket is waited on
// by one thread).
#pragma once

#include <pthread.h>
#include <sched.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "hybridcache/concepts/storage_backend.hpp"
#include "hybridcache/core/error.hpp"
#include "hybridcache/core/expected.hpp"

namespace hybridcache::tiered {

template <class Job>
class io_queue {
 public:
  /// Runs one job on worker `worker` (0 .. workers-1); returns its result. An exception
  /// from it ends the job `unavailable`.
  using handler = std::function<io_result(Job&, std::size_t worker)>;

  /// Starts `workers` threads; `helpers` waiting threads may run queued jobs themselves
  /// (handler index workers .. workers + helpers - 1).
  /// @throws invalid_argument for depth < 1, workers < 1 or helpers < 0 (naming the field).
  io_queue(std::int32_t depth, int workers, handler h, int helpers = 0) : handler_(std::move(h)) {
    HYBRIDCACHE_EXPECTS(helpers >= 0, invalid_argument, "io_queue: helpers must be >= 0, got " + std::to_string(helpers));
    for (int i = helpers - 1; i >= 0; --i) free_seats_.push_back(static_cast<std::size_t>(workers + i));
    HYBRIDCACHE_EXPECTS(depth >= 1, invalid_argument, "io_queue: field 'queue_depth' must be >= 1, got " + std::to_string(depth));
    HYBRIDCACHE_EXPECTS(workers >= 1, invalid_argument, "io_queue: field 'io_threads' must be >= 1, got " + std::to_string(workers));
    slots_.resize(static_cast<std::size_t>(depth));
    ring_.resize(static_cast<std::size_t>(depth));
    free_.reserve(static_cast<std::size_t>(depth));
    for (std::int32_t i = depth - 1; i >= 0; --i) free_.push_back(static_cast<std::uint32_t>(i));
    workers_.reserve(static_cast<std::size_t>(workers));
    for (int w = 0; w < workers; ++w) workers_.emplace_back([this, w] { run(static_cast<std::size_t>(w)); });
  }
  ~io_queue() { shutdown(); }
  io_queue(const io_queue&) = delete;
  io_queue& operator=(const io_queue&) = delete;

  /// Runs what is queued, then stops the workers. Idempotent. Submitting afterwards is busy.
  void shutdown() noexcept {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (std::thread& t : workers_)
      if (t.joinable()) t.join();
  }

  /// Queues `job`. busy: every slot is in use (or the queue is shut down); nothing queued.
  [[nodiscard]] expected<io_ticket> submit(Job&& job) {
    std::lock_guard lock(mu_);
    if (stop_ || free_.empty()) return unexpected(errc::busy);
    const std::uint32_t s = take_slot();
    slot& sl = slots_[s];
    sl.job = std::move(job);
    sl.state = slot_state::queued;
    ring_[(head_ + count_) % ring_.size()] = s;
    ++count_;
    work_cv_.notify_one();
    return io_ticket{s, sl.generation};
  }

  /// A ticket that is already done with `r`. busy when every slot is in use.
  [[nodiscard]] expected<io_ticket> complete_now(const io_result& r) {
    std::lock_guard lock(mu_);
    if (free_.empty()) return unexpected(errc::busy);
    const std::uint32_t s = take_slot();
    slots_[s].result = r;
    slots_[s].state = slot_state::done;
    return io_ticket{s, slots_[s].generation};
  }

  /// true when the operation finished (wait returns at once); stale_handle for a ticket
  /// that is not live.
  [[nodiscard]] expected<bool> poll(io_ticket t) const {
    std::lock_guard lock(mu_);
    if (!live(t)) return unexpected(errc::stale_handle);
    return slots_[t.slot].state == slot_state::done;
  }

  /// Blocks until the operation finished; returns its result and consumes the ticket.
  [[nodiscard]] expected<io_result> wait(io_ticket t) {
    std::unique_lock lock(mu_);
    if (!live(t)) return unexpected(errc::stale_handle);
    if (slots_[t.slot].state == slot_state::queued && !free_seats_.empty()) {
      const std::size_t seat = free_seats_.back();
      free_seats_.pop_back();
      unqueue(t.slot);
      execute(t.slot, seat, lock);
      free_seats_.push_back(seat);  // capacity reserved: never allocates
    }
    done_cv_.wait(lock, [&] { return slots_[t.slot].state == slot_state::done; });
    return consume(t.slot);
  }

  /// As `wait`, but gives up after `timeout`: then the result's status is `pending` and
  /// the ticket stays live.
  [[nodiscard]] expected<io_result> wait_for(io_ticket t, std::chrono::nanoseconds timeout) {
    std::unique_lock lock(mu_);
    if (!live(t)) return unexpected(errc::stale_handle);
    if (!done_cv_.wait_for(lock, timeout, [&] { return slots_[t.slot].state == slot_state::done; }))
      return io_result{};
    return consume(t.slot);
  }

  /// Slots in use (queued, running, or done and not yet consumed).
  [[nodiscard]] std::int32_t in_use() const {
    std::lock_guard lock(mu_);
    return static_cast<std::int32_t>(slots_.size() - free_.size());
  }
  [[nodiscard]] std::int32_t depth() const noexcept { return static_cast<std::int32_t>(slots_.size()); }
  [[nodiscard]] std::size_t workers() const noexcept { return workers_.size(); }

 private:
  enum class slot_state : std::uint8_t { free, queued, running, done };
  struct slot {
    std::uint32_t generation = 1;
    slot_state state = slot_state::free;
    Job job{};
    io_result result{};
  };

  [[nodiscard]] bool live(io_ticket t) const noexcept {
    return t.generation != 0 && t.slot < slots_.size() && slots_[t.slot].generation == t.generation &&
           slots_[t.slot].state != slot_state::free;
  }
  std::uint32_t take_slot() noexcept {
    const std::uint32_t s = free_.back();
    free_.pop_back();
    return s;
  }
  io_result consume(std::uint32_t s) noexcept {
    slot& sl = slots_[s];
    const io_result r = sl.result;
    sl.state = slot_state::free;
    sl.job = Job{};
    if (++sl.generation == 0) sl.generation = 1;  // 0 is the null ticket
    free_.push_back(s);                            // capacity reserved: never allocates
    return r;
  }

  /// Takes queued slot `s` out of the FIFO (a waiter runs it). O(depth).
  void unqueue(std::uint32_t s) noexcept {
    const std::size_t n = ring_.size();
    std::size_t i = 0;
    while (ring_[(head_ + i) % n] != s) ++i;
    for (; i + 1 < count_; ++i) ring_[(head_ + i) % n] = ring_[(head_ + i + 1) % n];
    --count_;
  }
  /// Runs slot `s` (already off the queue) with `lock` released, then marks it done.
  void execute(std::uint32_t s, std::size_t worker, std::unique_lock<std::mutex>& lock) {
    slots_[s].state = slot_state::running;
    lock.unlock();
    io_result r;
    try {
      r = handler_(slots_[s].job, worker);  // the slot is this thread's until done
    } catch (...) {
      r = io_result{io_status::unavailable, 0, {}};
    }
    lock.lock();
    slots_[s].result = r;
    slots_[s].state = slot_state::done;
    done_cv_.notify_all();
  }

  void run(std::size_t worker) {
#if defined(__linux__) && defined(SCHED_BATCH)
    sched_param batch{};
    (void)pthread_setschedparam(pthread_self(), SCHED_BATCH, &batch);  // best effort
#endif
    std::unique_lock lock(mu_);
    for (;;) {
      work_cv_.wait(lock, [&] { return stop_ || count_ > 0; });
      if (count_ == 0) return;  // stopped and drained
      const std::uint32_t s = ring_[head_];
      head_ = (head_ + 1) % ring_.size();
      --count_;
      execute(s, worker, lock);
    }
  }

  handler handler_;
  std::vector<std::size_t> free_seats_;  // helper seats not in use
  mutable std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::vector<slot> slots_;
  std::vector<std::uint32_t> free_;
  std::vector<std::uint32_t> ring_;  // queued slots, FIFO
  std::size_t head_ = 0, count_ = 0;
  bool stop_ = false;
  std::vector<std::thread> workers_;  // last: started after everything above exists
};

}  // namespace hybridcache::tiered
