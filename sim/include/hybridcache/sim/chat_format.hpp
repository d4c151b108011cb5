// hybridcache/sim/chat_format.hpp
//
// The message model of the chat and agent trace readers (chat_trace.hpp): a conversation
// of role-tagged messages (`chat_message`, `chat_conversation`), the Jinja-free chat
// template that renders it (`chat_template`, ChatML by default), the reader options
// (`chat_options`) and the size caps (`chat_limits`), and the parsers that turn one
// openai line, one SWE-agent .traj document or one tau-bench task into a conversation
// (detail::parse_*). The request recipe built on top is described in chat_trace.hpp
// and docs/traces.md. Every parser is O(input) and throws `format_error` naming the line
// and the field.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <istream>
#include <limits>
#include <memory>
#include <optional>
#include <queue>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "hybridcache/core/error.hpp"
#include "hybridcache/core/hash.hpp"
#include "hybridcache/sim/tokenizer/bpe_tokenizer.hpp"
#include "hybridcache/sim/cachepawl_trace.hpp"
#include "hybridcache/sim/json.hpp"
#include "hybridcache/sim/line_reader.hpp"
#include "hybridcache/sim/request.hpp"
#include "hybridcache/sim/tokenizer/text_tokenizer.hpp"

namespace hybridcache::sim {

/// Size caps of the chat readers (bad-input rules).
struct chat_limits {
  static constexpr std::size_t max_messages = std::size_t{1} << 20;       ///< per conversation
  static constexpr std::size_t max_tool_calls = std::size_t{1} << 12;     ///< per message
  static constexpr std::uintmax_t max_document_bytes = std::uintmax_t{1} << 30;  ///< one .traj file
  static constexpr std::size_t max_files = std::size_t{1} << 20;          ///< .traj files in a directory
  /// Longest prompt or output of one request (16 Mi tokens; no model's context is longer).
  static constexpr std::int64_t max_request_tokens = std::int64_t{1} << 24;
  /// Latest arrival (s after the trace's origin), so arrival arithmetic stays finite.
  static constexpr double max_arrival_seconds = 1e10;
};

/// Roles after normalisation.
enum class chat_role : std::uint8_t { system = 0, user = 1, assistant = 2, tool = 3 };

/// One message, rendered to text (tool calls serialised).
struct chat_message {
  chat_role role = chat_role::user;
  std::string text;
  bool observation = false;              ///< a tool / environment result
  std::optional<double> timestamp;       ///< openai: arrival of this assistant call (s)
};

/// One conversation or agent session.
struct chat_conversation {
  std::vector<chat_message> messages;
  std::optional<double> timestamp;  ///< session start (s), when the input gives one
  std::int64_t line = 0;            ///< 1-based line where it starts
  void clear() noexcept {
    messages.clear();
    timestamp.reset();
    line = 0;
  }
};

/// Role prefixes and suffixes (Jinja-free chat template).
struct chat_template {
  std::array<std::string, 4> prefix;  ///< indexed by chat_role
  std::array<std::string, 4> suffix;
  std::string begin;  ///< before the first message of every prompt (Llama 3: "<|begin_of_text|>")

  /// The default: ChatML (`<|im_start|>ROLE\n` ... `<|im_end|>\n`).
  [[nodiscard]] static chat_template chatml() {
    chat_template t;
    const std::array<const char*, 4> names = {"system", "user", "assistant", "tool"};
    for (std::size_t i = 0; i < 4; ++i) {
      t.prefix[i] = std::string("<|im_start|>") + names[i] + "\n";
      t.suffix[i] = "<|im_end|>\n";
    }
    return t;
  }

