// examples/llama_cpp/conversations.hpp
//
// The conversations hybridcache-llama replays, read with hybridcache's trace readers
// (sim/chat_format.hpp, chat_trace.hpp: openai, tau-bench, swe-agent) or, for ShareGPT, one
// `{"conversations": [{"from", "value"}, ...]}` object per line. A conversation becomes one
// request per assistant message: the messages before it are the prompt (rendered with the
// model's chat template and tokenized by llama.cpp, as llama-server does for
// /v1/chat/completions), and the recorded assistant message is what the next request's
// prompt carries, whatever the model generated. Every parser throws hybridcache's
// format_error / invalid_argument naming the line and field.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "hybridcache/sim/chat_trace.hpp"
#include "hybridcache/sim/json_value.hpp"
#include "hybridcache/sim/line_reader.hpp"

namespace hybridcache_llama {

/// One conversation: (role, text) messages, roles as chat templates name them.
struct conversation {
  std::vector<std::pair<std::string, std::string>> messages;
  /// Indices of the assistant messages: request k's prompt is messages[0, turns[k]).
  [[nodiscard]] std::vector<std::size_t> turns() const {
    std::vector<std::size_t> t;
    for (std::size_t i = 1; i < messages.size(); ++i)
      if (messages[i].first == "assistant") t.push_back(i);
    return t;
  }
};

namespace detail {
inline const char* role_name(hybridcache::sim::chat_role r) {
  switch (r) {
    case hybridcache::sim::chat_role::system: return "system";
    case hybridcache::sim::chat_role::user: return "user";
    case hybridcache::sim::chat_role::assistant: return "assistant";
    // A tool result is sent as a user message carrying its text: llama.cpp's built-in ChatML
    // renderer and llama-server's Jinja template agree on plain text, not on tool roles.
    case hybridcache::sim::chat_role::tool: return "user";
  }
  return "user";
}

template <class Source>
std::vector<conversation> read_chat(Source src, std::size_t limit) {
  std::vector<conversation> out;
  hybridcache::sim::chat_conversation c;
  while (out.size() < limit && src.next(c)) {
    conversation v;
    for (const auto& m : c.messages) v.messages.emplace_back(role_name(m.role), m.text);
    if (!v.turns().empty()) out.push_back(std::move(v));
  }
  return out;
}

inline std::vector<conversation> read_sharegpt(const std::filesystem::path& path, std::size_t limit) {
  hybridcache::sim::line_reader lines(path);
  std::vector<conversation> out;
  std::string_view text;
  while (out.size() < limit && lines.next_nonblank(text)) {
    const auto line = lines.line_number();
    const hybridcache::sim::json_value doc = hybridcache::sim::parse_json(text, line);
    const auto* msgs = doc.find("conversations");
    if (msgs == nullptr) msgs = doc.find("items");
    if (msgs == nullptr)
      throw hybridcache::format_error(line, "conversations", "missing (a ShareGPT line is {\"conversations\": [...]})");
    conversation v;
    for (const auto& m : msgs->as_array()) {
      const auto* from = m.find("from");
      const auto* value = m.find("value");
      if (from == nullptr || value == nullptr) throw hybridcache::format_error(line, "conversations[].from/value", "missing");
      const std::string& f = from->as_string();
      const char* role = f == "human" || f == "user" ? "user" : f == "gpt" || f == "assistant" || f == "chatgpt" ? "assistant"
                         : f == "system" ? "system" : nullptr;
      if (role == nullptr) throw hybridcache::format_error(line, "conversations[].from", "unknown speaker '" + f + "'");
      v.messages.emplace_back(role, value->as_string());
    }
    if (!v.turns().empty()) out.push_back(std::move(v));
  }
  return out;
}
}  // namespace detail

/// Reads at most `limit` conversations (with at least one assistant turn) of `format`
/// (openai | tau-bench | swe-agent | sharegpt) from `path`.
/// @throws hybridcache::invalid_argument for an unknown format or an unreadable path;
///         format_error for malformed input.
inline std::vector<conversation> read_conversations(const std::filesystem::path& path, const std::string& format,
                                                    std::size_t limit) {
  namespace sim = hybridcache::sim;
  if (format == "openai") return detail::read_chat(sim::openai_source(path), limit);
  if (format == "tau-bench") return detail::read_chat(sim::tau_bench_source(path), limit);
  if (format == "swe-agent") return detail::read_chat(sim::swe_agent_source(path), limit);
  if (format == "sharegpt") return detail::read_sharegpt(path, limit);
  throw hybridcache::invalid_argument("--format '" + format + "' (known: openai, tau-bench, swe-agent, sharegpt)");
}

}  // namespace hybridcache_llama
