// hybridcache/sim/bpe_backtracking.hpp
//
// A fast encoder for one pre-token that returns exactly what merging in the package's order
// (bpe_merges.hpp) returns, without replaying the merges: it walks the text left to right,
// takes the longest vocabulary token that may follow the previous one, and backs off to a
// shorter one when none fits further on.
//
// Why that is exact. Call the merge list well-formed when every merged token is made by
// exactly one merge and each merge's two inputs are byte tokens or made by a lower-ranked
// merge (what a trainer writes; checked on load, else this encoder stays off). Then merges
// are applied in increasing rank order, and three facts follow (by induction over the
// merges):
//   1. A token t of the output was built inside its own bytes exactly as encoding bytes(t)
//      alone builds it, so encode(bytes(t)) = [t], and its history is its merge tree.
//   2. encode(u ++ v) = encode(u) ++ encode(v) iff the last token a of the first and the
//      first token b of the second "fit": encode(bytes(a) ++ bytes(b)) = [a, b].
//   3. Hence the output is the only sequence of tokens with encode(bytes(t)) = [t] for each
//      token and every neighbouring pair fitting; and while the tokens taken so far fit
//      pairwise they are the encoding of the text they cover, so a position from which no
//      fitting continuation exists is never a boundary of the answer (it is marked dead and
//      never tried again).
// a and b fit iff no merge (x, y) joins a node x of a's right spine (a, its right part, that
// part's right part, ... down to a byte) with a node y of b's left spine at a rank before x
// is consumed (strictly) and before or when y is consumed (leftmost merges first); only the
// spine pairs alive at the same time need a look, one walk down both spines
// (`no_merge_across`).
//
// Candidates come from a trie of the tokens that encode to themselves and are whole UTF-8
// characters, walked one code point per step. A token that is part of a character is not in
// it, so text whose encoding needs one (a character outside the vocabulary) finds no fitting
// sequence: `encode` returns false and the caller merges instead. Given the caller's merger,
// a character that no trie token starts with is merged alone instead, and its ids kept
// where they fit the tokens on both sides (by fact 3 the result is then the encoding: every
// token encodes to itself and every neighbouring pair fits; where they do not fit, the
// piece goes back to the caller). The answer is exact either way.
//
// Cost: building O(merges x spine depth + vocabulary bytes); `encode` is O(n x L) for a
// pre-token of n bytes and tokens of at most L characters (each position's candidates are
// tried once), with one hash probe per character walked and a walk of O(spine depth) array
// reads (and a merge lookup only where a merge can exist) per pair checked. It reuses its
// buffers (no allocation once warm). Not thread-safe (the buffers).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "hybridcache/core/config.hpp"
#include "hybridcache/core/hash.hpp"
#include "hybridcache/sim/bpe_char_trie.hpp"
#include "hybridcache/sim/bpe_merges.hpp"
#include "hybridcache/sim/request.hpp"
#include "hybridcache/sim/utf8_pretokenize.hpp"

namespace hybridcache::sim {

/// Exact longest-fitting-token encoder of one pre-token. See the file comment.
class bpe_backtracking_encoder {
 public:
  /// Ids must be below this (arrays are indexed by id; a pair of ids packs into 48 bits); a
  /// model with larger ids keeps the encoder off.
  static constexpr std::size_t max_ids = (std::size_t{1} << 24) - 1;

  bpe_backtracking_encoder() = default;

