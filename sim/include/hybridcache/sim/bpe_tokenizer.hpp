// hybridcache/sim/bpe_tokenizer.hpp
//
// A byte-level BPE tokenizer read from a Hugging Face `tokenizer.json`, for replaying text
// traces with a model's real token ids instead of the built-in approximation
// (text_tokenizer.hpp). Its output equals the `tokenizers` Python package's
// `Tokenizer.encode(text).ids` for the components it implements (tested on thousands of
// strings against the package, tests/tokenizer/):
//
//   added_tokens   split out first, leftmost-longest, in two passes as the package does:
//                  the tokens with "normalized": false over the whole text, then those with
//                  "normalized": true over what is left. "single_word", "lstrip" and
//                  "rstrip" must be false.
//   normalizer     must be null.
//   pre_tokenizer  ByteLevel with "add_prefix_space": false and "use_regex": true: the
//                  GPT-2 split
//                    's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//                  then every byte of a piece mapped to GPT-2's printable byte alphabet.
//                  \p{L} and \p{N} come from data/unicode_ln.hpp (Python's unicodedata,
//                  its version in `data::unicode_ln_version`; code points assigned in a
//                  later Unicode version than that classify as "other"); \s is Unicode
//                  White_Space (Oniguruma's \s).
//   model          BPE: "vocab" and "merges" (either "a b" strings or ["a", "b"] pairs);
//                  a merge's priority is its index (lowest first; equal pairs leftmost
//                  first); "ignore_merges" supported; "dropout", "unk_token",
//                  "continuing_subword_prefix", "end_of_word_suffix" must be null and
//                  "byte_fallback" false. A byte missing from the vocabulary is dropped, as
//                  the package does without an unk token.
//   post_processor null or ByteLevel (which changes offsets only); "truncation" and
//                  "padding" must be null. "decoder" is ignored (no decoding here).
// Any other component is rejected with `invalid_argument` naming it: the tokenizer never
// silently approximates.
//
// Invalid UTF-8: the package takes Python strings, so text must be Unicode. `encode`
// replaces every invalid sequence in its input with U+FFFD exactly as Python's
// `bytes.decode("utf-8", errors="replace")` does (one U+FFFD per maximal invalid subpart,
// `utf8_replace_invalid`); encoding raw bytes here equals encoding their "replace"-decoded
// string with the package.
//
// Cost: loading is O(file size). `encode` merges a pre-token of up to 64 bytes by scanning an
// array of pair ranks (O(n^2) compares, 2 lookups per merge) and a longer one with a heap of
// candidate merges (O(n log n)), in the package's order either way (lowest rank, then
// leftmost); pre-tokens of up to 64 bytes seen before come from a cache in flat arenas
// (cleared when it holds `cache_capacity` entries). Not thread-safe (the cache); use one per
// thread.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "hybridcache/core/error.hpp"
#include "hybridcache/core/hash.hpp"
#include "hybridcache/sim/data/unicode_ln.hpp"
#include "hybridcache/sim/json.hpp"
#include "hybridcache/sim/request.hpp"

