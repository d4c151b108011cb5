// hybridcache/attention/cuda/kv_buffer_device.cuh
//
// Device memory of a KVBuffer: `device_kv_buffer_table` (the device mirror of a
// kv_buffer_table's block table, cursors and modes, shared by all layers) and
// `device_kv_buffer_pool` (one layer's keys, values and decays). No kernels here (host code
// over the CUDA runtime): nvcc, or a host compiler with the CUDA runtime headers.
//
// `upload` goes through a pinned staging mirror: the three arrays are copied into pinned
// host memory and sent with ONE cudaMemcpyAsync, which never stalls the host the way a copy
// from pageable memory does (the driver copies pageable memory through its own staging
// buffer, synchronously). The mirror is rewritten only after the previous upload's copy
// completed (an event), so the table may change as soon as `upload` returns.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "hybridcache/core/error.hpp"
#include "hybridcache/core/cuda/cuda_check.cuh"
#include "hybridcache/attention/kv_buffer.hpp"

namespace hybridcache::attention {

/// Device mirror of a `kv_buffer_table`'s arrays (block table, cursors, modes), shared by the
/// buffers of all layers. `upload` sends them when the table changed since the last upload
/// (asynchronous on `stream`; the table may change again at once).
class device_kv_buffer_table {
 public:
  /// @throws cuda_error when an allocation or the event fails.
  explicit device_kv_buffer_table(const kv_buffer_table& t)
      : table_n_(static_cast<std::size_t>(t.config().num_slots) * static_cast<std::size_t>(t.max_blocks_per_slot())),
        slots_(static_cast<std::size_t>(t.config().num_slots)),
        device_(table_n_ + 2 * slots_) {
    void* p = nullptr;
    HYBRIDCACHE_CUDA_TRY(cudaHostAlloc(&p, bytes(), cudaHostAllocDefault));
    mirror_ = static_cast<std::int32_t*>(p);
    if (const cudaError_t st = cudaEventCreateWithFlags(&done_, cudaEventDisableTiming); st != cudaSuccess) {
      (void)cudaFreeHost(mirror_);
      throw_on_cuda_error(st, "cudaEventCreateWithFlags", __FILE__, __LINE__);
    }
  }
  device_kv_buffer_table(const device_kv_buffer_table&) = delete;
  device_kv_buffer_table& operator=(const device_kv_buffer_table&) = delete;
  ~device_kv_buffer_table() {
    if (done_ != nullptr) {
      (void)cudaEventSynchronize(done_);  // the copy may still read the mirror
      (void)cudaEventDestroy(done_);
    }
    if (mirror_ != nullptr) (void)cudaFreeHost(mirror_);
  }

  /// Sends the table's arrays if they changed since the last upload. Waits (host) only for
  /// the previous upload's copy, which is normally long done.
  /// @throws invalid_argument for a table of another shape; cuda_error.
  void upload(const kv_buffer_table& t, cudaStream_t stream = nullptr) {
    HYBRIDCACHE_EXPECTS(table_n_ == static_cast<std::size_t>(t.config().num_slots) * t.max_blocks_per_slot() &&
                            slots_ == static_cast<std::size_t>(t.config().num_slots),
                        invalid_argument, "device_kv_buffer_table: uploaded from a table of another shape");
    if (uploaded_ && version_ == t.version()) return;
    if (uploaded_) HYBRIDCACHE_CUDA_TRY(cudaEventSynchronize(done_));
    std::memcpy(mirror_, t.block_table_data(), table_n_ * sizeof(std::int32_t));
    std::memcpy(mirror_ + table_n_, t.cursor_data(), slots_ * sizeof(std::int32_t));
    std::memcpy(mirror_ + table_n_ + slots_, t.state_valid_data(), slots_ * sizeof(std::int32_t));
    HYBRIDCACHE_CUDA_TRY(cudaMemcpyAsync(device_.data(), mirror_, bytes(), cudaMemcpyHostToDevice, stream));
    HYBRIDCACHE_CUDA_TRY(cudaEventRecord(done_, stream));
    uploaded_ = true;
    version_ = t.version();
  }

  [[nodiscard]] const std::int32_t* block_table() const noexcept { return device_.data(); }
  [[nodiscard]] const std::int32_t* cursor() const noexcept { return device_.data() + table_n_; }
  [[nodiscard]] const std::int32_t* state_valid() const noexcept { return device_.data() + table_n_ + slots_; }

 private:
  [[nodiscard]] std::size_t bytes() const noexcept { return (table_n_ + 2 * slots_) * sizeof(std::int32_t); }
  std::size_t table_n_, slots_;
  device_array<std::int32_t> device_;  // [table | cursor | state_valid]
  std::int32_t* mirror_ = nullptr;     // pinned, same layout
  cudaEvent_t done_ = nullptr;         // the last upload's copy
  bool uploaded_ = false;
  std::uint64_t version_ = 0;
};

/// One layer's KVBuffer pool in device memory (keys, values, decays for every block).
template <class KeyT, class ValueT>
class device_kv_buffer_pool {
 public:
  device_kv_buffer_pool(const kv_buffer_table& t, int num_k_heads, int num_v_heads, int key_dim, int value_dim)
      : h_(num_k_heads), hv_(num_v_heads), dk_(key_dim), dv_(value_dim), block_tokens_(t.config().block_tokens),
        max_blocks_(t.max_blocks_per_slot()),
        keys_(tokens(t) * static_cast<std::size_t>(num_k_heads) * key_dim),
        values_(tokens(t) * static_cast<std::size_t>(num_v_heads) * value_dim),
        decays_(tokens(t) * static_cast<std::size_t>(num_v_heads)) {}

  /// The view the kernels take, over this pool and a mirror of its table.
  [[nodiscard]] kv_buffer_ref<KeyT, ValueT> ref(const device_kv_buffer_table& t) const noexcept {
    return {keys_.data(), values_.data(), decays_.data(), t.block_table(), t.cursor(), t.state_valid(),
            block_tokens_, max_blocks_, h_, hv_, dk_, dv_};
  }

 private:
  static std::size_t tokens(const kv_buffer_table& t) {
    return static_cast<std::size_t>(t.config().num_blocks) * static_cast<std::size_t>(t.config().block_tokens);
  }
  int h_, hv_, dk_, dv_, block_tokens_, max_blocks_;
  device_array<KeyT> keys_;
  device_array<ValueT> values_;
  device_array<float> decays_;
};

}  // namespace hybridcache::attention