  /// Builds from the merge table and the 256 byte tokens' ids. `id_limit` bounds every id
  /// (exclusive). Leaves the encoder off (`enabled()` false) when the merge list is not
  /// well-formed, a byte has no id, or the ids are too large.
  void build(const bpe_merge_table& merges, const std::array<token_id, 256>& byte_ids, std::size_t id_limit) {
    *this = bpe_backtracking_encoder();
    if (id_limit > max_ids) return;
    info_.assign(id_limit, token_info{unmade, -1, -1, none, none});
    for (const token_id b : byte_ids) {
      if (b < 0 || static_cast<std::size_t>(b) >= id_limit || info_[static_cast<std::size_t>(b)].create != unmade) return;
      info_[static_cast<std::size_t>(b)].create = byte_rank;
    }
    struct merge {
      std::int32_t rank;
      token_id a, b, made;
    };
    std::vector<merge> list;
    list.reserve(merges.size());
    std::vector<std::uint8_t> made_count(id_limit, 0);
    bool ok = true;
    merges.for_each([&](token_id a, token_id b, const bpe_merge_target& t) {
      if (a < 0 || b < 0 || t.id < 0 || static_cast<std::size_t>(std::max({a, b, t.id})) >= id_limit) {
        ok = false;
        return;
      }
      list.push_back({t.rank, a, b, t.id});
      auto& c = made_count[static_cast<std::size_t>(t.id)];
      if (c < 2) ++c;
    });
    if (!ok) return;
    sort_by_rank(list);
    // Creation ranks in rank order; a merge whose input is never made can never apply.
    for (const merge& m : list) {
      token_info& made = info_[static_cast<std::size_t>(m.made)];
      if (made_count[static_cast<std::size_t>(m.made)] > 1 || made.create == byte_rank) return;  // made twice, or a byte
      const token_info& a = info_[static_cast<std::size_t>(m.a)];
      const token_info& b = info_[static_cast<std::size_t>(m.b)];
      const bool a_later = a.create == unmade && made_count[static_cast<std::size_t>(m.a)] > 0;
      const bool b_later = b.create == unmade && made_count[static_cast<std::size_t>(m.b)] > 0;
      if (a_later || b_later) return;  // an input made by a later merge: not well-formed
      if (a.create == unmade || b.create == unmade) continue;  // dead merge
      made = {m.rank, m.a, m.b, made.min_as_left, made.min_as_right};
      auto& l = info_[static_cast<std::size_t>(m.a)].min_as_left;
      auto& r = info_[static_cast<std::size_t>(m.b)].min_as_right;
      l = std::min(l, m.rank);
      r = std::min(r, m.rank);
    }
    // Tokens that encode to themselves (fact 1), and their bytes, in rank order.
    self_.assign(id_limit, 0);
    std::vector<std::uint32_t> at(id_limit, 0), len(id_limit, 0);
    std::string bytes;
    for (std::size_t b = 0; b < 256; ++b) {
      const auto id = static_cast<std::size_t>(byte_ids[b]);
      self_[id] = 1;
      at[id] = static_cast<std::uint32_t>(bytes.size());
      len[id] = 1;
      bytes.push_back(static_cast<char>(b));
    }
    for (const merge& m : list) {
      const auto t = static_cast<std::size_t>(m.made);
      if (info_[t].create != m.rank) continue;  // dead
      const auto a = static_cast<std::size_t>(m.a), b = static_cast<std::size_t>(m.b);
      self_[t] = self_[a] != 0 && self_[b] != 0 && no_merge_across(merges, m.a, m.b, true) ? 1 : 0;
      const std::size_t old = bytes.size();
      if (old + len[a] + len[b] > std::numeric_limits<std::uint32_t>::max()) return;
      at[t] = static_cast<std::uint32_t>(old);
      len[t] = len[a] + len[b];
      bytes.resize(old + len[t]);  // the parts lie before `old`: copies never overlap
      std::copy_n(bytes.data() + at[a], len[a], bytes.data() + old);
      std::copy_n(bytes.data() + at[b], len[b], bytes.data() + old + len[a]);
    }
    // The candidates: whole-character tokens that encode to themselves.
    std::vector<std::pair<std::string_view, token_id>> candidates;
    std::size_t chars = 0;
    for (std::size_t t = 0; t < id_limit; ++t) {
      const std::string_view s(bytes.data() + at[t], len[t]);
      if (self_[t] == 0 || !is_valid_utf8(s)) continue;
      candidates.emplace_back(s, static_cast<token_id>(t));
      chars += s.size();  // bounds the characters
    }
    if (!bpe_char_trie::fits(id_limit, chars)) return;
    trie_.build(std::move(candidates), id_limit, chars);
    build_fit_filter(list, id_limit);
    enabled_ = true;
  }

  /// True when built for a well-formed merge list.
  [[nodiscard]] bool enabled() const noexcept { return enabled_; }

