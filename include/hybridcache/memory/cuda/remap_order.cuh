// hybridcache/memory/cuda/remap_order.cuh
//
// Ordering of a pool's remaps (migration, compaction) against the GPU work that uses its
// units. cuMemUnmap does not wait for device work, and a copy on the legacy stream is not
// ordered against non-blocking streams, so a remap must be told which work may still touch
// the units:
//
//   remap_ordering   what the caller names: the streams whose queued work may read or write
//                    the pool's units (`users`), and the stream compaction copies run on
//                    (`copy_stream`; null: the pool's own non-blocking stream). No users named:
//                    every stream of the device (the backing synchronises the device, as
//                    PyTorch's expandable segments do before unmapping).
//   remap_fence      what the backings do with it: a compaction copy runs on the copy stream
//                    after everything queued on the users so far (an event per user, or a
//                    device synchronisation), and the users' later work waits for the copy (an
//                    event); before a chunk is unmapped the host waits for the users' queued
//                    work and for every copy (`drain`). Requirement on the caller: work that
//                    touches a unit is queued on a named user stream, and a remap does not run
//                    concurrently with the enqueueing of such work (asymmetric_pool has one
//                    owner thread).
//
// Costs: a copy = one event record per user + one stream wait per user; `drain` = one event
// record per user + host waits. Failures throw cuda_error; `drain_nothrow` (destructors) does not.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>
#include <vector>

#include "hybridcache/core/error.hpp"
#include "hybridcache/core/cuda/cuda_check.cuh"

namespace hybridcache::memory {

/// What a pool's remaps are ordered against (see the header comment).
struct remap_ordering {
  cudaStream_t copy_stream = nullptr;  ///< compaction copies; nullptr: the pool's own non-blocking stream
  std::vector<cudaStream_t> users;     ///< streams whose work may touch units; empty: the whole device
};

/// Orders a backing's copies and unmaps after the users' work (see the header comment).
class remap_fence {
 public:
  remap_fence() = default;
  remap_fence(const remap_fence&) = delete;
  remap_fence& operator=(const remap_fence&) = delete;
  ~remap_fence() { reset(); }

  /// Replaces the ordering (after draining the old one). @throws cuda_error.
  void set(remap_ordering o) {
    drain();
    reset();
    order_ = std::move(o);
  }
  [[nodiscard]] const remap_ordering& ordering() const noexcept { return order_; }

  /// Copies n bytes device to device on the copy stream, after the users' queued work; the
  /// users' later work waits for it. Asynchronous. @throws cuda_error.
  void copy(void* dst, const void* src, std::size_t n) {
    const cudaStream_t s = copy_stream();
    after_users(s);
    HYBRIDCACHE_CUDA_TRY(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, s));
    HYBRIDCACHE_CUDA_TRY(cudaEventRecord(copied_event(), s));
    for (cudaStream_t u : order_.users) HYBRIDCACHE_CUDA_TRY(cudaStreamWaitEvent(u, copied_, 0));
    pending_copy_ = true;
  }

  /// Blocks until the users' work queued so far and every copy completed: what must hold
  /// before an unmap or a release. @throws cuda_error.
  void drain() {
    if (order_.users.empty()) {
      HYBRIDCACHE_CUDA_TRY(cudaDeviceSynchronize());
    } else {
      grow_user_events();
      for (std::size_t i = 0; i < order_.users.size(); ++i)
        HYBRIDCACHE_CUDA_TRY(cudaEventRecord(user_events_[i], order_.users[i]));
      for (std::size_t i = 0; i < order_.users.size(); ++i) HYBRIDCACHE_CUDA_TRY(cudaEventSynchronize(user_events_[i]));
      if (pending_copy_) HYBRIDCACHE_CUDA_TRY(cudaEventSynchronize(copied_));
    }
    pending_copy_ = false;
  }
  /// `drain` for destructors: errors are ignored (the memory is released anyway).
  void drain_nothrow() noexcept {
    try {
      drain();
    } catch (...) {
    }
  }

 private:
  cudaStream_t copy_stream() {
    if (order_.copy_stream != nullptr) return order_.copy_stream;
    if (own_ == nullptr) HYBRIDCACHE_CUDA_TRY(cudaStreamCreateWithFlags(&own_, cudaStreamNonBlocking));
    return own_;
  }
  cudaEvent_t copied_event() {
    if (copied_ == nullptr) HYBRIDCACHE_CUDA_TRY(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming));
    return copied_;
  }
  void grow_user_events() {
    while (user_events_.size() < order_.users.size()) {
      cudaEvent_t e = nullptr;
      HYBRIDCACHE_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      user_events_.push_back(e);
    }
  }
  // The copy stream waits for what the users queued so far (or for the whole device).
  void after_users(cudaStream_t s) {
    if (order_.users.empty()) {
      HYBRIDCACHE_CUDA_TRY(cudaDeviceSynchronize());
      return;
    }
    grow_user_events();
    for (std::size_t i = 0; i < order_.users.size(); ++i) {
      if (order_.users[i] == s) continue;  // same stream: already ordered
      HYBRIDCACHE_CUDA_TRY(cudaEventRecord(user_events_[i], order_.users[i]));
      HYBRIDCACHE_CUDA_TRY(cudaStreamWaitEvent(s, user_events_[i], 0));
    }
  }
  void reset() noexcept {
    if (own_ != nullptr) {
      (void)cudaStreamSynchronize(own_);
      (void)cudaStreamDestroy(own_);
      own_ = nullptr;
    }
    if (copied_ != nullptr) {
      (void)cudaEventSynchronize(copied_);
      (void)cudaEventDestroy(copied_);
      copied_ = nullptr;
    }
    for (cudaEvent_t e : user_events_) (void)cudaEventDestroy(e);
    user_events_.clear();
    pending_copy_ = false;
  }

  remap_ordering order_;
  cudaStream_t own_ = nullptr;
  cudaEvent_t copied_ = nullptr;
  std::vector<cudaEvent_t> user_events_;
  bool pending_copy_ = false;
};

}  // namespace hybridcache::memory
