// hybridcache/memory/cuda/vmm_backing.cuh
//
// `vmm_backing`: pool memory through the CUDA virtual memory management driver API, so
// capacity moves between the KV and SSM pools by remapping physical chunks: no copy, and
// physical memory reserved once (= the budget; the AVMP reference reserves it twice).
//
//   arena  one cuMemCreate per chunk (chunk = a multiple of the allocation granularity,
//          2 MiB on current GPUs), all created up front: reserved physical memory = budget
//   view   one cuMemAddressReserve per pool of max_slots x chunk_bytes of VA (VA only);
//          map(slot, chunk) = cuMemMap + cuMemSetAccess (mappings start inaccessible),
//          unmap(slot) = cuMemUnmap of exactly that mapping (a mapping cannot be split, so
//          every chunk is mapped on its own)
//
// Because slots are contiguous VA, unit u of a pool lives at base + slot(u) x chunk_bytes +
// offset(u): `make_unit_ref` gives kernels a trivially copyable view of that formula.
// Which chunk is mapped where, and which chunk to give away, is decided by the host-side
// chunk_region shared with every other backing (tested without a GPU); this file is only
// the driver calls. Map/unmap are host driver calls: run rebalancing off the decode
// critical path (asymmetric_pool::maintain from a scheduler thread).
//
// Ordering against GPU work (remap_order.cuh): cuMemUnmap does not wait for kernels or copies
// that still use a range, so `unmap` first waits (host) for the work queued on the streams
// the caller named with `arena::set_ordering` (default: the whole device) and for every
// compaction copy; compaction copies run on the named copy stream (default: the arena's own
// non-blocking stream) after that work, and the named streams' later work waits for them.
// The reservation is aligned to the allocation granularity (a power of two; the chunk size
// need not be one: 6 MiB chunks hold 80 fp32 value heads of 128 x 128).
//
// Failed driver calls throw `cuda_error` naming the call and the CUresult name; a failed
// map leaves nothing mapped (and the pool rolls the whole migration back). Destruction
// unmaps, frees the VA and releases the handles without throwing.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "hybridcache/core/byte_count.hpp"
#include "hybridcache/core/config.hpp"
#include "hybridcache/core/error.hpp"
#include "hybridcache/core/cuda/cuda_check.cuh"
#include "hybridcache/memory/backing.hpp"
#include "hybridcache/memory/cuda/remap_order.cuh"
#include "hybridcache/memory/stores.hpp"

namespace hybridcache::memory {

namespace detail {

// The driver entry points the VMM backing uses, resolved at run time through the CUDA
// runtime (cudaGetDriverEntryPointByVersion), so that nothing links against libcuda:
// binaries that include this header still start, and skip, on machines without a driver.
struct vmm_driver {
  decltype(&::cuGetErrorName) get_error_name = nullptr;
  decltype(&::cuGetErrorString) get_error_string = nullptr;
  decltype(&::cuMemGetAllocationGranularity) get_granularity = nullptr;
  decltype(&::cuMemCreate) create = nullptr;
  decltype(&::cuMemRelease) release = nullptr;
  decltype(&::cuMemAddressReserve) address_reserve = nullptr;
  decltype(&::cuMemAddressFree) address_free = nullptr;
  decltype(&::cuMemMap) map = nullptr;
  decltype(&::cuMemUnmap) unmap = nullptr;
  decltype(&::cuMemSetAccess) set_access = nullptr;

  /// Loaded once; @throws cuda_error naming the entry point that could not be found.
  static const vmm_driver& get() {
    static const vmm_driver d = load();
    return d;
  }

 private:
  template <class F>
  static void resolve(F& fn, const char* symbol) {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
    const cudaError_t st = cudaGetDriverEntryPointByVersion(symbol, &p, CUDART_VERSION, cudaEnableDefault, &found);
#else
    const cudaError_t st = cudaGetDriverEntryPoint(symbol, &p, cudaEnableDefault, &found);
#endif
    if (st != cudaSuccess || found != cudaDriverEntryPointSuccess || p == nullptr)
      throw cuda_error(std::string("cudaGetDriverEntryPoint(") + symbol + ") failed: " +
                       (st != cudaSuccess ? cudaGetErrorName(st) : "symbol not found in the driver"));
    fn = reinterpret_cast<F>(p);
  }
  static vmm_driver load() {
    vmm_driver d;
    resolve(d.get_error_name, "cuGetErrorName");
    resolve(d.get_error_string, "cuGetErrorString");
    resolve(d.get_granularity, "cuMemGetAllocationGranularity");
    resolve(d.create, "cuMemCreate");
    resolve(d.release, "cuMemRelease");
    resolve(d.address_reserve, "cuMemAddressReserve");
    resolve(d.address_free, "cuMemAddressFree");
    resolve(d.map, "cuMemMap");
    resolve(d.unmap, "cuMemUnmap");
    resolve(d.set_access, "cuMemSetAccess");
    return d;
  }
};

}  // namespace detail

/// Throws `cuda_error` when a driver call failed, naming the call and the CUresult.
inline void throw_on_cu_error(CUresult status, const char* call, const char* file, int line) {
  if (status == CUDA_SUCCESS) return;
  const char* name = nullptr;
  const char* text = nullptr;
  const auto& drv = detail::vmm_driver::get();
  if (drv.get_error_name(status, &name) != CUDA_SUCCESS || name == nullptr) name = "CUDA_ERROR_UNKNOWN";
  if (drv.get_error_string(status, &text) != CUDA_SUCCESS || text == nullptr) text = "unknown driver error";
  throw cuda_error(std::string(call) + " failed: " + name + " (" + text + ") at " + file + ":" + std::to_string(line));
}

}  // namespace hybridcache::memory

