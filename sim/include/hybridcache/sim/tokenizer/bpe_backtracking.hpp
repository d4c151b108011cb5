// hybridcache/sim/tokenizer/bpe_backtracking.hpp
//
// A fast encoder for one pre-token that returns exactly what merging in the package's order
// (bpe_merges.hpp) returns, without replaying the merges: it walks the text left to right,
// takes the longest vocabulary token that may follow the previous one, and backs off to a
// shorter one when none fits further on.
//
// Why that is exact. Say the merge list is in rank order when each merge's two inputs are
// byte tokens or made only by lower-ranked merges (what a trainer writes: each token made
// by one merge; a list converted from a vocabulary may make a token by several merges, one
// per split; lists out of rank order are below). Then merges are applied in increasing rank
// order, and three facts follow (by induction over the merges):
//   1. A token t of the output was built inside its own bytes exactly as encoding bytes(t)
//      alone builds it, so encode(bytes(t)) = [t], and its history is that merge tree (for
//      a token made by one merge, the tree of its merges; for one made several ways, the
//      last merge of encoding its bytes decides, `canonical_creation`).
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
// Out of rank order. A list converted from a tiktoken vocabulary (Llama 3's, Qwen's
// tokenizer.json) lists every split of each token, also into tokens made after it: a merge
// then ranks before one of its inputs exists and applies as soon as it does, so merges do
// not apply in rank order and ranks no longer say when a spine node is consumed. Fact 1
// holds regardless (a token's bytes are merged among themselves as when encoded alone:
// nothing outside changes which of their pairs are available), and so do facts 2 and 3,
// whose only question is the boundary: the encoding of u ++ v runs u's and v's merges
// interleaved, the lowest-ranked available pair first, and a merge across the boundary can
// only join the current last symbol of u's last token with the current first of v's first.
// So each token's own merges are recorded (its encoding alone, in order: `events_`) and a
// and b fit iff replaying the two sequences side by side, with the merge across their
// current edge symbols competing, never lets that merge go first (`replay_fit`; ties go to
// the leftmost pair: a's merge, then the one across, then b's). The fit filters bound each
// spine node's life by the highest rank among the token's merges while it lives.
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
// Cost: building O(merges x spine depth + vocabulary bytes), plus O(n^2) merge lookups for
// each token of n bytes made by several merges (every token, out of rank order; replay_fit
// is then O(bytes of a + bytes of b) per pair the filters let through); `encode` is O(n x L) for a
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

#include "hybridcache/concepts/ids.hpp"
#include "hybridcache/core/config.hpp"
#include "hybridcache/core/hash.hpp"
#include "hybridcache/sim/tokenizer/bpe_char_trie.hpp"
#include "hybridcache/sim/tokenizer/bpe_merges.hpp"
#include "hybridcache/sim/tokenizer/utf8_pretokenize.hpp"

namespace hybridcache::sim {

/// Exact longest-fitting-token encoder of one pre-token. See the file comment.
class bpe_backtracking_encoder {
 public:
  /// Ids must be below this (arrays are indexed by id; a pair of ids packs into 48 bits); a
  /// model with larger ids keeps the encoder off.
  static constexpr std::size_t max_ids = (std::size_t{1} << 24) - 1;

  bpe_backtracking_encoder() = default;