namespace hybridcache::sim {

namespace bpe_detail {

/// Character classes of the pre-tokenizer regex.
enum class cclass : std::uint8_t { other = 0, letter = 1, number = 2, space = 3 };

/// Unicode White_Space (Oniguruma's \s for Unicode text).
[[nodiscard]] constexpr bool is_white_space(std::uint32_t cp) noexcept {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

[[nodiscard]] inline cclass classify(std::uint32_t cp) noexcept {
  if (is_white_space(cp)) return cclass::space;
  if (cp < 0x80) {
    if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return cclass::letter;
    if (cp >= '0' && cp <= '9') return cclass::number;
    return cclass::other;
  }
  const auto* first = std::begin(data::unicode_ln_ranges);
  const auto* last = std::end(data::unicode_ln_ranges);
  const auto* it = std::upper_bound(first, last, cp, [](std::uint32_t v, const data::unicode_ln_range& r) { return v < r.first; });
  if (it == first) return cclass::other;
  --it;
  return cp <= it->last ? static_cast<cclass>(it->cls) : cclass::other;
}

/// Decodes the code point at s[i] of valid UTF-8; sets `len`.
[[nodiscard]] inline std::uint32_t decode_valid(std::string_view s, std::size_t i, std::size_t& len) noexcept {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    len = 1;
    return b0;
  }
  if (b0 < 0xE0) {
    len = 2;
    return ((b0 & 0x1Fu) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3Fu);
  }
  if (b0 < 0xF0) {
    len = 3;
    return ((b0 & 0x0Fu) << 12) | ((static_cast<unsigned char>(s[i + 1]) & 0x3Fu) << 6) | (static_cast<unsigned char>(s[i + 2]) & 0x3Fu);
  }
  len = 4;
  return ((b0 & 0x07u) << 18) | ((static_cast<unsigned char>(s[i + 1]) & 0x3Fu) << 12) |
         ((static_cast<unsigned char>(s[i + 2]) & 0x3Fu) << 6) | (static_cast<unsigned char>(s[i + 3]) & 0x3Fu);
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

inline void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace bpe_detail

/// True when `s` is well-formed UTF-8.
[[nodiscard]] inline bool is_valid_utf8(std::string_view s) noexcept {
  std::size_t sub = 0;
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = bpe_detail::valid_sequence(s, i, sub);
    if (n == 0) return false;
    i += n;
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
    const std::size_t n = bpe_detail::valid_sequence(in, i, sub);
    if (n == 0) {
      out.append("\xEF\xBF\xBD");
      i += sub;
    } else {
      out.append(in.substr(i, n));
      i += n;
    }
  }
}

/// Calls `emit(piece)` for each piece of valid UTF-8 `text` split by the GPT-2 pattern
/// (ByteLevel pre-tokenizer with use_regex).
template <class Emit>
void byte_level_split(std::string_view text, Emit&& emit) {
  using bpe_detail::cclass;
  const std::size_t n = text.size();
  std::size_t p = 0;
  std::size_t len = 0;
  auto class_at = [&](std::size_t i, std::size_t& l) { return bpe_detail::classify(bpe_detail::decode_valid(text, i, l)); };
  auto run_end = [&](std::size_t i, cclass cls) {  // end of the run of `cls` starting at i
    std::size_t l = 0;
    while (i < n && class_at(i, l) == cls) i += l;
    return i;
  };
  while (p < n) {
    if (text[p] == '\'' && p + 1 < n) {
      const char c = text[p + 1];
      if (c == 's' || c == 't' || c == 'm' || c == 'd') {
        emit(text.substr(p, 2));
        p += 2;
        continue;
      }
      if (p + 2 < n) {
        const std::string_view two = text.substr(p + 1, 2);
        if (two == "re" || two == "ve" || two == "ll") {
          emit(text.substr(p, 3));
          p += 3;
          continue;
        }
      }
    }
    const cclass cls = class_at(p, len);
    if (text[p] == ' ' && p + 1 < n) {
      std::size_t l2 = 0;
      const cclass next = class_at(p + 1, l2);
      if (next != cclass::space) {
        const std::size_t e = run_end(p + 1, next);
        emit(text.substr(p, e - p));
        p = e;
        continue;
      }
    }
    if (cls != cclass::space) {
      const std::size_t e = run_end(p, cls);
      emit(text.substr(p, e - p));
      p = e;
      continue;
    }
    // Whitespace: \s+(?!\S) takes the run but its last character when a non-space follows
    // (and the run has at least two characters); otherwise \s+ takes the whole run.
    std::size_t e = p, last = p, count = 0, l = 0;
    while (e < n && class_at(e, l) == cclass::space) {
      last = e;
      e += l;
      ++count;
    }
    const std::size_t end = (e < n && count >= 2) ? last : e;
    emit(text.substr(p, end - p));
    p = end;
  }
}

/// Byte-level BPE tokenizer from a Hugging Face tokenizer.json. See the file comment.
class bpe_tokenizer {
 public:
  /// Largest tokenizer.json read (bytes).
  static constexpr std::uintmax_t max_file_bytes = std::uintmax_t{1} << 30;
  /// Largest vocabulary, merge list and added-token list accepted.
  static constexpr std::size_t max_entries = std::size_t{1} << 24;
  /// Pre-tokens remembered before the cache is cleared.
  static constexpr std::size_t cache_capacity = std::size_t{1} << 16;
  /// Longer pre-tokens are not cached (long CJK runs rarely repeat).
  static constexpr std::size_t max_cached_piece = 64;

