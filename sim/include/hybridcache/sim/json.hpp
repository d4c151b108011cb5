// hybridcache/sim/json.hpp
//
// A small, strict JSON reader (RFC 8259) for trace lines, standard library only.
//
// Two layers:
//   json_cursor  a pull parser over one document in memory (one JSONL line, or one
//                element of a streamed array). Readers walk it in schema order
//                (`begin_object`, `next_member`, `read_int`, `read_id_array`, ...), so a
//                line of 30,000 token ids is parsed straight into a reused vector with no
//                intermediate tree. Every error throws `format_error(line, field, what)`
//                with the field the caller was reading and the column.
//   json_value   a plain tree built on the cursor (`parse_json`), for small documents,
//                tools and tests: json_value.hpp.
//
// Strictness: numbers follow the JSON grammar (no leading zeros, `+`, `.5`, `1.`, NaN);
// integers must fit int64; strings must not contain raw control characters; escapes
// include \uXXXX with UTF-16 surrogate pairs (decoded to UTF-8; an unpaired surrogate is
// an error); nesting deeper than 256 levels is an error (bounds recursion). Invalid UTF-8
// bytes inside strings are passed through unchanged (not validated, for speed).
//
// Cost: O(length of the text); `json_cursor` allocates only when a string or key
// contains escapes (into a reused buffer).
#pragma once

#include <array>
#include <bit>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "hybridcache/core/error.hpp"

