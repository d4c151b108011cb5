// hybridcache/concepts/ids.hpp
//
// The id types the seams speak in, defined once:
//   token_id          one token of a sequence (every index, trace reader and replay uses it)
//   prefix::node_id   a slot of the prefix cache's radix tree (32 bits: the tree is dense)
//   prefix::no_node   its "no node" sentinel
//   prefix::time_point a tick of the prefix cache's logical clock
//   tiered::entry_id  a row of the tiered store's cache table, chosen by the caller (a tree
//                     node's store id, a block hash): 64 bits, and a different name from
//                     node_id because the two index different tables
#pragma once

#include <cstdint>
#include <limits>

namespace hybridcache {

/// A token id. Traces store ids < 2^31; 32 bits halve the memory of cached edges.
using token_id = std::int32_t;

}  // namespace hybridcache

namespace hybridcache::prefix {

using hybridcache::token_id;

/// Index of a node slot in the radix tree. Slots are reused after a node is freed.
using node_id = std::uint32_t;

/// "No node" sentinel (the root is node 0 and is never a victim or a match result).
inline constexpr node_id no_node = std::numeric_limits<node_id>::max();

/// A time point of the cache's logical clock.
using time_point = std::uint64_t;

}  // namespace hybridcache::prefix

namespace hybridcache::tiered {

/// Identifier of a cache-table entry (a radix-tree node's store id, a block hash, ...).
/// Chosen by the caller.
using entry_id = std::uint64_t;

}  // namespace hybridcache::tiered
