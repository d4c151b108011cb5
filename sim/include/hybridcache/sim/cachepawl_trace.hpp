// hybridcache/sim/cachepawl_trace.hpp
//
// Reader for cachepawl's prompt-length file (codepawl/cachepawl,
// research/avmp/data/sharegpt_prompts.json): one JSON array, pretty-printed over many lines,
//
//   [ {"conversation_id": "AhS7uI8_41", "prompt_tokens": 8, "prompt_chars": 31}, ... ]
//
// `prompt_tokens` is a words x 1.3 proxy of the first human turn of a ShareGPT
// conversation. The file has no outputs, no arrivals and no prefixes: requests get
// `input_tokens = prompt_tokens`, `output_tokens = options.output_tokens`, arrivals at a
// fixed rate (request i at i / requests_per_second) and no ids. For allocator replays and
// length distributions only.
//
// The array is streamed element by element (`json_array_reader`), so only one element is
// in memory. `prompt_tokens` is required (an integer >= 0); `conversation_id` must be a
// string and `prompt_chars` an integer >= 0 when present; other keys are skipped.
// Cost: O(bytes).
#pragma once

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <istream>
#include <string>
#include <string_view>

#include "hybridcache/core/error.hpp"
#include "hybridcache/sim/json.hpp"
#include "hybridcache/sim/line_reader.hpp"
#include "hybridcache/sim/request.hpp"

namespace hybridcache::sim {

/// Streams the elements of a top-level JSON array one at a time, whatever the line layout.
/// Each element's text is returned for parsing with `json_cursor`; the array's brackets and
/// commas are checked here, the elements' syntax by the caller's parse.
class json_array_reader {
 public:
  /// Reads from `in` (which must outlive the reader).
  explicit json_array_reader(std::istream& in) : lines_(in) {}
  /// Opens `path`; throws `invalid_argument` if it cannot be opened.
  explicit json_array_reader(const std::filesystem::path& path) : lines_(path) {}

  /// Sets `element` to the next element's text (valid until the next call) and
  /// `first_line` to the line where it starts; returns false after the closing ']'
  /// (having checked that only whitespace follows). Throws `format_error` on a missing
  /// '[', ',' or ']' or a truncated file.
  bool next(std::string_view& element, std::int64_t& first_line) {
    element_.clear();
    bool in_string = false, escape = false;
    std::int64_t depth = 0;
    for (;;) {
      if (pos_ >= line_.size()) {
        if (state_ == state::in_element) element_ += '\n';
        if (!lines_.next(line_)) {
          if (state_ != state::done) throw format_error(lines_.line_number(), "", "unexpected end of input inside the top-level JSON array");
          return false;
        }
        pos_ = 0;
        continue;
      }
      const char c = line_[pos_];
      const bool space = c == ' ' || c == '\t' || c == '\r' || c == '\n';
      switch (state_) {
        case state::before_array:
          if (!space && c != '[') fail(std::string("expected '[' at the start of the file, found '") + c + "'");
          if (c == '[') state_ = state::first_element;
          ++pos_;
          continue;
        case state::done:
          if (!space) fail(std::string("unexpected '") + c + "' after the end of the top-level array");
          ++pos_;
          continue;
        case state::first_element:
        case state::after_comma:
        case state::after_element:
          if (space) {
            ++pos_;
            continue;
          }
          if (c == ']' && state_ != state::after_comma) {
            state_ = state::done;
            ++pos_;
            continue;
          }
          if (state_ == state::after_element) {
            if (c != ',') fail(std::string("expected ',' or ']' between array elements, found '") + c + "'");
            state_ = state::after_comma;
            ++pos_;
            continue;
          }
          if (c == ']' || c == ',') fail(std::string("expected an array element, found '") + c + "'");
          state_ = state::in_element;
          first_line = lines_.line_number();
          continue;
        case state::in_element:
          if (in_string) {
            element_ += c;
            ++pos_;
            if (escape) {
              escape = false;
            } else if (c == '\\') {
              escape = true;
            } else if (c == '"') {
              in_string = false;
              if (depth == 0) return finish(element);
            }
            continue;
          }
          if (c == '"') {
            in_string = true;
          } else if (c == '{' || c == '[') {
            ++depth;
          } else if (c == '}' || c == ']') {
            if (depth == 0) return finish(element);  // a scalar ended by the closing ']'
            if (--depth == 0) {
              element_ += c;
              ++pos_;
              return finish(element);
            }
          } else if (depth == 0 && (c == ',' || space)) {
            return finish(element);  // a scalar ended by ',' or whitespace
          }
          element_ += c;
          ++pos_;
          continue;
      }
    }
  }

