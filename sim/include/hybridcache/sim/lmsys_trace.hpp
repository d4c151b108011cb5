// hybridcache/sim/lmsys_trace.hpp
//
// `--format lmsys`: LMSys-Chat-1M conversations (lmsys/lmsys-chat-1m, the third workload
// family of Marconi's evaluation, papers/000 §5.1), as JSON Lines, one dataset row per line
// (what `datasets`' `to_json` writes from the published parquet files):
//
//   {"conversation_id": "...", "model": "vicuna-13b",
//    "conversation": [{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}, ...],
//    "turn": 1, "language": "English", "openai_moderation": [...], "redacted": false}
//
// "conversation" (OpenAI-style role/content messages) is required; "conversation_id",
// "model" and "language" must be strings and "turn" a non-negative integer when present
// (they are checked, not used); every other key is skipped. The rows have no timestamps, so
// a conversation starts at its index / sessions_per_second and its turns follow the chat
// recipe (chat_trace.hpp: each assistant message is one request whose prompt is the history
// through the chat template; a turn arrives after the user's words at 90 words per minute),
// which is Marconi's LMSys timing rule (anchors/marconi.md: session s at s/sps, inter-turn
// gap = words / (90 wpm / 60)). Marconi's row filters (>= 10 turns, <= 50 % non-ASCII) are
// not applied: filter the rows first (e.g. `jq -c 'select(.turn >= 10)'`).
//
// Bad input: a `format_error` naming the line and the field (`conversation[2].role`); a
// JSON array (the whole file as one document) is refused with how to convert it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <istream>
#include <string>
#include <string_view>
#include <utility>

#include "hybridcache/core/error.hpp"
#include "hybridcache/sim/chat_format.hpp"
#include "hybridcache/sim/chat_trace.hpp"
#include "hybridcache/sim/json.hpp"
#include "hybridcache/sim/line_reader.hpp"
#include "hybridcache/sim/request.hpp"

namespace hybridcache::sim {

/// Parses one LMSys-Chat-1M row into `out` (see the header comment). O(line).
/// @throws format_error naming `line` and the field.
inline void parse_lmsys_line(std::string_view text, std::int64_t line, chat_conversation& out) {
  out.clear();
  out.line = line;
  if (const std::string_view t = detail::trim(text); !t.empty() && t.front() == '[')
    throw format_error(line, "", "a JSON array: --format lmsys reads one row object per line (JSON Lines); "
                                 "convert with jq -c '.[]'");
  json_cursor c(text, line);
  c.begin_object("");
  std::string_view key;
  enum : std::uint32_t { k_conversation = 1, k_id = 2, k_model = 4, k_turn = 8, k_language = 16 };
  std::uint32_t seen = 0;
  while (c.next_member(key)) {
    if (key == "conversation") {
      c.mark_key(seen, k_conversation, "conversation");
      detail::parse_messages(c, text, "conversation", out, {.timestamps = false, .swe_agent = false});
    } else if (key == "conversation_id" || key == "model" || key == "language") {
      const std::string field(key);
      c.mark_key(seen, key == "model" ? k_model : key == "language" ? k_language : k_id, field);
      (void)c.read_string(field);
    } else if (key == "turn") {
      c.mark_key(seen, k_turn, "turn");
      if (c.read_int("turn") < 0) c.fail("turn", "must be a non-negative integer");
    } else {
      c.skip_value(key);
    }
  }
  c.expect_end();
  if ((seen & k_conversation) == 0) throw format_error(line, "conversation", "missing required key");
}

/// lmsys: one row per non-blank line.
class lmsys_source {
 public:
  explicit lmsys_source(std::istream& in) : lines_(in) {}
  explicit lmsys_source(const std::filesystem::path& path) : lines_(path) {}
  bool next(chat_conversation& out) {
    std::string_view text;
    if (!lines_.next_nonblank(text)) return false;
    parse_lmsys_line(text, lines_.line_number(), out);
    return true;
  }

 private:
  line_reader lines_;
};

/// `--format lmsys`.
class lmsys_reader : public chat_reader<lmsys_source> {
 public:
  explicit lmsys_reader(std::istream& in, chat_options options = {}) : chat_reader(std::move(options), in) {}
  explicit lmsys_reader(const std::filesystem::path& path, chat_options options = {}) : chat_reader(std::move(options), path) {}
};
static_assert(request_source<lmsys_reader>);

}  // namespace hybridcache::sim