  /// Appends the ids of `piece` (valid UTF-8, non-empty) to `out` and returns true, or
  /// returns false (and leaves `out` as it was) when no sequence of trie tokens fits: the
  /// caller then merges. `merges` is the table it was built from. `merge_char(c, out)`,
  /// when given, appends the ids of one character `c` by merging (the caller's merger): a
  /// character no trie token starts with (one outside the vocabulary) is then merged alone
  /// and kept where its ids fit their neighbours, instead of the whole piece going back.
  template <class MergeChar = std::nullptr_t>
  bool encode(std::string_view piece, const bpe_merge_table& merges, std::vector<token_id>& out, MergeChar&& merge_char = nullptr) {
    if (!enabled_ || piece.empty() || piece.size() >= std::numeric_limits<std::uint32_t>::max()) return false;
    // Positions are character indices: the piece is decoded once (a walk reads code
    // points, and the characters a walk looks past are the next walk's). The tokens taken
    // so far are ids[0, count), token i starting at character starts[i]; they fit
    // pairwise, so they are the encoding of the characters before k (fact 3). Those below
    // `floor` were merged and are never backed off.
    const std::size_t chars = decode(piece);
    token_id* const ids = ids_.data();  // at most one id per byte (see merge_unknown)
    std::uint32_t* const starts = starts_.data();
    std::size_t count = 0, floor = 0;
    clear_dead(chars);
    std::size_t k = 0;
    std::size_t below = chars + 1;  // only candidates shorter than this (after backing off)
    std::array<bpe_char_trie::match, max_candidates> found;  // written before read
    while (k < chars) {
      std::size_t candidates = trie_.prefixes(cp_.data(), k, chars, found.data(), max_candidates,
                                              [this](token_id t) { __builtin_prefetch(&filter_[static_cast<std::size_t>(t)]); });
      if (candidates > max_candidates) return false;
      if (candidates == 0) {
        // No token starts here. Without a merger, the piece goes back to the caller.
        // With one: the character's ids merged alone are the answer's there when they
        // fit the tokens before and after (all of them then encode to themselves and fit
        // pairwise: fact 3); where they do not, the piece goes back too.
        if constexpr (std::is_same_v<std::decay_t<MergeChar>, std::nullptr_t>) {
          return false;
        } else {
          const std::size_t merged = merge_unknown(piece, k, merges, ids, count, merge_char);
          if (merged == 0) return false;
          std::fill(starts + count, starts + count + merged, static_cast<std::uint32_t>(k));  // never backed off
          count += merged;
          floor = count;
          ++k;
          below = chars + 1;
          continue;
        }
      }
      bool taken = false;
      while (candidates > 0) {  // longest first
        const bpe_char_trie::match m = found[--candidates];
        if (m.end - k >= below || is_dead(m.end)) continue;
        if (count > 0 && !fits(merges, ids[count - 1], m.token)) continue;
        ids[count] = m.token;
        starts[count] = static_cast<std::uint32_t>(k);
        ++count;
        k = m.end;
        taken = true;
        break;
      }
      below = chars + 1;
      if (taken) continue;
      // Nothing fits from k: k is no boundary of the answer. Back off the last token and
      // try its shorter alternatives.
      mark_dead(k);
      if (count == floor) return false;
      --count;
      below = k - starts[count];
      k = starts[count];
    }
    out.insert(out.end(), ids, ids + count);
    return true;
  }

 private:
  static constexpr std::int32_t none = std::numeric_limits<std::int32_t>::max();
  static constexpr std::int32_t byte_rank = -1;  // a byte token: made before every merge
  static constexpr std::int32_t unmade = -2;     // never made by a live merge nor a byte

  struct token_info {
    std::int32_t create;        // rank of the merge making it; byte_rank, or unmade
    token_id left, right;       // its merge's inputs
    std::int32_t min_as_left;   // lowest rank of a merge taking it as the left input
    std::int32_t min_as_right;  // ... as the right input
  };
  struct alignas(32) fit_filter {  // see build_fit_filter; two to a cache line
    std::uint64_t right, left;
    std::uint64_t right2, left2;
  };
  // Candidates a position may have (longer lists make `encode` give up, to the merger).
  static constexpr std::size_t max_candidates = 128;

