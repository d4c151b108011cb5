// hybridcache/sim/chat_trace.hpp
//
// Readers for the conversations users and agents actually have, turned into request traces:
//
//   openai     one conversation per line: {"messages": [OpenAI chat messages], "timestamp"?}
//   swe-agent  SWE-agent trajectories (.traj: a JSON object with a "history" message list);
//              a file, or a directory searched recursively for *.traj (sorted by path)
//   tau-bench  tau-bench results: a JSON array of tasks, each {"traj": [OpenAI messages]}
//
// All three parse messages into one model (`chat_message`: role, text, observation flag)
// and share one request recipe (docs/traces.md, "Chat and agent traces"):
//
//   - every assistant message is one request (one LLM call): its prompt is every earlier
//     message rendered through the chat template, then the assistant prefix (the
//     generation prompt); its output is the assistant message and the assistant suffix;
//   - rendering: a message is prefix(role) + text + suffix(role); the three pieces are
//     tokenized separately, so prompt k+1 extends prompt k + output k exactly;
//   - text of a message: string content, or the "text" of its content parts joined by
//     "\n" (a non-text part becomes "<TYPE>"); each tool call appends (after a "\n" when
//     the text is not empty) `<tool_call>\n{"name": NAME, "arguments": ARGS}\n</tool_call>`,
//     ARGS being the arguments string verbatim (or the raw JSON when it is not a string);
//   - roles: system/developer -> system, user, assistant, tool/function -> tool;
//   - arrivals: session s starts at its "timestamp" (openai) or s / sessions_per_second;
//     an openai assistant message with a "timestamp" arrives then; otherwise request k > 0
//     arrives after the previous one plus words(user messages in between) / (wpm / 60)
//     plus, when tool results (observations) came in between, a Poisson draw with mean
//     `tool_time_mean_s` (Marconi's SWE-bench recipe: Poisson(art), art = 5, 7.5, 10 s);
//   - optional observation collapsing: with `collapse_observations = K`, only the last K
//     observations before a call are kept whole; each older one is replaced by
//     "Old environment output: (N lines omitted)" (Marconi's SWE-bench recipe: K = 5);
//   - a session stops at the first prompt longer than `max_input_tokens` (0: no limit) or
//     after `max_requests_per_session` requests (0: no limit; Marconi: 50).
// A system prompt shared across sessions is kept verbatim, so a prefix cache can find it.
//
// Bad input: every error is a `format_error(line, field, what)` with a field path such as
// `messages[3].tool_calls[0].function.name`; sizes are capped (`chat_limits`) and nothing
// is allocated in proportion to a number read from the input.
//
// Fuzz entry points (one call on the whole input): `parse_openai_line`,
// `parse_swe_agent_traj`, `parse_tau_bench_task`, and the readers on a std::istream.
#pragma once

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <istream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hybridcache/core/error.hpp"
#include "hybridcache/core/hash.hpp"
#include "hybridcache/sim/chat_format.hpp"
#include "hybridcache/sim/line_reader.hpp"
#include "hybridcache/sim/request.hpp"
#include "hybridcache/sim/tokenizer/text_tokenizer.hpp"

namespace hybridcache::sim {

/// The shared engine: conversations from `Source` (`bool next(chat_conversation&)`) to
/// requests in (arrival, session, turn) order. Models `request_source`.
template <class Source>
class chat_reader {
 public:
  template <class... Args>
  explicit chat_reader(chat_options options, Args&&... args) : source_(std::forward<Args>(args)...), options_(validated(std::move(options))) {
    for (std::size_t r = 0; r < 4; ++r) {
      encode(options_.chat.prefix[r], prefix_tokens_[r]);
      encode(options_.chat.suffix[r], suffix_tokens_[r]);
    }
    encode(options_.chat.begin, begin_tokens_);
  }

  bool next(request& r) {
    while (!eof_ && (pending_.empty() || pending_.top().arrival_s > last_start_)) read_conversation();
    if (pending_.empty()) return false;
    const pending_request p = pending_.top();
    pending_.pop();
    auto it = sessions_.find(p.session_id);
    session& s = it->second;
    const std::size_t k = s.calls[static_cast<std::size_t>(p.turn_id)];
    build_input(s, k, r.input);
    r.output.clear();
    r.output.insert(r.output.end(), s.content[k].begin(), s.content[k].end());
    r.output.insert(r.output.end(), suffix_tokens_[2].begin(), suffix_tokens_[2].end());
    r.arrival_s = p.arrival_s;
    r.session_id = p.session_id;
    r.turn_id = p.turn_id;
    r.input_tokens = static_cast<std::int64_t>(r.input.size());
    r.output_tokens = static_cast<std::int64_t>(r.output.size());
    r.tokens_per_id = 1;
    r.source_line = s.line;
    if (--s.requests_left == 0) sessions_.erase(it);
    return true;
  }

