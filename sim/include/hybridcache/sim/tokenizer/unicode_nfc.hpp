// hybridcache/sim/tokenizer/unicode_nfc.hpp
//
// Unicode Normalization Form C (UAX #15) for the byte-level BPE tokenizer's "NFC"
// normalizer (bpe_tokenizer.hpp; Qwen 2, 2.5 and 3 ship it), with the data the `tokenizers`
// package's NFC uses (data/unicode_nfc.hpp: its combining classes and decompositions are
// those of an old Unicode, 9.0, so marks added since are left alone, as the package leaves
// them).
//
// NFC = canonical decomposition (recursive; Hangul syllables algorithmically), canonical
// ordering (marks of a run of non-zero classes stably sorted by class), then canonical
// composition (each character joins the last starter before it when nothing between blocks
// it and the pair is a primary composite; Hangul L+V and LV+T algorithmically).
//
// Most text needs none of that: `scan` tells, one bit per character (a bitmap of the BMP
// marking every character that NFC changes alone, that has a combining class or that
// composes onto the character before it; above the BMP, blocks of 256 code points and a
// binary search), whether NFC leaves a text unchanged.
//
// Costs: `scan` O(n); `normalize` O(n log t) (t: table sizes, binary searches) plus a
// stable sort of each run of marks, O(k log k) for k marks. Building the tables once: O(t), thread-safe.
// `normalize` reuses the caller's buffers (allocation-free once they are warm).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <iterator>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "hybridcache/sim/tokenizer/data/unicode_nfc.hpp"
#include "hybridcache/sim/tokenizer/utf8_pretokenize.hpp"

namespace hybridcache::sim {

/// NFC with the `tokenizers` package's data. See the file comment.
class nfc_normalizer {
 public:
  static const nfc_normalizer& get() {
    static const nfc_normalizer n;
    return n;
  }

  /// What `scan` finds in a text.
  enum class text_state : std::uint8_t { inert, changes, ill_formed };

  /// One pass over any bytes: `ill_formed` at an ill-formed UTF-8 sequence, else `changes`
  /// when some character needs NFC's attention (NFC changes it alone, it has a combining
  /// class, or it composes onto the one before it), else `inert` (NFC leaves the text as
  /// it is).
  [[nodiscard]] text_state scan(std::string_view text) const noexcept {
    const auto* s = reinterpret_cast<const unsigned char*>(text.data());
    const std::size_t n = text.size();
    text_state state = text_state::inert;
    for (std::size_t i = 0; i < n;) {
      const unsigned b0 = s[i];
      if (b0 < 0x80) {  // ASCII: no combining class, no decomposition, composes with nothing before it
        ++i;
        continue;
      }
      if (b0 - 0xE0u < 0x10u && i + 2 < n) {  // three bytes (most of CJK): one bit of the BMP map
        const unsigned b1 = s[i + 1], b2 = s[i + 2];
        const bool well_formed = ((b1 & 0xC0u) | ((b2 & 0xC0u) >> 2)) == 0xA0u && !(b0 == 0xE0 && b1 < 0xA0) && !(b0 == 0xED && b1 >= 0xA0);
        if (well_formed) {
          const std::uint32_t cp = ((b0 & 0x0Fu) << 12) | ((b1 & 0x3Fu) << 6) | (b2 & 0x3Fu);
          if ((bmp_[cp >> 6] >> (cp & 63)) & 1u) state = text_state::changes;
          i += 3;
          continue;
        }
      }
      std::size_t len = 0;
      const std::uint32_t cp = detail::decode_checked(s + i, n - i, len);
      if (cp == detail::ill_formed) return text_state::ill_formed;
      if (attention(cp)) state = text_state::changes;
      i += len;
    }
    return state;
  }

  /// True when NFC leaves `text` (valid UTF-8) unchanged. See `scan`.
  [[nodiscard]] bool inert(std::string_view text) const noexcept { return scan(text) == text_state::inert; }

  /// Appends NFC(`text`) to `out` (valid UTF-8 in, valid UTF-8 out); `cps` is scratch.
  void normalize(std::string_view text, std::string& out, std::vector<std::uint32_t>& cps) const {
    cps.clear();
    const auto* s = reinterpret_cast<const unsigned char*>(text.data());
    for (std::size_t i = 0; i < text.size();) {
      std::size_t len = 0;
      decompose(detail::decode_at(s + i, len), cps);
      i += len;
    }
    reorder(cps);
    compose(cps);
    for (const std::uint32_t cp : cps) detail::append_utf8(out, cp);
  }

  /// True when NFC may change text holding `cp` (<= U+10FFFF): NFC changes it alone, it has
  /// a combining class, or it composes onto the character before it.
  [[nodiscard]] bool attention(std::uint32_t cp) const noexcept {
    if (cp < 0x10000) return ((bmp_[cp >> 6] >> (cp & 63)) & 1u) != 0;
    return blocks_[cp >> 8] && std::binary_search(special_.begin(), special_.end(), cp);
  }

  /// The canonical combining class of `cp` (0 for starters and for code points the data
  /// does not know).
  [[nodiscard]] std::uint8_t combining_class(std::uint32_t cp) const noexcept {
    const auto* first = std::begin(data::nfc_classes);
    const auto* last = std::end(data::nfc_classes);
    const auto* it = std::lower_bound(first, last, cp, [](const data::nfc_class& c, std::uint32_t v) { return c.cp < v; });
    return it != last && it->cp == cp ? it->ccc : 0;
  }