namespace hybridcache::sim {

/// A double for an error message: "%g" ("1e+30", "inf", "nan").
[[nodiscard]] inline std::string format_number(double v) {
  char b[40];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

/// The kind of a JSON value.
enum class json_kind { null, boolean, number, string, array, object };

/// Pull parser over one JSON document held in memory.
class json_cursor {
 public:
  /// Deepest nesting of arrays and objects accepted.
  static constexpr int max_depth = 256;

  /// Parses `text`; `first_line` is the 1-based line of text[0] in its file (errors add
  /// the newlines before the failing column, so multi-line documents report exact lines).
  explicit json_cursor(std::string_view text, std::int64_t first_line = 1) noexcept
      : text_(text), first_line_(first_line) {}

  /// Kind of the next value (after whitespace). Throws at the end of input or on a
  /// character that cannot start a value.
  [[nodiscard]] json_kind peek(std::string_view field) {
    skip_ws();
    if (pos_ >= text_.size()) fail(field, "unexpected end of input, expected a value");
    switch (text_[pos_]) {
      case '{': return json_kind::object;
      case '[': return json_kind::array;
      case '"': return json_kind::string;
      case 't':
      case 'f': return json_kind::boolean;
      case 'n': return json_kind::null;
      default:
        if (text_[pos_] == '-' || (text_[pos_] >= '0' && text_[pos_] <= '9')) return json_kind::number;
        fail(field, "unexpected character " + describe(text_[pos_]) + ", expected a value");
    }
  }

  /// Consumes '{'; then call `next_member` until it returns false.
  void begin_object(std::string_view field) { open('{', field, "an object"); }

  /// Reads the next member's key (after the separating comma) and its ':'; the caller
  /// then reads or skips the value. Returns false (consuming '}') at the end of the
  /// object. The key view is valid until the next call that reads a key or string.
  [[nodiscard]] bool next_member(std::string_view& key) {
    if (!continue_container('}', "object", "")) return false;
    skip_ws();
    if (pos_ >= text_.size() || text_[pos_] != '"') fail("", "expected a member name (a string)" + found());
    key = parse_string("", key_scratch_);
    skip_ws();
    if (pos_ >= text_.size() || text_[pos_] != ':') fail(key, "expected ':' after the member name" + found());
    ++pos_;
    return true;
  }

  /// Consumes '['; then call `next_element` before each element until it returns false.
  void begin_array(std::string_view field) { open('[', field, "an array"); }

  /// True when another element follows (its comma consumed); false (consuming ']') at the
  /// end of the array. `field` names the array in errors.
  [[nodiscard]] bool next_element(std::string_view field = "") { return continue_container(']', "array", field); }

  /// Reads a number and returns its text, checked against the JSON grammar.
  [[nodiscard]] std::string_view read_number_token(std::string_view field) { return scan_number(field); }

  /// Reads an integer that fits int64. A number with a fraction or exponent is an error.
  [[nodiscard]] std::int64_t read_int(std::string_view field) {
    const std::size_t start = (skip_ws(), pos_);
    const std::string_view token = scan_number(field);
    std::int64_t value = 0;
    if (!parse_int(token, value)) {
      if (token.find_first_of(".eE") != std::string_view::npos) fail_at(start, field, "expected an integer, got " + std::string(token));
      fail_at(start, field, "integer " + std::string(token) + " does not fit in 64 bits");
    }
    return value;
  }

  /// Reads any number as a double (correctly rounded). Throws when its magnitude overflows
  /// a double; a number too small for a double reads as zero of its sign.
  [[nodiscard]] double read_double(std::string_view field) {
    const std::size_t start = (skip_ws(), pos_);
    const std::string_view token = scan_number(field);
    double value = 0;
    if (!parse_double(token, value)) fail_at(start, field, "number " + std::string(token) + " overflows a double");
    return value;
  }

  /// Integer value of a grammar-checked number token; false when it has a fraction or
  /// exponent or does not fit int64.
  static bool parse_int(std::string_view token, std::int64_t& value) noexcept {
    if (token.find_first_of(".eE") != std::string_view::npos) return false;
    const auto [ptr, ec] = std::from_chars(token.data(), token.data() + token.size(), value);
    return ec == std::errc{} && ptr == token.data() + token.size();
  }

  /// Double value of a grammar-checked number token; false when it overflows a double.
  static bool parse_double(std::string_view token, double& value) noexcept {
    const auto [ptr, ec] = std::from_chars(token.data(), token.data() + token.size(), value);
    if (ec != std::errc::result_out_of_range) return ec == std::errc{} && ptr == token.data() + token.size();
    // Out of range: overflow when the decimal magnitude is positive, else underflow to 0.
    const bool negative = token.front() == '-';
    const std::size_t e_at = token.find_first_of("eE");
    const std::string_view mantissa = token.substr(negative ? 1 : 0, e_at == std::string_view::npos ? std::string_view::npos : e_at - (negative ? 1 : 0));
    long long exponent = 0;
    if (e_at != std::string_view::npos) {
      std::string_view digits = token.substr(e_at + 1);
      const bool negative_exponent = !digits.empty() && digits.front() == '-';
      if (!digits.empty() && (digits.front() == '-' || digits.front() == '+')) digits.remove_prefix(1);
      // Saturate: anything beyond 10^9 digits is decided by the sign alone.
      for (char c : digits) exponent = exponent > 1'000'000'000 ? exponent : exponent * 10 + (c - '0');
      if (negative_exponent) exponent = -exponent;
    }
    const std::size_t point = mantissa.find('.');
    const std::string_view integer_part = mantissa.substr(0, point);
    long long magnitude = 0;  // decimal position of the first significant digit
    if (integer_part != "0") {
      magnitude = static_cast<long long>(integer_part.size());
    } else if (point != std::string_view::npos) {
      const std::string_view fraction = mantissa.substr(point + 1);
      const std::size_t first = fraction.find_first_not_of('0');
      if (first == std::string_view::npos) {
        value = negative ? -0.0 : 0.0;
        return true;
      }
      magnitude = -static_cast<long long>(first);
    }
    if (magnitude + exponent > 0) return false;
    value = negative ? -0.0 : 0.0;
    return true;
  }

  /// Reads a string, escapes decoded to UTF-8. The view is valid until the next string or
  /// key is read.
  [[nodiscard]] std::string_view read_string(std::string_view field) {
    skip_ws();
    if (pos_ >= text_.size() || text_[pos_] != '"') fail(field, "expected a string" + found());
    return parse_string(field, string_scratch_);
  }

  /// Fast path for a long object whose members are plain keys (no escape) with small
  /// non-negative integer values (a tokenizer's vocabulary). Call after `begin_object` or
  /// after a member: calls `member(key, value)` for each such member, the key a view of the
  /// text; returns true at the end of the object (consumed), or false before the first
  /// member of another shape (or any malformed input), the cursor unchanged from there, so
  /// that `next_member` reads it (and reports errors) and this can be called again after.
  template <class Member>
  bool plain_int_members(Member&& member) {
    for (;;) {
      const std::size_t at = pos_;
      bool& first = first_[static_cast<std::size_t>(depth_ - 1)];
      if (closes('}')) return true;
      std::string_view key;
      std::int64_t value = 0;
      if (!separated(first) || !plain_string(key) || !(skip_ws(), consume_char(':')) || !(skip_ws(), scan_small_non_negative(value))) {
        pos_ = at;
        return false;
      }
      first = false;
      member(key, value);
    }
  }

  /// Fast path for a long array whose elements are plain strings (no escape) or arrays of
  /// two plain strings (a tokenizer's merges, in either form). Call after `begin_array` or
  /// after an element: calls `one(s)` for a string element and `two(a, b)` for a pair;
  /// returns true at the end of the array (consumed), or false before the first element of
  /// another shape (the cursor unchanged from there: read it with `next_element`).
  template <class One, class Two>
  bool plain_string_elements(One&& one, Two&& two) {
    for (;;) {
      const std::size_t at = pos_;
      bool& first = first_[static_cast<std::size_t>(depth_ - 1)];
      if (closes(']')) return true;
      std::string_view a, b;
      if (!separated(first)) {
        pos_ = at;
        return false;
      }
      if (plain_string(a)) {
        one(a);
      } else if (consume_char('[') && (skip_ws(), plain_string(a)) && (skip_ws(), consume_char(',')) && (skip_ws(), plain_string(b)) &&
                 (skip_ws(), consume_char(']'))) {
        two(a, b);
      } else {
        pos_ = at;
        return false;
      }
      first = false;
    }
  }

  /// Reads `true` or `false`.
  [[nodiscard]] bool read_bool(std::string_view field) {
    skip_ws();
    if (consume_literal("true")) return true;
    if (consume_literal("false")) return false;
    fail(field, "expected true or false" + found());
  }

  /// Reads `null`.
  void read_null(std::string_view field) {
    skip_ws();
    if (!consume_literal("null")) fail(field, "expected null" + found());
  }

  /// Reads an array of integers into `out` (cleared first), each in [lo, hi]. The fast
  /// path for token-id and hash-id lists.
  template <class Int>
  void read_int_array(std::string_view field, std::vector<Int>& out, std::int64_t lo = std::numeric_limits<Int>::min(),
                      std::int64_t hi = std::numeric_limits<Int>::max()) {
    out.clear();
    begin_array(field);
    skip_ws();
    if (pos_ < text_.size() && text_[pos_] == ']') {
      ++pos_;
      --depth_;
      return;
    }
    for (;;) {
      skip_ws();
      const std::size_t start = pos_;
      std::int64_t v = 0;
      if (!scan_small_non_negative(v)) v = read_int(field);  // the general path (and its errors)
      if (v < lo || v > hi)
        fail_at(start, field, "element " + std::to_string(out.size()) + " = " + std::to_string(v) + " is outside [" + std::to_string(lo) + ", " +
                                  std::to_string(hi) + "]");
      out.push_back(static_cast<Int>(v));
      skip_ws();
      if (pos_ < text_.size() && text_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < text_.size() && text_[pos_] == ']') {
        ++pos_;
        --depth_;
        return;
      }
      fail(field, "expected ',' or ']' in array" + found());
    }
  }

  /// Skips one value of any kind, checking its syntax. `field` (named in errors) may be a
  /// key `next_member` unescaped into the cursor's buffers: the nested keys and strings
  /// skipped here reuse those buffers, so such a name is copied first (only escaped keys
  /// are; a plain key is a view of the document).
  void skip_value(std::string_view field) {
    if (in_scratch(field)) {
      const std::string stable(field);
      skip_value_named(stable);
    } else {
      skip_value_named(field);
    }
  }

  /// Checks that only whitespace remains.
  void expect_end() {
    skip_ws();
    if (pos_ != text_.size()) fail("", "unexpected " + describe(text_[pos_]) + " after the end of the JSON value");
  }

  /// Throws `format_error` at the current position.
  [[noreturn]] void fail(std::string_view field, const std::string& what) const { fail_at(pos_, field, what); }

  /// The duplicate-key rule of every reader: sets bit `key` of `seen` (the keys of the
  /// object being read), or fails with "duplicate key" at `field` when it is set already.
  /// `field` is a string, or a callable making one (so a path is built only for the error).
  template <class Field>
  void mark_key(std::uint32_t& seen, std::uint32_t key, const Field& field) const {
    if ((seen & key) != 0) {
      if constexpr (std::is_invocable_v<const Field&>)
        fail(field(), "duplicate key");
      else
        fail(field, "duplicate key");
    }
    seen |= key;
  }

  /// The required-key rule: throws `format_error(line, names[i], "missing required key")`
  /// for the first i whose bit 1 << i is not set in `seen`.
  static void require_keys(std::int64_t line, std::uint32_t seen, std::initializer_list<std::string_view> names) {
    std::uint32_t bit = 1;
    for (const std::string_view name : names) {
      if ((seen & bit) == 0) throw format_error(line, std::string(name), "missing required key");
      bit <<= 1;
    }
  }

  /// Byte offset of the cursor in the text.
  [[nodiscard]] std::size_t offset() const noexcept { return pos_; }

  /// Throws `format_error` for byte offset `at` (line and column computed from the text).
  [[noreturn]] void fail_at(std::size_t at, std::string_view field, const std::string& what) const {
    std::int64_t line = first_line_;
    std::size_t line_start = 0;
    for (std::size_t i = 0; i < at && i < text_.size(); ++i)
      if (text_[i] == '\n') {
        ++line;
        line_start = i + 1;
      }
    throw format_error(line, std::string(field), what + " (column " + std::to_string(at - line_start + 1) + ")");
  }

 private:

  static std::string describe(char c) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7F) {
      static constexpr char hex[] = "0123456789abcdef";
      const auto u = static_cast<unsigned char>(c);
      return std::string("byte 0x") + hex[u >> 4] + hex[u & 0xF];
    }
    return std::string("'") + c + "'";
  }

