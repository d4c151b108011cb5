// hybridcache/sim/synth_v1.hpp
//
// synth-v1: the project's deterministic synthetic multi-turn workload, bit-exact with the
// reference generator `shared/fixtures/marconi/gen_trace.py` (recipe: anchors/marconi.md,
// Appendix A). The same arguments give the same requests and, through
// `write_synth_v1_jsonl`, a JSONL file with the same sha256 as the Python script's.
//
// Why a generator at all: the Marconi reference's own traces cannot be fetched or rebuilt
// here, and a workload that needs no file lets `hcbench compare` run on a fresh machine.
// Two profiles shape the prefix sharing:
//   chat   5 system prompts (or none), 1-12 short turns, think time 2-60 s;
//   agent  one shared 1,200-token agent prompt, 2-10 turns with long observations.
//
// The PRNG is splitmix64 and every draw is an integer (`lo + next() % (hi - lo + 1)`), so
// nothing depends on floating point or on the platform. Order of draws (any change breaks
// the sha256): the K system prompts (length, then tokens); then per session the system
// prompt index (chat only: next() % (K+1), K meaning none), the number of turns, and per
// turn the think time (turns after the first), the user length and tokens, the output
// length and tokens. A turn whose history + user + output would exceed 32,768 tokens ends
// the session (its draws are still consumed). Requests are sorted by
// (ts_ms, session, turn).
//
// Cost: O(total input tokens) time and memory (each request stores its whole prompt, as
// the JSONL does).
#pragma once

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <limits>
#include <ostream>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "hybridcache/core/error.hpp"
#include "hybridcache/core/hash.hpp"
#include "hybridcache/sim/python_float.hpp"
#include "hybridcache/sim/request.hpp"

namespace hybridcache::sim {

/// splitmix64 (Steele, Lea, Flood 2014): a 64-bit state advanced by the golden-ratio
/// increment and mixed by two xor-shift-multiply rounds. Passes BigCrush; used here because
/// it is tiny and identical in every language with 64-bit wrapping integers.
class splitmix64 {
 public:
  /// Seeds the state (Python's `seed & (2**64 - 1)`: pass negative seeds as their
  /// two's-complement value).
  explicit constexpr splitmix64(std::uint64_t seed) noexcept : state_(seed) {}

  /// Next 64-bit output.
  constexpr std::uint64_t next() noexcept {
    state_ += splitmix64_gamma;
    return splitmix64_mix(state_);
  }

  /// Integer in [lo, hi] (inclusive) as `lo + next() % (hi - lo + 1)` (the modulo bias is
  /// part of the recipe). Requires lo <= hi.
  constexpr std::int64_t uniform(std::int64_t lo, std::int64_t hi) noexcept {
    const auto span = static_cast<std::uint64_t>(hi - lo) + 1;
    return lo + static_cast<std::int64_t>(next() % span);
  }

 private:
  std::uint64_t state_;
};

/// The two workload shapes of synth-v1.
enum class synth_profile { chat, agent };

/// Inclusive integer range of one draw.
struct synth_range {
  std::int64_t lo = 0;  ///< smallest value drawn
  std::int64_t hi = 0;  ///< largest value drawn
};

/// Parameters of one profile (the table in gen_trace.py's PROFILES).
struct synth_profile_params {
  int system_prompts = 0;          ///< K: distinct system prompts (chat also draws "none")
  synth_range system_prompt_len;   ///< tokens per system prompt
  synth_range turns;               ///< turns per session
  synth_range user_len;            ///< tokens per user turn
  synth_range output_len;          ///< tokens per output
  synth_range think_ms;            ///< delay before every turn after the first
};

/// The published parameters of `profile`.
[[nodiscard]] constexpr synth_profile_params synth_params(synth_profile profile) noexcept {
  if (profile == synth_profile::agent) return {1, {1200, 1200}, {2, 10}, {64, 1536}, {32, 256}, {1000, 10000}};
  return {5, {256, 2048}, {1, 12}, {16, 512}, {16, 768}, {2000, 60000}};
}

/// Token ids are drawn from [3, 31999] (0-2 are left to special tokens).
inline constexpr synth_range synth_vocab{3, 31999};
/// A session stops at the first turn whose history + user + output exceeds this.
inline constexpr std::int64_t synth_max_total_tokens = 32768;

/// "chat" or "agent".
[[nodiscard]] constexpr std::string_view to_string(synth_profile profile) noexcept {
  return profile == synth_profile::agent ? "agent" : "chat";
}

/// Parses "chat" / "agent"; throws `invalid_argument` naming the value otherwise.
[[nodiscard]] inline synth_profile parse_synth_profile(std::string_view name) {
  if (name == "chat") return synth_profile::chat;
  if (name == "agent") return synth_profile::agent;
  throw invalid_argument("unknown synth-v1 profile '" + std::string(name) + "' (expected chat or agent)");
}

/// Arguments of one generated trace (gen_trace.py's command line).
struct synth_v1_options {
  synth_profile profile = synth_profile::chat;  ///< --profile
  std::uint64_t seed = 1;                       ///< --seed (negative seeds: their two's complement)
  std::int64_t sessions = 100;         ///< --sessions
  std::int64_t session_gap_ms = 2000;  ///< --session-gap-ms: session s starts at s * gap
};

/// One generated request, with its time in integer milliseconds (the JSONL's `ts` is
/// ts_ms / 1000.0).
struct synth_request {
  std::int64_t ts_ms = 0;       ///< arrival in ms: session * gap + the think times of earlier turns
  std::int64_t session_id = 0;  ///< 0-based session
  std::int64_t turn_id = 0;     ///< 0-based turn within the session
  std::vector<token_id> input;   ///< history (system prompt, earlier turns and outputs) + user turn
  std::vector<token_id> output;  ///< this turn's output

