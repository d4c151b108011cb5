// hybridcache/concepts/storage_backend.hpp
//
// `storage_backend`: a tier that is not byte-addressable (a file system, a Redis server):
// the tiered store cannot copy pages into it, it hands it whole values by content key and
// gets completion tickets back. Models: disk_backend (tiered/disk_backend.hpp),
// redis_backend (tiered/redis/redis_backend.hpp, opt-in target hybridcache::redis), and the
// reference model of the tests (tests/support/memory_storage_backend.hpp). The typed
// conformance suite is tests/conformance/storage_backend_laws.hpp.
//
// The vocabulary:
//   storage_key    what a value is: model identity, the content-key chain of the token prefix
//                  in the request's namespace (core/hash.hpp content_key), the
//                  prefix length and what the value holds (KV or a recurrent checkpoint).
//                  Two nodes serving the same model compute the same key for the same
//                  tokens; two models or two tenants never do.
//   value_meta     what the writer says about the bytes: the first token a KV value covers
//                  and the layer layout; stored in the value's header, returned by `get`.
//   io_ticket      a submitted operation; waited on with poll / wait / wait_for.
//   io_result      how it ended (io_status), bytes moved, and for `get` the value's meta.
//
// The contract every model keeps (checked by the conformance suite):
//   - submit calls (`put`, `get`, `exists`, `remove`) never block on I/O: they validate the
//     call (`errc::invalid_argument`, nothing changed) and queue it (`errc::busy` when the
//     bounded queue is full, nothing changed), or answer at once from an in-memory index;
//   - the caller's spans (the bytes of a put, the buffer of a get, the keys and flags of an
//     exists) must stay valid until the ticket is waited on;
//   - every ticket is consumed exactly once by `wait` or by a `wait_for` that returns a
//     final status; using it again is `errc::stale_handle` (generation counters);
//   - a value whose header or checksum does not verify, whose key is not the one asked
//     for, or that is shorter than its header says is a miss (`io_status::corrupt`, never
//     `ok`), counted, and removed; the bytes written into the `get` buffer are then garbage;
//   - a backend that cannot reach its storage (server gone) answers `unavailable`, counted,
//     never an exception on the request path;
//   - capacity is the backend's own: it evicts by its scorer to stay within
//     `capacity_bytes()`, counting the bytes it wrote (header included).
#pragma once

#include <array>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "hybridcache/core/enum_names.hpp"
#include "hybridcache/core/expected.hpp"