 private:
  static constexpr std::uint32_t s_base = 0xAC00, l_base = 0x1100, v_base = 0x1161, t_base = 0x11A7;
  static constexpr std::uint32_t l_count = 19, v_count = 21, t_count = 28, n_count = v_count * t_count, s_count = l_count * n_count;

  nfc_normalizer() {
    auto mark = [&](std::uint32_t cp) {
      special_.push_back(cp);
      blocks_[cp >> 8] = true;
    };
    for (const auto& c : data::nfc_classes) mark(c.cp);
    for (const auto& d : data::nfc_decompositions) {
      if (d.composes) {
        mark(d.second);
        pairs_.emplace(pair_key(d.first, d.second), d.cp);
      }
    }
    for (std::uint32_t v = v_base; v < v_base + v_count; ++v) mark(v);  // Hangul L+V, LV+T
    for (std::uint32_t t = t_base + 1; t < t_base + t_count; ++t) mark(t);
    // A character that decomposes needs attention only when NFC changes it alone (a
    // singleton, an excluded composite, a decomposition that starts with a mark): a
    // precomposed letter that composes back ("é") changes only with a mark after it, and
    // that mark is marked.
    std::vector<std::uint32_t> cps;
    std::string one, normalized;
    for (const auto& d : data::nfc_decompositions) {
      one.clear();
      normalized.clear();
      detail::append_utf8(one, d.cp);
      normalize(one, normalized, cps);
      if (normalized != one) mark(d.cp);
    }
    std::sort(special_.begin(), special_.end());
    special_.erase(std::unique(special_.begin(), special_.end()), special_.end());
    for (const std::uint32_t cp : special_)
      if (cp < 0x10000) bmp_[cp >> 6] |= std::uint64_t{1} << (cp & 63);
  }

  [[nodiscard]] static std::uint64_t pair_key(std::uint32_t a, std::uint32_t b) noexcept { return (std::uint64_t{a} << 21) | b; }

  void decompose(std::uint32_t cp, std::vector<std::uint32_t>& out) const {
    if (cp - s_base < s_count) {
      const std::uint32_t s = cp - s_base;
      out.push_back(l_base + s / n_count);
      out.push_back(v_base + (s % n_count) / t_count);
      if (s % t_count != 0) out.push_back(t_base + s % t_count);
      return;
    }
    const auto* first = std::begin(data::nfc_decompositions);
    const auto* last = std::end(data::nfc_decompositions);
    const auto* it = std::lower_bound(first, last, cp, [](const data::nfc_decomposition& d, std::uint32_t v) { return d.cp < v; });
    if (it == last || it->cp != cp) {
      out.push_back(cp);
      return;
    }
    decompose(it->first, out);  // depth: at most a few levels (the data is acyclic)
    if (it->second != 0) decompose(it->second, out);
  }

  // Canonical ordering: each run of non-zero classes stably sorted by class (O(k log k) for
  // a run of k marks: a text of a long run of marks is not quadratic).
  void reorder(std::vector<std::uint32_t>& cps) const {
    const auto by_class = [this](std::uint32_t x, std::uint32_t y) { return combining_class(x) < combining_class(y); };
    for (std::size_t i = 0; i < cps.size();) {
      if (combining_class(cps[i]) == 0) {
        ++i;
        continue;
      }
      std::size_t j = i + 1;
      while (j < cps.size() && combining_class(cps[j]) != 0) ++j;
      if (j - i > 1) std::stable_sort(cps.begin() + static_cast<std::ptrdiff_t>(i), cps.begin() + static_cast<std::ptrdiff_t>(j), by_class);
      i = j;
    }
  }

  [[nodiscard]] std::uint32_t composite(std::uint32_t a, std::uint32_t b) const {
    if (a - l_base < l_count && b - v_base < v_count) return s_base + ((a - l_base) * v_count + (b - v_base)) * t_count;
    if (a - s_base < s_count && (a - s_base) % t_count == 0 && b - t_base - 1 < t_count - 1) return a + (b - t_base);
    const auto it = pairs_.find(pair_key(a, b));
    return it != pairs_.end() ? it->second : 0;
  }

  // Canonical composition, in place: each character joins the last starter when no
  // character between them has class 0 or a class >= its own (it is not blocked).
  void compose(std::vector<std::uint32_t>& cps) const {
    if (cps.empty()) return;
    std::size_t starter = 0, out = 1;
    bool have_starter = combining_class(cps[0]) == 0;
    int last_class = have_starter ? 0 : 256;  // a leading mark blocks nothing and joins nothing
    for (std::size_t i = 1; i < cps.size(); ++i) {
      const std::uint32_t cp = cps[i];
      const int cls = combining_class(cp);
      if (have_starter && (last_class < cls || (last_class == 0 && out == starter + 1))) {
        if (const std::uint32_t c = composite(cps[starter], cp); c != 0) {
          cps[starter] = c;
          continue;
        }
      }
      if (cls == 0) {
        starter = out;
        have_starter = true;
      }
      last_class = cls;
      cps[out++] = cp;
    }
    cps.resize(out);
  }

  std::array<std::uint64_t, 1024> bmp_{};  // one bit per BMP code point: special (8 KiB)
  std::array<bool, 0x1100> blocks_{};    // a 256-code-point block holds a special code point
  std::vector<std::uint32_t> special_;   // sorted: changed alone, has a class, or composes onto the previous
  std::unordered_map<std::uint64_t, std::uint32_t> pairs_;  // primary composites
};

}  // namespace hybridcache::sim