  /// Parses a template file: a JSON object {"ROLE": {"prefix": "...", "suffix": "..."}}
  /// for ROLE in system, user, assistant, tool, and optionally "begin": "..." (text before
  /// the first message of every prompt); a missing role or key is empty.
  [[nodiscard]] static chat_template from_json(std::string_view text) {
    chat_template t;
    json_cursor c(text);
    c.begin_object("");
    std::string_view key;
    std::uint32_t seen = 0;
    while (c.next_member(key)) {
      const std::string role(key);
      if (role == "begin") {
        c.mark_key(seen, std::uint32_t{1} << 4, role);
        t.begin = std::string(c.read_string(role));
        continue;
      }
      std::size_t r = 4;
      if (role == "system") r = 0;
      if (role == "user") r = 1;
      if (role == "assistant") r = 2;
      if (role == "tool") r = 3;
      if (r == 4) c.fail(role, "unknown role (expected system, user, assistant, tool, or begin)");
      c.mark_key(seen, std::uint32_t{1} << r, role);
      c.begin_object(role);
      std::string_view member;
      while (c.next_member(member)) {
        const std::string field = role + "." + std::string(member);
        if (member == "prefix") {
          t.prefix[r] = std::string(c.read_string(field));
        } else if (member == "suffix") {
          t.suffix[r] = std::string(c.read_string(field));
        } else {
          c.fail(field, "unknown key (expected prefix or suffix)");
        }
      }
    }
    c.expect_end();
    return t;
  }

  /// Reads a template file; throws `invalid_argument` when it cannot be read.
  [[nodiscard]] static chat_template from_file(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw invalid_argument("chat template '" + path.string() + "': cannot open");
    std::ostringstream s;
    s << in.rdbuf();
    if (s.str().size() > (std::size_t{1} << 20)) throw invalid_argument("chat template '" + path.string() + "': larger than 1 MiB");
    return from_json(s.str());
  }
};

/// How chat and agent conversations become requests.
struct chat_options {
  chat_template chat = chat_template::chatml();
  /// The tokenizer; null: the built-in approximation (text_tokenizer.hpp).
  std::shared_ptr<bpe_tokenizer> tokenizer = nullptr;
  double sessions_per_second = 1.0;
  double words_per_minute = 90.0;
  /// Mean of the Poisson tool/environment time before a call that follows tool results (s).
  double tool_time_mean_s = 5.0;
  std::uint64_t seed = 42;
  /// Keep only the last K observations whole (-1: no collapsing).
  std::int64_t collapse_observations = -1;
  /// A session stops at the first prompt longer than this (0: no limit).
  std::int64_t max_input_tokens = 32768;
  /// At most this many requests per session (0: no limit).
  std::int64_t max_requests_per_session = 0;
};

namespace detail {

inline void append_json_string(std::string& out, std::string_view s) {
  out.push_back('"');
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(ch);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20) {
      static constexpr char hex[] = "0123456789abcdef";
      out += "\\u00";
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 15]);
    } else {
      out.push_back(ch);
    }
  }
  out.push_back('"');
}