  /// Conversations read so far.
  [[nodiscard]] std::int64_t conversations() const noexcept { return next_session_; }
  /// True when a real tokenizer (not the built-in approximation) is used.
  [[nodiscard]] bool exact_tokenizer() const noexcept { return options_.tokenizer != nullptr; }

 private:
  struct session {
    std::vector<chat_role> roles;
    std::vector<std::vector<token_id>> content;    // tokens of each message's text
    std::vector<std::vector<token_id>> collapsed;  // observation placeholders (when collapsing)
    std::vector<std::int64_t> observations_upto;   // observations among messages [0, i]
    std::vector<std::size_t> calls;                // message index of each request
    std::int64_t requests_left = 0;
    std::int64_t line = 0;
  };

  static chat_options validated(chat_options o) {
    HYBRIDCACHE_EXPECTS(o.sessions_per_second > 0 && std::isfinite(o.sessions_per_second), invalid_argument,
                        "chat trace: sessions_per_second must be positive");
    HYBRIDCACHE_EXPECTS(o.words_per_minute > 0 && std::isfinite(o.words_per_minute), invalid_argument,
                        "chat trace: words_per_minute must be positive");
    HYBRIDCACHE_EXPECTS(o.tool_time_mean_s >= 0 && o.tool_time_mean_s <= 600, invalid_argument,
                        "chat trace: tool_time_mean_s must be in [0, 600]");
    HYBRIDCACHE_EXPECTS(o.collapse_observations >= -1, invalid_argument, "chat trace: collapse_observations must be >= 0 (-1: off)");
    HYBRIDCACHE_EXPECTS(o.max_input_tokens >= 0 && o.max_requests_per_session >= 0, invalid_argument,
                        "chat trace: limits must be >= 0 (0: none)");
    return o;
  }

  void encode(std::string_view text, std::vector<token_id>& out) {
    if (options_.tokenizer)
      options_.tokenizer->encode(text, out);
    else
      tokenize_text(text, out);
  }

  [[nodiscard]] bool collapsed_at(const session& s, std::size_t i, std::size_t call) const noexcept {
    if (options_.collapse_observations < 0 || s.collapsed[i].empty()) return false;
    const std::int64_t before_call = call == 0 ? 0 : s.observations_upto[call - 1];
    return before_call - s.observations_upto[i] >= options_.collapse_observations;
  }

  void append_message(const session& s, std::size_t i, bool collapse, std::vector<token_id>& out) const {
    const auto r = static_cast<std::size_t>(s.roles[i]);
    out.insert(out.end(), prefix_tokens_[r].begin(), prefix_tokens_[r].end());
    const auto& body = collapse ? s.collapsed[i] : s.content[i];
    out.insert(out.end(), body.begin(), body.end());
    out.insert(out.end(), suffix_tokens_[r].begin(), suffix_tokens_[r].end());
  }

  void build_input(const session& s, std::size_t call, std::vector<token_id>& out) const {
    out.assign(begin_tokens_.begin(), begin_tokens_.end());
    for (std::size_t i = 0; i < call; ++i) append_message(s, i, collapsed_at(s, i, call), out);
    out.insert(out.end(), prefix_tokens_[2].begin(), prefix_tokens_[2].end());
  }

  [[nodiscard]] std::int64_t input_length(const session& s, std::size_t call) const noexcept {
    std::size_t n = begin_tokens_.size() + prefix_tokens_[2].size();
    for (std::size_t i = 0; i < call; ++i) {
      const auto r = static_cast<std::size_t>(s.roles[i]);
      n += prefix_tokens_[r].size() + suffix_tokens_[r].size() + (collapsed_at(s, i, call) ? s.collapsed[i] : s.content[i]).size();
    }
    return static_cast<std::int64_t>(n);
  }

