// hybridcache/stores/tiered_offloader.hpp
//
// `tiered_offloader<Cache>`: the offload engine of the one multi-tier cache. A background
// thread that, whenever it is notified (a request finished) or every `poll` interval,
// takes the cache's lock (`prefix_cache::with_store`) and lets the `tiered_state_store`
// complete the copies that landed (`poll`: write-backs free their HBM pages, loads become
// readable) and run its watermark cleaner (`offload`: above the high watermark, the
// coldest dirty entries are copied down so that eviction drops them without a copy, down
// to the low watermark: CaR's asynchronous offload). The copies themselves run on the
// store's copy engine (its own threads or CUDA streams), never under the cache's lock.
//
//   tiered_offloader off(cache);
//   off.start();                    // and off.notify() after each finish; off.stop() at the end
//
// Costs: a pass is the store's poll (O(copies in flight)) and offload (O(k log n) for the k
// coldest entries it visits), under the cache's lock. Link hybridcache::threads.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>

#include "hybridcache/tiered/detail/background_pass.hpp"

namespace hybridcache::stores {

/// Counters of a `tiered_offloader`.
struct offloader_stats {
  std::int64_t passes = 0;
  std::int64_t completed = 0;      ///< copies completed by its polls
  std::int64_t cleaned_bytes = 0;  ///< bytes whose clean copies its passes started
};

/// `start(poll)` runs `run_once` in a background thread when notified (`notify()`, cheap:
/// call it after each finish) or every `poll`; `stop()` joins it (idempotent). Copies in
/// flight keep running on the store's engine.
template <class Cache>
class tiered_offloader : public tiered::detail::background_passes<tiered_offloader<Cache>> {
 public:
  explicit tiered_offloader(Cache& cache) : cache_(cache) {}
  ~tiered_offloader() { this->stop(); }
  tiered_offloader(const tiered_offloader&) = delete;
  tiered_offloader& operator=(const tiered_offloader&) = delete;

  /// One pass, on the calling thread.
  void run_once() {
    cache_.with_store([this](auto& store) {
      const std::int64_t done = store.poll();
      const std::int64_t cleaned = store.offload();
      std::lock_guard lock(mu_);
      stats_.passes += 1;
      stats_.completed += done;
      stats_.cleaned_bytes += cleaned;
    });
  }

  [[nodiscard]] offloader_stats stats() const {
    std::lock_guard lock(mu_);
    return stats_;
  }

 private:
  Cache& cache_;
  mutable std::mutex mu_;
  offloader_stats stats_;
};

}  // namespace hybridcache::stores