inline std::string_view trim(std::string_view s) noexcept {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\n' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

struct parse_flags {
  bool timestamps = false;  ///< read assistant "timestamp" (openai)
  bool swe_agent = false;   ///< "message_type": "observation" marks an observation
};

// Content: a string, null, or a list of parts.
inline void read_content(json_cursor& c, std::string_view doc, const std::string& field, std::string& out) {
  switch (c.peek(field)) {
    case json_kind::null: c.read_null(field); return;
    case json_kind::string: out.append(c.read_string(field)); return;
    case json_kind::array: {
      c.begin_array(field);
      std::size_t i = 0;
      while (c.next_element(field)) {
        const std::string pf = field + "[" + std::to_string(i) + "]";
        if (c.peek(pf) == json_kind::string) {  // a bare string part
          if (i > 0) out.push_back('\n');
          out.append(c.read_string(pf));
          ++i;
          continue;
        }
        std::string type, text;
        bool have_text = false;
        c.begin_object(pf);
        std::string_view key;
        while (c.next_member(key)) {
          if (key == "type") {
            type = std::string(c.read_string(pf + ".type"));
          } else if (key == "text") {
            if (c.peek(pf + ".text") == json_kind::string) {
              text = std::string(c.read_string(pf + ".text"));
              have_text = true;
            } else {
              c.skip_value(pf + ".text");
            }
          } else {
            c.skip_value(pf + "." + std::string(key));
          }
        }
        if (i > 0) out.push_back('\n');
        if (have_text && (type.empty() || type == "text" || type == "input_text" || type == "output_text")) {
          out += text;
        } else if (!type.empty()) {
          out += "<" + type + ">";
        } else {
          c.fail(pf, "a content part needs a \"type\" or a \"text\"");
        }
        ++i;
      }
      return;
    }
    default: c.fail(field, "content must be a string, null or a list of parts");
  }
  (void)doc;
}

// One tool call object {"function": {"name", "arguments"}, ...} or a legacy function_call
// {"name", "arguments"}; appends its rendering.
inline void read_function(json_cursor& c, std::string_view doc, const std::string& field, std::string& name, std::string& args,
                          bool& have_name) {
  c.begin_object(field);
  std::string_view key;
  while (c.next_member(key)) {
    if (key == "name") {
      name = std::string(c.read_string(field + ".name"));
      have_name = true;
    } else if (key == "arguments") {
      const std::string af = field + ".arguments";
      if (c.peek(af) == json_kind::string) {
        args = std::string(c.read_string(af));
      } else {
        const std::size_t begin = c.offset();
        c.skip_value(af);
        args = std::string(trim(doc.substr(begin, c.offset() - begin)));
      }
    } else {
      c.skip_value(field + "." + std::string(key));
    }
  }
}

inline void append_tool_call(std::string& text, const std::string& name, const std::string& args) {
  if (!text.empty()) text.push_back('\n');
  text += "<tool_call>\n{\"name\": ";
  append_json_string(text, name);
  text += ", \"arguments\": ";
  text += args.empty() ? std::string("{}") : args;
  text += "}\n</tool_call>";
}

inline void read_tool_calls(json_cursor& c, std::string_view doc, const std::string& field, std::string& calls) {
  if (c.peek(field) == json_kind::null) {
    c.read_null(field);
    return;
  }
  c.begin_array(field);
  std::size_t i = 0;
  while (c.next_element(field)) {
    if (i >= chat_limits::max_tool_calls) c.fail(field, "more than 4096 tool calls in one message");
    const std::string cf = field + "[" + std::to_string(i) + "]";
    std::string name, args;
    bool have_name = false;
    c.begin_object(cf);
    std::string_view key;
    while (c.next_member(key)) {
      if (key == "function") {
        read_function(c, doc, cf + ".function", name, args, have_name);
      } else {
        c.skip_value(cf + "." + std::string(key));
      }
    }
    if (!have_name) c.fail(cf + ".function.name", "missing required key");
    append_tool_call(calls, name, args);
    ++i;
  }
}

inline bool parse_role(std::string_view s, chat_role& r) noexcept {
  if (s == "system" || s == "developer") {
    r = chat_role::system;
  } else if (s == "user" || s == "human") {
    r = chat_role::user;
  } else if (s == "assistant") {
    r = chat_role::assistant;
  } else if (s == "tool" || s == "function") {
    r = chat_role::tool;
  } else {
    return false;
  }
  return true;
}

// Parses an array of messages at the cursor into out.messages.
inline void parse_messages(json_cursor& c, std::string_view doc, const std::string& field, chat_conversation& out, parse_flags flags) {
  c.begin_array(field);
  std::size_t index = 0;
  while (c.next_element(field)) {
    if (index >= chat_limits::max_messages) c.fail(field, "more than 2^20 messages");
    const std::string mf = field + "[" + std::to_string(index) + "]";
    chat_message m;
    std::uint32_t keys = 0;  // bit 0: "role"
    std::string content, calls;
    c.begin_object(mf);
    std::string_view key;
    while (c.next_member(key)) {
      if (key == "role") {
        const std::string_view role = c.read_string(mf + ".role");
        if (!parse_role(role, m.role)) c.fail(mf + ".role", "unknown role '" + std::string(role) + "'");
        c.mark_key(keys, 1, [&] { return mf + ".role"; });
      } else if (key == "content") {
        content.clear();
        read_content(c, doc, mf + ".content", content);
      } else if (key == "tool_calls") {
        calls.clear();
        read_tool_calls(c, doc, mf + ".tool_calls", calls);
      } else if (key == "function_call") {
        if (c.peek(mf + ".function_call") == json_kind::null) {
          c.read_null(mf + ".function_call");
        } else {
          std::string name, args;
          bool have_name = false;
          read_function(c, doc, mf + ".function_call", name, args, have_name);
          if (!have_name) c.fail(mf + ".function_call.name", "missing required key");
          calls.clear();
          append_tool_call(calls, name, args);
        }
      } else if (key == "timestamp" && flags.timestamps) {
        const double t = c.read_double(mf + ".timestamp");
        if (!(t >= 0 && t <= chat_limits::max_arrival_seconds)) c.fail(mf + ".timestamp", "must be in [0, 1e10] seconds");
        m.timestamp = t;
      } else if (key == "message_type" && flags.swe_agent) {
        m.observation = m.observation || c.read_string(mf + ".message_type") == "observation";
      } else {
        c.skip_value(mf + "." + std::string(key));
      }
    }
    if (keys == 0) c.fail(mf + ".role", "missing required key");
    m.text = std::move(content);
    if (!calls.empty()) {
      if (!m.text.empty()) m.text.push_back('\n');
      m.text += calls;
    }
    if (m.role == chat_role::tool) m.observation = true;
    if (m.role != chat_role::assistant) m.timestamp.reset();
    out.messages.push_back(std::move(m));
    ++index;
  }
}

}  // namespace detail

