// hybridcache/sim/json_value.hpp
//
// `json_value`: a plain tree of a JSON document built on `json_cursor` (json.hpp), for small
// documents (a tokenizer.json's settings, a chat template), tools and tests; `parse_json`
// reads a whole document into one. Long documents are read with the cursor instead.
//
// Cost: O(length of the text) to parse; a tree node per value.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "hybridcache/core/error.hpp"
#include "hybridcache/sim/json.hpp"

namespace hybridcache::sim {

/// A parsed JSON value (a plain tree, for small documents). Object members keep their
/// order; duplicate keys are kept (find returns the first).
class json_value {
 public:
  json_value() = default;

  [[nodiscard]] json_kind kind() const noexcept { return kind_; }
  [[nodiscard]] bool is_null() const noexcept { return kind_ == json_kind::null; }
  /// True for a number written without fraction or exponent that fits int64.
  [[nodiscard]] bool is_integer() const noexcept { return kind_ == json_kind::number && is_integer_; }

  /// The boolean; throws `invalid_argument` for another kind.
  [[nodiscard]] bool as_bool() const {
    check(json_kind::boolean);
    return boolean_;
  }
  /// The integer; throws `invalid_argument` unless `is_integer()`.
  [[nodiscard]] std::int64_t as_int() const {
    HYBRIDCACHE_EXPECTS(is_integer(), invalid_argument, "json value is not an integer");
    return integer_;
  }
  /// Any number as a double.
  [[nodiscard]] double as_double() const {
    check(json_kind::number);
    return number_;
  }
  /// The decoded UTF-8 string.
  [[nodiscard]] const std::string& as_string() const {
    check(json_kind::string);
    return string_;
  }
  /// The elements of an array.
  [[nodiscard]] const std::vector<json_value>& as_array() const {
    check(json_kind::array);
    return elements_;
  }
  /// The members of an object, in order.
  [[nodiscard]] const std::vector<std::pair<std::string, json_value>>& as_object() const {
    check(json_kind::object);
    return members_;
  }
  /// The first member named `key`, or nullptr (also for non-objects).
  [[nodiscard]] const json_value* find(std::string_view key) const noexcept {
    if (kind_ != json_kind::object) return nullptr;
    for (const auto& [k, v] : members_)
      if (k == key) return &v;
    return nullptr;
  }

  /// Reads one value at the cursor (recursively; depth bounded by the cursor).
  static json_value read(json_cursor& cursor, std::string_view field) {
    json_value v;
    v.kind_ = cursor.peek(field);
    switch (v.kind_) {
      case json_kind::null: cursor.read_null(field); break;
      case json_kind::boolean: v.boolean_ = cursor.read_bool(field); break;
      case json_kind::string: v.string_ = std::string(cursor.read_string(field)); break;
      case json_kind::number: {
        // Integers keep their exact value; every number also gets its double.
        const std::size_t start = cursor.offset();
        const std::string_view token = cursor.read_number_token(field);
        v.is_integer_ = json_cursor::parse_int(token, v.integer_);
        if (!json_cursor::parse_double(token, v.number_)) cursor.fail_at(start, field, "number " + std::string(token) + " overflows a double");
        break;
      }
      case json_kind::array:
        cursor.begin_array(field);
        while (cursor.next_element(field)) v.elements_.push_back(read(cursor, field));
        break;
      case json_kind::object: {
        cursor.begin_object(field);
        std::string_view key;
        while (cursor.next_member(key)) {
          std::string name(key);
          json_value member = read(cursor, name);
          v.members_.emplace_back(std::move(name), std::move(member));
        }
        break;
      }
    }
    return v;
  }

 private:
  void check(json_kind expected) const {
    HYBRIDCACHE_EXPECTS(kind_ == expected, invalid_argument, "json value has another kind than the one asked for");
  }

  json_kind kind_ = json_kind::null;
  bool boolean_ = false;
  bool is_integer_ = false;
  std::int64_t integer_ = 0;
  double number_ = 0.0;
  std::string string_;
  std::vector<json_value> elements_;
  std::vector<std::pair<std::string, json_value>> members_;
};

/// Parses a whole document (one value, then only whitespace). Throws `format_error`.
[[nodiscard]] inline json_value parse_json(std::string_view text, std::int64_t first_line = 1) {
  json_cursor cursor(text, first_line);
  json_value v = json_value::read(cursor, "");
  cursor.expect_end();
  return v;
}

}  // namespace hybridcache::sim