/// Evaluates a CUDA driver call and throws hybridcache::cuda_error if it fails.
#ifndef HYBRIDCACHE_CU_TRY
#define HYBRIDCACHE_CU_TRY(call) ::hybridcache::memory::throw_on_cu_error((call), #call, __FILE__, __LINE__)
#endif

namespace hybridcache::memory {

/// The allocation granularity (MINIMUM) of pinned device memory on `device`, in bytes.
/// @throws cuda_error.
[[nodiscard]] inline byte_count vmm_granularity(int device) {
  HYBRIDCACHE_CUDA_TRY(cudaFree(nullptr));  // make sure the primary context exists
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  std::size_t g = 0;
  throw_on_cu_error(detail::vmm_driver::get().get_granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                    "cuMemGetAllocationGranularity", __FILE__, __LINE__);
  return static_cast<byte_count>(g);  // a driver size: a few MiB at most
}

/// Device memory through cuMemCreate / cuMemMap: capacity moves by remapping chunks.
struct vmm_backing {
  static constexpr bool holds_memory = true;

  class arena {
   public:
    /// Creates `chunks` physical allocations of `chunk_bytes` on the current device.
    /// @throws invalid_argument if chunk_bytes is not a multiple of the granularity;
    ///         cuda_error (e.g. "cuMemCreate ... failed: CUDA_ERROR_OUT_OF_MEMORY").
    arena(std::uint32_t chunks, std::uint64_t chunk_bytes) : chunk_bytes_(chunk_bytes) {
      HYBRIDCACHE_EXPECTS(chunks > 0 && chunk_bytes > 0, invalid_argument,
                          "vmm_backing: arena needs at least one chunk of at least one byte");
      HYBRIDCACHE_CUDA_TRY(cudaGetDevice(&device_));
      granularity_ = static_cast<std::uint64_t>(vmm_granularity(device_));
      HYBRIDCACHE_EXPECTS(chunk_bytes % granularity_ == 0, invalid_argument,
                          "vmm_backing: chunk of " + std::to_string(chunk_bytes) +
                              " B is not a multiple of the allocation granularity (" + std::to_string(granularity_) +
                              " B)");
      CUmemAllocationProp prop{};
      prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
      prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      prop.location.id = device_;
      handles_.reserve(chunks);
      try {
        for (std::uint32_t c = 0; c < chunks; ++c) {
          CUmemGenericAllocationHandle h{};
          throw_on_cu_error(detail::vmm_driver::get().create(&h, chunk_bytes, &prop, 0),
                            "cuMemCreate", __FILE__, __LINE__);
          handles_.push_back(h);
        }
      } catch (...) {
        release_all();
        throw;
      }
    }
    arena(const arena&) = delete;
    arena& operator=(const arena&) = delete;
    ~arena() {
      fence_.drain_nothrow();  // nothing may still use the memory released below
      release_all();
    }

    /// Which GPU work remaps (unmaps, compaction copies) are ordered against: the streams
    /// whose work may touch the pool's units, and the copy stream. Call before other streams
    /// use the pool (asymmetric_pool::arena()). @throws cuda_error.
    void set_ordering(remap_ordering o) { fence_.set(std::move(o)); }
    [[nodiscard]] const remap_ordering& ordering() const noexcept { return fence_.ordering(); }
    /// The fence the views order their copies and unmaps with.
    [[nodiscard]] remap_fence& fence() noexcept { return fence_; }

    [[nodiscard]] std::uint32_t chunks() const noexcept { return static_cast<std::uint32_t>(handles_.size()); }
    [[nodiscard]] std::uint64_t chunk_bytes() const noexcept { return chunk_bytes_; }
    /// Physical bytes held: exactly chunks x chunk_bytes.
    [[nodiscard]] std::uint64_t reserved_bytes() const noexcept { return handles_.size() * chunk_bytes_; }
    [[nodiscard]] CUmemGenericAllocationHandle handle(std::uint32_t c) const noexcept { return handles_[c]; }
    [[nodiscard]] int device() const noexcept { return device_; }
    [[nodiscard]] std::uint64_t granularity() const noexcept { return granularity_; }

   private:
    void release_all() noexcept {
      if (handles_.empty()) return;
      const auto& drv = detail::vmm_driver::get();
      for (auto h : handles_) (void)drv.release(h);
      handles_.clear();
    }
    std::uint64_t chunk_bytes_;
    int device_ = 0;
    std::uint64_t granularity_ = 0;
    std::vector<CUmemGenericAllocationHandle> handles_;
    remap_fence fence_;
  };

