// hybridcache/sim/bpe_char_trie.hpp
//
// The tokens the fast BPE encoder (bpe_backtracking.hpp) may choose, in a trie walked one
// UTF-8 character at a time, so that it can list the tokens starting at a position of the
// text, shortest first.
//
// The walk is a chain of dependent lookups, each a likely cache miss, so the trie is kept
// small: an edge is one 64-bit word (parent node, code point, child node: 21 bits each) in
// 64-byte buckets of 8, filled to at most 3/4 (about 11 bytes an edge; a 32k vocabulary's
// trie of 50k edges takes 0.5 MiB, within a core's L2). A node that spells a token has that
// token's id as its number, so finding the edge also gives the token; the other nodes are
// numbered from `id_limit` up. Node numbers and ids must stay below 2^21 - 1 (`fits`).
//
// Cost: building O(total token bytes); a lookup hashes once and scans one bucket (rarely
// the next); `for_each_prefix` does one lookup per character walked.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string_view>
#include <utility>
#include <vector>

#include "hybridcache/core/hash.hpp"
#include "hybridcache/sim/request.hpp"
#include "hybridcache/sim/utf8_pretokenize.hpp"

namespace hybridcache::sim {

/// A trie of tokens over code points, compact for cache. See the file comment.
class bpe_char_trie {
 public:
  /// Node numbers (and token ids) must be below this.
  static constexpr std::uint32_t max_nodes = (std::uint32_t{1} << 21) - 1;

  /// True when `tokens` tokens of `chars` characters in all, with ids below `id_limit`,
  /// certainly fit.
  [[nodiscard]] static bool fits(std::size_t id_limit, std::size_t chars) noexcept {
    return id_limit + chars + 1 < max_nodes;
  }

  /// Builds from (bytes, id) pairs: valid UTF-8, non-empty, distinct, ids below `id_limit`;
  /// `chars` bounds the characters of all of them (see `fits`).
  void build(std::vector<std::pair<std::string_view, token_id>> tokens, std::size_t id_limit, std::size_t chars) {
    // Shorter first, so a prefix that is a token is made before any node below it.
    std::sort(tokens.begin(), tokens.end(), [](const auto& a, const auto& b) {
      return a.first.size() != b.first.size() ? a.first.size() < b.first.size() : a.second < b.second;
    });
    // Twice: sized by `chars`, then again sized by the edges it held (load <= 1/2).
    insert_all(tokens, id_limit, chars);
    insert_all(tokens, id_limit, edges_);
  }

  /// Calls `found(token, end)` for every token that `text` (valid UTF-8) holds at `pos`,
  /// shortest first (`end`: one past its last byte).
  template <class Found>
  void for_each_prefix(std::string_view text, std::size_t pos, Found&& found) const {
    std::uint64_t edge = key(root_, 0) | root_ | inner;  // the root, as if reached by an edge
    for (std::size_t i = pos; i < text.size();) {
      if ((edge & inner) == 0) return;  // a leaf: nothing longer
      std::size_t l = 0;
      const std::uint32_t cp = bpe_detail::decode_valid(text, i, l);
      edge = find(static_cast<std::uint32_t>(edge & field), cp);
      if (edge == empty) return;
      i += l;
      const auto node = static_cast<std::uint32_t>(edge & field);
      if (node < root_) found(static_cast<token_id>(node), i);
    }
  }

 private:
  static constexpr std::uint32_t none = max_nodes;
  static constexpr std::uint64_t empty = ~std::uint64_t{0};  // parent field all ones: no node
  static constexpr std::uint64_t field = (std::uint64_t{1} << 21) - 1;
  static constexpr std::uint64_t inner = std::uint64_t{1} << 63;  // the child has children

  // Bits 21-41: the code point; 42-62: the parent; 0-20: the child; 63: `inner`.
  [[nodiscard]] static std::uint64_t key(std::uint32_t parent, std::uint32_t cp) noexcept {
    return ((static_cast<std::uint64_t>(parent) << 21) | cp) << 21;
  }
  static constexpr std::uint64_t key_bits = ~field & ~inner;
  // The edge (parent, cp), or `empty`.
  [[nodiscard]] std::uint64_t find(std::uint32_t parent, std::uint32_t cp) const noexcept {
    return *slot(key(parent, cp));
  }

  void insert_all(const std::vector<std::pair<std::string_view, token_id>>& tokens, std::size_t id_limit, std::size_t edges) {
    root_ = static_cast<std::uint32_t>(id_limit);
    next_node_ = root_ + 1;
    edges_ = 0;
    std::size_t slots = 16;
    while (slots < 2 * edges) slots *= 2;
    slots_.assign(slots, empty);
    mask_ = slots - 1;
    for (const auto& [bytes, id] : tokens) {
      std::uint32_t node = root_;
      std::uint64_t* into = nullptr;  // the edge into `node` (none into the root)
      for (std::size_t i = 0; i < bytes.size();) {
        std::size_t l = 0;
        const std::uint32_t cp = bpe_detail::decode_valid(bytes, i, l);
        i += l;
        if (into != nullptr) *into |= inner;
        const std::uint64_t k = key(node, cp);
        into = const_cast<std::uint64_t*>(slot(k));
        if (*into == empty) {
          *into = k | (i == bytes.size() ? static_cast<std::uint32_t>(id) : next_node_++);
          ++edges_;
        }
        node = static_cast<std::uint32_t>(*into & field);
      }
    }
  }

  // The slot holding the edge with key `k`, or the empty slot where it would go.
  [[nodiscard]] const std::uint64_t* slot(std::uint64_t k) const noexcept {
    for (std::size_t i = splitmix64_mix(k) & mask_;; i = (i + 1) & mask_) {
      const std::uint64_t& e = slots_[i];
      if ((e & key_bits) == k || e == empty) return &e;
    }
  }

  std::vector<std::uint64_t> slots_;
  std::size_t mask_ = 0;
  std::uint32_t root_ = 0;
  std::uint32_t next_node_ = 0;
  std::size_t edges_ = 0;
};

}  // namespace hybridcache::sim
