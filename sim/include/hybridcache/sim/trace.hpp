// hybridcache/sim/trace.hpp
//
// One entry point for every trace format: `open_trace(path or stream, format, options)`
// returns a `trace_reader`, a `request_source` that holds whichever reader the format needs
// (a std::variant, so no virtual calls and no heap allocation per request). This header is
// the one list of formats: their names, what each carries (has_prefix_ids, is_text_format,
// is_chat_format) and its reader; hcbench's --format and its messages take them from here.
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
//   lmsys      LMSys-Chat-1M rows (JSONL: conversation_id, conversation)     lmsys_trace.hpp
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <istream>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "hybridcache/core/error.hpp"
#include "hybridcache/sim/azure_trace.hpp"
#include "hybridcache/sim/cachepawl_trace.hpp"
#include "hybridcache/sim/chat_trace.hpp"
#include "hybridcache/sim/lmsys_trace.hpp"
#include "hybridcache/sim/marconi_trace.hpp"
#include "hybridcache/sim/mooncake_trace.hpp"
#include "hybridcache/sim/request.hpp"
#include "hybridcache/sim/sharegpt_trace.hpp"

namespace hybridcache::sim {

/// The trace formats `open_trace` reads.
enum class trace_format { marconi, mooncake, sharegpt, azure, cachepawl, openai, swe_agent, tau_bench, lmsys };

/// Names of the formats, in enum order (the CLI's `--format` values).
inline constexpr std::array<std::string_view, 9> trace_format_names = {
    "marconi", "mooncake", "sharegpt", "azure", "cachepawl", "openai", "swe-agent", "tau-bench", "lmsys"};

/// The format's name.
[[nodiscard]] constexpr std::string_view to_string(trace_format f) noexcept {
  return trace_format_names[static_cast<std::size_t>(f)];
}

/// True when the format carries ids, so a prefix cache can replay it (every format but the
/// length-only azure and cachepawl).
[[nodiscard]] constexpr bool has_prefix_ids(trace_format f) noexcept {
  return f != trace_format::azure && f != trace_format::cachepawl;
}

/// True for the chat formats: conversations of role messages through a chat template
/// (openai, swe-agent, tau-bench; chat_trace.hpp; lmsys, lmsys_trace.hpp).
[[nodiscard]] constexpr bool is_chat_format(trace_format f) noexcept {
  return f == trace_format::openai || f == trace_format::swe_agent || f == trace_format::tau_bench ||
         f == trace_format::lmsys;
}

/// True for the formats whose requests are text, tokenized while reading (sharegpt and the
/// chat formats): the ones a tokenizer applies to.
[[nodiscard]] constexpr bool is_text_format(trace_format f) noexcept {
  return f == trace_format::sharegpt || is_chat_format(f);
}

/// The format named `name` (one of trace_format_names), or nullopt.
[[nodiscard]] constexpr std::optional<trace_format> find_trace_format(std::string_view name) noexcept {
  for (std::size_t i = 0; i < trace_format_names.size(); ++i)
    if (trace_format_names[i] == name) return static_cast<trace_format>(i);
  return std::nullopt;
}

/// The names of the formats `keep(format)` accepts, in enum order, comma-separated
/// ("marconi, mooncake, ..."): what a message listing valid formats says.
template <class Keep>
[[nodiscard]] std::string trace_format_list(Keep keep) {
  std::string out;
  for (std::size_t i = 0; i < trace_format_names.size(); ++i) {
    if (!keep(static_cast<trace_format>(i))) continue;
    if (!out.empty()) out += ", ";
    out += trace_format_names[i];
  }
  return out;
}
/// Every format's name, comma-separated.
[[nodiscard]] inline std::string trace_format_list() {
  return trace_format_list([](trace_format) { return true; });
}

/// Parses a format name; throws `invalid_argument` listing the valid names otherwise.
[[nodiscard]] inline trace_format parse_trace_format(std::string_view name) {
  if (const auto f = find_trace_format(name)) return *f;
  throw invalid_argument("unknown trace format '" + std::string(name) + "' (known: " + trace_format_list() + ")");
}

/// Per-format options (only the one for the opened format is used).
struct trace_options {
  mooncake_options mooncake{};
  sharegpt_options sharegpt{};
  cachepawl_options cachepawl{};
  chat_options chat{};  ///< openai, swe-agent, tau-bench, lmsys
};

/// Any of the readers, as one `request_source`.
class trace_reader {
 public:
  using reader_variant = std::variant<marconi_reader, mooncake_reader, sharegpt_reader, azure_reader, cachepawl_reader, openai_reader,
                                      swe_agent_reader, tau_bench_reader, lmsys_reader>;