  /// 1-based number of the line being read.
  [[nodiscard]] std::int64_t line_number() const noexcept { return lines_.line_number(); }

 private:
  enum class state { before_array, first_element, after_comma, after_element, in_element, done };

  bool finish(std::string_view& element) {
    state_ = state::after_element;
    element = element_;
    return true;
  }

  [[noreturn]] void fail(const std::string& what) const { throw format_error(lines_.line_number(), "", what); }

  line_reader lines_;
  std::string_view line_;
  std::size_t pos_ = 0;
  state state_ = state::before_array;
  std::string element_;
};

/// How cachepawl prompts become requests.
struct cachepawl_options {
  /// Request i arrives at i / requests_per_second.
  double requests_per_second = 1.0;
  /// Output length given to every request (the file has none).
  std::int64_t output_tokens = 0;
};

/// Streaming reader of cachepawl's prompt-length JSON. Models `request_source`.
class cachepawl_reader {
 public:
  /// Reads from `in` (which must outlive the reader). Throws `invalid_argument` for a
  /// non-positive rate or negative output length.
  explicit cachepawl_reader(std::istream& in, cachepawl_options options = {}) : elements_(in), options_(validated(options)) {}
  /// Opens `path`; throws `invalid_argument` if it cannot be opened.
  explicit cachepawl_reader(const std::filesystem::path& path, cachepawl_options options = {})
      : elements_(path), options_(validated(options)) {}

  /// Reads the next prompt into `r`; false at the end of the array.
  bool next(request& r) {
    std::string_view text;
    std::int64_t line = 0;
    if (!elements_.next(text, line)) return false;
    json_cursor c(text, line);
    std::uint32_t seen = 0;  // bit 0: "prompt_tokens"
    std::int64_t tokens = 0;
    c.begin_object("");
    std::string_view key;
    while (c.next_member(key)) {
      if (key == "prompt_tokens") {
        c.mark_key(seen, 1, key);
        tokens = c.read_int(key);
        if (tokens < 0 || tokens > max_request_tokens)
          c.fail(key, "expected a token count in [0, " + std::to_string(max_request_tokens) + "], got " + std::to_string(tokens));
      } else if (key == "conversation_id") {
        (void)c.read_string(key);
      } else if (key == "prompt_chars") {
        if (c.read_int(key) < 0) c.fail(key, "must be >= 0");
      } else {
        c.skip_value(key);
      }
    }
    c.expect_end();
    if (seen == 0) throw format_error(line, "prompt_tokens", "missing required key");
    r.arrival_s = static_cast<double>(index_++) / options_.requests_per_second;
    if (!(r.arrival_s <= max_arrival_seconds))
      throw format_error(line, "", "arrival time " + format_number(r.arrival_s) + " s exceeds 1e10 s at this request rate");
    r.session_id = -1;
    r.turn_id = -1;
    r.input.clear();
    r.output.clear();
    r.input_tokens = tokens;
    r.output_tokens = options_.output_tokens;
    r.tokens_per_id = 1;
    r.source_line = line;
    return true;
  }

 private:
  static cachepawl_options validated(cachepawl_options o) {
    HYBRIDCACHE_EXPECTS(o.requests_per_second > 0 && std::isfinite(o.requests_per_second), invalid_argument,
                        "cachepawl: requests_per_second must be positive");
    HYBRIDCACHE_EXPECTS(o.output_tokens >= 0, invalid_argument, "cachepawl: output_tokens must be >= 0");
    return o;
  }

  json_array_reader elements_;
  cachepawl_options options_;

 public:
  /// 1-based line of the element last read.
  [[nodiscard]] std::int64_t line_number() const noexcept { return elements_.line_number(); }

 private:
  std::int64_t index_ = 0;
};
static_assert(request_source<cachepawl_reader>);

}  // namespace hybridcache::sim
