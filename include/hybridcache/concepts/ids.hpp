// hybridcache/concepts/ids.hpp
//
// The id types the seams speak in, defined once:
//   token_id          one token of a sequence (every index, trace reader and replay uses it)
//   cache_salt        a tenant's cache namespace (vLLM's cache_salt); make_cache_salt(string)
//   node_id           a slot of the prefix cache's radix tree (32 bits: the tree is dense)
//   no_node           its "no node" sentinel
//   time_point        a tick of the prefix cache's logical clock
//   entry_id          a row of the tiered store's cache table, chosen by the caller (a tree
//                     node's store id, a block hash): 64 bits, and a strong type (a scoped
//                     enum) so that it cannot be mixed up with node_id or any integer: the
//                     two index different tables
//   make_entry_id / to_underlying / to_string / no_entry  its conversions and the
//                     "empty handle" value
// All in namespace hybridcache: the vocabulary every part shares.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

namespace hybridcache {

/// A token id. Traces store ids < 2^31; 32 bits halve the memory of cached edges.
using token_id = std::int32_t;

/// A tenant's cache namespace (vLLM's `cache_salt`). Requests with different salts never
/// share a node, a page or a lower-tier entry, so one tenant cannot learn another's prompts
/// from hits or TTFT; no salt (`std::nullopt`, the default) is the shared namespace. Any
/// 64-bit value, 0 included, is a namespace of its own; `make_cache_salt` derives one from a
/// string (a 64-bit hash: two different strings share a namespace with probability 2^-64;
/// pass your own distinct 64-bit ids where that is not enough).
using cache_salt = std::optional<std::uint64_t>;

/// A salt from a tenant's string id (FNV-1a 64 over the bytes, then splitmix64's finaliser).
[[nodiscard]] constexpr cache_salt make_cache_salt(std::string_view tenant) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const char c : tenant) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

/// Index of a node slot in the radix tree. Slots are reused after a node is freed.
using node_id = std::uint32_t;

/// "No node" sentinel (the root is node 0 and is never a victim or a match result).
inline constexpr node_id no_node = std::numeric_limits<node_id>::max();

/// A time point of the cache's logical clock.
using time_point = std::uint64_t;

/// Identifier of a cache-table entry (a radix-tree node's store id, a block hash, ...).
/// Chosen by the caller.
///
/// A scoped enum over 64 bits: it never converts implicitly from or to an integer, so a
/// `node_id`, a token count or a byte count cannot be passed where an entry id is
/// expected (nor the other way round). It compares with `==`, `<` and `<=>`, orders a
/// `std::set`/`std::map`, and keys an `std::unordered_map` through `std::hash<entry_id>`.
/// Code that computes ids (a counter, a hash of tokens) keeps a `std::uint64_t` and crosses
/// the boundary with `make_entry_id` / `to_underlying`.
enum class entry_id : std::uint64_t {};

/// The entry id whose value is `v`.
[[nodiscard]] constexpr entry_id make_entry_id(std::uint64_t v) noexcept { return static_cast<entry_id>(v); }

/// The value of `id` (for arithmetic on ids, hashing, printing).
[[nodiscard]] constexpr std::uint64_t to_underlying(entry_id id) noexcept { return static_cast<std::uint64_t>(id); }

/// `entry_id{0}`: the "empty handle" of `stores::tiered_state_store` (a KV extent or a
/// checkpoint that holds no bytes has no table row). The tiered store itself accepts any
/// value, 0 included, as a caller-chosen id.
inline constexpr entry_id no_entry{0};

/// The id's value in decimal, for messages (`std::to_string` of the value).
[[nodiscard]] inline std::string to_string(entry_id id) { return std::to_string(to_underlying(id)); }

}  // namespace hybridcache