  explicit trace_reader(reader_variant reader, trace_format format) : reader_(std::move(reader)), format_(format) {}

  /// Reads the next request; false at the end. Throws `format_error` on malformed input.
  bool next(request& r) {
    return std::visit([&r](auto& reader) { return reader.next(r); }, reader_);
  }

  /// The format being read.
  [[nodiscard]] trace_format format() const noexcept { return format_; }

  /// The line the reader is at (1-based), for error messages; 0 for a reader that does not
  /// count lines (the chat formats).
  [[nodiscard]] std::int64_t line_number() const noexcept {
    return std::visit(
        [](const auto& reader) -> std::int64_t {
          if constexpr (requires { reader.line_number(); }) return reader.line_number();
          else return 0;
        },
        reader_);
  }

 private:
  reader_variant reader_;
  trace_format format_;
};
static_assert(request_source<trace_reader>);

namespace detail {
/// The one switch from a format to its reader; `source` is a path (the reader opens it) or
/// a std::istream& (the reader borrows it).
template <class Source>
[[nodiscard]] trace_reader open_trace_from(Source& source, trace_format format, const trace_options& options) {
  using any = trace_reader::reader_variant;
  switch (format) {
    case trace_format::marconi: return trace_reader(any(std::in_place_type<marconi_reader>, source), format);
    case trace_format::mooncake: return trace_reader(any(std::in_place_type<mooncake_reader>, source, options.mooncake), format);
    case trace_format::sharegpt: return trace_reader(any(std::in_place_type<sharegpt_reader>, source, options.sharegpt), format);
    case trace_format::azure: return trace_reader(any(std::in_place_type<azure_reader>, source), format);
    case trace_format::cachepawl:
      return trace_reader(any(std::in_place_type<cachepawl_reader>, source, options.cachepawl), format);
    case trace_format::openai: return trace_reader(any(std::in_place_type<openai_reader>, source, options.chat), format);
    case trace_format::swe_agent: return trace_reader(any(std::in_place_type<swe_agent_reader>, source, options.chat), format);
    case trace_format::tau_bench: return trace_reader(any(std::in_place_type<tau_bench_reader>, source, options.chat), format);
    case trace_format::lmsys: return trace_reader(any(std::in_place_type<lmsys_reader>, source, options.chat), format);
  }
  throw invalid_argument("unknown trace format");
}
}  // namespace detail

/// Opens `path` as a trace of `format` (swe-agent: a .traj file or a directory of them).
/// Throws `invalid_argument` when the file cannot be opened or an option is invalid;
/// reading throws `format_error` on malformed lines.
[[nodiscard]] inline trace_reader open_trace(const std::filesystem::path& path, trace_format format, const trace_options& options = {}) {
  return detail::open_trace_from(path, format, options);
}

/// Reads a trace of `format` from `in` (a decompressed file, stdin), which must outlive
/// the reader. Throws as the path overload does.
[[nodiscard]] inline trace_reader open_trace(std::istream& in, trace_format format, const trace_options& options = {}) {
  return detail::open_trace_from(in, format, options);
}

}  // namespace hybridcache::sim