  /// The request in the common representation.
  [[nodiscard]] request to_request() const {
    request r;
    r.arrival_s = static_cast<double>(ts_ms) / 1000.0;
    r.session_id = session_id;
    r.turn_id = turn_id;
    r.input = input;
    r.output = output;
    r.input_tokens = static_cast<std::int64_t>(input.size());
    r.output_tokens = static_cast<std::int64_t>(output.size());
    return r;
  }
};

/// Generates a synth-v1 trace. Throws `invalid_argument` for negative sessions or gap, or
/// a gap so large that timestamps would overflow.
[[nodiscard]] inline std::vector<synth_request> generate_synth_v1(const synth_v1_options& options) {
  HYBRIDCACHE_EXPECTS(options.sessions >= 0, invalid_argument, "synth-v1: sessions must be >= 0");
  HYBRIDCACHE_EXPECTS(options.session_gap_ms >= 0, invalid_argument, "synth-v1: session_gap_ms must be >= 0");
  // Largest ts: (sessions-1)*gap + 11 think times of at most 60 s; keep it far inside int64.
  HYBRIDCACHE_EXPECTS(options.sessions == 0 || options.session_gap_ms <= (std::int64_t{1} << 52) / options.sessions,
                      invalid_argument, "synth-v1: sessions * session_gap_ms is too large");
  const synth_profile_params p = synth_params(options.profile);
  splitmix64 rng(options.seed);
  auto draw_tokens = [&rng](std::int64_t n, std::vector<token_id>& into) {
    for (std::int64_t i = 0; i < n; ++i)
      into.push_back(static_cast<token_id>(rng.uniform(synth_vocab.lo, synth_vocab.hi)));
  };

  std::vector<std::vector<token_id>> system_prompts(static_cast<std::size_t>(p.system_prompts));
  for (auto& prompt : system_prompts) draw_tokens(rng.uniform(p.system_prompt_len.lo, p.system_prompt_len.hi), prompt);

  std::vector<synth_request> requests;
  std::vector<token_id> history, user, output;
  for (std::int64_t s = 0; s < options.sessions; ++s) {
    std::uint64_t system_index = 0;
    if (options.profile == synth_profile::chat) system_index = rng.next() % static_cast<std::uint64_t>(p.system_prompts + 1);
    history.clear();
    if (system_index < system_prompts.size()) history = system_prompts[system_index];
    const std::int64_t turns = rng.uniform(p.turns.lo, p.turns.hi);
    std::int64_t ts = s * options.session_gap_ms;
    for (std::int64_t t = 0; t < turns; ++t) {
      if (t > 0) ts += rng.uniform(p.think_ms.lo, p.think_ms.hi);
      user.clear();
      output.clear();
      const std::int64_t user_len = rng.uniform(p.user_len.lo, p.user_len.hi);
      draw_tokens(user_len, user);
      const std::int64_t output_len = rng.uniform(p.output_len.lo, p.output_len.hi);
      draw_tokens(output_len, output);
      if (static_cast<std::int64_t>(history.size()) + user_len + output_len > synth_max_total_tokens) break;
      synth_request r;
      r.ts_ms = ts;
      r.session_id = s;
      r.turn_id = t;
      r.input = history;
      r.input.insert(r.input.end(), user.begin(), user.end());
      r.output = output;
      history = r.input;
      history.insert(history.end(), output.begin(), output.end());
      requests.push_back(std::move(r));
    }
  }
  std::sort(requests.begin(), requests.end(), [](const synth_request& a, const synth_request& b) {
    return std::tie(a.ts_ms, a.session_id, a.turn_id) < std::tie(b.ts_ms, b.session_id, b.turn_id);
  });
  return requests;
}

namespace detail {
inline void append_int(std::string& out, std::int64_t value) {
  char buffer[24];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  out.append(buffer, result.ptr);
}
inline void append_id_list(std::string& out, const std::vector<token_id>& ids) {
  out += '[';
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (i != 0) out += ", ";
    append_int(out, ids[i]);
  }
  out += ']';
}
}  // namespace detail