  void read_conversation() {
    if (!source_.next(conversation_)) {
      eof_ = true;
      last_start_ = std::numeric_limits<double>::infinity();
      return;
    }
    const std::int64_t id = next_session_++;
    const chat_conversation& conv = conversation_;
    double start = static_cast<double>(id) / options_.sessions_per_second;  // <= 1e10 checked per request
    if (conv.timestamp) {
      start = *conv.timestamp;
    } else {
      for (const auto& m : conv.messages)
        if (m.role == chat_role::assistant && m.timestamp) {
          start = *m.timestamp;
          break;
        }
    }
    if (start < last_start_)
      throw format_error(conv.line, "timestamp", "session starts at " + std::to_string(start) + " s, before the previous session (" +
                                                     std::to_string(last_start_) + " s): sessions must be in start order");
    last_start_ = start;

    session s;
    s.line = conv.line;
    const std::size_t n = conv.messages.size();
    s.roles.reserve(n);
    s.content.resize(n);
    s.collapsed.resize(n);
    s.observations_upto.resize(n);
    std::int64_t observations = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const chat_message& m = conv.messages[i];
      s.roles.push_back(m.role);
      encode(m.text, s.content[i]);
      if (m.observation) {
        ++observations;
        if (options_.collapse_observations >= 0) {
          const auto lines = m.text.empty() ? 0 : std::count(m.text.begin(), m.text.end(), '\n') + (m.text.back() == '\n' ? 0 : 1);
          encode("Old environment output: (" + std::to_string(lines) + " lines omitted)", s.collapsed[i]);
        }
      }
      s.observations_upto[i] = observations;
    }
    // Requests: the assistant messages, with arrivals.
    const double words_per_second = options_.words_per_minute / 60.0;
    double arrival = start;
    std::int64_t words = 0;
    bool tool_results = false;
    for (std::size_t k = 0; k < n; ++k) {
      const chat_message& m = conv.messages[k];
      if (m.role != chat_role::assistant) {
        if (m.observation)
          tool_results = true;
        else if (m.role == chat_role::user)
          words += count_words(m.text);
        continue;
      }
      const auto turn = static_cast<std::int64_t>(s.calls.size());
      if (options_.max_requests_per_session > 0 && turn >= options_.max_requests_per_session) break;
      const std::int64_t prompt = input_length(s, k);
      if (options_.max_input_tokens > 0 && prompt > options_.max_input_tokens) break;
      if (prompt > chat_limits::max_request_tokens ||
          static_cast<std::int64_t>(s.content[k].size() + suffix_tokens_[2].size()) > chat_limits::max_request_tokens)
        throw format_error(conv.line, "messages[" + std::to_string(k) + "]", "a prompt or output longer than 2^24 tokens");
      if (m.timestamp) {
        if (*m.timestamp < arrival)
          throw format_error(conv.line, "messages[" + std::to_string(k) + "].timestamp",
                             "goes backwards (before the session start or the previous call)");
        arrival = *m.timestamp;
      } else if (turn > 0) {
        arrival += static_cast<double>(words) / words_per_second;
        if (tool_results) arrival += static_cast<double>(chat_poisson(options_.tool_time_mean_s, options_.seed, id, turn));
      }
      if (!(arrival <= chat_limits::max_arrival_seconds))
        throw format_error(conv.line, "messages[" + std::to_string(k) + "]", "arrival later than 1e10 s");
      words = 0;
      tool_results = false;
      s.calls.push_back(k);
      pending_.push({arrival, id, turn});
      ++s.requests_left;
    }
    if (s.requests_left > 0) sessions_.emplace(id, std::move(s));
  }

  Source source_;
  chat_options options_;
  std::array<std::vector<token_id>, 4> prefix_tokens_;
  std::array<std::vector<token_id>, 4> suffix_tokens_;
  std::vector<token_id> begin_tokens_;  // the template's "begin", before every prompt
  chat_conversation conversation_;
  std::int64_t next_session_ = 0;
  double last_start_ = -std::numeric_limits<double>::infinity();
  bool eof_ = false;
  std::unordered_map<std::int64_t, session> sessions_;
  pending_requests pending_;
};

/// openai: one conversation per non-blank line.
class openai_source {
 public:
  explicit openai_source(std::istream& in) : lines_(in) {}
  explicit openai_source(const std::filesystem::path& path) : lines_(path) {}
  bool next(chat_conversation& out) {
    std::string_view text;
    if (!lines_.next_nonblank(text)) return false;
    parse_openai_line(text, lines_.line_number(), out);
    return true;
  }

 private:
  line_reader lines_;
};