  /// Builds from the merge table and the 256 byte tokens' ids. `id_limit` bounds every id
  /// (exclusive). Leaves the encoder off (`enabled()` false) when a merge makes a byte, a
  /// token would have two lengths (a cycle), learning token histories would cost more than
  /// `max_history_work`, a byte has no id, or the ids are too large; the caller merges.
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
    bool ok = true;
    merges.for_each([&](token_id a, token_id b, const bpe_merge_target& t) {
      if (a < 0 || b < 0 || t.id < 0 || static_cast<std::size_t>(std::max({a, b, t.id})) >= id_limit) {
        ok = false;
        return;
      }
      list.push_back({t.rank, a, b, t.id});
    });
    if (!ok) return;
    detail::sort_by_rank(list);
    // Which tokens are ever made (a merge whose input never is can never apply), and each
    // token's length in bytes: a worklist from the bytes over the merges by input, O(merges)
    // (an input may be made by a merge ranked after the one taking it).
    std::vector<std::uint32_t> length(id_limit, 0);
    for (const token_id b : byte_ids) length[static_cast<std::size_t>(b)] = 1;
    {
      std::vector<std::uint32_t> first(id_limit + 1, 0);  // merges by input (CSR)
      for (const merge& m : list) {
        ++first[static_cast<std::size_t>(m.a) + 1];
        if (m.b != m.a) ++first[static_cast<std::size_t>(m.b) + 1];
      }
      for (std::size_t i = 0; i < id_limit; ++i) first[i + 1] += first[i];
      std::vector<std::uint32_t> uses(first[id_limit]), fill(first.begin(), first.end() - 1);
      for (std::uint32_t k = 0; k < list.size(); ++k) {
        uses[fill[static_cast<std::size_t>(list[k].a)]++] = k;
        if (list[k].b != list[k].a) uses[fill[static_cast<std::size_t>(list[k].b)]++] = k;
      }
      std::vector<token_id> ready(byte_ids.begin(), byte_ids.end());
      while (!ready.empty()) {
        const auto x = static_cast<std::size_t>(ready.back());
        ready.pop_back();
        for (std::uint32_t u = first[x]; u < first[x + 1]; ++u) {
          const merge& m = list[uses[u]];
          auto& lt = length[static_cast<std::size_t>(m.made)];
          const std::uint32_t la = length[static_cast<std::size_t>(m.a)], lb = length[static_cast<std::size_t>(m.b)];
          if (lt != 0 || la == 0 || lb == 0) continue;
          if (static_cast<std::uint64_t>(la) + lb > std::numeric_limits<std::uint32_t>::max()) return;
          lt = la + lb;
          ready.push_back(m.made);
        }
      }
    }
    auto applies = [&](const merge& m) { return length[static_cast<std::size_t>(m.a)] != 0 && length[static_cast<std::size_t>(m.b)] != 0; };
    // Each made token's first merge (for now), the lowest merges taking it, and its last
    // merge (every merge making an input must rank before the merges taking it: then merges
    // apply in rank order).
    std::vector<std::int32_t> last_make(id_limit, byte_rank);
    std::vector<std::uint32_t> makers(id_limit, 0);
    for (const merge& m : list) {
      if (!applies(m)) continue;
      token_info& made = info_[static_cast<std::size_t>(m.made)];
      if (made.create == byte_rank) return;  // a byte made by a merge
      // Each merge spells its token: a list where a token would have two lengths (a table
      // built by hand with a cycle, x -> y ... -> x) is not BPE over bytes.
      if (length[static_cast<std::size_t>(m.a)] + length[static_cast<std::size_t>(m.b)] != length[static_cast<std::size_t>(m.made)]) return;
      if (made.create == unmade) made = {m.rank, m.a, m.b, made.min_as_left, made.min_as_right};
      last_make[static_cast<std::size_t>(m.made)] = m.rank;
      ++makers[static_cast<std::size_t>(m.made)];
      auto& l = info_[static_cast<std::size_t>(m.a)].min_as_left;
      auto& r = info_[static_cast<std::size_t>(m.b)].min_as_right;
      l = std::min(l, m.rank);
      r = std::min(r, m.rank);
    }
    // Out of rank order (a merge ranks before one of its inputs can be made, as in merge
    // lists converted from tiktoken vocabularies, which list every split of a token,
    // including splits into tokens made after it), a token's spine nodes are consumed later
    // than their ranks say, and the walk's "before it is consumed" no longer holds. Then
    // every token's history comes from its own bytes, with the order of its merges, and two
    // tokens fit when replaying both histories side by side lets no merge across them go
    // first (`replay_fit`).
    in_rank_order_ = true;
    for (const merge& m : list)
      if (applies(m) && (last_make[static_cast<std::size_t>(m.a)] >= m.rank || last_make[static_cast<std::size_t>(m.b)] >= m.rank))
        in_rank_order_ = false;
    // Histories from the tokens' own bytes, shortest first, for tokens made several ways
    // (all of them out of rank order). 1: encodes to itself; 0: does not; 2: made once, in
    // rank order (the walk decides).
    std::vector<token_id> by_length;  // merged tokens, shortest first (a counting sort)
    {
      std::vector<std::uint32_t> count;
      for (std::size_t t = 0; t < id_limit; ++t) {
        if (length[t] < 2) continue;
        if (count.size() <= length[t]) count.resize(length[t] + 1, 0);
        ++count[length[t]];
      }
      std::uint32_t sum = 0;
      for (auto& c : count) sum += std::exchange(c, sum);
      by_length.resize(sum);
      for (std::size_t t = 0; t < id_limit; ++t)
        if (length[t] >= 2) by_length[count[length[t]]++] = static_cast<token_id>(t);
    }
    std::vector<std::uint8_t> canonical_self(id_limit, 2);
    // Encoding a token's bytes to learn its history is O(n^2) for n bytes: a list whose
    // tokens would cost more than `max_history_work` in all (a chain of thousands of
    // one-byte merges; real vocabularies need a few million) leaves the encoder off.
    std::uint64_t work = 0;
    for (const token_id t : by_length)
      if (!in_rank_order_ || makers[static_cast<std::size_t>(t)] > 1)
        work += std::uint64_t{length[static_cast<std::size_t>(t)]} * length[static_cast<std::size_t>(t)];
    if (work > max_history_work) return;
    if (!in_rank_order_) {
      event_begin_.assign(id_limit + 1, 0);
      edge_bytes_.assign(id_limit, {none, none});
      for (const token_id b : byte_ids) edge_bytes_[static_cast<std::size_t>(b)] = {b, b};
    }
    for (std::size_t k = 0; k < by_length.size(); ++k) {
      const token_id t = by_length[k];
      if (!in_rank_order_) {  // its events, in by_length order (the CSR's begins follow)
        event_begin_[static_cast<std::size_t>(t)] = static_cast<std::uint32_t>(events_.size());
        canonical_self[static_cast<std::size_t>(t)] = canonical_creation(merges, t, true) ? 1 : 0;
      } else if (makers[static_cast<std::size_t>(t)] > 1) {
        canonical_self[static_cast<std::size_t>(t)] = canonical_creation(merges, t, false) ? 1 : 0;
      }
    }
    if (!in_rank_order_) {
      event_end_.assign(id_limit, 0);
      for (std::size_t k = 0; k < by_length.size(); ++k)
        event_end_[static_cast<std::size_t>(by_length[k])] =
            k + 1 < by_length.size() ? event_begin_[static_cast<std::size_t>(by_length[k + 1])] : static_cast<std::uint32_t>(events_.size());
    }
    // Tokens that encode to themselves (fact 1), and their bytes, shortest first (parts first).
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
    for (const token_id tok : by_length) {
      const auto t = static_cast<std::size_t>(tok);
      const token_id ta = info_[t].left, tb = info_[t].right;
      const auto a = static_cast<std::size_t>(ta), b = static_cast<std::size_t>(tb);
      const std::uint8_t walked =
          !in_rank_order_ ? canonical_self[t] : self_[a] != 0 && self_[b] != 0 && no_merge_across(merges, ta, tb, true) ? 1 : 0;
      // A token whose history its bytes gave encodes to itself (its bytes end in that
      // history's merge); the walk over that history must agree (else the facts the encoder
      // rests on fail for this list: it stays off). One whose bytes do not encode to it has
      // no history to walk.
      if (canonical_self[t] == 1 && walked != 1) return;
      self_[t] = canonical_self[t] == 2 ? walked : canonical_self[t];
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
    build_fit_filter(list, by_length, id_limit);
    enabled_ = true;
  }

