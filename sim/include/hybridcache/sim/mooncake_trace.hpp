// hybridcache/sim/mooncake_trace.hpp
//
// Reader for Mooncake's FAST'25 traces (kvcache-ai/Mooncake, FAST25-release/traces):
//
//   {"timestamp": 27, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, ...]}
//
// `timestamp` is in ms; `hash_ids` has one id per 512-token block of the input
// (ceil(input_length / 512) of them, the last block partial), and ids are chained hashes,
// so equal ids mean an equal prefix. The trace has no token ids and no sessions.
//
// Block granularity. The replay runs on ids that each stand for B tokens (B = the engine
// block size, a divisor of 512; `request::tokens_per_id` = B). Each 512-token id h expands
// into the 512/B child ids h * (512/B) + j, j = 0, 1, ...; the request keeps the first
// ceil(input_length / B) of them, so the partial last block yields only the children that
// hold tokens. The map (h, j) -> h * (512/B) + j is injective, so different parents never
// share a child, and equal prefixes of parents give equal prefixes of children: hits stay
// block-aligned and the prefix structure is exactly the trace's.
//
// Output. Decode blocks have no ids in the trace; they are unique by definition. With
// `synthesize_output_ids` the reader gives each request ceil(output_length / B) fresh
// negative ids (-1, -2, ... counted over the whole trace), which no other block can match,
// so a replay that inserts input + output treats them as the README prescribes.
//
// Validation: all four keys required once; lengths in [0, max_request_tokens] (request.hpp);
// timestamps in [0, 1e13] ms; ids >= 0 and small enough to
// expand into int32; hash_ids length = ceil(input_length / 512); timestamps
// non-decreasing. Violations throw `format_error` naming the line and key.
//
// Infinite-cache bound: see `infinite_cache_bound` in trace_stats.hpp (36.64 % of blocks
// on the conversation trace at B = 512).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <istream>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "hybridcache/core/error.hpp"
#include "hybridcache/sim/json.hpp"
#include "hybridcache/sim/line_reader.hpp"
#include "hybridcache/sim/request.hpp"

namespace hybridcache::sim {

/// Tokens per hash id in the Mooncake traces.
inline constexpr std::int32_t mooncake_trace_block_tokens = 512;

/// How Mooncake requests are expanded.
struct mooncake_options {
  /// Engine block size B in tokens; must divide 512.
  std::int32_t block_size = 512;
  /// Give every output block a fresh negative id (unique over the trace).
  bool synthesize_output_ids = true;
};

/// Streaming reader of Mooncake-format JSONL. Models `request_source`.
class mooncake_reader {
 public:
  /// Reads from `in` (which must outlive the reader). Throws `invalid_argument` for a
  /// block size that does not divide 512.
  explicit mooncake_reader(std::istream& in, mooncake_options options = {}) : lines_(in), options_(validated(options)) {}
  /// Opens `path`; throws `invalid_argument` if it cannot be opened.
  explicit mooncake_reader(const std::filesystem::path& path, mooncake_options options = {})
      : lines_(path), options_(validated(options)) {}

  /// Reads the next request into `r`; false at the end of the file.
  bool next(request& r) {
    std::string_view line;
    if (!lines_.next_nonblank(line)) return false;
    parse(line, lines_.line_number(), r);
    return true;
  }

  /// 1-based line of the request last read.
  [[nodiscard]] std::int64_t line_number() const noexcept { return lines_.line_number(); }

  /// The 512-token hash ids of the request last read (before expansion).
  [[nodiscard]] const std::vector<std::int64_t>& hash_ids() const noexcept { return hash_ids_; }

 private:
  static mooncake_options validated(mooncake_options o) {
    HYBRIDCACHE_EXPECTS(o.block_size > 0 && mooncake_trace_block_tokens % o.block_size == 0, invalid_argument,
                        "mooncake: block_size " + std::to_string(o.block_size) + " must be a positive divisor of 512");
    return o;
  }

  // a <= max_request_tokens (checked when read), so a + b - 1 cannot overflow.
  static std::int64_t ceil_div(std::int64_t a, std::int64_t b) noexcept { return a / b + (a % b != 0 ? 1 : 0); }

