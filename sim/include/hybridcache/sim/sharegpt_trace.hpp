// hybridcache/sim/sharegpt_trace.hpp
//
// Reader for multi-turn conversations in ShareGPT form, one conversation per line:
//
//   {"conversations": [{"from": "human", "value": "..."}, {"from": "gpt", "value": "..."}, ...]}
//
// turned into a request trace by Marconi's recipe (ruipeterpan/marconi,
// utils/generate_trace.py):
//   - request k of a conversation: input = every earlier message + human message k,
//     output = gpt message k; so each prompt extends the previous prompt + output;
//   - messages are tokenized by the built-in tokenizer (text_tokenizer.hpp), or by a real
//     byte-level BPE (`sharegpt_options::tokenizer`, bpe_tokenizer.hpp), each preceded by one
//     role token (system/user/assistant ids 1-3) as a minimal chat template;
//   - conversation s (its 0-based line among non-blank lines) starts at s / sessions_per_second;
//     request k > 0 arrives words(human message k) / (words_per_minute / 60) seconds after
//     request k-1 (the user's typing time; Marconi: 90 words per minute, counting spaces);
//   - a conversation stops at the first request whose prompt would exceed
//     `max_input_tokens` (Marconi: 32,768);
//   - a trailing human message with no answer makes no request (as Marconi's pairing).
// Roles: leading "system" messages become history; then messages must alternate
// human ("human"/"user") and assistant ("gpt"/"assistant"/"chatgpt"/"bing"/"bard").
// Other keys ("id", ...) are skipped.
//
// Streaming and order: requests are emitted in (arrival, session, turn) order. Sessions
// start in line order, so a request can be emitted once it is no later than the start of
// the next unread conversation; the reader keeps only the conversations still in flight
// (their tokens), never the whole file.
// Cost: O(line bytes) to tokenize; O(prompt) to emit a request; O(log in-flight requests)
// for the ordering heap.
#pragma once

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <istream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "hybridcache/core/error.hpp"
#include "hybridcache/sim/tokenizer/bpe_tokenizer.hpp"
#include "hybridcache/sim/json.hpp"
#include "hybridcache/sim/line_reader.hpp"
#include "hybridcache/sim/request.hpp"
#include "hybridcache/sim/tokenizer/text_tokenizer.hpp"

namespace hybridcache::sim {

/// How the think time between turns counts words.
enum class think_time_words {
  words,   ///< `count_words`: letter/digit runs and CJK characters (default)
  spaces,  ///< Marconi's exact rule: the number of ' ' in the user's message
};

/// How conversations become requests.
struct sharegpt_options {
  /// Conversations started per second (session s starts at s / sessions_per_second).
  double sessions_per_second = 1.0;
  /// Typing speed for the think time before every turn after the first.
  double words_per_minute = 90.0;
  think_time_words word_rule = think_time_words::words;
  /// A conversation stops at the first prompt longer than this (0: no limit).
  std::int64_t max_input_tokens = 32768;
  /// Put one role token before every message.
  bool role_tokens = true;
  /// A real tokenizer (bpe_tokenizer.hpp); null: the built-in approximation.
  std::shared_ptr<bpe_tokenizer> tokenizer = nullptr;
};

/// Streaming ShareGPT reader. Models `request_source`.
class sharegpt_reader {
 public:
  /// Reads from `in` (which must outlive the reader). Throws `invalid_argument` for
  /// non-positive rates or a negative token limit.
  explicit sharegpt_reader(std::istream& in, sharegpt_options options = {}) : lines_(in), options_(validated(options)) {}
  /// Opens `path`; throws `invalid_argument` if it cannot be opened.
  explicit sharegpt_reader(const std::filesystem::path& path, sharegpt_options options = {})
      : lines_(path), options_(validated(options)) {}

  /// Fills `r` with the next request in arrival order; false when every conversation is done.
  bool next(request& r) {
    // Read conversations until the earliest pending request cannot be preceded by one
    // from an unread conversation (which starts no earlier than next_session_start()).
    while (!eof_ && (pending_.empty() || pending_.top().arrival_s > next_session_start())) read_conversation();
    if (pending_.empty()) return false;
    const pending_request p = pending_.top();
    pending_.pop();
    auto it = sessions_.find(p.session_id);
    conversation& c = it->second;
    const std::size_t human = c.first_request_message + 2 * static_cast<std::size_t>(p.turn_id);
    const std::size_t input_end = c.message_end[human];
    const std::size_t output_end = c.message_end[human + 1];
    r.arrival_s = p.arrival_s;
    r.session_id = p.session_id;
    r.turn_id = p.turn_id;
    r.input.assign(c.tokens.begin(), c.tokens.begin() + static_cast<std::ptrdiff_t>(input_end));
    r.output.assign(c.tokens.begin() + static_cast<std::ptrdiff_t>(input_end), c.tokens.begin() + static_cast<std::ptrdiff_t>(output_end));
    r.input_tokens = static_cast<std::int64_t>(r.input.size());
    r.output_tokens = static_cast<std::int64_t>(r.output.size());
    r.tokens_per_id = 1;
    r.source_line = c.line;
    if (--c.requests_left == 0) sessions_.erase(it);
    return true;
  }

  /// 1-based line of the conversation last read.
  [[nodiscard]] std::int64_t line_number() const noexcept { return lines_.line_number(); }

  /// Conversations read so far.
  [[nodiscard]] std::int64_t conversations() const noexcept { return next_session_; }
  /// Conversations whose requests are not all emitted yet (memory held).
  [[nodiscard]] std::size_t conversations_in_flight() const noexcept { return sessions_.size(); }

