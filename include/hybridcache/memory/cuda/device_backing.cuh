// hybridcache/memory/cuda/device_backing.cuh
//
// `device_backing`: pool memory in CUDA device memory, one cudaMalloc per arena.
//
// A fixed_dual_pool or padded_unified_pool has one arena per pool, so this is exactly
// "cudaMalloc once per pool" (what SGLang and vLLM do). Under an asymmetric_pool the
// arena is the whole budget and a view maps a chunk by remembering its address (software
// remapping): capacity still moves between the pools without copying, but a pool's units
// are not one contiguous range; use vmm_backing for that.
//
// Compaction copies and unmaps are ordered against GPU work as `arena::set_ordering` says
// (remap_order.cuh; default: the whole device): a copy runs on the copy stream after the
// named streams' queued work, an unmap waits for that work and for the copies.
//
// Failed CUDA calls throw `cuda_error` naming the call and the error; destruction never
// throws. Models `memory_backing`.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "hybridcache/core/error.hpp"
#include "hybridcache/core/cuda/cuda_check.cuh"
#include "hybridcache/memory/backing.hpp"
#include "hybridcache/memory/cuda/remap_order.cuh"

namespace hybridcache::memory {

/// Device memory from one cudaMalloc per arena.
struct device_backing {
  static constexpr bool holds_memory = true;

  class arena {
   public:
    /// Allocates chunks x chunk_bytes on the current device.
    /// @throws invalid_argument on zero sizes; cuda_error("cudaMalloc failed: ...") when out of memory.
    arena(std::uint32_t chunks, std::uint64_t chunk_bytes) : chunks_(chunks), chunk_bytes_(chunk_bytes) {
      HYBRIDCACHE_EXPECTS(chunks > 0 && chunk_bytes > 0, invalid_argument,
                          "device_backing: arena needs at least one chunk of at least one byte");
      void* p = nullptr;
      HYBRIDCACHE_CUDA_TRY(cudaMalloc(&p, reserved_bytes()));
      base_ = static_cast<std::byte*>(p);
    }
    arena(const arena&) = delete;
    arena& operator=(const arena&) = delete;
    ~arena() {
      fence_.drain_nothrow();
      if (base_) (void)cudaFree(base_);
    }
    /// Which GPU work compaction copies and unmaps are ordered against (remap_order.cuh).
    void set_ordering(remap_ordering o) { fence_.set(std::move(o)); }
    [[nodiscard]] const remap_ordering& ordering() const noexcept { return fence_.ordering(); }
    [[nodiscard]] remap_fence& fence() noexcept { return fence_; }
    [[nodiscard]] std::uint32_t chunks() const noexcept { return chunks_; }
    [[nodiscard]] std::uint64_t chunk_bytes() const noexcept { return chunk_bytes_; }
    [[nodiscard]] std::uint64_t reserved_bytes() const noexcept { return std::uint64_t{chunks_} * chunk_bytes_; }
    [[nodiscard]] std::byte* chunk_pointer(std::uint32_t c) const noexcept { return base_ + c * chunk_bytes_; }

   private:
    std::uint32_t chunks_;
    std::uint64_t chunk_bytes_;
    std::byte* base_ = nullptr;
    remap_fence fence_;
  };

  class view {
   public:
    view(arena& a, std::uint32_t max_slots) : arena_(&a), base_(max_slots, nullptr) {}
    void map(std::uint32_t slot, std::uint32_t chunk) noexcept { base_[slot] = arena_->chunk_pointer(chunk); }
    /// Forgets the chunk at `slot` once the queued work and copies that may use it completed
    /// (the pool hands its memory to the other pool next). @throws cuda_error.
    void unmap(std::uint32_t slot) {
      arena_->fence().drain();
      base_[slot] = nullptr;
    }
    [[nodiscard]] std::byte* slot_base(std::uint32_t slot) const noexcept { return base_[slot]; }
    /// Device-to-device copy of one unit (compaction) on the ordering's copy stream, after the
    /// users' queued work; asynchronous (the unmap that follows a compaction waits for it).
    void copy(std::byte* dst, const std::byte* src, std::uint64_t n) { arena_->fence().copy(dst, src, n); }

   private:
    arena* arena_;
    std::vector<std::byte*> base_;
  };
};

static_assert(memory::memory_backing<device_backing>);

}  // namespace hybridcache::memory