  // Sorts merges by rank. Ranks are distinct (one per pair) and below the merge list's
  // length, so each goes straight to its place (O(n), no comparisons), gaps squeezed out.
  template <class Merge>
  static void sort_by_rank(std::vector<Merge>& list) {
    std::int32_t top = -1;
    for (const Merge& m : list) {
      if (m.rank < 0) return std::sort(list.begin(), list.end(), [](const Merge& x, const Merge& y) { return x.rank < y.rank; });
      top = std::max(top, m.rank);
    }
    if (static_cast<std::size_t>(top) >= 4 * list.size() + 64)  // sparse ranks: sort
      return std::sort(list.begin(), list.end(), [](const Merge& x, const Merge& y) { return x.rank < y.rank; });
    std::vector<Merge> placed(static_cast<std::size_t>(top) + 1, Merge{-1, 0, 0, 0});
    for (const Merge& m : list) placed[static_cast<std::size_t>(m.rank)] = m;
    std::size_t k = 0;
    for (const Merge& m : placed)
      if (m.rank >= 0) list[k++] = m;
  }

  // Decodes `piece` (valid UTF-8) into cp_ and at_ (each character's first byte, and the
  // end after the last) and returns its characters; sizes ids_ and starts_ for it.
  std::size_t decode(std::string_view piece) {
    const std::size_t n = piece.size();
    if (cp_.size() < n + 1) {
      cp_.resize(n + 1);
      at_.resize(n + 1);
      ids_.resize(n);
      starts_.resize(n);
    }
    const auto* s = reinterpret_cast<const unsigned char*>(piece.data());
    std::uint32_t* const cp = cp_.data();
    std::uint32_t* const at = at_.data();
    std::size_t k = 0;
    for (std::size_t i = 0; i < n; ++k) {
      std::size_t len = 0;
      at[k] = static_cast<std::uint32_t>(i);
      cp[k] = bpe_detail::decode_at(s + i, len);
      i += len;
    }
    at[k] = static_cast<std::uint32_t>(n);
    return k;
  }

  // Writes at ids[count, ...) the ids of character k merged alone and returns how many,
  // or returns 0 when they do not fit the token before. They are at most its bytes (a
  // merge of its bytes), so ids_ (one per byte of the piece) holds them. Out of line:
  // rare, and the main loop stays small.
  template <class MergeChar>
  [[gnu::noinline]] std::size_t merge_unknown(std::string_view piece, std::size_t k, const bpe_merge_table& merges, token_id* ids, std::size_t count,
                                              MergeChar& merge_char) {
    unknown_.clear();
    merge_char(piece.substr(at_[k], at_[k + 1] - at_[k]), unknown_);
    if (unknown_.empty() || unknown_.size() > at_[k + 1] - at_[k] || (count > 0 && !fits(merges, ids[count - 1], unknown_.front()))) return 0;
    std::copy(unknown_.begin(), unknown_.end(), ids + count);
    return unknown_.size();
  }

  // Dead positions: a bitset over the piece, cleared where the last piece dirtied it.
  void clear_dead(std::size_t n) {
    const std::size_t words = n / 64 + 1;
    if (dead_.size() < words) dead_.resize(words, 0);
    if (dead_dirty_) std::fill(dead_.begin(), dead_.begin() + static_cast<std::ptrdiff_t>(std::min(dead_.size(), dead_words_)), 0);
    dead_dirty_ = false;
    dead_words_ = words;
  }
  void mark_dead(std::size_t pos) {
    dead_[pos / 64] |= std::uint64_t{1} << (pos % 64);
    dead_dirty_ = true;
  }
  [[nodiscard]] bool is_dead(std::size_t pos) const noexcept {
    return dead_dirty_ && ((dead_[pos / 64] >> (pos % 64)) & 1u) != 0;
  }

  // One bit of 64 standing for token z in the fit filter.
  [[nodiscard]] static std::uint64_t filter_bit(token_id z) noexcept {
    return std::uint64_t{1} << ((static_cast<std::uint64_t>(static_cast<std::uint32_t>(z)) * 0x9E3779B97F4A7C15ULL) >> 58);
  }
  // ... and in the second pair of filters (another multiplier: independent of the first).
  [[nodiscard]] static std::uint64_t filter_bit2(token_id z) noexcept {
    return std::uint64_t{1} << ((static_cast<std::uint64_t>(static_cast<std::uint32_t>(z)) * 0xD1B54A32D192ED03ULL) >> 58);
  }

