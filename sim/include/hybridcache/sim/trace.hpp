// hybridcache/sim/trace.hpp
//
// One entry point for every trace format: `open_trace(path, format, options)` returns a
// `trace_reader`, a `request_source` that holds whichever reader the format needs (a
// std::variant, so no virtual calls and no heap allocation per request).
//
//   auto trace = hybridcache::sim::open_trace("conversation_trace.jsonl",
//                                             hybridcache::sim::trace_format::mooncake,
//                                             {.mooncake = {.block_size = 16}});
//   hybridcache::sim::request r;
//   while (trace.next(r)) { /* r.input, r.arrival_s, ... */ }
//
// Formats (one header each, all streaming):
//   marconi    Marconi-reference JSONL with token ids (also synth-v1 files)   marconi_trace.hpp
//   mooncake   Mooncake FAST'25 JSONL with 512-token block hashes            mooncake_trace.hpp
//   sharegpt   ShareGPT conversations, built-in tokenizer, Marconi timing    sharegpt_trace.hpp
//   azure      Azure CSV (TIMESTAMP,ContextTokens,GeneratedTokens), lengths  azure_trace.hpp
//   cachepawl  cachepawl prompt-length JSON array, lengths                   cachepawl_trace.hpp
//   openai     OpenAI-style chat conversations, one per line                 chat_trace.hpp
//   swe-agent  SWE-agent .traj files (a file or a directory)                 chat_trace.hpp
//   tau-bench  tau-bench results (a JSON array of task trajectories)         chat_trace.hpp
#pragma once

#include <array>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "hybridcache/core/error.hpp"
#include "hybridcache/sim/azure_trace.hpp"
#include "hybridcache/sim/cachepawl_trace.hpp"
#include "hybridcache/sim/chat_trace.hpp"
#include "hybridcache/sim/marconi_trace.hpp"
#include "hybridcache/sim/mooncake_trace.hpp"
#include "hybridcache/sim/request.hpp"
#include "hybridcache/sim/sharegpt_trace.hpp"

namespace hybridcache::sim {

/// The trace formats `open_trace` reads.
enum class trace_format { marconi, mooncake, sharegpt, azure, cachepawl, openai, swe_agent, tau_bench };

/// Names of the formats, in enum order (the CLI's `--format` values).
inline constexpr std::array<std::string_view, 8> trace_format_names = {"marconi", "mooncake", "sharegpt", "azure",
                                                                       "cachepawl", "openai", "swe-agent", "tau-bench"};

/// The format's name.
[[nodiscard]] constexpr std::string_view to_string(trace_format f) noexcept {
  return trace_format_names[static_cast<std::size_t>(f)];
}

/// Parses a format name; throws `invalid_argument` listing the valid names otherwise.
[[nodiscard]] inline trace_format parse_trace_format(std::string_view name) {
  for (std::size_t i = 0; i < trace_format_names.size(); ++i)
    if (trace_format_names[i] == name) return static_cast<trace_format>(i);
  throw invalid_argument("unknown trace format '" + std::string(name) + "' (expected marconi, mooncake, sharegpt, azure, cachepawl, openai, swe-agent or tau-bench)");
}

/// True when the format carries ids, so a prefix cache can replay it (every format but the
/// length-only azure and cachepawl).
[[nodiscard]] constexpr bool has_prefix_ids(trace_format f) noexcept {
  return f != trace_format::azure && f != trace_format::cachepawl;
}

/// Per-format options (only the one for the opened format is used).
struct trace_options {
  mooncake_options mooncake{};
  sharegpt_options sharegpt{};
  cachepawl_options cachepawl{};
  chat_options chat{};  ///< openai, swe-agent, tau-bench
};

/// Any of the readers, as one `request_source`.
class trace_reader {
 public:
  using reader_variant = std::variant<marconi_reader, mooncake_reader, sharegpt_reader, azure_reader, cachepawl_reader, openai_reader,
                                      swe_agent_reader, tau_bench_reader>;

  explicit trace_reader(reader_variant reader, trace_format format) : reader_(std::move(reader)), format_(format) {}

  /// Reads the next request; false at the end. Throws `format_error` on malformed input.
  bool next(request& r) {
    return std::visit([&r](auto& reader) { return reader.next(r); }, reader_);
  }

  /// The format being read.
  [[nodiscard]] trace_format format() const noexcept { return format_; }

 private:
  reader_variant reader_;
  trace_format format_;
};
static_assert(request_source<trace_reader>);

/// Opens `path` as a trace of `format`. Throws `invalid_argument` when the file cannot be
/// opened or an option is invalid; reading throws `format_error` on malformed lines.
[[nodiscard]] inline trace_reader open_trace(const std::filesystem::path& path, trace_format format, const trace_options& options = {}) {
  switch (format) {
    case trace_format::marconi: return trace_reader(trace_reader::reader_variant(std::in_place_type<marconi_reader>, path), format);
    case trace_format::mooncake:
      return trace_reader(trace_reader::reader_variant(std::in_place_type<mooncake_reader>, path, options.mooncake), format);
    case trace_format::sharegpt:
      return trace_reader(trace_reader::reader_variant(std::in_place_type<sharegpt_reader>, path, options.sharegpt), format);
    case trace_format::azure: return trace_reader(trace_reader::reader_variant(std::in_place_type<azure_reader>, path), format);
    case trace_format::cachepawl:
      return trace_reader(trace_reader::reader_variant(std::in_place_type<cachepawl_reader>, path, options.cachepawl), format);
    case trace_format::openai:
      return trace_reader(trace_reader::reader_variant(std::in_place_type<openai_reader>, path, options.chat), format);
    case trace_format::swe_agent:
      return trace_reader(trace_reader::reader_variant(std::in_place_type<swe_agent_reader>, path, options.chat), format);
    case trace_format::tau_bench:
      return trace_reader(trace_reader::reader_variant(std::in_place_type<tau_bench_reader>, path, options.chat), format);
  }
  throw invalid_argument("unknown trace format");
}

}  // namespace hybridcache::sim