/// Parses one openai line: {"messages": [...], "timestamp"?: seconds}; other keys skipped.
inline void parse_openai_line(std::string_view text, std::int64_t line, chat_conversation& out) {
  out.clear();
  out.line = line;
  json_cursor c(text, line);
  c.begin_object("");
  std::string_view key;
  enum : std::uint32_t { k_messages = 1, k_timestamp = 2 };
  std::uint32_t seen = 0;
  while (c.next_member(key)) {
    if (key == "messages") {
      c.mark_key(seen, k_messages, "messages");
      detail::parse_messages(c, text, "messages", out, {.timestamps = true, .swe_agent = false});
    } else if (key == "timestamp") {
      c.mark_key(seen, k_timestamp, "timestamp");
      const double t = c.read_double("timestamp");
      if (!(t >= 0 && t <= chat_limits::max_arrival_seconds)) c.fail("timestamp", "must be in [0, 1e10] seconds");
      out.timestamp = t;
    } else {
      c.skip_value(key);
    }
  }
  c.expect_end();
  if ((seen & k_messages) == 0) throw format_error(line, "messages", "missing required key");
}

/// Parses one SWE-agent trajectory document: an object whose "history" is the LLM's
/// message list (other keys skipped). A user message with "message_type": "observation"
/// is an observation.
inline void parse_swe_agent_traj(std::string_view text, chat_conversation& out) {
  out.clear();
  out.line = 1;
  json_cursor c(text, 1);
  c.begin_object("");
  std::string_view key;
  std::uint32_t seen = 0;  // bit 0: "history"
  while (c.next_member(key)) {
    if (key == "history") {
      c.mark_key(seen, 1, "history");
      detail::parse_messages(c, text, "history", out, {.timestamps = false, .swe_agent = true});
    } else {
      c.skip_value(key);
    }
  }
  c.expect_end();
  if (seen == 0) throw format_error(1, "history", "missing required key");
}

/// Parses one tau-bench task (an element of the results array, starting at `line`):
/// {"traj": [...] } (or "messages"); other keys skipped.
inline void parse_tau_bench_task(std::string_view text, std::int64_t line, chat_conversation& out) {
  out.clear();
  out.line = line;
  json_cursor c(text, line);
  c.begin_object("");
  std::string_view key;
  bool have_traj = false;
  while (c.next_member(key)) {
    if (key == "traj" || key == "messages") {
      if (have_traj) c.fail(key, "duplicate trajectory (\"traj\" or \"messages\")");
      have_traj = true;
      const std::string field(key);
      detail::parse_messages(c, text, field, out, {.timestamps = false, .swe_agent = false});
    } else {
      c.skip_value(key);
    }
  }
  c.expect_end();
  if (!have_traj) throw format_error(line, "traj", "missing required key");
}

/// Poisson(mean) draw for (seed, session, turn), deterministic and order independent.
[[nodiscard]] inline std::int64_t chat_poisson(double mean, std::uint64_t seed, std::int64_t session, std::int64_t turn) noexcept {
  if (!(mean > 0)) return 0;
  std::uint64_t state = splitmix64_mix(seed ^ splitmix64_mix(static_cast<std::uint64_t>(session) * 2 + 1) ^
                                       splitmix64_mix((static_cast<std::uint64_t>(turn) << 1) | 1u) * 3);
  const double limit = std::exp(-mean);
  double p = 1.0;
  std::int64_t k = 0;
  for (;;) {
    state += splitmix64_gamma;
    const double u = static_cast<double>(splitmix64_mix(state) >> 11) * 0x1.0p-53;
    p *= u;
    if (p <= limit) return k;
    ++k;
  }
}

}  // namespace hybridcache::sim