  /// Reads `path`. Throws `invalid_argument` when it cannot be read, is too large, or uses
  /// a component this tokenizer does not implement; `format_error` for malformed JSON.
  [[nodiscard]] static bpe_tokenizer from_file(const std::filesystem::path& path) {
    std::error_code ec;
    const auto size = std::filesystem::file_size(path, ec);
    if (ec) throw invalid_argument("tokenizer '" + path.string() + "': cannot read (" + ec.message() + ")");
    if (size > max_file_bytes) throw invalid_argument("tokenizer '" + path.string() + "': larger than 1 GiB");
    std::ifstream in(path, std::ios::binary);
    if (!in) throw invalid_argument("tokenizer '" + path.string() + "': cannot open");
    std::string text(static_cast<std::size_t>(size), '\0');
    in.read(text.data(), static_cast<std::streamsize>(size));
    if (static_cast<std::uintmax_t>(in.gcount()) != size) throw invalid_argument("tokenizer '" + path.string() + "': short read");
    bpe_tokenizer t = from_json(text, path.string());
    return t;
  }

  /// Parses the text of a tokenizer.json; `name` labels errors.
  [[nodiscard]] static bpe_tokenizer from_json(std::string_view text, const std::string& name = "tokenizer.json") {
    bpe_tokenizer t;
    t.load(text, name);
    return t;
  }

  /// Appends the ids of `text` to `out` (invalid UTF-8 replaced as documented).
  void encode(std::string_view text, std::vector<token_id>& out) {
    if (!is_valid_utf8(text)) {
      std::string clean;
      utf8_replace_invalid(text, clean);
      encode_valid(clean, out);
      return;
    }
    encode_valid(text, out);
  }

  /// The ids of `text`.
  [[nodiscard]] std::vector<token_id> encode(std::string_view text) {
    std::vector<token_id> out;
    encode(text, out);
    return out;
  }

  /// Entries in the model vocabulary (added tokens not counted unless also in it).
  [[nodiscard]] std::size_t vocab_size() const noexcept { return vocab_.size(); }
  /// Number of merges.
  [[nodiscard]] std::size_t merge_count() const noexcept { return merge_count_; }
  /// Number of added tokens.
  [[nodiscard]] std::size_t added_token_count() const noexcept { return added_.size(); }
  /// The id of a vocabulary entry or added token (its byte-level spelling), or -1.
  [[nodiscard]] token_id token_to_id(std::string_view token) const {
    for (const auto& a : added_)
      if (a.content == token) return a.id;
    auto it = vocab_.find(std::string(token));
    return it == vocab_.end() ? -1 : it->second;
  }

 private:
  struct merge_target {
    std::int32_t rank;
    token_id id;
  };
  struct added_token {
    std::string content;
    token_id id;
    bool normalized;
  };
  struct symbol {
    token_id id;
    std::int32_t prev;
    std::int32_t next;
    bool alive;
  };
  struct merge_slot {
    std::uint64_t key;  // empty_key: free
    merge_target target;
  };
  static constexpr std::uint64_t empty_key = ~std::uint64_t{0};  // never a pair of ids >= 0
  // The pre-token cache: open addressing over flat arenas (no allocation per entry).
  struct cache_slot {
    std::uint64_t hash;  // 0: free
    std::uint32_t bytes_at;
    std::uint32_t ids_at;
    std::uint16_t byte_count;
    std::uint16_t id_count;
  };
  [[nodiscard]] static std::uint64_t piece_hash(std::string_view s) noexcept {
    std::uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a, then a mixer
    for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
    return splitmix64_mix(h) | 1u;
  }
  struct candidate {
    std::int32_t rank;
    std::int32_t pos;
    token_id id;
    token_id left;
    token_id right;
    bool operator>(const candidate& o) const noexcept { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };

  [[nodiscard]] static std::uint64_t pair_key(token_id a, token_id b) noexcept {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
  }

  [[noreturn]] static void unsupported(const std::string& name, const std::string& what) {
    throw invalid_argument("tokenizer '" + name + "': " + what + " is not implemented (supported: byte-level BPE, see bpe_tokenizer.hpp)");
  }

  static void require_null_or(const json_value* v, const std::string& name, const std::string& what) {
    if (v != nullptr && !v->is_null()) unsupported(name, what);
  }

  static bool get_bool(const json_value& obj, std::string_view key, bool fallback, const std::string& name) {
    const json_value* v = obj.find(key);
    if (v == nullptr || v->is_null()) return fallback;
    if (v->kind() != json_kind::boolean) throw invalid_argument("tokenizer '" + name + "': '" + std::string(key) + "' must be a boolean");
    return v->as_bool();
  }