  [[nodiscard]] std::string found() const {
    if (pos_ >= text_.size()) return ", found the end of input";
    return ", found " + describe(text_[pos_]);
  }

  void skip_ws() noexcept {
    // Pretty-printed files (tokenizer.json: 159k lines) indent every entry: the spaces of a
    // word go at once (the first byte that is not a space found by xor and a bit count).
    if constexpr (std::endian::native == std::endian::little) {
      constexpr std::uint64_t spaces = 0x2020202020202020ULL;
      while (pos_ + 8 <= text_.size()) {
        std::uint64_t w;
        std::memcpy(&w, text_.data() + pos_, 8);
        const std::uint64_t x = w ^ spaces;
        if (x == 0) {
          pos_ += 8;
          continue;
        }
        pos_ += static_cast<std::size_t>(std::countr_zero(x)) / 8;
        const char c = text_[pos_];
        if (c != '\t' && c != '\n' && c != '\r') return;
        ++pos_;
      }
    }
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r') return;
      ++pos_;
    }
  }

  // Inside a string: moves to the first '"', '\\' or control byte, 8 bytes at a time (each
  // flagged by the high bit of its byte in `stop`; the lowest flag is exact, so its byte is
  // the first), or to within 8 bytes of the end (the caller's byte loop goes on from there).
  void skip_plain_string_bytes() noexcept {
    if constexpr (std::endian::native == std::endian::little) {
      constexpr std::uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
      while (pos_ + 8 <= text_.size()) {
        std::uint64_t w;
        std::memcpy(&w, text_.data() + pos_, 8);
        const std::uint64_t q = w ^ (ones * '"'), b = w ^ (ones * '\\');
        const std::uint64_t stop = ((q - ones) & ~q) | ((b - ones) & ~b) | ((w - ones * 0x20) & ~w);
        if ((stop & highs) != 0) {
          pos_ += static_cast<std::size_t>(std::countr_zero(stop & highs)) / 8;
          return;
        }
        pos_ += 8;
      }
    }
  }

  // Skips whitespace and, at `close`, consumes it and leaves the container: true.
  bool closes(char close) noexcept {
    skip_ws();
    if (pos_ >= text_.size() || text_[pos_] != close) return false;
    ++pos_;
    --depth_;
    return true;
  }

  // Before a member or element after `closes` found none: its ',' (unless `first`) and the
  // whitespace after it.
  bool separated(bool first) noexcept {
    if (!first && !consume_char(',')) return false;
    skip_ws();
    return true;
  }

  bool consume_char(char c) noexcept {
    if (pos_ >= text_.size() || text_[pos_] != c) return false;
    ++pos_;
    return true;
  }

  // At a '"': reads a string without escapes or control bytes as a view of the text and
  // returns true; returns false (position unspecified: the caller restores it) otherwise.
  bool plain_string(std::string_view& out) noexcept {
    if (pos_ >= text_.size() || text_[pos_] != '"') return false;
    const std::size_t start = ++pos_;
    skip_plain_string_bytes();
    while (pos_ < text_.size()) {
      const auto c = static_cast<unsigned char>(text_[pos_]);
      if (c == '"') {
        out = text_.substr(start, pos_ - start);
        ++pos_;
        return true;
      }
      if (c == '\\' || c < 0x20) return false;
      ++pos_;
    }
    return false;
  }

  bool consume_literal(std::string_view literal) noexcept {
    if (text_.substr(pos_, literal.size()) != literal) return false;
    pos_ += literal.size();
    return true;
  }

  void open(char bracket, std::string_view field, const char* what) {
    skip_ws();
    if (pos_ >= text_.size() || text_[pos_] != bracket) fail(field, std::string("expected ") + what + found());
    if (depth_ >= max_depth) fail(field, "nesting deeper than " + std::to_string(max_depth) + " levels");
    ++pos_;
    first_[static_cast<std::size_t>(depth_++)] = true;
  }

  // Between elements: consumes ',' or the closing bracket. Returns false at the close.
  bool continue_container(char close, const char* what, std::string_view field) {
    skip_ws();
    if (pos_ >= text_.size()) fail(field, std::string("unexpected end of input in ") + what);
    auto& first = first_[static_cast<std::size_t>(depth_ - 1)];
    if (pos_ < text_.size() && text_[pos_] == close) {
      ++pos_;
      --depth_;
      return false;
    }
    if (!first) {
      if (pos_ >= text_.size() || text_[pos_] != ',')
        fail(field, std::string("expected ',' or '") + close + "' in " + what + found());
      ++pos_;
      skip_ws();
      if (pos_ < text_.size() && text_[pos_] == close) fail(field, std::string("trailing comma in ") + what);
    }
    first = false;
    return true;
  }

  // Fast path for the common token id: a non-negative integer of at most 18 digits with
  // no fraction or exponent. Leaves the cursor unchanged and returns false otherwise.
  bool scan_small_non_negative(std::int64_t& value) noexcept {
    std::size_t p = pos_;
    const std::size_t n = text_.size();
    auto digit = [&](std::size_t i) { return i < n && text_[i] >= '0' && text_[i] <= '9'; };
    if (!digit(p)) return false;
    std::int64_t v = 0;
    if (text_[p] == '0') {
      ++p;
      if (digit(p)) return false;
    } else {
      int digits = 0;
      while (digit(p) && digits < 18) {
        v = v * 10 + (text_[p++] - '0');
        ++digits;
      }
      if (digit(p)) return false;
    }
    if (p < n && (text_[p] == '.' || text_[p] == 'e' || text_[p] == 'E')) return false;
    pos_ = p;
    value = v;
    return true;
  }

  std::string_view scan_number(std::string_view field) {
    skip_ws();
    const std::size_t start = pos_;
    auto digit = [this] { return pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9'; };
    if (pos_ < text_.size() && text_[pos_] == '-') ++pos_;
    if (!digit()) fail(field, "expected a number" + found());
    if (text_[pos_] == '0') {
      ++pos_;
      if (digit()) fail_at(start, field, "number with a leading zero");
    } else {
      while (digit()) ++pos_;
    }
    if (pos_ < text_.size() && text_[pos_] == '.') {
      ++pos_;
      if (!digit()) fail(field, "expected a digit after the decimal point" + found());
      while (digit()) ++pos_;
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
      if (!digit()) fail(field, "expected a digit in the exponent" + found());
      while (digit()) ++pos_;
    }
    return text_.substr(start, pos_ - start);
  }

  static int hex_value(char c) noexcept {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  std::uint32_t parse_hex4(std::string_view field) {
    if (pos_ + 4 > text_.size()) fail(field, "truncated \\u escape");
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const int h = hex_value(text_[pos_ + static_cast<std::size_t>(i)]);
      if (h < 0) fail_at(pos_ + static_cast<std::size_t>(i), field, "invalid hex digit in \\u escape");
      v = v * 16 + static_cast<std::uint32_t>(h);
    }
    pos_ += 4;
    return v;
  }

  static void append_utf8(std::string& out, std::uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  // skip_value with a name that no nested read can overwrite.
  void skip_value_named(std::string_view field) {
    switch (peek(field)) {
      case json_kind::object: {
        begin_object(field);
        std::string_view key;
        while (next_member(key)) skip_value(key);
        return;
      }
      case json_kind::array:
        begin_array(field);
        while (next_element(field)) skip_value(field);
        return;
      case json_kind::string: (void)read_string(field); return;
      case json_kind::boolean: (void)read_bool(field); return;
      case json_kind::null: read_null(field); return;
      case json_kind::number: (void)scan_number(field); return;
    }
  }

  [[nodiscard]] bool in_scratch(std::string_view s) const noexcept {
    const auto inside = [&](const std::string& b) {
      return !s.empty() && std::less_equal<>{}(b.data(), s.data()) && std::less<>{}(s.data(), b.data() + b.capacity() + 1);
    };
    return inside(key_scratch_) || inside(string_scratch_);
  }

  // At the opening quote. Returns a view of the text itself when there is no escape.
  std::string_view parse_string(std::string_view field, std::string& scratch) {
    const std::size_t start = ++pos_;
    skip_plain_string_bytes();
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c == '"') return text_.substr(start, pos_++ - start);
      if (c == '\\') break;
      if (static_cast<unsigned char>(c) < 0x20) fail(field, "raw control character " + describe(c) + " in a string");
      ++pos_;
    }
    if (pos_ >= text_.size()) fail_at(start - 1, field, "unterminated string");
    scratch.assign(text_.data() + start, pos_ - start);
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c == '"') {
        ++pos_;
        return scratch;
      }
      if (static_cast<unsigned char>(c) < 0x20) fail(field, "raw control character " + describe(c) + " in a string");
      if (c != '\\') {
        scratch += c;
        ++pos_;
        continue;
      }
      const std::size_t escape_at = pos_++;
      if (pos_ >= text_.size()) break;
      switch (text_[pos_++]) {
        case '"': scratch += '"'; break;
        case '\\': scratch += '\\'; break;
        case '/': scratch += '/'; break;
        case 'b': scratch += '\b'; break;
        case 'f': scratch += '\f'; break;
        case 'n': scratch += '\n'; break;
        case 'r': scratch += '\r'; break;
        case 't': scratch += '\t'; break;
        case 'u': {
          std::uint32_t cp = parse_hex4(field);
          if (cp >= 0xDC00 && cp <= 0xDFFF) fail_at(escape_at, field, "unpaired low surrogate in \\u escape");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (pos_ + 2 > text_.size() || text_[pos_] != '\\' || text_[pos_ + 1] != 'u')
              fail_at(escape_at, field, "unpaired high surrogate in \\u escape");
            pos_ += 2;
            const std::uint32_t low = parse_hex4(field);
            if (low < 0xDC00 || low > 0xDFFF) fail_at(escape_at, field, "high surrogate not followed by a low surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          append_utf8(scratch, cp);
          break;
        }
        default: fail_at(escape_at, field, "invalid escape \\" + std::string(1, text_[pos_ - 1]));
      }
    }
    fail_at(start - 1, field, "unterminated string");
  }

  std::string_view text_;
  std::int64_t first_line_;
  std::size_t pos_ = 0;
  int depth_ = 0;
  std::array<bool, max_depth> first_{};
  std::string key_scratch_;
  std::string string_scratch_;
};

}  // namespace hybridcache::sim
