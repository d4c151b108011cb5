// hybridcache/sim/marconi_trace.hpp
//
// Reader for the Marconi reference simulator's JSONL traces (and synth-v1 files, which use
// the same schema). One request per line:
//
//   {"session_id": 0, "turn_id": 0, "ts": 62.345, "num_input_tokens": 814,
//    "num_output_tokens": 557, "input_tokens": [...], "output_tokens": [...]}
//
// `ts` is in seconds; `input_tokens` is the whole history plus the new user turn. All seven
// keys are required, each once; other keys are skipped. The counts must equal the array
// lengths, token ids must fit int32 (negative ids are accepted: they are the unique ids
// other readers synthesize, e.g. Mooncake decode blocks), `ts` must be finite, >= 0 and non-decreasing
// (the replay consumes requests in file order, as the reference does). Blank lines are
// skipped. Any violation throws `format_error` naming the line and the key.
//
// Cost: O(line bytes) per request, no allocation once the request's vectors are warm.
//
// `append_marconi_jsonl` writes any id-carrying request in this format (as Python's
// json.dump would), so a trace from another reader (ShareGPT, Mooncake at some B) can be fed
// to the Marconi reference simulator for side-by-side runs.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <istream>
#include <limits>
#include <ostream>
#include <string>
#include <string_view>

#include "hybridcache/core/error.hpp"
#include "hybridcache/sim/json.hpp"
#include "hybridcache/sim/line_reader.hpp"
#include "hybridcache/sim/python_float.hpp"
#include "hybridcache/sim/request.hpp"

namespace hybridcache::sim {

/// Streaming reader of Marconi-format JSONL. Models `request_source`.
class marconi_reader {
 public:
  /// Reads from `in` (which must outlive the reader).
  explicit marconi_reader(std::istream& in) : lines_(in) {}
  /// Opens `path`; throws `invalid_argument` if it cannot be opened.
  explicit marconi_reader(const std::filesystem::path& path) : lines_(path) {}

  /// Reads the next request into `r`; false at the end of the file.
  bool next(request& r) {
    std::string_view line;
    if (!lines_.next_nonblank(line)) return false;
    parse(line, lines_.line_number(), r);
    return true;
  }

  /// 1-based line of the request last read.
  [[nodiscard]] std::int64_t line_number() const noexcept { return lines_.line_number(); }

