// hybridcache/sim/tokenizer/utf8_pretokenize.hpp
//
// The text side of the byte-level BPE tokenizer (bpe_tokenizer.hpp): UTF-8 validation and
// replacement of invalid bytes with U+FFFD exactly as Python's errors="replace" decodes
// them, letter/number classes from the generated Unicode tables (data/unicode_ln.hpp), and
// the GPT-2 pre-tokenizer split (the ByteLevel pre-tokenizer with use_regex) without a
// regex engine. Every function is O(length) and allocation-free except where it appends
// to the caller's string.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "hybridcache/core/config.hpp"
#include "hybridcache/sim/tokenizer/data/unicode_ln.hpp"

namespace hybridcache::sim {

namespace detail {

/// Character classes of the pre-tokenizer regex.
enum class cclass : std::uint8_t { other = 0, letter = 1, number = 2, space = 3 };

/// Unicode White_Space (Oniguruma's \s for Unicode text).
[[nodiscard]] constexpr bool is_white_space(std::uint32_t cp) noexcept {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/// The class of an ASCII code point.
[[nodiscard]] constexpr cclass classify_ascii(std::uint32_t cp) noexcept {
  if (is_white_space(cp)) return cclass::space;
  if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return cclass::letter;
  if (cp >= '0' && cp <= '9') return cclass::number;
  return cclass::other;
}

/// The class of `cp` by a binary search of the generated ranges (what `class_table` is
/// built from).
[[nodiscard]] inline cclass classify(std::uint32_t cp) noexcept {
  if (cp < 0x80) return classify_ascii(cp);
  if (is_white_space(cp)) return cclass::space;
  const auto* first = std::begin(data::unicode_ln_ranges);
  const auto* last = std::end(data::unicode_ln_ranges);
  const auto* it = std::upper_bound(first, last, cp, [](std::uint32_t v, const data::unicode_ln_range& r) { return v < r.first; });
  if (it == first) return cclass::other;
  --it;
  return cp <= it->last ? static_cast<cclass>(it->cls) : cclass::other;
}

/// Every code point's class in two stages: blocks of 256 code points, those of one class
/// shared. One load per character instead of a binary search; built once (about 0.1 ms,
/// 80 KiB), thread-safe.
class class_table {
 public:
  static const class_table& get() {
    static const class_table table;
    return table;
  }
  /// The class of a code point <= U+10FFFF.
  [[nodiscard]] HYBRIDCACHE_FORCEINLINE cclass of(std::uint32_t cp) const noexcept {
    return static_cast<cclass>(blocks_[(std::size_t{index_[cp >> 8]} << 8) | (cp & 0xFFu)]);
  }
  /// The class every well-formed three-byte sequence starting with `b0 b1` has (the 64
  /// code points U+(b0 & 0x0F)(b1 & 0x3F)xx), or `mixed` when they differ or `b0 b1` starts
  /// none (an overlong or surrogate prefix). `b0` is 0xE0-0xEF, `b1` any byte: only its
  /// low six bits are read, so the caller checks it is a continuation byte. Nearly every
  /// CJK ideograph, Hangul syllable and CJK punctuation mark lies in a single-class block.
  static constexpr std::uint8_t mixed = 0xFF;
  [[nodiscard]] HYBRIDCACHE_FORCEINLINE std::uint8_t block3(unsigned char b0, unsigned char b1) const noexcept {
    return block3_[((b0 & 0x0Fu) << 6) | (b1 & 0x3Fu)];
  }

 private:
  class_table() {
    blocks_.assign(4 * 256, 0);  // blocks 0-3: every code point of class 0-3
    for (std::size_t c = 0; c < 4; ++c) std::fill_n(blocks_.begin() + static_cast<std::ptrdiff_t>(c * 256), 256, static_cast<std::uint8_t>(c));
    std::array<std::uint8_t, 256> block{};
    std::size_t r = 0;
    const auto& ranges = data::unicode_ln_ranges;
    const std::size_t count = std::size(ranges);
    for (std::uint32_t b = 0; b < index_.size(); ++b) {
      const std::uint32_t base = b << 8, top = base + 255;
      block.fill(static_cast<std::uint8_t>(cclass::other));
      while (r < count && ranges[r].last < base) ++r;
      for (std::size_t k = r; k < count && ranges[k].first <= top; ++k)
        for (std::uint32_t cp = std::max(ranges[k].first, base); cp <= std::min(ranges[k].last, top); ++cp) block[cp - base] = ranges[k].cls;
      if (base <= 0x3000)  // every White_Space code point is below U+3001
        for (std::uint32_t cp = base; cp <= top; ++cp)
          if (is_white_space(cp)) block[cp - base] = static_cast<std::uint8_t>(cclass::space);
      if (std::all_of(block.begin(), block.end(), [&](std::uint8_t c) { return c == block[0]; })) {
        index_[b] = block[0];
        continue;
      }
      index_[b] = static_cast<std::uint16_t>(blocks_.size() / 256);
      blocks_.insert(blocks_.end(), block.begin(), block.end());
    }
    for (std::uint32_t lead = 0; lead < 16; ++lead) {
      for (std::uint32_t b1 = 0; b1 < 64; ++b1) {
        const std::uint32_t first = (lead << 12) | (b1 << 6);
        const bool starts_one = !(lead == 0 && b1 < 0x20) && !(lead == 0x0D && b1 >= 0x20);  // overlong; surrogates
        bool same = starts_one;
        for (std::uint32_t cp = first; same && cp < first + 64; ++cp) same = of(cp) == of(first);
        block3_[(lead << 6) | b1] = same ? static_cast<std::uint8_t>(of(first)) : mixed;
      }
    }
  }
  std::array<std::uint16_t, 0x1100> index_{};
  std::array<std::uint8_t, 1024> block3_{};  // by the lead byte's low four bits and the second byte's low six
  std::vector<std::uint8_t> blocks_;
};

/// Decodes the code point at `p` of valid UTF-8; sets `len`.
[[nodiscard]] HYBRIDCACHE_FORCEINLINE std::uint32_t decode_at(const unsigned char* p, std::size_t& len) noexcept {
  const std::uint32_t b0 = p[0];
  if (b0 < 0x80) {
    len = 1;
    return b0;
  }
  if (b0 < 0xE0) {
    len = 2;
    return ((b0 & 0x1Fu) << 6) | (p[1] & 0x3Fu);
  }
  if (b0 < 0xF0) {
    len = 3;
    return ((b0 & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
  }
  len = 4;
  return ((b0 & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3Fu);
}

/// Code point returned by `decode_checked` for an ill-formed sequence.
inline constexpr std::uint32_t ill_formed = 0x110000;

/// Decodes the code point at `p` (`avail` bytes readable) and sets `len`, or returns
/// `ill_formed` (len = 1) when the bytes there are not a well-formed sequence: continuation
/// bytes missing, an overlong form, a surrogate or a code point above U+10FFFF (the
/// constraints of Unicode Table 3-7, checked on the decoded value).
[[nodiscard]] HYBRIDCACHE_FORCEINLINE std::uint32_t decode_checked(const unsigned char* p, std::size_t avail, std::size_t& len) noexcept {
  const std::uint32_t b0 = p[0];
  if (b0 < 0x80) {
    len = 1;
    return b0;
  }
  if (b0 - 0xE0u < 0x10u && avail >= 3) {  // three bytes: most of CJK
    const std::uint32_t b1 = p[1], b2 = p[2];
    const std::uint32_t cp = ((b0 & 0x0Fu) << 12) | ((b1 & 0x3Fu) << 6) | (b2 & 0x3Fu);
    if (((b1 ^ 0x80u) | (b2 ^ 0x80u)) < 0x40u && cp >= 0x800 && cp - 0xD800u >= 0x800u) {
      len = 3;
      return cp;
    }
    len = 1;
    return ill_formed;
  }
  if ((b0 & 0xE0u) == 0xC0u && avail >= 2 && (p[1] & 0xC0u) == 0x80u && b0 >= 0xC2) {
    len = 2;
    return ((b0 & 0x1Fu) << 6) | (p[1] & 0x3Fu);
  }
  if ((b0 & 0xF8u) == 0xF0u && avail >= 4 && (((p[1] & 0xC0u) << 16) | ((p[2] & 0xC0u) << 8) | (p[3] & 0xC0u)) == 0x808080u) {
    const std::uint32_t cp = ((b0 & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3Fu);
    len = 4;
    return cp >= 0x10000 && cp <= 0x10FFFF ? cp : (len = 1, ill_formed);
  }
  len = 1;
  return ill_formed;
}

/// Decodes the code point at s[i] of valid UTF-8; sets `len`.
[[nodiscard]] HYBRIDCACHE_FORCEINLINE std::uint32_t decode_valid(std::string_view s, std::size_t i, std::size_t& len) noexcept {
  return decode_at(reinterpret_cast<const unsigned char*>(s.data()) + i, len);
}

/// Length of the well-formed UTF-8 sequence at s[i] (Unicode Table 3-7), or 0 when the
/// bytes there are not one; `subpart` gets the length of the maximal invalid subpart.
[[nodiscard]] inline std::size_t valid_sequence(std::string_view s, std::size_t i, std::size_t& subpart) noexcept {
  const auto b0 = static_cast<unsigned char>(s[i]);
  subpart = 1;
  if (b0 < 0x80) return 1;
  std::size_t need = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (std::size_t k = 1; k <= need; ++k) {
    if (i + k >= s.size()) return 0;
    const auto b = static_cast<unsigned char>(s[i + k]);
    const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) return 0;
    subpart = k + 1;
  }
  return need + 1;
}

/// GPT-2's byte-to-unicode map: printable bytes map to themselves, the others to 256 + n.
[[nodiscard]] constexpr std::array<std::uint32_t, 256> byte_to_unicode() noexcept {
  std::array<std::uint32_t, 256> map{};
  std::uint32_t n = 0;
  for (std::uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    map[b] = printable ? b : 256 + n++;
  }
  return map;
}

// Appends the UTF-8 bytes of code point `cp` (<= U+10FFFF).
inline void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

/// Writes the bytes that `token`, spelled in GPT-2's byte alphabet (`byte_to_unicode`),
/// stands for; false when a character of it is not in the alphabet.
[[nodiscard]] inline bool byte_level_to_bytes(std::string_view token, std::string& out) {
  static constexpr std::array<std::int16_t, 324> from_unicode = [] {
    std::array<std::int16_t, 324> inv{};
    inv.fill(-1);
    const auto map = byte_to_unicode();
    for (std::size_t b = 0; b < 256; ++b) inv[map[b]] = static_cast<std::int16_t>(b);
    return inv;
  }();
  out.clear();
  std::size_t sub = 0;
  for (std::size_t i = 0; i < token.size();) {
    std::size_t len = valid_sequence(token, i, sub);
    if (len == 0) return false;
    const std::uint32_t cp = decode_valid(token, i, len);
    if (cp >= from_unicode.size() || from_unicode[cp] < 0) return false;
    out.push_back(static_cast<char>(from_unicode[cp]));
    i += len;
  }
  return true;
}

}  // namespace detail

/// True when `s` is well-formed UTF-8. ASCII runs are checked 8 bytes at a time, two- and
/// three-byte sequences without a restricted second byte by a masked compare.
[[nodiscard]] inline bool is_valid_utf8(std::string_view s) noexcept {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  std::size_t i = 0, sub = 0;
  while (i < n) {
    const unsigned b0 = p[i];
    if (b0 < 0x80) {
      ++i;
      while (i + 8 <= n) {
        std::uint64_t word = 0;
        std::memcpy(&word, p + i, 8);
        if ((word & 0x8080808080808080ULL) != 0) break;
        i += 8;
      }
      continue;
    }
    if (b0 >= 0xE1 && b0 != 0xED && b0 <= 0xEF && i + 2 < n) {  // most of CJK
      if ((p[i + 1] & 0xC0u) != 0x80u || (p[i + 2] & 0xC0u) != 0x80u) return false;
      i += 3;
      continue;
    }
    if (b0 >= 0xC2 && b0 <= 0xDF && i + 1 < n) {
      if ((p[i + 1] & 0xC0u) != 0x80u) return false;
      i += 2;
      continue;
    }
    const std::size_t len = detail::valid_sequence(s, i, sub);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

/// Writes `in` to `out` with every maximal invalid UTF-8 subpart replaced by U+FFFD, as
/// Python's `bytes.decode("utf-8", errors="replace")`.
inline void utf8_replace_invalid(std::string_view in, std::string& out) {
  out.clear();
  out.reserve(in.size());
  std::size_t sub = 0;
  for (std::size_t i = 0; i < in.size();) {
    const std::size_t n = detail::valid_sequence(in, i, sub);
    if (n == 0) {
      out.append("\xEF\xBF\xBD");
      i += sub;
    } else {
      out.append(in.data() + i, n);
      i += n;
    }
  }
}

/// Calls `emit(piece)` for each piece of valid UTF-8 `text` split by the GPT-2 pattern
/// (ByteLevel pre-tokenizer with use_regex). ASCII characters are classified by a 128-entry
/// table, others by `class_table`. With `Checked`, `text` may be any bytes: the split stops
/// (emitting nothing more) and returns false at the first piece holding an ill-formed
/// sequence; else it returns true.
namespace detail {

inline constexpr std::array<cclass, 128> ascii_classes = [] {
  std::array<cclass, 128> t{};
  for (std::uint32_t c = 0; c < 128; ++c) t[c] = classify_ascii(c);
  return t;
}();

// The class and length of the character at s[i] (n bytes in all); with Checked, an
// ill-formed sequence sets `bad` (and reads as one byte of class other).
template <bool Checked>
HYBRIDCACHE_FORCEINLINE cclass class_at(const unsigned char* s, std::size_t n, std::size_t i, const class_table& table, std::size_t& len,
                                        bool& bad) noexcept {
  if (s[i] < 0x80) {
    len = 1;
    return ascii_classes[s[i]];
  }
  if (s[i] >= 0xE0 && s[i] < 0xF0 && i + 3 <= n) {  // most of CJK: one load, no decoding
    const std::uint8_t c = table.block3(s[i], s[i + 1]);
    if (c != class_table::mixed && ((s[i + 1] & 0xC0u) | ((s[i + 2] & 0xC0u) >> 2)) == 0xA0u) {
      len = 3;
      return static_cast<cclass>(c);
    }
  }
  if constexpr (Checked) {
    const std::uint32_t cp = decode_checked(s + i, n - i, len);
    if (cp == ill_formed) {
      bad = true;
      return cclass::other;
    }
    return table.of(cp);
  } else {
    (void)n;
    (void)bad;
    return table.of(decode_at(s + i, len));
  }
}

// The end of the run of `cls` starting at s[i].
template <bool Checked>
HYBRIDCACHE_FORCEINLINE std::size_t run_end(const unsigned char* s, std::size_t n, std::size_t i, cclass cls, const class_table& table,
                                            bool& bad) noexcept {
  std::size_t len = 0;
  while (i < n) {
    if (class_at<Checked>(s, n, i, table, len, bad) != cls) break;
    i += len;
  }
  return i;
}

// The whitespace run starting at s[p] as both patterns end it: `after_crlf` is one past its
// last CR or LF (0: none; Llama 3's \s*[\r\n]+), `end` what \s+(?!\S)|\s+ takes (the run,
// but its last character when a non-space follows and the run has at least two).
struct space_run {
  std::size_t end = 0;
  std::size_t after_crlf = 0;
};
template <bool Checked>
HYBRIDCACHE_FORCEINLINE space_run whitespace_run(const unsigned char* s, std::size_t n, std::size_t p, const class_table& table,
                                                 bool& bad) noexcept {
  space_run r;
  std::size_t e = p, last = p, count = 0, l = 0;
  while (e < n && class_at<Checked>(s, n, e, table, l, bad) == cclass::space) {
    if (s[e] == '\r' || s[e] == '\n') r.after_crlf = e + 1;
    last = e;
    e += l;
    ++count;
  }
  r.end = (e < n && count >= 2) ? last : e;
  return r;
}

}  // namespace detail

template <bool Checked = false, class Emit>
bool byte_level_split(std::string_view text, Emit&& emit) {
  using detail::cclass;
  const detail::class_table& table = detail::class_table::get();
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  bool bad = false;
  std::size_t p = 0, len = 0;
  while (p < n) {
    std::size_t end = 0;
    if (s[p] == '\'' && p + 1 < n &&
        (s[p + 1] == 's' || s[p + 1] == 't' || s[p + 1] == 'm' || s[p + 1] == 'd')) {
      end = p + 2;
    } else if (s[p] == '\'' && p + 2 < n &&
               ((s[p + 1] == 'r' && s[p + 2] == 'e') || (s[p + 1] == 'v' && s[p + 2] == 'e') || (s[p + 1] == 'l' && s[p + 2] == 'l'))) {
      end = p + 3;
    } else {
      const cclass cls = detail::class_at<Checked>(s, n, p, table, len, bad);
      std::size_t l2 = 0;
      cclass next = cclass::space;
      if (s[p] == ' ' && p + 1 < n) next = detail::class_at<Checked>(s, n, p + 1, table, l2, bad);
      if (next != cclass::space) {  // " ?X+" with the space
        end = detail::run_end<Checked>(s, n, p + 1 + l2, next, table, bad);
      } else if (cls != cclass::space) {
        end = detail::run_end<Checked>(s, n, p + len, cls, table, bad);
      } else {
        end = detail::whitespace_run<Checked>(s, n, p, table, bad).end;  // \s+(?!\S)|\s+
      }
    }
    if (Checked && bad) return false;
    emit(std::string_view(text.data() + p, end - p));
    p = end;
  }
  return true;
}

}  // namespace hybridcache::sim