  // The fit filter of every token that encodes to itself, two conditions a merge (x, y)
  // across a and b must meet (x on a's right spine, alive at its rank; y on b's left
  // spine, likewise), each a test of one common bit:
  //   right & left:   right[a] holds the bits of every z some merge (x, z) may join a's
  //                   right spine node x with before x is consumed; left[b] the bits of
  //                   b's left spine nodes y some merge (w, y) may take before y is
  //                   consumed (y = z for the merge across).
  //   right2 & left2: right2[a] holds the bits (another hash) of a's right spine nodes x
  //                   some merge may take as the left input before x is consumed;
  //                   left2[b] the bits of every w some merge (w, y) may join b's left
  //                   spine node y with before y is consumed (w = x for the merge across).
  // When either is 0 they fit without a walk. Either alone lets through pairs whose bits
  // only collide (a byte's partners are many: right[a] is often dense); both together
  // keep out most of those.
  template <class Merge>
  void build_fit_filter(const std::vector<Merge>& live_merges, std::size_t id_limit) {
    auto live = [&](const Merge& m) { return info_[static_cast<std::size_t>(m.made)].create == m.rank; };
    // Each token's merges as the left input (partners' bits) and as the right input
    // (partners' second bits), by rank, with prefix ORs.
    struct by_rank {
      std::vector<std::uint32_t> begin;
      std::vector<std::int32_t> ranks;
      std::vector<std::uint64_t> prefix;
      // The OR of the bits of merges ranked below `limit` (`inclusive`: up to it).
      [[nodiscard]] std::uint64_t upto(token_id x, std::int32_t limit, bool inclusive) const {
        const auto* first = ranks.data() + begin[static_cast<std::size_t>(x)];
        const auto* last = ranks.data() + begin[static_cast<std::size_t>(x) + 1];
        const auto* it = inclusive ? std::upper_bound(first, last, limit) : std::lower_bound(first, last, limit);
        return it == first ? std::uint64_t{0} : prefix[begin[static_cast<std::size_t>(x)] + static_cast<std::size_t>(it - first) - 1];
      }
    };
    auto make = [&](auto key, auto bits) {
      by_rank r;
      r.begin.assign(id_limit + 1, 0);
      for (const Merge& m : live_merges)
        if (live(m)) ++r.begin[static_cast<std::size_t>(key(m)) + 1];
      for (std::size_t i = 0; i < id_limit; ++i) r.begin[i + 1] += r.begin[i];
      r.ranks.resize(r.begin[id_limit]);
      r.prefix.resize(r.begin[id_limit]);
      std::vector<std::uint32_t> fill(r.begin.begin(), r.begin.end() - 1);
      for (const Merge& m : live_merges) {  // rank order, so each list is sorted
        if (!live(m)) continue;
        const auto x = static_cast<std::size_t>(key(m));
        const std::uint32_t k = fill[x]++;
        r.ranks[k] = m.rank;
        r.prefix[k] = (k > r.begin[x] ? r.prefix[k - 1] : 0) | bits(m);
      }
      return r;
    };
    const by_rank as_left = make([](const Merge& m) { return m.a; }, [](const Merge& m) { return filter_bit(m.b); });
    const by_rank as_right = make([](const Merge& m) { return m.b; }, [](const Merge& m) { return filter_bit2(m.a); });
    // Over the spines, in rank order (a token's parts come before it), without walking
    // them: each token's filter ORs its part's (the right part b for the right spine, the
    // left part a for the left one), with that part consumed at the token's rank, and
    // what that part contributes itself; the token's own share is added at the end.
    filter_.assign(id_limit, fit_filter{0, 0, 0, 0});
    for (const Merge& m : live_merges) {
      if (!live(m)) continue;
      const auto t = static_cast<std::size_t>(m.made);
      const auto a = static_cast<std::size_t>(m.a), b = static_cast<std::size_t>(m.b);
      fit_filter& f = filter_[t];
      f.right = as_left.upto(m.b, m.rank, false) | filter_[b].right;
      f.left = (info_[a].min_as_right <= m.rank ? filter_bit(m.a) : 0) | filter_[a].left;
      f.right2 = (info_[b].min_as_left < m.rank ? filter_bit2(m.b) : 0) | filter_[b].right2;
      f.left2 = as_right.upto(m.a, m.rank, true) | filter_[a].left2;
    }
    for (std::size_t t = 0; t < id_limit; ++t) {
      fit_filter& f = filter_[t];
      if (self_[t] == 0) {
        f = fit_filter{0, 0, 0, 0};
        continue;
      }
      const auto id = static_cast<token_id>(t);
      f.right |= as_left.upto(id, none, false);
      f.left |= filter_bit(id);  // min_as_right <= none always holds
      f.right2 |= info_[t].min_as_left < none ? filter_bit2(id) : 0;
      f.left2 |= as_right.upto(id, none, true);
    }
  }