  static std::string type_of(const json_value& obj, const std::string& name, const std::string& where) {
    const json_value* t = obj.find("type");
    if (t == nullptr || t->kind() != json_kind::string) throw invalid_argument("tokenizer '" + name + "': " + where + " has no \"type\"");
    return t->as_string();
  }

  void load(std::string_view text, const std::string& name) {
    json_cursor cursor(text);
    cursor.begin_object("");
    std::string_view key;
    bool have_model = false;
    json_value added;
    while (cursor.next_member(key)) {
      const std::string k(key);
      if (k == "model") {
        have_model = true;
        load_model(cursor, name);
        continue;
      }
      const json_value v = json_value::read(cursor, k);
      if (k == "normalizer") {
        if (!v.is_null()) unsupported(name, "normalizer '" + type_of(v, name, "normalizer") + "'");
      } else if (k == "pre_tokenizer") {
        if (v.is_null()) unsupported(name, "a null pre_tokenizer");
        const std::string type = type_of(v, name, "pre_tokenizer");
        if (type != "ByteLevel") unsupported(name, "pre_tokenizer '" + type + "'");
        if (get_bool(v, "add_prefix_space", true, name)) unsupported(name, "ByteLevel add_prefix_space = true");
        if (!get_bool(v, "use_regex", true, name)) unsupported(name, "ByteLevel use_regex = false");
      } else if (k == "post_processor") {
        if (!v.is_null() && type_of(v, name, "post_processor") != "ByteLevel")
          unsupported(name, "post_processor '" + type_of(v, name, "post_processor") + "'");
      } else if (k == "truncation") {
        require_null_or(&v, name, "truncation");
      } else if (k == "padding") {
        require_null_or(&v, name, "padding");
      } else if (k == "added_tokens") {
        added = v;
      }
      // "version", "decoder" and unknown keys are ignored.
    }
    cursor.expect_end();
    if (!have_model) throw invalid_argument("tokenizer '" + name + "': no \"model\"");
    if (added.kind() == json_kind::array) {
      if (added.as_array().size() > max_entries) throw invalid_argument("tokenizer '" + name + "': too many added tokens");
      for (const json_value& a : added.as_array()) {
        const json_value* content = a.find("content");
        const json_value* id = a.find("id");
        if (content == nullptr || content->kind() != json_kind::string || content->as_string().empty() || id == nullptr || !id->is_integer() ||
            id->as_int() < 0 || id->as_int() > 0x7FFFFFFF)
          throw invalid_argument("tokenizer '" + name + "': an added token needs a non-empty \"content\" and an \"id\" in [0, 2^31)");
        if (get_bool(a, "single_word", false, name) || get_bool(a, "lstrip", false, name) || get_bool(a, "rstrip", false, name))
          unsupported(name, "added token '" + content->as_string() + "' with single_word/lstrip/rstrip");
        const bool special = get_bool(a, "special", false, name);
        added_.push_back({content->as_string(), static_cast<token_id>(id->as_int()), get_bool(a, "normalized", !special, name)});
      }
    } else if (!added.is_null()) {
      throw invalid_argument("tokenizer '" + name + "': \"added_tokens\" must be an array");
    }
    // Longest first, so the first match at a position is the longest.
    std::stable_sort(added_.begin(), added_.end(), [](const added_token& a, const added_token& b) { return a.content.size() > b.content.size(); });
    for (std::size_t i = 0; i < added_.size(); ++i)
      by_first_byte_[static_cast<unsigned char>(added_[i].content[0])].push_back(static_cast<std::uint32_t>(i));
  }

