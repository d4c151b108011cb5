// hybridcache/sim/tokenizer/bpe_char_trie.hpp
//
// The tokens the fast BPE encoder (bpe_backtracking.hpp) may choose, in a trie walked one
// UTF-8 character at a time, so that it can list the tokens starting at a position of the
// text, shortest first.
//
// An edge is one 64-bit word: parent node, code point and child node (21 bits each) and a
// bit saying whether the child has children (so a walk stops at a leaf without a lookup).
// The root's edges below U+10000 are found by code point in a direct table (one load; CJK
// text touches its 168 KiB of ideographs); the others in an open-addressing table of such
// words, at most half full. An edge's home slot is a hash of the code points spelling its
// child (the text from the walk's start), not of its parent's number: so where a walk
// probes next depends on the text alone, and the processor loads the slots of the next
// characters while the current one is still coming from memory (the table is larger than
// the caches; a walk whose next slot waited for the previous load spent a third of the
// encoder's time stalled). The probe still compares the exact (parent, code point) key, so
// a hash collision costs a probe, never a wrong answer. A node that spells a token is
// numbered by that token's id, so finding the edge gives the token; the other nodes are
// numbered from `id_limit` up. Ids and node numbers must stay below 2^21 - 1 (`fits`).
//
// Cost: building O(total token bytes); a walk does one load (the root) or one probe per
// character, and stops at the first character no token continues with.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string_view>
#include <utility>
#include <vector>

#include "hybridcache/concepts/ids.hpp"
#include "hybridcache/core/hash.hpp"
#include "hybridcache/sim/tokenizer/utf8_pretokenize.hpp"

namespace hybridcache::sim {

/// A trie of tokens over code points. See the file comment.
class bpe_char_trie {
 public:
  /// Node numbers (and token ids) must be below this.
  static constexpr std::uint32_t max_nodes = (std::uint32_t{1} << 21) - 1;

  /// A token found by a walk, and the end of its bytes in the text.
  struct match {
    token_id token;
    std::uint32_t end;
  };

  /// True when tokens of `chars` characters in all, with ids below `id_limit`, certainly fit.
  [[nodiscard]] static bool fits(std::size_t id_limit, std::size_t chars) noexcept { return id_limit + chars + 1 < max_nodes; }

  /// Builds from (bytes, id) pairs: valid UTF-8, non-empty, distinct, ids below `id_limit`;
  /// `chars` bounds their characters in all (see `fits`).
  void build(std::vector<std::pair<std::string_view, token_id>> tokens, std::size_t id_limit, std::size_t chars) {
    // Shorter first, so a prefix that is a token is made (numbered by its id) before any
    // node below it: a stable counting sort by length (tokens of one length are never
    // prefixes of each other, so their order only fixes how inner nodes are numbered).
    {
      std::vector<std::size_t> at;
      for (const auto& t : tokens) {
        if (at.size() <= t.first.size() + 1) at.resize(t.first.size() + 2, 0);
        ++at[t.first.size() + 1];
      }
      for (std::size_t l = 1; l < at.size(); ++l) at[l] += at[l - 1];
      std::vector<std::pair<std::string_view, token_id>> sorted(tokens.size());
      for (const auto& t : tokens) sorted[at[t.first.size()]++] = t;
      tokens.swap(sorted);
    }
    // Into a table sized for half the code points of all tokens (edges are fewer: tokens
    // share prefixes), doubled and redone in the rare case that it fills over half, up to
    // the bound (every code point an edge; `chars` counts bytes, three times too many for
    // CJK). Then, if the table is larger than the edges need, they move into one sized by
    // their count (at most half full; an edge word keeps its key and child, so it moves as
    // it is, to the home of the prefix hash recorded for it).
    std::size_t code_points = 0;
    for (const auto& [bytes, id] : tokens)
      for (const char c : bytes) code_points += (static_cast<unsigned char>(c) & 0xC0u) != 0x80u ? 1 : 0;
    const std::size_t bound = std::min(chars, code_points);
    std::vector<std::pair<std::uint64_t, std::size_t>> placed;  // (prefix hash, slot) of each table edge
    placed.reserve(bound);
    for (std::size_t edges = std::max<std::size_t>(bound / 2, 1);; edges = std::min(edges * 2, bound))
      if (insert_all(tokens, id_limit, edges, edges == bound, placed)) break;
    if (slots_for(placed.size()) == slots_.size()) return;
    std::vector<std::uint64_t> all;
    all.swap(slots_);
    size_table(placed.size());
    for (const auto& [h, at] : placed) {
      std::size_t i = home(h);
      while (slots_[i] != empty) i = (i + 1) & mask_;
      slots_[i] = all[at];
    }
  }

  /// Writes to `out` the tokens that the code points `cp[pos, n)` start with, shortest
  /// first, and returns their count; returns `max + 1` (having written `max`) when there
  /// are more than `max`. A match's `end` is the index in `cp` after its last character.
  /// `found(token)` is called as each is found, before the walk goes on (the encoder
  /// prefetches what it will read about the token, so that load overlaps the walk).
  template <class Found>
  std::size_t prefixes(const std::uint32_t* cp, std::size_t pos, std::size_t n, match* out, std::size_t max, Found&& found) const noexcept {
    std::size_t count = 0, i = pos;
    std::uint64_t h = extend(seed, cp[i]);
    std::uint64_t e = cp[i] < 0x10000 ? bmp_[cp[i]] : find(root_, cp[i], h);
    while (e != empty) {
      ++i;
      const auto node = static_cast<std::uint32_t>(e & field);
      if (node < root_) {
        if (count == max) return max + 1;
        out[count++] = {static_cast<token_id>(node), static_cast<std::uint32_t>(i)};
        found(static_cast<token_id>(node));
      }
      if ((e & inner) == 0 || i >= n) break;
      h = extend(h, cp[i]);
      e = find(node, cp[i], h);
    }
    return count;
  }