namespace hybridcache {

/// What a stored value holds.
enum class value_kind : std::uint8_t {
  kv = 1,          ///< attention KV of the tokens [meta.span_begin, key.tokens)
  checkpoint = 2,  ///< recurrent (SSM + conv) state after token key.tokens
};

/// How a value's bytes are ordered across layers.
enum class layer_order : std::uint8_t {
  unspecified = 0,  ///< one opaque block
  token_major = 1,  ///< all layers of token i before token i+1
  layer_major = 2,  ///< all tokens of layer l before layer l+1 (per-layer loading)
};

/// The layer layout recorded in a value's header.
struct value_layout {
  layer_order order = layer_order::unspecified;
  std::uint32_t layers = 0;  ///< layers the bytes span (0 = not stated)
  friend constexpr bool operator==(const value_layout&, const value_layout&) = default;
};

/// Content key of a stored value. See the file comment.
struct storage_key {
  std::uint64_t model = 0;   ///< model identity (tiered/storage_format.hpp `model_identity`)
  std::uint64_t prefix = 0;  ///< content-key chain after `tokens` tokens, in the request's namespace
  std::int64_t tokens = 0;   ///< prefix length the key names (>= 0)
  value_kind kind = value_kind::kv;
  friend constexpr bool operator==(const storage_key&, const storage_key&) = default;
};

/// What the writer says about a value besides its bytes; `get` returns it.
struct value_meta {
  std::int64_t span_begin = 0;  ///< first token the value covers (a checkpoint: key.tokens)
  value_layout layout{};
  friend constexpr bool operator==(const value_meta&, const value_meta&) = default;
};

/// A submitted operation. `generation == 0` is the null ticket (never issued).
struct io_ticket {
  std::uint32_t slot = 0;
  std::uint32_t generation = 0;
  friend constexpr bool operator==(io_ticket, io_ticket) = default;
};

/// How an operation ended (or that it has not).
enum class io_status : std::uint8_t {
  pending,      ///< not finished (`wait_for` timed out; the ticket stays live)
  ok,           ///< done: stored / found and verified / answered / removed
  not_found,    ///< get, remove: no value under the key (a miss)
  corrupt,      ///< get: the value failed its check (a miss; counted and removed)
  unavailable,  ///< the storage could not be reached or timed out (a miss; counted)
  no_space,     ///< put: the storage is full even after eviction (disk full); nothing stored
  too_large,    ///< put: larger than the tier; get: larger than the buffer (nothing read)
};

[[nodiscard]] constexpr std::string_view to_string(io_status s) noexcept {
  constexpr std::array<std::string_view, 7> names{"pending", "ok", "not_found", "corrupt", "unavailable", "no_space",
    "too_large"};
  static_assert(names_every_enumerator(names, io_status::too_large));
  return enum_name(s, names);
}

/// The outcome of one operation.
struct io_result {
  io_status status = io_status::pending;
  /// put: payload bytes stored; get: payload bytes written into the buffer (the value's
  /// length); exists: keys found; remove: 1 when a value was removed.
  std::int64_t bytes = 0;
  value_meta meta{};  ///< get (status ok): the value's meta
};

/// Counters of a backend since construction. Fields a backend has no use for stay 0.
struct backend_counters {
  std::int64_t puts = 0, put_bytes = 0;          ///< puts that stored (payload bytes)
  std::int64_t put_failures = 0;                 ///< puts that ended no_space / unavailable / too_large
  std::int64_t gets = 0, hits = 0, hit_bytes = 0;
  std::int64_t misses = 0;                       ///< gets that ended not_found
  std::int64_t corrupt = 0;                      ///< values that failed their check (each a miss)
  std::int64_t unavailable = 0;                  ///< operations that ended unavailable (each a miss)
  std::int64_t exists_calls = 0, exists_keys = 0, exists_found = 0;
  std::int64_t removes = 0;
  std::int64_t evictions = 0, evicted_bytes = 0; ///< values the backend's scorer evicted
  std::int64_t no_space = 0;                     ///< times the storage reported full (ENOSPC)
  std::int64_t rejected_busy = 0;                ///< submissions refused: queue full
  std::int64_t round_trips = 0;                  ///< network round trips (Redis pipelines flushed)
  std::int64_t reconnects = 0;                   ///< connections re-established after a failure
  std::int64_t redirects = 0;                    ///< commands resent after a cluster MOVED / ASK
  std::int64_t recovered = 0;                    ///< values found again at start-up (disk restart)
  std::int64_t dropped_at_recovery = 0;          ///< torn / unreadable files removed at start-up
};

/// A tier that stores whole values by content key, asynchronously. See the file comment.
template <class B>
concept storage_backend =
    requires(B& b, const B& cb, const storage_key& key, const value_meta& meta, std::span<const std::byte> src,
             std::span<std::byte> dst, std::span<const storage_key> keys, std::span<std::uint8_t> found,
             io_ticket t, std::chrono::nanoseconds timeout) {
      { b.put(key, meta, src) } -> std::same_as<expected<io_ticket>>;
      { b.get(key, dst) } -> std::same_as<expected<io_ticket>>;
      { b.exists(keys, found) } -> std::same_as<expected<io_ticket>>;
      { b.remove(key) } -> std::same_as<expected<io_ticket>>;
      { cb.poll(t) } -> std::same_as<expected<bool>>;
      { b.wait(t) } -> std::same_as<expected<io_result>>;
      { b.wait_for(t, timeout) } -> std::same_as<expected<io_result>>;
      { cb.counters() } -> std::same_as<backend_counters>;
      { cb.capacity_bytes() } -> std::same_as<std::int64_t>;
      { cb.used_bytes() } -> std::same_as<std::int64_t>;
    };

}  // namespace hybridcache