  void load_model(json_cursor& cursor, const std::string& name) {
    cursor.begin_object("model");
    std::string_view key;
    bool have_vocab = false, have_merges = false;
    std::vector<std::pair<std::string, std::string>> merge_pairs;
    std::string type;
    while (cursor.next_member(key)) {
      const std::string k(key);
      if (k == "vocab") {
        have_vocab = true;
        cursor.begin_object("model.vocab");
        std::string_view token;
        while (cursor.next_member(token)) {
          std::string t(token);
          const std::int64_t id = cursor.read_int("model.vocab");
          if (id < 0 || id > 0x7FFFFFFF) cursor.fail("model.vocab", "id outside [0, 2^31)");
          if (vocab_.size() >= max_entries) cursor.fail("model.vocab", "more than 2^24 entries");
          vocab_[std::move(t)] = static_cast<token_id>(id);
        }
      } else if (k == "merges") {
        have_merges = true;
        cursor.begin_array("model.merges");
        while (cursor.next_element("model.merges")) {
          if (merge_pairs.size() >= max_entries) cursor.fail("model.merges", "more than 2^24 merges");
          if (cursor.peek("model.merges") == json_kind::string) {
            const std::string_view m = cursor.read_string("model.merges");
            const std::size_t sp = m.find(' ');
            if (sp == std::string_view::npos || m.find(' ', sp + 1) != std::string_view::npos)
              cursor.fail("model.merges", "a merge must be two tokens separated by one space");
            merge_pairs.emplace_back(std::string(m.substr(0, sp)), std::string(m.substr(sp + 1)));
          } else {
            cursor.begin_array("model.merges");
            std::string a, b;
            if (!cursor.next_element("model.merges")) cursor.fail("model.merges", "a merge pair needs two tokens");
            a = std::string(cursor.read_string("model.merges"));
            if (!cursor.next_element("model.merges")) cursor.fail("model.merges", "a merge pair needs two tokens");
            b = std::string(cursor.read_string("model.merges"));
            if (cursor.next_element("model.merges")) cursor.fail("model.merges", "a merge pair has exactly two tokens");
            merge_pairs.emplace_back(std::move(a), std::move(b));
          }
        }
      } else {
        const json_value v = json_value::read(cursor, k);
        if (k == "type") {
          if (v.kind() != json_kind::string) throw invalid_argument("tokenizer '" + name + "': model.type must be a string");
          type = v.as_string();
        } else if (k == "dropout" || k == "unk_token" || k == "continuing_subword_prefix" || k == "end_of_word_suffix") {
          require_null_or(&v, name, "model." + k);
        } else if (k == "byte_fallback") {
          if (v.kind() == json_kind::boolean && v.as_bool()) unsupported(name, "model.byte_fallback = true");
        } else if (k == "ignore_merges") {
          ignore_merges_ = v.kind() == json_kind::boolean && v.as_bool();
        }
      }
    }
    if (type != "BPE") unsupported(name, "model type '" + type + "'");
    if (!have_vocab || !have_merges) throw invalid_argument("tokenizer '" + name + "': model needs \"vocab\" and \"merges\"");
    std::size_t slots = 16;
    while (slots < 2 * merge_pairs.size()) slots *= 2;
    merge_table_.assign(slots, merge_slot{empty_key, {0, 0}});
    merge_mask_ = slots - 1;
    for (std::size_t r = 0; r < merge_pairs.size(); ++r) {
      const auto& [a, b] = merge_pairs[r];
      const auto ia = vocab_.find(a), ib = vocab_.find(b), iab = vocab_.find(a + b);
      if (ia == vocab_.end() || ib == vocab_.end() || iab == vocab_.end())
        throw invalid_argument("tokenizer '" + name + "': merge " + std::to_string(r) + " ('" + a + "' '" + b + "') uses a token missing from the vocab");
      const std::uint64_t key = pair_key(ia->second, ib->second);
      std::size_t i = splitmix64_mix(key) & merge_mask_;
      while (merge_table_[i].key != empty_key && merge_table_[i].key != key) i = (i + 1) & merge_mask_;
      if (merge_table_[i].key == empty_key) ++merge_count_;
      merge_table_[i] = {key, {static_cast<std::int32_t>(r), iab->second}};  // a repeated pair: the last wins, as in the package
    }
    const auto map = bpe_detail::byte_to_unicode();
    for (std::size_t b = 0; b < 256; ++b) {
      std::string s;
      bpe_detail::append_utf8(s, map[b]);
      byte_chars_[b] = s;
      const auto it = vocab_.find(s);
      byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
    }
  }

  [[nodiscard]] const merge_target* find_merge(token_id a, token_id b) const noexcept {
    const std::uint64_t key = pair_key(a, b);
    for (std::size_t i = splitmix64_mix(key) & merge_mask_;; i = (i + 1) & merge_mask_) {
      if (merge_table_[i].key == key) return &merge_table_[i].target;
      if (merge_table_[i].key == empty_key) return nullptr;
    }
  }

