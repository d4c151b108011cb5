// hybridcache/tiered/storage_tier_io.hpp
//
// `storage_tier_io`: the calls of one storage tier (a `storage_backend`: disk_backend.hpp,
// redis/redis_backend.hpp, or your own) with the backend's type erased, so that the code
// that moves a tier's bytes (a copy engine, the harness's real-bytes replay) neither knows
// the backend's type nor links its library: a Redis tier is made where hiredis is linked
// and handed over as a `storage_tier_io`. `storage_io_of(backend)` makes one.
//
// It forwards put / get / wait / remove one to one, with the backend's semantics
// (concepts/storage_backend.hpp): asynchronous tickets, whole values by key, the backend's
// own CRC check on get. The backend must outlive every copy of the `storage_tier_io`.
//
// Costs: one std::function call per operation (an indirect call, no allocation: each
// function holds one reference); making one allocates nothing beyond the four functions.
// Thread safety: that of the backend.
#pragma once

#include <cstddef>
#include <functional>
#include <span>

#include "hybridcache/concepts/storage_backend.hpp"
#include "hybridcache/core/expected.hpp"

namespace hybridcache::tiered {

/// The calls of one storage tier, type-erased (see the file comment). A default-constructed
/// one is empty (every function null).
struct storage_tier_io {
  std::function<expected<io_ticket>(const storage_key&, const value_meta&, std::span<const std::byte>)> put;
  std::function<expected<io_ticket>(const storage_key&, std::span<std::byte>)> get;
  std::function<expected<io_result>(io_ticket)> wait;
  std::function<expected<io_ticket>(const storage_key&)> remove;

  /// True when every call is set.
  [[nodiscard]] bool complete() const noexcept { return put && get && wait && remove; }
};

/// The calls of `backend`, which must outlive them.
template <storage_backend Backend>
[[nodiscard]] storage_tier_io storage_io_of(Backend& backend) {
  return {[&backend](const storage_key& k, const value_meta& m, std::span<const std::byte> b) {
            return backend.put(k, m, b);
          },
          [&backend](const storage_key& k, std::span<std::byte> into) { return backend.get(k, into); },
          [&backend](io_ticket t) { return backend.wait(t); },
          [&backend](const storage_key& k) { return backend.remove(k); }};
}

}  // namespace hybridcache::tiered