  // True when a and b fit: the filter first, then the answers of recent walks, then a walk.
  [[nodiscard]] HYBRIDCACHE_FORCEINLINE bool fits(const bpe_merge_table& merges, token_id a, token_id b) noexcept {
    const fit_filter& fa = filter_[static_cast<std::size_t>(a)];
    const fit_filter& fb = filter_[static_cast<std::size_t>(b)];
    if ((fa.right & fb.left) == 0 || (fa.right2 & fb.left2) == 0) return true;
    const std::uint64_t pair = (static_cast<std::uint64_t>(a) << 24) | static_cast<std::uint64_t>(b);  // ids < 2^24
    std::uint64_t& memo = walked_[splitmix64_mix(pair) & (walked_.size() - 1)];
    if ((memo & pair_bits) == pair) return (memo & fit_bit) != 0;
    const bool fit = no_merge_across(merges, a, b, false);
    memo = pair | (fit ? fit_bit : 0);
    return fit;
  }

  // True when no merge joins a's right spine with b's left spine while both are alive
  // (a and b fit, fact 2); `skip_top` leaves out the pair (a, b) itself (the merge that
  // makes a token from its two parts, when checking that it encodes to itself).
  [[nodiscard]] bool no_merge_across(const bpe_merge_table& merges, token_id a, token_id b, bool skip_top) const noexcept {
    std::int32_t consumed_x = none, consumed_y = none;  // when x / y is merged into its parent
    token_id x = a, y = b;
    bool top = skip_top;
    while (true) {
      const token_info& ix = info_[static_cast<std::size_t>(x)];
      const token_info& iy = info_[static_cast<std::size_t>(y)];
      if (!top && ix.min_as_left < consumed_x && iy.min_as_right <= consumed_y) {
        const bpe_merge_target* m = merges.find(x, y);
        if (m != nullptr && m->rank < consumed_x && m->rank <= consumed_y) return false;
      }
      top = false;
      // Back in time: the later-made of the two splits first.
      if (ix.create >= iy.create) {
        if (ix.create < 0) return true;  // both bytes
        consumed_x = ix.create;
        x = ix.right;
      } else {
        consumed_y = iy.create;
        y = iy.left;
      }
    }
  }

  bool enabled_ = false;
  std::vector<token_info> info_;
  std::vector<std::uint8_t> self_;
  std::vector<fit_filter> filter_;
  // Recent walks: (a << 24 | b), with fit_bit set when they fit; ~0: empty.
  static constexpr std::uint64_t pair_bits = (std::uint64_t{1} << 48) - 1;
  static constexpr std::uint64_t fit_bit = std::uint64_t{1} << 48;
  std::vector<std::uint64_t> walked_ = std::vector<std::uint64_t>(std::size_t{1} << 14, ~std::uint64_t{0});
  bpe_char_trie trie_;
  std::vector<std::uint64_t> dead_;
  bool dead_dirty_ = false;
  std::size_t dead_words_ = 0;
  // `encode`'s buffers, grown to the longest piece seen: each character's code point and
  // first byte, the ids taken and the character each starts at, a merged character's ids.
  std::vector<std::uint32_t> cp_, at_;
  std::vector<token_id> ids_;
  std::vector<std::uint32_t> starts_;
  std::vector<token_id> unknown_;
};

}  // namespace hybridcache::sim