  void encode_valid(std::string_view text, std::vector<token_id>& out) {
    if (added_.empty()) {
      encode_plain(text, out);
      return;
    }
    // Pass 1: tokens with normalized = false; pass 2 (inside): normalized = true.
    split_added(text, false, out);
  }

  void split_added(std::string_view text, bool normalized, std::vector<token_id>& out) {
    std::size_t start = 0;
    for (std::size_t i = 0; i < text.size();) {
      const added_token* hit = nullptr;
      for (const std::uint32_t k : by_first_byte_[static_cast<unsigned char>(text[i])]) {
        const added_token& a = added_[k];
        if (a.normalized == normalized && text.compare(i, a.content.size(), a.content) == 0) {
          hit = &a;
          break;
        }
      }
      if (hit == nullptr) {
        ++i;
        continue;
      }
      emit_segment(text.substr(start, i - start), normalized, out);
      out.push_back(hit->id);
      i += hit->content.size();
      start = i;
    }
    emit_segment(text.substr(start), normalized, out);
  }

  void emit_segment(std::string_view segment, bool normalized_pass, std::vector<token_id>& out) {
    if (segment.empty()) return;
    if (!normalized_pass)
      split_added(segment, true, out);
    else
      encode_plain(segment, out);
  }

  void encode_plain(std::string_view text, std::vector<token_id>& out) {
    byte_level_split(text, [&](std::string_view piece) { encode_piece(piece, out); });
  }

  void encode_piece(std::string_view piece, std::vector<token_id>& out) {
    const bool cacheable = piece.size() <= max_cached_piece;
    std::uint64_t hash = 0;
    std::size_t slot = 0;
    if (cacheable) {
      if (cache_table_.empty()) cache_table_.assign(2 * cache_capacity, cache_slot{0, 0, 0, 0, 0});
      hash = piece_hash(piece);
      for (slot = hash & (cache_table_.size() - 1); cache_table_[slot].hash != 0; slot = (slot + 1) & (cache_table_.size() - 1)) {
        const cache_slot& c = cache_table_[slot];
        if (c.hash == hash && c.byte_count == piece.size() && std::string_view(cache_bytes_).substr(c.bytes_at, c.byte_count) == piece) {
          out.insert(out.end(), cache_ids_.begin() + c.ids_at, cache_ids_.begin() + c.ids_at + c.id_count);
          return;
        }
      }
    }
    word_.clear();
    if (ignore_merges_) {
      std::string spelled;
      for (char c : piece) spelled += byte_chars_[static_cast<unsigned char>(c)];
      if (const auto it = vocab_.find(spelled); it != vocab_.end()) word_.push_back(it->second);
    }
    if (word_.empty()) merge_word(piece);
    if (cacheable) {
      if (cache_entries_ >= cache_capacity) {  // full: start over
        std::fill(cache_table_.begin(), cache_table_.end(), cache_slot{0, 0, 0, 0, 0});
        cache_bytes_.clear();
        cache_ids_.clear();
        cache_entries_ = 0;
        for (slot = hash & (cache_table_.size() - 1); cache_table_[slot].hash != 0; slot = (slot + 1) & (cache_table_.size() - 1)) {
        }
      }
      cache_table_[slot] = {hash, static_cast<std::uint32_t>(cache_bytes_.size()), static_cast<std::uint32_t>(cache_ids_.size()),
                            static_cast<std::uint16_t>(piece.size()), static_cast<std::uint16_t>(word_.size())};
      cache_bytes_.append(piece);
      cache_ids_.insert(cache_ids_.end(), word_.begin(), word_.end());
      ++cache_entries_;
    }
    out.insert(out.end(), word_.begin(), word_.end());
  }

  // Words of up to `small_word` bytes: the same order of merges (lowest rank, then leftmost)
  // by a scan over an array of pair ranks, cheaper than a heap for short words.
  static constexpr std::size_t small_word = 64;