 private:
  struct conversation {
    std::vector<token_id> tokens;         // all messages, role tokens included
    std::vector<std::size_t> message_end; // end offset of each message in tokens
    std::size_t first_request_message = 0;
    std::int64_t requests_left = 0;
    std::int64_t line = 0;
  };
  enum class role { system, human, assistant };

  static sharegpt_options validated(sharegpt_options o) {
    HYBRIDCACHE_EXPECTS(o.sessions_per_second > 0 && std::isfinite(o.sessions_per_second), invalid_argument,
                        "sharegpt: sessions_per_second must be positive");
    HYBRIDCACHE_EXPECTS(o.words_per_minute > 0 && std::isfinite(o.words_per_minute), invalid_argument,
                        "sharegpt: words_per_minute must be positive");
    HYBRIDCACHE_EXPECTS(o.max_input_tokens >= 0, invalid_argument, "sharegpt: max_input_tokens must be >= 0 (0: no limit)");
    return o;
  }

  [[nodiscard]] double next_session_start() const noexcept {
    return static_cast<double>(next_session_) / options_.sessions_per_second;
  }

  static bool parse_role(std::string_view from, role& out) noexcept {
    if (from == "human" || from == "user") {
      out = role::human;
    } else if (from == "gpt" || from == "assistant" || from == "chatgpt" || from == "bing" || from == "bard") {
      out = role::assistant;
    } else if (from == "system") {
      out = role::system;
    } else {
      return false;
    }
    return true;
  }

  void read_conversation() {
    std::string_view text;
    if (!lines_.next_nonblank(text)) {
      eof_ = true;
      return;
    }
    const std::int64_t line = lines_.line_number();
    const std::int64_t session = next_session_++;
    conversation c;
    c.line = line;
    std::vector<std::string> human_texts;  // for the think time
    json_cursor cursor(text, line);
    std::uint32_t seen = 0;  // the one key taken: "conversations"
    cursor.begin_object("");
    std::string_view key;
    while (cursor.next_member(key)) {
      if (key != "conversations") {
        cursor.skip_value(key);
        continue;
      }
      cursor.mark_key(seen, 1, key);
      cursor.begin_array("conversations");
      std::size_t index = 0;
      bool in_dialogue = false;  // past the leading system messages
      role expected = role::human;
      while (cursor.next_element("conversations")) {
        const std::string field = "conversations[" + std::to_string(index) + "]";
        enum : std::uint32_t { k_from = 1, k_value = 2 };
        std::uint32_t keys = 0;
        role who = role::human;
        value_.clear();
        cursor.begin_object(field);
        std::string_view member;
        while (cursor.next_member(member)) {
          if (member == "from") {
            cursor.mark_key(keys, k_from, [&] { return field + ".from"; });
            const std::string_view from = cursor.read_string(field + ".from");
            if (!parse_role(from, who)) cursor.fail(field + ".from", "unknown role '" + std::string(from) + "'");
          } else if (member == "value") {
            cursor.mark_key(keys, k_value, [&] { return field + ".value"; });
            value_.assign(cursor.read_string(field + ".value"));
          } else {
            cursor.skip_value(field + "." + std::string(member));
          }
        }
        if ((keys & k_from) == 0) throw format_error(line, field + ".from", "missing required key");
        if ((keys & k_value) == 0) throw format_error(line, field + ".value", "missing required key");
        if (who == role::system) {
          if (in_dialogue) throw format_error(line, field + ".from", "a system message after the dialogue started");
          c.first_request_message = index + 1;
        } else {
          in_dialogue = true;
          if (who != expected)
            throw format_error(line, field + ".from",
                               expected == role::human ? "expected a human turn (turns must alternate)" : "expected an assistant turn (turns must alternate)");
          expected = expected == role::human ? role::assistant : role::human;
          if (who == role::human) human_texts.push_back(value_);
        }
        if (options_.role_tokens)
          c.tokens.push_back(who == role::system ? role_token_system : who == role::human ? role_token_user : role_token_assistant);
        if (options_.tokenizer)
          options_.tokenizer->encode(value_, c.tokens);
        else
          tokenize_text(value_, c.tokens);
        c.message_end.push_back(c.tokens.size());
        ++index;
      }
    }
    cursor.expect_end();
    if (seen == 0) throw format_error(line, "conversations", "missing required key");

    // Requests: every answered human turn, until a prompt exceeds the limit.
    const std::size_t messages = c.message_end.size();
    const double words_per_second = options_.words_per_minute / 60.0;
    double arrival = static_cast<double>(session) / options_.sessions_per_second;
    std::int64_t turn = 0;
    for (std::size_t human = c.first_request_message; human + 1 < messages; human += 2, ++turn) {
      if (options_.max_input_tokens > 0 && static_cast<std::int64_t>(c.message_end[human]) > options_.max_input_tokens) break;
      if (turn > 0) {
        const std::string& typed = human_texts[static_cast<std::size_t>(turn)];
        const auto words = options_.word_rule == think_time_words::spaces ? count_spaces(typed) : count_words(typed);
        arrival += static_cast<double>(words) / words_per_second;
      }
      if (!(arrival <= max_arrival_seconds))
        throw format_error(line, "", "arrival time " + format_number(arrival) + " s exceeds 1e10 s (conversation " +
                                         std::to_string(session) + " at this --sessions-per-second)");
      pending_.push({arrival, session, turn});
      ++c.requests_left;
    }
    if (c.requests_left > 0) sessions_.emplace(session, std::move(c));
  }

  line_reader lines_;
  sharegpt_options options_;
  std::int64_t next_session_ = 0;
  bool eof_ = false;
  std::string value_;
  std::unordered_map<std::int64_t, conversation> sessions_;
  pending_requests pending_;
};
static_assert(request_source<sharegpt_reader>);

}  // namespace hybridcache::sim