  class view {
   public:
    /// Reserves max_slots x chunk_bytes of virtual address space, aligned to the allocation
    /// granularity (cuMemAddressReserve takes 0 or a power of two, which a chunk size such as
    /// 6 MiB is not; granularity alignment is all cuMemMap needs). @throws cuda_error.
    view(arena& a, std::uint32_t max_slots)
        : arena_(&a), bytes_(std::uint64_t{max_slots} * a.chunk_bytes()), mapped_(max_slots, 0) {
      const std::uint64_t g = a.granularity();
      const std::uint64_t alignment = g != 0 && (g & (g - 1)) == 0 ? g : 0;
      throw_on_cu_error(detail::vmm_driver::get().address_reserve(&va_, bytes_, alignment, 0, 0),
                        "cuMemAddressReserve", __FILE__, __LINE__);
    }
    view(const view&) = delete;
    view& operator=(const view&) = delete;
    ~view() {
      arena_->fence().drain_nothrow();  // no queued work may touch a range once it is unmapped
      for (std::size_t s = 0; s < mapped_.size(); ++s)
        if (mapped_[s]) (void)detail::vmm_driver::get().unmap(va_ + s * arena_->chunk_bytes(), arena_->chunk_bytes());
      if (va_) (void)detail::vmm_driver::get().address_free(va_, bytes_);
    }

    /// Maps physical chunk `chunk` at `slot` and makes it read/write for the arena's device.
    /// On failure nothing stays mapped. @throws cuda_error.
    void map(std::uint32_t slot, std::uint32_t chunk) {
      const CUdeviceptr at = va_ + slot * arena_->chunk_bytes();
      throw_on_cu_error(detail::vmm_driver::get().map(at, arena_->chunk_bytes(), 0, arena_->handle(chunk), 0),
                        "cuMemMap", __FILE__, __LINE__);
      CUmemAccessDesc access{};
      access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      access.location.id = arena_->device();
      access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      const CUresult st = detail::vmm_driver::get().set_access(at, arena_->chunk_bytes(), &access, 1);
      if (st != CUDA_SUCCESS) {
        (void)detail::vmm_driver::get().unmap(at, arena_->chunk_bytes());
        throw_on_cu_error(st, "cuMemSetAccess", __FILE__, __LINE__);
      }
      mapped_[slot] = 1;
    }
    /// Unmaps the chunk at `slot` (the physical chunk stays in the arena), after the work
    /// queued on the ordering's streams and every compaction copy completed. @throws cuda_error.
    void unmap(std::uint32_t slot) {
      arena_->fence().drain();
      throw_on_cu_error(detail::vmm_driver::get().unmap(va_ + slot * arena_->chunk_bytes(), arena_->chunk_bytes()),
                        "cuMemUnmap", __FILE__, __LINE__);
      mapped_[slot] = 0;
    }
    [[nodiscard]] std::byte* slot_base(std::uint32_t slot) const noexcept {
      return reinterpret_cast<std::byte*>(static_cast<std::uintptr_t>(va_ + slot * arena_->chunk_bytes()));
    }
    /// Device-to-device copy of one unit (compaction) on the ordering's copy stream, after
    /// the users' queued work; asynchronous (the unmap that follows a compaction waits for it).
    void copy(std::byte* dst, const std::byte* src, std::uint64_t n) { arena_->fence().copy(dst, src, n); }
    /// First byte of the pool's virtual range.
    [[nodiscard]] std::byte* base() const noexcept { return slot_base(0); }

   private:
    arena* arena_;
    CUdeviceptr va_ = 0;
    std::uint64_t bytes_;
    std::vector<std::uint8_t> mapped_;
  };
};

static_assert(memory::memory_backing<vmm_backing>);
static_assert(!memory::nothrow_backing_v<vmm_backing>);

/// Trivially copyable device view of a VMM-backed store's units: pass it to kernels by value.
struct vmm_unit_ref {
  std::byte* base = nullptr;
  std::uint64_t chunk_bytes = 0;
  std::uint64_t unit_bytes = 0;
  std::uint32_t units_per_chunk = 0;

  /// Address of unit `u`: base + (u / units_per_chunk) x chunk_bytes + (u % units_per_chunk) x unit_bytes.
  HYBRIDCACHE_HD_INLINE std::byte* address(std::uint32_t u) const noexcept {
    return base + static_cast<std::uint64_t>(u / units_per_chunk) * chunk_bytes +
           static_cast<std::uint64_t>(u % units_per_chunk) * unit_bytes;
  }
};

/// The device view of `store`'s units (valid while the store lives; mappings may change
/// when capacity moves, so take it again after a rebalance if slots were added).
template <pool_kind Kind>
[[nodiscard]] vmm_unit_ref make_unit_ref(const memory::paged_store<Kind, vmm_backing>& store) noexcept {
  return {store.view().base(), store.region().chunk_bytes(), store.region().unit_bytes(),
          store.region().units_per_chunk()};
}

}  // namespace hybridcache::memory