  /// True when built (see `build` for when it is not).
  [[nodiscard]] bool enabled() const noexcept { return enabled_; }
  /// True when merges apply in rank order (fits are checked by walking spines); false when
  /// some merge ranks before one of its inputs can be made (fits are checked by replaying
  /// both tokens' histories, `replay_fit`).
  [[nodiscard]] bool in_rank_order() const noexcept { return in_rank_order_; }

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
  // Merge lookups `build` may spend learning histories from tokens' own bytes.
  static constexpr std::uint64_t max_history_work = std::uint64_t{1} << 28;

  // For a token made by several merges: encodes its own bytes by the definition (the
  // lowest-ranked neighbouring pair first, leftmost among equals) and, when that ends in
  // the token, records the last merge as its history (its parts were made inside its bytes
  // the same way, so their histories are theirs). With `record`, appends each merge of that
  // encoding to `events_` (rank, and the symbol it leaves at the right or left end) and
  // sets the token's end bytes. False when its bytes do not encode to it. O(n^2) merge
  // lookups for n bytes: at build time only.
  bool canonical_creation(const bpe_merge_table& merges, token_id t, bool record) {
    std::vector<token_id> sym;
    std::vector<token_id> stack{t};
    while (!stack.empty()) {  // its bytes, by any one of its histories (they spell the same bytes)
      const token_id x = stack.back();
      stack.pop_back();
      const token_info& ix = info_[static_cast<std::size_t>(x)];
      if (ix.create == byte_rank) {
        sym.push_back(x);
        continue;
      }
      stack.push_back(ix.right);
      stack.push_back(ix.left);
    }
    if (record) edge_bytes_[static_cast<std::size_t>(t)] = {sym.front(), sym.back()};
    while (sym.size() > 1) {
      std::size_t best = sym.size();
      const bpe_merge_target* best_merge = nullptr;
      for (std::size_t i = 0; i + 1 < sym.size(); ++i) {
        const bpe_merge_target* m = merges.find(sym[i], sym[i + 1]);
        if (m != nullptr && (best_merge == nullptr || m->rank < best_merge->rank)) {
          best = i;
          best_merge = m;
        }
      }
      if (best_merge == nullptr) return false;
      if (record)
        events_.push_back({best_merge->rank, best + 2 == sym.size() ? best_merge->id : -1, best == 0 ? best_merge->id : -1});
      if (sym.size() == 2) {
        if (best_merge->id != t) return false;
        token_info& it = info_[static_cast<std::size_t>(t)];
        it.create = best_merge->rank;
        it.left = sym[0];
        it.right = sym[1];
        return true;
      }
      sym[best] = best_merge->id;
      sym.erase(sym.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    }
    return false;
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
      cp[k] = detail::decode_at(s + i, len);
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
  void build_fit_filter(const std::vector<Merge>& live_merges, const std::vector<token_id>& by_length, std::size_t id_limit) {
    // A merge that can apply at all (both inputs made) may join two spines, whether or not
    // it is a token's history: the partner lists take them all. The spines follow histories.
    auto applies = [&](const Merge& m) {
      return info_[static_cast<std::size_t>(m.a)].create != unmade && info_[static_cast<std::size_t>(m.b)].create != unmade;
    };
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
        if (applies(m)) ++r.begin[static_cast<std::size_t>(key(m)) + 1];
      for (std::size_t i = 0; i < id_limit; ++i) r.begin[i + 1] += r.begin[i];
      r.ranks.resize(r.begin[id_limit]);
      r.prefix.resize(r.begin[id_limit]);
      std::vector<std::uint32_t> fill(r.begin.begin(), r.begin.end() - 1);
      for (const Merge& m : live_merges) {  // rank order, so each list is sorted
        if (!applies(m)) continue;
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
    for (const token_id tok : by_length) {  // parts (shorter) first
      const auto t = static_cast<std::size_t>(tok);
      const token_info& it = info_[t];
      if (it.create < 0) continue;
      fit_filter& f = filter_[t];
      if (!in_rank_order_) {
        // Out of rank order, from the token's own merges: a spine node x can meet a merge
        // across while some merge of the token's pending while x lives ranks above it, so
        // its limit is the highest rank from its making to its consumption (inclusive).
        token_id x = edge_bytes_[t].second, y = edge_bytes_[t].first;
        std::int32_t lim_x = byte_rank, lim_y = byte_rank;
        for (std::uint32_t e = event_begin_[t]; e < event_end_[t]; ++e) {
          const event& ev = events_[e];
          lim_x = std::max(lim_x, ev.rank);
          lim_y = std::max(lim_y, ev.rank);
          if (ev.right >= 0) {
            f.right |= as_left.upto(x, lim_x, false);
            f.right2 |= info_[static_cast<std::size_t>(x)].min_as_left < lim_x ? filter_bit2(x) : 0;
            x = ev.right;
            lim_x = byte_rank;
          }
          if (ev.left >= 0) {
            f.left |= info_[static_cast<std::size_t>(y)].min_as_right <= lim_y ? filter_bit(y) : 0;
            f.left2 |= as_right.upto(y, lim_y, true);
            y = ev.left;
            lim_y = byte_rank;
          }
        }
        continue;  // the token itself, never consumed: below
      }
      const auto a = static_cast<std::size_t>(it.left), b = static_cast<std::size_t>(it.right);
      f.right = as_left.upto(it.right, it.create, false) | filter_[b].right;
      f.left = (info_[a].min_as_right <= it.create ? filter_bit(it.left) : 0) | filter_[a].left;
      f.right2 = (info_[b].min_as_left < it.create ? filter_bit2(it.right) : 0) | filter_[b].right2;
      f.left2 = as_right.upto(it.left, it.create, true) | filter_[a].left2;
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
    const bool fit = in_rank_order_ ? no_merge_across(merges, a, b, false) : replay_fit(merges, a, b);
    memo = pair | (fit ? fit_bit : 0);
    return fit;
  }

  // Out of rank order: replays a's and b's histories side by side as encoding their bytes
  // together does (the lowest-ranked merge available goes first, leftmost among equals:
  // a's, then the one across, then b's) and says whether a merge across the boundary (a's
  // rightmost symbol with b's leftmost) ever goes first. Exact for any merge list (a
  // token's history is what encoding its bytes alone does, fact 1, which holds out of rank
  // order too); O(bytes of a + bytes of b) merge lookups.
  [[nodiscard]] bool replay_fit(const bpe_merge_table& merges, token_id a, token_id b) const noexcept {
    std::uint32_t i = event_begin_[static_cast<std::size_t>(a)], j = event_begin_[static_cast<std::size_t>(b)];
    const std::uint32_t ie = event_end_[static_cast<std::size_t>(a)], je = event_end_[static_cast<std::size_t>(b)];
    token_id x = edge_bytes_[static_cast<std::size_t>(a)].second, y = edge_bytes_[static_cast<std::size_t>(b)].first;
    std::int32_t rc = none;
    bool moved = true;  // x or y changed: look the merge across up again
    while (true) {
      if (moved) {
        const bpe_merge_target* across = merges.find(x, y);
        rc = across != nullptr ? across->rank : none;
        moved = false;
      }
      const std::int32_t ra = i < ie ? events_[i].rank : none;
      const std::int32_t rb = j < je ? events_[j].rank : none;
      if (ra != none && ra <= rb && ra <= rc) {
        if (events_[i].right >= 0) {
          x = events_[i].right;
          moved = true;
        }
        ++i;
      } else if (rc != none && rc <= rb) {
        return false;
      } else if (rb != none) {
        if (events_[j].left >= 0) {
          y = events_[j].left;
          moved = true;
        }
        ++j;
      } else {
        return true;
      }
    }
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
  bool in_rank_order_ = true;  // merges apply in rank order (the walk); else replay_fit
  struct event {
    std::int32_t rank;  // a merge of a token's own encoding, in order
    token_id right;     // the symbol it leaves at the right end, or -1 when it does not touch it
    token_id left;      // ... at the left end
  };
  std::vector<event> events_;                // out of rank order: every token's merges
  std::vector<std::uint32_t> event_begin_;  // by token: its first event
  std::vector<std::uint32_t> event_end_;     // ... one past its last
  std::vector<std::pair<token_id, token_id>> edge_bytes_;  // by token: its first and last byte tokens
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