/// swe-agent: one .traj document from a stream, or every *.traj under a path (a file or
/// a directory searched recursively, in sorted path order).
class swe_agent_source {
 public:
  explicit swe_agent_source(std::istream& in) : stream_(&in) {}
  explicit swe_agent_source(const std::filesystem::path& path) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) {
      for (auto it = std::filesystem::recursive_directory_iterator(path, ec); !ec && it != std::filesystem::recursive_directory_iterator();
           it.increment(ec)) {
        if (it->is_regular_file(ec) && it->path().extension() == ".traj") {
          if (files_.size() >= chat_limits::max_files) throw invalid_argument("swe-agent: more than 2^20 .traj files under '" + path.string() + "'");
          files_.push_back(it->path());
        }
      }
      if (ec) throw invalid_argument("swe-agent: cannot list '" + path.string() + "': " + ec.message());
      std::sort(files_.begin(), files_.end());
      if (files_.empty()) throw invalid_argument("swe-agent: no .traj file under '" + path.string() + "'");
    } else if (std::filesystem::is_regular_file(path, ec)) {
      files_.push_back(path);
    } else {
      throw invalid_argument("swe-agent: '" + path.string() + "' is neither a file nor a directory");
    }
  }

  bool next(chat_conversation& out) {
    if (stream_ != nullptr) {
      if (done_) return false;
      done_ = true;
      read_capped(*stream_, "<stream>");
      parse_swe_agent_traj(text_, out);
      return true;
    }
    if (next_file_ >= files_.size()) return false;
    const std::filesystem::path& path = files_[next_file_++];
    std::ifstream in(path, std::ios::binary);
    if (!in) throw invalid_argument("swe-agent: cannot open '" + path.string() + "'");
    read_capped(in, path.string());
    try {
      parse_swe_agent_traj(text_, out);
    } catch (const format_error& e) {
      throw format_error(e.line(), e.field(), path.string() + ": " + e.what());
    }
    return true;
  }

  /// The .traj files read, in session order.
  [[nodiscard]] const std::vector<std::filesystem::path>& files() const noexcept { return files_; }

 private:
  void read_capped(std::istream& in, const std::string& name) {
    text_.clear();
    char buf[1 << 16];
    while (in) {
      in.read(buf, sizeof buf);
      text_.append(buf, static_cast<std::size_t>(in.gcount()));
      if (text_.size() > chat_limits::max_document_bytes) throw invalid_argument("swe-agent: '" + name + "' is larger than 1 GiB");
    }
  }

  std::istream* stream_ = nullptr;
  bool done_ = false;
  std::vector<std::filesystem::path> files_;
  std::size_t next_file_ = 0;
  std::string text_;
};

/// tau-bench: the elements of the results array.
class tau_bench_source {
 public:
  explicit tau_bench_source(std::istream& in) : array_(in) {}
  explicit tau_bench_source(const std::filesystem::path& path) : array_(path) {}
  bool next(chat_conversation& out) {
    std::string_view element;
    std::int64_t line = 0;
    if (!array_.next(element, line)) return false;
    parse_tau_bench_task(element, line, out);
    return true;
  }

 private:
  json_array_reader array_;
};

/// `--format openai`.
class openai_reader : public chat_reader<openai_source> {
 public:
  explicit openai_reader(std::istream& in, chat_options options = {}) : chat_reader(std::move(options), in) {}
  explicit openai_reader(const std::filesystem::path& path, chat_options options = {}) : chat_reader(std::move(options), path) {}
};
static_assert(request_source<openai_reader>);

/// `--format swe-agent`.
class swe_agent_reader : public chat_reader<swe_agent_source> {
 public:
  explicit swe_agent_reader(std::istream& in, chat_options options = {}) : chat_reader(std::move(options), in) {}
  explicit swe_agent_reader(const std::filesystem::path& path, chat_options options = {}) : chat_reader(std::move(options), path) {}
};
static_assert(request_source<swe_agent_reader>);

/// `--format tau-bench`.
class tau_bench_reader : public chat_reader<tau_bench_source> {
 public:
  explicit tau_bench_reader(std::istream& in, chat_options options = {}) : chat_reader(std::move(options), in) {}
  explicit tau_bench_reader(const std::filesystem::path& path, chat_options options = {}) : chat_reader(std::move(options), path) {}
};
static_assert(request_source<tau_bench_reader>);

}  // namespace hybridcache::sim