/// Appends one request as a JSONL line exactly as gen_trace.py's `json.dump` writes it
/// (keys session_id, turn_id, ts, num_input_tokens, num_output_tokens, input_tokens,
/// output_tokens; separators ", " and ": "; `ts` as Python's repr of ts_ms / 1000.0),
/// followed by '\n'.
inline void append_synth_v1_jsonl(std::string& out, const synth_request& r) {
  out += "{\"session_id\": ";
  detail::append_int(out, r.session_id);
  out += ", \"turn_id\": ";
  detail::append_int(out, r.turn_id);
  out += ", \"ts\": ";
  append_python_float_repr(out, static_cast<double>(r.ts_ms) / 1000.0);
  out += ", \"num_input_tokens\": ";
  detail::append_int(out, static_cast<std::int64_t>(r.input.size()));
  out += ", \"num_output_tokens\": ";
  detail::append_int(out, static_cast<std::int64_t>(r.output.size()));
  out += ", \"input_tokens\": ";
  detail::append_id_list(out, r.input);
  out += ", \"output_tokens\": ";
  detail::append_id_list(out, r.output);
  out += "}\n";
}

/// The whole trace as JSONL text (byte-identical to gen_trace.py's output file).
[[nodiscard]] inline std::string synth_v1_jsonl(const std::vector<synth_request>& requests) {
  std::string out;
  for (const auto& r : requests) append_synth_v1_jsonl(out, r);
  return out;
}

/// Writes the trace as JSONL to `out`, one line at a time (bounded memory).
inline void write_synth_v1_jsonl(std::ostream& out, const std::vector<synth_request>& requests) {
  std::string line;
  for (const auto& r : requests) {
    line.clear();
    append_synth_v1_jsonl(line, r);
    out.write(line.data(), static_cast<std::streamsize>(line.size()));
  }
}

/// A generated trace as a `request_source` (in arrival order).
class synth_v1_source {
 public:
  /// Generates the trace (see `generate_synth_v1`).
  explicit synth_v1_source(const synth_v1_options& options) : requests_(generate_synth_v1(options)) {}
  /// Replays already generated requests.
  explicit synth_v1_source(std::vector<synth_request> requests) : requests_(std::move(requests)) {}

  /// Fills `r` with the next request; false at the end. Reuses `r`'s vectors.
  bool next(request& r) {
    if (next_ >= requests_.size()) return false;
    const synth_request& s = requests_[next_++];
    r.arrival_s = static_cast<double>(s.ts_ms) / 1000.0;
    r.session_id = s.session_id;
    r.turn_id = s.turn_id;
    r.input.assign(s.input.begin(), s.input.end());
    r.output.assign(s.output.begin(), s.output.end());
    r.input_tokens = static_cast<std::int64_t>(s.input.size());
    r.output_tokens = static_cast<std::int64_t>(s.output.size());
    r.tokens_per_id = 1;
    r.source_line = 0;
    return true;
  }

  /// The generated requests.
  [[nodiscard]] const std::vector<synth_request>& requests() const noexcept { return requests_; }

 private:
  std::vector<synth_request> requests_;
  std::size_t next_ = 0;
};
static_assert(request_source<synth_v1_source>);

}  // namespace hybridcache::sim
