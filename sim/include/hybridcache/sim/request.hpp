// hybridcache/sim/request.hpp
//
// The one in-memory request every trace reader and generator produces, and the
// `request_source` concept the replay engine consumes.
//
// A request is what a serving engine sees: an arrival time, the prompt as a sequence of
// ids, the output, and the real token counts. Formats differ in what they know:
//
//   format      input ids                       output ids              lengths
//   synth-v1    token ids                       token ids               exact
//   marconi     token ids                       token ids               exact
//   sharegpt    built-in tokenizer ids          tokenizer ids           tokenizer counts
//   mooncake    block ids (one per B tokens)    synthetic unique ids    exact
//   azure       none                            none                    exact
//   cachepawl   none                            none                    prompt only
//
// `tokens_per_id` says how many real tokens one id stands for (1 for token traces, the
// engine block size B for Mooncake), so a block-granular replay and a token-granular one
// use the same type. Sources fill a caller-owned `request` and reuse its vectors, so a
// replay loop over millions of requests does not allocate once the buffers are warm.
#pragma once

#include <concepts>
#include <cstdint>
#include <functional>
#include <queue>
#include <tuple>
#include <vector>

#include "hybridcache/concepts/ids.hpp"

namespace hybridcache::sim {

/// A token (or block) id in a replayed sequence (the library's one `token_id`). Real
/// vocabularies and the Mooncake block ids expanded to 16-token blocks fit comfortably;
/// negative ids are reserved for ids a reader synthesizes to be unique (Mooncake decode
/// blocks).
using hybridcache::token_id;

/// One request of a trace, in the common representation.
/// Documented caps every trace reader enforces before it allocates or computes with a
/// number read from a file (docs/traces.md, "Caps"): a request holds at most
/// `max_request_tokens` input tokens and as many output tokens (16 Mi; no model's context is
/// longer), and an arrival time is at most `max_arrival_seconds` (10^10 s, 317 years) after
/// the trace's origin, so arrival arithmetic (scaling, spreading, TTFT) stays finite.
inline constexpr std::int64_t max_request_tokens = std::int64_t{1} << 24;
inline constexpr double max_arrival_seconds = 1e10;

struct request {
  /// Arrival time in seconds since the start of the trace.
  double arrival_s = 0.0;
  /// Session (conversation) id, or -1 when the format has none (Mooncake, Azure, cachepawl).
  std::int64_t session_id = -1;
  /// Turn within the session (0-based), or -1 when unknown.
  std::int64_t turn_id = -1;
  /// The prompt's ids: full history plus the new user turn. Empty for length-only formats.
  std::vector<token_id> input;
  /// The output's ids. Empty when the format has no output ids and none were synthesized.
  std::vector<token_id> output;
  /// Real prompt length in tokens (not ids): for Mooncake `input_length`, not `input.size()*B`.
  std::int64_t input_tokens = 0;
  /// Real output length in tokens.
  std::int64_t output_tokens = 0;
  /// How many real tokens one id of `input`/`output` stands for (1 = token granularity).
  std::int32_t tokens_per_id = 1;
  /// 1-based line of the source file where the request was read (0 when generated).
  std::int64_t source_line = 0;

  /// True when the request carries ids (a prefix cache can replay it), false for the
  /// length-only formats that feed allocator replays.
  [[nodiscard]] bool has_ids() const noexcept { return !input.empty() || input_tokens == 0; }
};

/// A request of a session read ahead, waiting to be emitted in (arrival, session, turn)
/// order: how the conversation readers (sharegpt_trace.hpp, chat_trace.hpp) interleave
/// the sessions in flight.
struct pending_request {
  double arrival_s;
  std::int64_t session_id;
  std::int64_t turn_id;
  bool operator>(const pending_request& o) const noexcept {
    return std::tie(arrival_s, session_id, turn_id) > std::tie(o.arrival_s, o.session_id, o.turn_id);
  }
};
/// Pending requests, earliest (then lowest session, then turn) on top.
using pending_requests = std::priority_queue<pending_request, std::vector<pending_request>, std::greater<>>;

/// A stream of requests in arrival order. `next(r)` overwrites `r` (reusing its vectors)
/// and returns true, or returns false at the end. Malformed input throws
/// `hybridcache::format_error` naming the line and field (then `r`'s contents are
/// unspecified and the source should not be read further). Every reader in this folder and
/// `trace_reader` (trace.hpp) model it.
template <class S>
concept request_source = requires(S& source, request& r) {
  { source.next(r) } -> std::same_as<bool>;
};

/// Drains a source into a vector (for small traces and tests; the replay engine streams).
template <request_source S>
[[nodiscard]] std::vector<request> collect(S& source) {
  std::vector<request> out;
  request r;
  while (source.next(r)) out.push_back(r);
  return out;
}

}  // namespace hybridcache::sim