 private:
  void parse(std::string_view text, std::int64_t line, request& r) {
    enum : unsigned { k_session = 1, k_turn = 2, k_ts = 4, k_num_in = 8, k_num_out = 16, k_in = 32, k_out = 64, k_all = 127 };
    json_cursor c(text, line);
    std::uint32_t seen = 0;
    std::int64_t num_input = 0, num_output = 0;
    auto mark = [&](std::uint32_t bit, std::string_view key) { c.mark_key(seen, bit, key); };
    c.begin_object("");
    std::string_view key;
    while (c.next_member(key)) {
      if (key == "session_id") {
        mark(k_session, key);
        r.session_id = c.read_int(key);
      } else if (key == "turn_id") {
        mark(k_turn, key);
        r.turn_id = c.read_int(key);
      } else if (key == "ts") {
        mark(k_ts, key);
        r.arrival_s = c.read_double(key);
        if (!(r.arrival_s >= 0.0) || !(r.arrival_s <= max_arrival_seconds))
          c.fail(key, "expected a time in seconds in [0, 1e10], got " + format_number(r.arrival_s));
      } else if (key == "num_input_tokens") {
        mark(k_num_in, key);
        num_input = c.read_int(key);
        if (num_input < 0 || num_input > max_request_tokens)
          c.fail(key, "expected a token count in [0, " + std::to_string(max_request_tokens) + "], got " + std::to_string(num_input));
      } else if (key == "num_output_tokens") {
        mark(k_num_out, key);
        num_output = c.read_int(key);
        if (num_output < 0 || num_output > max_request_tokens)
          c.fail(key, "expected a token count in [0, " + std::to_string(max_request_tokens) + "], got " + std::to_string(num_output));
      } else if (key == "input_tokens") {
        mark(k_in, key);
        c.read_int_array(key, r.input);
      } else if (key == "output_tokens") {
        mark(k_out, key);
        c.read_int_array(key, r.output);
      } else {
        c.skip_value(key);
      }
    }
    c.expect_end();
    if (static_cast<std::int64_t>(r.input.size()) > max_request_tokens || static_cast<std::int64_t>(r.output.size()) > max_request_tokens)
      throw format_error(line, r.input.size() > r.output.size() ? "input_tokens" : "output_tokens",
                         "more than " + std::to_string(max_request_tokens) + " ids");
    if (seen != k_all)
      json_cursor::require_keys(line, seen, {"session_id", "turn_id", "ts", "num_input_tokens", "num_output_tokens", "input_tokens", "output_tokens"});
    if (num_input != static_cast<std::int64_t>(r.input.size()))
      throw format_error(line, "num_input_tokens",
                         std::to_string(num_input) + " does not match the " + std::to_string(r.input.size()) + " ids in input_tokens");
    if (num_output != static_cast<std::int64_t>(r.output.size()))
      throw format_error(line, "num_output_tokens",
                         std::to_string(num_output) + " does not match the " + std::to_string(r.output.size()) + " ids in output_tokens");
    if (r.arrival_s < last_arrival_s_)
      throw format_error(line, "ts", "timestamps go backwards (" + std::to_string(r.arrival_s) + " s after " + std::to_string(last_arrival_s_) + " s)");
    last_arrival_s_ = r.arrival_s;
    r.input_tokens = num_input;
    r.output_tokens = num_output;
    r.tokens_per_id = 1;
    r.source_line = line;
  }

  line_reader lines_;
  double last_arrival_s_ = 0.0;
};
static_assert(request_source<marconi_reader>);

/// Appends `r` as one Marconi JSONL line (keys in the reference's order, separators
/// ", " and ": ", `ts` as Python's repr of `arrival_s`), then '\n'. Session and turn ids
/// of -1 are written as they are. Throws `invalid_argument` for a request without ids
/// (a length-only format) whose input is not empty, since the format needs the ids.
inline void append_marconi_jsonl(std::string& out, const request& r) {
  HYBRIDCACHE_EXPECTS(r.has_ids(), invalid_argument, "marconi JSONL needs token ids; this request has lengths only");
  auto append_int = [&out](std::int64_t v) {
    char buffer[24];
    out.append(buffer, std::to_chars(buffer, buffer + sizeof buffer, v).ptr);
  };
  auto append_ids = [&](const std::vector<token_id>& ids) {
    out += '[';
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (i != 0) out += ", ";
      append_int(ids[i]);
    }
    out += ']';
  };
  out += "{\"session_id\": ";
  append_int(r.session_id);
  out += ", \"turn_id\": ";
  append_int(r.turn_id);
  out += ", \"ts\": ";
  append_python_float_repr(out, r.arrival_s);
  out += ", \"num_input_tokens\": ";
  append_int(static_cast<std::int64_t>(r.input.size()));
  out += ", \"num_output_tokens\": ";
  append_int(static_cast<std::int64_t>(r.output.size()));
  out += ", \"input_tokens\": ";
  append_ids(r.input);
  out += ", \"output_tokens\": ";
  append_ids(r.output);
  out += "}\n";
}

/// Writes every request of `source` as Marconi JSONL to `out`, one line at a time; returns
/// the number of requests written.
template <request_source S>
std::int64_t write_marconi_jsonl(std::ostream& out, S& source) {
  request r;
  std::string line;
  std::int64_t n = 0;
  while (source.next(r)) {
    line.clear();
    append_marconi_jsonl(line, r);
    out.write(line.data(), static_cast<std::streamsize>(line.size()));
    ++n;
  }
  return n;
}

}  // namespace hybridcache::sim