  void merge_small_word(std::string_view piece) {
    std::array<token_id, small_word> ids{};
    std::array<std::int32_t, small_word> ranks{};
    std::array<token_id, small_word> merged{};
    std::size_t n = 0;
    for (char c : piece) {
      const token_id id = byte_ids_[static_cast<unsigned char>(c)];
      if (id >= 0) ids[n++] = id;  // no unk token: the package drops it
    }
    constexpr std::int32_t none = std::numeric_limits<std::int32_t>::max();
    auto set_pair = [&](std::size_t i) {
      const merge_target* m = find_merge(ids[i], ids[i + 1]);
      ranks[i] = m != nullptr ? m->rank : none;
      merged[i] = m != nullptr ? m->id : 0;
    };
    for (std::size_t i = 0; i + 1 < n; ++i) set_pair(i);
    while (n > 1) {
      std::size_t best = 0;
      for (std::size_t i = 1; i + 1 < n; ++i)
        if (ranks[i] < ranks[best]) best = i;
      if (ranks[best] == none) break;
      ids[best] = merged[best];
      for (std::size_t i = best + 1; i + 1 < n; ++i) {
        ids[i] = ids[i + 1];
        ranks[i] = ranks[i + 1];
        merged[i] = merged[i + 1];
      }
      --n;
      if (best > 0) set_pair(best - 1);
      if (best + 1 < n) set_pair(best);
    }
    word_.insert(word_.end(), ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n));
  }

  void merge_word(std::string_view piece) {
    if (piece.size() <= small_word) {
      merge_small_word(piece);
      return;
    }
    symbols_.clear();
    for (char c : piece) {
      const token_id id = byte_ids_[static_cast<unsigned char>(c)];
      if (id < 0) continue;  // no unk token: the package drops it
      const auto idx = static_cast<std::int32_t>(symbols_.size());
      symbols_.push_back({id, idx - 1, idx + 1, true});
    }
    if (symbols_.empty()) return;
    symbols_.back().next = -1;
    // A min-heap on (rank, position) in a reused vector; a candidate is stale when the
    // pair at its position changed since it was pushed.
    heap_.clear();
    const auto later = [](const candidate& a, const candidate& b) { return a > b; };
    auto candidate_at = [&](std::int32_t pos, candidate& out) {
      const std::int32_t nx = symbols_[static_cast<std::size_t>(pos)].next;
      if (nx < 0) return false;
      const token_id a = symbols_[static_cast<std::size_t>(pos)].id, b = symbols_[static_cast<std::size_t>(nx)].id;
      const merge_target* m = find_merge(a, b);
      if (m == nullptr) return false;
      out = {m->rank, pos, m->id, a, b};
      return true;
    };
    auto push_pair = [&](std::int32_t pos) {
      candidate c{};
      if (!candidate_at(pos, c)) return;
      heap_.push_back(c);
      std::push_heap(heap_.begin(), heap_.end(), later);
    };
    candidate c{};
    for (std::int32_t i = 0; i + 1 < static_cast<std::int32_t>(symbols_.size()); ++i)
      if (candidate_at(i, c)) heap_.push_back(c);
    std::make_heap(heap_.begin(), heap_.end(), later);
    while (!heap_.empty()) {
      std::pop_heap(heap_.begin(), heap_.end(), later);
      const candidate top = heap_.back();
      heap_.pop_back();
      symbol& left = symbols_[static_cast<std::size_t>(top.pos)];
      if (!left.alive || left.next < 0) continue;
      symbol& right = symbols_[static_cast<std::size_t>(left.next)];
      if (left.id != top.left || right.id != top.right) continue;  // stale: the pair changed
      left.id = top.id;
      right.alive = false;
      left.next = right.next;
      if (right.next >= 0) symbols_[static_cast<std::size_t>(right.next)].prev = top.pos;
      if (left.prev >= 0) push_pair(left.prev);
      push_pair(top.pos);
    }
    for (const symbol& s : symbols_)
      if (s.alive) word_.push_back(s.id);
  }

  std::unordered_map<std::string, token_id> vocab_;
  std::vector<merge_slot> merge_table_;
  std::size_t merge_mask_ = 0;
  std::size_t merge_count_ = 0;
  std::vector<added_token> added_;
  std::array<token_id, 256> byte_ids_{};
  std::array<std::string, 256> byte_chars_{};
  bool ignore_merges_ = false;
  std::vector<cache_slot> cache_table_;
  std::string cache_bytes_;
  std::vector<token_id> cache_ids_;
  std::size_t cache_entries_ = 0;
  std::vector<symbol> symbols_;
  std::vector<token_id> word_;
  std::vector<candidate> heap_;
  std::array<std::vector<std::uint32_t>, 256> by_first_byte_{};  // indices into added_
};

}  // namespace hybridcache::sim
