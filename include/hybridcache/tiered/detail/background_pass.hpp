// include/hybridcache/tiered/detail/background_pass.hpp
//
// The thread behind `offload_engine` and `tiered_offloader`: runs a pass when notified, or
// every `poll` otherwise, off the request path. start/stop are idempotent; stop joins (the
// pass in progress finishes first). The pass runs without this object's lock held, so it
// may take its owner's locks. Costs: notify O(1) (one lock, one wake-up).
// `background_passes<Owner>` gives an owner whose pass is `run_once()` the public
// start/notify/stop of both engines.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace hybridcache::tiered::detail {

class background_pass {
 public:
  background_pass() = default;
  background_pass(const background_pass&) = delete;
  background_pass& operator=(const background_pass&) = delete;
  ~background_pass() { stop(); }

  /// Starts the thread running `pass` (a no-op while it runs).
  void start(std::chrono::microseconds poll, std::function<void()> pass) {
    std::lock_guard lock(mu_);
    if (thread_.joinable()) return;
    stop_ = false;
    thread_ = std::thread([this, poll, pass = std::move(pass)] {
      std::unique_lock l(mu_);
      while (!stop_) {
        cv_.wait_for(l, poll, [&] { return stop_ || pending_; });
        if (stop_) break;
        pending_ = false;
        l.unlock();
        pass();
        l.lock();
      }
    });
  }
  /// Asks for a pass now.
  void notify() {
    {
      std::lock_guard lock(mu_);
      pending_ = true;
    }
    cv_.notify_one();
  }
  /// Stops and joins the thread.
  void stop() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false, pending_ = false;
  std::thread thread_;
};

/// Base of an owner whose pass is its public `run_once()`: its start/notify/stop. The
/// owner's destructor must call `stop()` (the thread must be joined while the members its
/// pass uses are alive; a base is destroyed after them).
template <class Owner>
class background_passes {
 public:
  /// Starts the background thread (idempotent): a pass when notified, or every `poll`.
  void start(std::chrono::microseconds poll = std::chrono::milliseconds(1)) {
    worker_.start(poll, [this] { (void)static_cast<Owner*>(this)->run_once(); });
  }
  /// Wakes the thread for a pass (cheap: call it after the work that may need one).
  void notify() { worker_.notify(); }
  /// Stops and joins the thread (idempotent); the pass in progress finishes first. Copies
  /// it started keep running on their engine.
  void stop() { worker_.stop(); }

 protected:
  background_passes() = default;
  ~background_passes() = default;

 private:
  background_pass worker_;
};

}  // namespace hybridcache::tiered::detail
