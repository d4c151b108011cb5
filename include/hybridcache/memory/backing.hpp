// hybridcache/memory/backing.hpp
//
// Backings: where the bytes of a pool's units live. A backing is a policy of two parts:
//
//   arena  the physical memory, as `chunks` equal chunks of `chunk_bytes`, shared by the
//          pools built on it (the budget);
//   view   one pool's address range: `map(slot, chunk)` makes a physical chunk appear at
//          a slot, `unmap(slot)` takes it away, `slot_base(slot)` is where its bytes are,
//          `copy` moves one unit's bytes (compaction).
//
// Host-only backings here; the CUDA ones (device memory, VMM) are in
// hybridcache/cuda/memory/. Every backing models `memory_backing`:
//
//   counting_backing  no memory at all: addresses are null, copies do nothing. For
//                     simulation and allocator replay; the chunk logic is the same as on
//                     the GPU, so it is the "simulated VMM".
//   host_backing      one aligned host allocation for the whole budget; a view maps a
//                     chunk by remembering its address (software remapping: capacity
//                     still moves without copying).
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <utility>
#include <string>
#include <vector>

#include "hybridcache/core/error.hpp"

namespace hybridcache::memory {

/// A backing: arena (physical chunks) + view (one pool's mapped address range).
template <class B>
concept memory_backing =
    requires(typename B::arena& a, const typename B::arena& ca, typename B::view& v, const typename B::view& cv,
             std::uint32_t slot, std::uint32_t chunk, std::byte* p, std::uint64_t n) {
      requires std::constructible_from<typename B::arena, std::uint32_t, std::uint64_t>;  // (chunks, chunk_bytes)
      requires std::constructible_from<typename B::view, typename B::arena&, std::uint32_t>;  // (arena, max_slots)
      { ca.chunks() } -> std::convertible_to<std::uint32_t>;
      { ca.chunk_bytes() } -> std::convertible_to<std::uint64_t>;
      { ca.reserved_bytes() } -> std::convertible_to<std::uint64_t>;
      { v.map(slot, chunk) };
      { v.unmap(slot) };
      { cv.slot_base(slot) } noexcept -> std::same_as<std::byte*>;
      { v.copy(p, p, n) };
      { B::holds_memory } -> std::convertible_to<bool>;
    };

/// True when a backing's map/unmap/copy never throw (host backings); then the pools'
/// allocate, free and rebalance are noexcept too.
template <class B>
inline constexpr bool nothrow_backing_v =
    noexcept(std::declval<typename B::view&>().map(0u, 0u)) &&
    noexcept(std::declval<typename B::view&>().unmap(0u)) &&
    noexcept(std::declval<typename B::view&>().copy(nullptr, nullptr, 0u));

/// No memory: counts units only. Addresses are null.
struct counting_backing {
  static constexpr bool holds_memory = false;

  class arena {
   public:
    arena(std::uint32_t chunks, std::uint64_t chunk_bytes) : chunks_(chunks), chunk_bytes_(chunk_bytes) {}
    [[nodiscard]] std::uint32_t chunks() const noexcept { return chunks_; }
    [[nodiscard]] std::uint64_t chunk_bytes() const noexcept { return chunk_bytes_; }
    /// What the same layout would reserve on a device.
    [[nodiscard]] std::uint64_t reserved_bytes() const noexcept { return std::uint64_t{chunks_} * chunk_bytes_; }

   private:
    std::uint32_t chunks_;
    std::uint64_t chunk_bytes_;
  };

  class view {
   public:
    view(arena&, std::uint32_t) noexcept {}
    void map(std::uint32_t, std::uint32_t) noexcept {}
    void unmap(std::uint32_t) noexcept {}
    [[nodiscard]] std::byte* slot_base(std::uint32_t) const noexcept { return nullptr; }
    void copy(std::byte*, const std::byte*, std::uint64_t) noexcept {}
  };
};

/// Host memory: one allocation of chunks x chunk_bytes, 256 B aligned.
struct host_backing {
  static constexpr bool holds_memory = true;
  static constexpr std::size_t alignment = 256;

  class arena {
   public:
    /// @throws invalid_argument on zero sizes; std::bad_alloc if the host has no room.
    arena(std::uint32_t chunks, std::uint64_t chunk_bytes) : chunks_(chunks), chunk_bytes_(chunk_bytes) {
      HYBRIDCACHE_EXPECTS(chunks > 0 && chunk_bytes > 0, invalid_argument,
                          "host_backing: arena needs at least one chunk of at least one byte");
      base_.reset(static_cast<std::byte*>(::operator new(reserved_bytes(), std::align_val_t{alignment})));
    }
    [[nodiscard]] std::uint32_t chunks() const noexcept { return chunks_; }
    [[nodiscard]] std::uint64_t chunk_bytes() const noexcept { return chunk_bytes_; }
    [[nodiscard]] std::uint64_t reserved_bytes() const noexcept { return std::uint64_t{chunks_} * chunk_bytes_; }
    [[nodiscard]] std::byte* chunk_pointer(std::uint32_t c) const noexcept { return base_.get() + c * chunk_bytes_; }

   private:
    struct aligned_delete {
      void operator()(std::byte* p) const noexcept { ::operator delete(p, std::align_val_t{alignment}); }
    };
    std::uint32_t chunks_;
    std::uint64_t chunk_bytes_;
    std::unique_ptr<std::byte, aligned_delete> base_;
  };

  class view {
   public:
    view(arena& a, std::uint32_t max_slots) : arena_(&a), base_(max_slots, nullptr) {}
    void map(std::uint32_t slot, std::uint32_t chunk) noexcept { base_[slot] = arena_->chunk_pointer(chunk); }
    void unmap(std::uint32_t slot) noexcept { base_[slot] = nullptr; }
    [[nodiscard]] std::byte* slot_base(std::uint32_t slot) const noexcept { return base_[slot]; }
    void copy(std::byte* dst, const std::byte* src, std::uint64_t n) noexcept { std::memcpy(dst, src, n); }

   private:
    arena* arena_;
    std::vector<std::byte*> base_;
  };
};

static_assert(memory_backing<counting_backing>);
static_assert(memory_backing<host_backing>);
static_assert(nothrow_backing_v<counting_backing> && nothrow_backing_v<host_backing>);

}  // namespace hybridcache::memory