  void parse(std::string_view text, std::int64_t line, request& r) {
    enum : unsigned { k_ts = 1, k_in = 2, k_out = 4, k_ids = 8, k_all = 15 };
    json_cursor c(text, line);
    std::uint32_t seen = 0;
    double timestamp_ms = 0;
    std::int64_t input_length = 0, output_length = 0;
    auto mark = [&](std::uint32_t bit, std::string_view key) { c.mark_key(seen, bit, key); };
    c.begin_object("");
    std::string_view key;
    while (c.next_member(key)) {
      if (key == "timestamp") {
        mark(k_ts, key);
        timestamp_ms = c.read_double(key);
        if (!(timestamp_ms >= 0.0) || !(timestamp_ms <= max_arrival_seconds * 1000.0))
          c.fail(key, "expected a time in ms in [0, 1e13], got " + format_number(timestamp_ms));
      } else if (key == "input_length") {
        mark(k_in, key);
        input_length = c.read_int(key);
        if (input_length < 0 || input_length > max_request_tokens)
          c.fail(key, "expected a token count in [0, " + std::to_string(max_request_tokens) + "], got " +
                          std::to_string(input_length));
      } else if (key == "output_length") {
        mark(k_out, key);
        output_length = c.read_int(key);
        if (output_length < 0 || output_length > max_request_tokens)
          c.fail(key, "expected a token count in [0, " + std::to_string(max_request_tokens) + "], got " +
                          std::to_string(output_length));
      } else if (key == "hash_ids") {
        mark(k_ids, key);
        c.read_int_array(key, hash_ids_, 0, std::numeric_limits<std::int64_t>::max());
      } else {
        c.skip_value(key);
      }
    }
    c.expect_end();
    if (seen != k_all) json_cursor::require_keys(line, seen, {"timestamp", "input_length", "output_length", "hash_ids"});
    const std::int64_t expected_ids = ceil_div(input_length, mooncake_trace_block_tokens);
    if (static_cast<std::int64_t>(hash_ids_.size()) != expected_ids)
      throw format_error(line, "hash_ids",
                         "has " + std::to_string(hash_ids_.size()) + " ids, but input_length " + std::to_string(input_length) +
                             " needs ceil(input_length / 512) = " + std::to_string(expected_ids));
    const double arrival_s = timestamp_ms / 1000.0;
    if (arrival_s < last_arrival_s_) throw format_error(line, "timestamp", "timestamps go backwards");
    last_arrival_s_ = arrival_s;

    const std::int64_t fan_out = mooncake_trace_block_tokens / options_.block_size;
    const std::int64_t input_ids = ceil_div(input_length, options_.block_size);
    r.input.clear();
    r.input.reserve(static_cast<std::size_t>(input_ids));
    for (std::size_t i = 0; i < hash_ids_.size(); ++i) {
      const std::int64_t parent = hash_ids_[i];
      if (parent > (std::int64_t{std::numeric_limits<token_id>::max()} - fan_out + 1) / fan_out)
        throw format_error(line, "hash_ids", "id " + std::to_string(parent) + " is too large to expand into 32-bit block ids");
      const std::int64_t children = std::min<std::int64_t>(fan_out, input_ids - static_cast<std::int64_t>(i) * fan_out);
      for (std::int64_t j = 0; j < children; ++j) r.input.push_back(static_cast<token_id>(parent * fan_out + j));
    }
    r.output.clear();
    if (options_.synthesize_output_ids) {
      const std::int64_t output_ids = ceil_div(output_length, options_.block_size);
      if (output_ids > std::int64_t{std::numeric_limits<token_id>::max()} + next_output_id_)
        throw format_error(line, "output_length", "too many output blocks in the trace to give each a unique 32-bit id");
      for (std::int64_t j = 0; j < output_ids; ++j) r.output.push_back(static_cast<token_id>(next_output_id_--));
    }
    r.arrival_s = arrival_s;
    r.session_id = -1;
    r.turn_id = -1;
    r.input_tokens = input_length;
    r.output_tokens = output_length;
    r.tokens_per_id = options_.block_size;
    r.source_line = line;
  }

  line_reader lines_;
  mooncake_options options_;
  std::vector<std::int64_t> hash_ids_;
  double last_arrival_s_ = 0.0;
  std::int64_t next_output_id_ = -1;
};
static_assert(request_source<mooncake_reader>);

}  // namespace hybridcache::sim