 private:
  static constexpr std::uint64_t empty = ~std::uint64_t{0};  // parent field all ones: no node
  static constexpr std::uint64_t field = (std::uint64_t{1} << 21) - 1;
  static constexpr std::uint64_t inner = std::uint64_t{1} << 63;  // the child has children
  static constexpr std::uint64_t key_bits = ~field & ~inner;

  // Bits 0-20: the child; 21-41: the code point; 42-62: the parent; 63: `inner`.
  [[nodiscard]] static std::uint64_t key(std::uint32_t parent, std::uint32_t cp) noexcept {
    return ((static_cast<std::uint64_t>(parent) << 21) | cp) << 21;
  }
  // The hash of a walk's code points so far (`seed` before the first), extended by `cp`.
  static constexpr std::uint64_t seed = 0x243F6A8885A308D3ULL;
  [[nodiscard]] static std::uint64_t extend(std::uint64_t h, std::uint32_t cp) noexcept {
    return (((h << 23) | (h >> 41)) ^ cp) * splitmix64_gamma;
  }
  [[nodiscard]] std::size_t home(std::uint64_t h) const noexcept { return static_cast<std::size_t>(h >> shift_); }

  // The edge (parent, cp) whose child is spelled by code points hashing to `h`, or `empty`.
  [[nodiscard]] std::uint64_t find(std::uint32_t parent, std::uint32_t cp, std::uint64_t h) const noexcept {
    const std::uint64_t k = key(parent, cp);
    for (std::size_t i = home(h);; i = (i + 1) & mask_) {
      const std::uint64_t e = slots_[i];
      if ((e & key_bits) == k || e == empty) return e;
    }
  }

  // The index in slots_ of the word holding the edge (parent, cp) (hash `h`), made
  // (empty) when missing; SIZE_MAX for a root edge below U+10000 (in bmp_).
  std::size_t slot(std::uint32_t parent, std::uint32_t cp, std::uint64_t h) {
    if (parent == root_ && cp < 0x10000) return std::numeric_limits<std::size_t>::max();
    const std::uint64_t k = key(parent, cp);
    std::size_t i = home(h);
    while (slots_[i] != empty && (slots_[i] & key_bits) != k) i = (i + 1) & mask_;
    return i;
  }

  // Inserts every token into a table sized for `edges` edges; returns false (to be redone
  // larger) when they need more, unless `last` (the size is a bound: they fit).
  bool insert_all(const std::vector<std::pair<std::string_view, token_id>>& tokens, std::size_t id_limit, std::size_t edges, bool last,
                  std::vector<std::pair<std::uint64_t, std::size_t>>& placed) {
    placed.clear();
    root_ = static_cast<std::uint32_t>(id_limit);
    next_node_ = root_ + 1;
    size_table(edges);
    bmp_.assign(0x10000, empty);
    for (const auto& [bytes, id] : tokens) {
      std::uint32_t node = root_;
      std::uint64_t h = seed;
      std::uint64_t* into = nullptr;  // the edge into `node` (none into the root)
      for (std::size_t i = 0; i < bytes.size();) {
        std::size_t l = 0;
        const std::uint32_t cp = detail::decode_valid(bytes, i, l);
        i += l;
        h = extend(h, cp);
        if (into != nullptr) *into |= inner;
        const std::size_t at = slot(node, cp, h);
        std::uint64_t& e = at == std::numeric_limits<std::size_t>::max() ? bmp_[cp] : slots_[at];
        if (e == empty) {
          e = key(node, cp) | (i == bytes.size() ? static_cast<std::uint32_t>(id) : next_node_++);
          if (at != std::numeric_limits<std::size_t>::max()) {
            placed.emplace_back(h, at);
            if (!last && 2 * placed.size() > slots_.size()) return false;
          }
        }
        into = &e;
        node = static_cast<std::uint32_t>(e & field);
      }
    }
    return true;
  }

  [[nodiscard]] static std::size_t slots_for(std::size_t edges) noexcept {
    std::size_t slots = 16;
    while (slots < 2 * edges) slots *= 2;
    return slots;
  }
  void size_table(std::size_t edges) {
    const std::size_t slots = slots_for(edges);
    slots_.assign(slots, empty);
    mask_ = slots - 1;
    shift_ = 64;
    for (std::size_t s = slots; s > 1; s /= 2) --shift_;
  }

  std::vector<std::uint64_t> bmp_;    // the root's edges below U+10000, by code point
  std::vector<std::uint64_t> slots_;  // the other edges
  std::size_t mask_ = 0;
  unsigned shift_ = 64;
  std::uint32_t root_ = 0;
  std::uint32_t next_node_ = 0;
};

}  // namespace hybridcache::sim
