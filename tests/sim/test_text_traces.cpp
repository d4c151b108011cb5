// ShareGPT conversations (tokenizer, request construction, think time, ordering), Azure CSV,
// cachepawl JSON, and the open_trace factory.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <hybridcache/sim/trace.hpp>
#include <hybridcache/sim/trace_stats.hpp>

#include "../support/shared_data.hpp"

using namespace hybridcache;
using namespace hybridcache::sim;

namespace {

std::vector<token_id> tokens_of(std::string_view text) {
  std::vector<token_id> ids;
  tokenize_text(text, ids);
  return ids;
}

template <class R, class... Options>
format_error read_error(const std::string& text, Options... options) {
  std::istringstream in(text);
  R reader(in, options...);
  request r;
  try {
    while (reader.next(r)) {
    }
  } catch (const format_error& e) {
    return e;
  }
  FAIL("no format_error for:\n" << text);
  return format_error(0, "", "");
}

}  // namespace

TEST_CASE("tokenizer: deterministic pieces, counts and word rules") {
  CHECK(tokens_of("").empty());
  CHECK(tokens_of("hello") == tokens_of("hello"));
  CHECK(tokens_of("hello") != tokens_of("hellO"));
  CHECK(tokens_of("hello world").size() == 2);      // "hello", " world"
  CHECK(tokens_of("hello world")[0] == tokens_of("hello")[0]);
  CHECK(tokens_of("hello world")[1] != tokens_of("world")[0]);  // " world" differs from "world"
  CHECK(tokens_of("internationalization").size() == 4);         // 20 letters, pieces of 6
  CHECK(tokens_of("1234567").size() == 3);                      // 123 456 7
  CHECK(tokens_of("a, b.").size() == 4);                        // a , " b" .
  CHECK(tokens_of("x\n\n    y").size() == 3);                   // x, "\n\n   ", " y"
  CHECK(tokens_of("  ").size() == 1);
  CHECK(tokens_of("中文字").size() == 3);                       // one per CJK character
  CHECK(tokens_of("свинья").size() == 1);                       // Cyrillic letters form words
  CHECK(tokens_of("😀").size() == 1);
  CHECK(tokens_of("\xFF\xFE").size() == 2);                     // invalid bytes: one each
  CHECK(tokens_of("ab\xE4\xB8").size() == 3);                   // truncated sequence
  // Prefix property: tokens of a prefix message + more text start with the message's
  // tokens when the cut is at a piece boundary (the reader tokenizes messages separately).
  const auto whole = tokens_of("short words here");
  const auto head = tokens_of("short words");
  CHECK(std::equal(head.begin(), head.end(), whole.begin()));
  for (token_id id : tokens_of("The quick brown fox, 42 times! 中文 ok")) {
    CHECK(id >= first_text_token);
  }

  CHECK(count_words("") == 0);
  CHECK(count_words("the quick  brown fox") == 4);
  CHECK(count_words("abc123 x") == 3);
  CHECK(count_words("你好，世界") == 4);  // fullwidth comma is not a word
  CHECK(count_words("hello 世界!") == 3);
  CHECK(count_spaces("a b  c") == 3);
}

TEST_CASE("sharegpt: requests extend the history, outputs are gpt turns, think time") {
  // Conversation 0: two answered turns + a trailing unanswered human turn.
  // Conversation 1: a system message, then one turn.
  const std::string text =
      R"({"id": "x", "conversations": [{"from": "human", "value": "hi there"}, {"from": "gpt", "value": "hello!"}, {"value": "one two three", "from": "human"}, {"from": "gpt", "value": "ok"}, {"from": "human", "value": "bye"}]})"
      "\n"
      R"({"conversations": [{"from": "system", "value": "be brief"}, {"from": "user", "value": "q"}, {"from": "assistant", "value": "a"}]})"
      "\n";
  std::istringstream in(text);
  sharegpt_reader reader(in, {.sessions_per_second = 0.5, .words_per_minute = 60.0});
  const auto requests = collect(reader);
  REQUIRE(requests.size() == 3);
  // Arrival order: (0, s0 t0), (2, s1 t0), (3, s0 t1) — session 1 starts at 1 / 0.5 = 2 s;
  // s0's second turn types "one two three" = 3 words at 1 word/s.
  CHECK(requests[0].session_id == 0);
  CHECK(requests[0].turn_id == 0);
  CHECK(requests[0].arrival_s == 0.0);
  CHECK(requests[1].session_id == 1);
  CHECK(requests[1].arrival_s == 2.0);
  CHECK(requests[2].session_id == 0);
  CHECK(requests[2].turn_id == 1);
  CHECK(requests[2].arrival_s == 3.0);

  // Token layout: role token + text tokens per message.
  std::vector<token_id> expected = {role_token_user};
  for (token_id t : tokens_of("hi there")) expected.push_back(t);
  CHECK(requests[0].input == expected);
  std::vector<token_id> out0 = {role_token_assistant};
  for (token_id t : tokens_of("hello!")) out0.push_back(t);
  CHECK(requests[0].output == out0);
  // Turn 1's input = turn 0's input + output + the new human message.
  const request& t1 = requests[2];
  REQUIRE(t1.input.size() > requests[0].input.size() + out0.size());
  CHECK(std::equal(requests[0].input.begin(), requests[0].input.end(), t1.input.begin()));
  CHECK(std::equal(out0.begin(), out0.end(), t1.input.begin() + static_cast<std::ptrdiff_t>(requests[0].input.size())));
  CHECK(t1.input_tokens == static_cast<std::int64_t>(t1.input.size()));
  CHECK(t1.source_line == 1);
  // The system message is history.
  CHECK(requests[1].input.front() == role_token_system);
  CHECK(requests[1].output.front() == role_token_assistant);

  SUBCASE("Marconi's space-count rule and a token cap") {
    std::istringstream again(text);
    sharegpt_reader spaces(again, {.sessions_per_second = 0.5, .words_per_minute = 60.0, .word_rule = think_time_words::spaces,
                                   .max_input_tokens = 8});
    const auto capped = collect(spaces);
    // s0 turn 1's prompt is longer than 8 tokens, so session 0 stops after turn 0.
    REQUIRE(capped.size() == 2);
    CHECK(capped[0].session_id == 0);
    CHECK(capped[1].session_id == 1);
  }
}

TEST_CASE("sharegpt: streaming order matches a sort of all requests") {
  // 40 conversations with varied turn counts and lengths, sessions closer than think times.
  std::string text;
  for (int s = 0; s < 40; ++s) {
    text += R"({"conversations": [)";
    const int turns = 1 + (s * 7) % 5;
    for (int t = 0; t < turns; ++t) {
      if (t) text += ", ";
      text += R"({"from": "human", "value": ")" + std::string(static_cast<std::size_t>((s * 13 + t * 29) % 40), 'w') + " word" +
              std::string(static_cast<std::size_t>((s + t) % 9), ' ') + "x" + R"("}, {"from": "gpt", "value": "answer )" +
              std::to_string(s) + R"("})";
    }
    text += "]}\n";
  }
  std::istringstream in(text);
  sharegpt_reader reader(in, {.sessions_per_second = 2.0, .words_per_minute = 30.0, .word_rule = think_time_words::spaces});
  const auto streamed = collect(reader);
  auto sorted = streamed;
  std::sort(sorted.begin(), sorted.end(), [](const request& a, const request& b) {
    return std::tie(a.arrival_s, a.session_id, a.turn_id) < std::tie(b.arrival_s, b.session_id, b.turn_id);
  });
  REQUIRE(streamed.size() == sorted.size());
  std::map<std::int64_t, int> turns_seen;
  for (std::size_t i = 0; i < streamed.size(); ++i) {
    CHECK(streamed[i].session_id == sorted[i].session_id);
    CHECK(streamed[i].turn_id == sorted[i].turn_id);
    ++turns_seen[streamed[i].session_id];
  }
  for (int s = 0; s < 40; ++s) CHECK(turns_seen[s] == 1 + (s * 7) % 5);
  CHECK(reader.conversations_in_flight() == 0);
}

TEST_CASE("sharegpt: malformed conversations name line and field") {
  const std::string ok = R"({"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}]})" "\n";
  struct bad_case {
    std::string line;
    const char* field;
  };
  const bad_case cases[] = {
      {R"({"conv": []})", "conversations"},
      {R"({"conversations": {}})", "conversations"},
      {R"({"conversations": [{"from": "gpt", "value": "b"}]})", "conversations[0].from"},
      {R"({"conversations": [{"from": "human", "value": "a"}, {"from": "human", "value": "b"}]})", "conversations[1].from"},
      {R"({"conversations": [{"from": "human"}]})", "conversations[0].value"},
      {R"({"conversations": [{"value": "a"}]})", "conversations[0].from"},
      {R"({"conversations": [{"from": "robot", "value": "a"}]})", "conversations[0].from"},
      {R"({"conversations": [{"from": "human", "value": 7}]})", "conversations[0].value"},
      {R"({"conversations": [{"from": "human", "value": "a"}, {"from": "system", "value": "b"}]})", "conversations[1].from"},
      {R"({"conversations": [{"from": "human", "value": "a\q"}]})", "conversations[0].value"},
      {R"({"conversations": [)", "conversations"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.line);
    const format_error e = read_error<sharegpt_reader>(ok + c.line + "\n" + ok);
    CHECK(e.line() == 2);
    CHECK(e.field() == c.field);
  }
  CHECK_THROWS_AS(sharegpt_reader(*std::make_unique<std::istringstream>(ok), {.sessions_per_second = 0}), invalid_argument);
}

TEST_CASE("sharegpt_zh_1k: whole file streams, prompts extend" * doctest::test_suite("shared_data")) {
  const std::filesystem::path path = hybridcache::test::shared_path("data/traces/sharegpt_zh_1k/sharegpt_zh_1K_format.jsonl");
  if (!hybridcache::test::shared_available(path)) return;
  sharegpt_reader reader(path, {.max_input_tokens = 0});
  request r;
  std::int64_t requests = 0, input = 0, output = 0;
  double last = 0;
  while (reader.next(r)) {
    ++requests;
    input += r.input_tokens;
    output += r.output_tokens;
    CHECK(r.arrival_s >= last);
    last = r.arrival_s;
  }
  // 4,372 answered human turns in 1,000 conversations (7 end with an unanswered turn).
  CHECK(requests == 4'372);
  CHECK(reader.conversations() == 1'000);
  MESSAGE("sharegpt_zh_1k: " << requests << " requests, " << input << " input tokens, " << output << " output tokens, last arrival "
                             << last << " s");
  auto again = open_trace(path, trace_format::sharegpt, {.sharegpt = {.max_input_tokens = 0}});
  const infinite_cache_result bound = infinite_cache_bound(again);
  CHECK(bound.requests == 4'372);
  CHECK(bound.hit_ids > 0);
  MESSAGE("sharegpt_zh_1k infinite-cache token hit rate: " << bound.token_hit_rate());
}

TEST_CASE("azure CSV: arrivals from wall-clock timestamps, lengths, errors") {
  const std::string text =
      "TIMESTAMP,ContextTokens,GeneratedTokens\n"
      "2023-11-16 18:15:46.6805900,374,44\n"
      "2023-11-16 18:15:50.9951690,396,109\r\n"
      "2023-11-16 19:14:08.4025270,197,183";
  std::istringstream in(text);
  azure_reader reader(in);
  const auto requests = collect(reader);
  REQUIRE(requests.size() == 3);
  CHECK(requests[0].arrival_s == 0.0);
  CHECK(requests[1].arrival_s == doctest::Approx(4.314579).epsilon(1e-12));
  CHECK(requests[2].arrival_s == doctest::Approx(3501.721937).epsilon(1e-12));
  CHECK(requests[0].input_tokens == 374);
  CHECK(requests[2].output_tokens == 183);
  CHECK_FALSE(requests[0].has_ids());
  CHECK(requests[1].source_line == 3);

  // Columns by name, any order; midnight and month boundaries.
  std::istringstream swapped("GeneratedTokens,TIMESTAMP,ContextTokens,Extra\n5,2023-12-31 23:59:59.5,10,x\n6,2024-01-01 00:00:00.25,11,y\n");
  azure_reader r2(swapped);
  const auto two = collect(r2);
  REQUIRE(two.size() == 2);
  CHECK(two[1].arrival_s == doctest::Approx(0.75));
  CHECK(two[1].input_tokens == 11);
  CHECK(two[1].output_tokens == 6);

  const std::string header = "TIMESTAMP,ContextTokens,GeneratedTokens\n";
  const std::string good = "2023-11-16 18:15:46.6805900,374,44\n";
  CHECK(read_error<azure_reader>(header + good + "2023-11-16 18:15:47,abc,4\n").field() == "ContextTokens");
  CHECK(read_error<azure_reader>(header + good + "2023-11-16 18:15:47,3,-4\n").field() == "GeneratedTokens");
  CHECK(read_error<azure_reader>(header + good + "2023-13-16 18:15:47,3,4\n").field() == "TIMESTAMP");
  CHECK(read_error<azure_reader>(header + good + "yesterday,3,4\n").field() == "TIMESTAMP");
  CHECK(read_error<azure_reader>(header + good + "2023-11-16 18:15:47,3\n").field() == "GeneratedTokens");
  CHECK(read_error<azure_reader>(header + good + "2023-11-16 18:15:40,3,4\n").field() == "TIMESTAMP");  // backwards
  CHECK(read_error<azure_reader>(header + good + "2023-11-16 18:15:47,3,4\n" + "2023-11-16 18:15:48,3,x\n").line() == 4);
  CHECK(read_error<azure_reader>("TIME,Context,Generated\n" + good).field() == "TIMESTAMP");
  CHECK(read_error<azure_reader>("").line() == 0);
}

TEST_CASE("cachepawl JSON: streamed array of prompt lengths, errors") {
  const std::string text = R"([
  {
    "conversation_id": "AhS7uI8_41",
    "prompt_tokens": 8,
    "prompt_chars": 31
  },
  {"conversation_id": "q\"x", "prompt_tokens": 95, "prompt_chars": 1118, "extra": [1, {"a": "]"}]},
  {
    "prompt_tokens": 0
  }
])";
  std::istringstream in(text);
  cachepawl_reader reader(in, {.requests_per_second = 4.0, .output_tokens = 16});
  const auto requests = collect(reader);
  REQUIRE(requests.size() == 3);
  CHECK(requests[0].input_tokens == 8);
  CHECK(requests[1].input_tokens == 95);
  CHECK(requests[2].input_tokens == 0);
  CHECK(requests[2].arrival_s == 0.5);
  CHECK(requests[1].output_tokens == 16);
  CHECK(requests[0].source_line == 2);
  CHECK(requests[2].source_line == 8);

  std::istringstream empty_array("  [ ]  \n");
  cachepawl_reader none(empty_array);
  request r;
  CHECK_FALSE(none.next(r));

  CHECK(read_error<cachepawl_reader>("[\n  {\"prompt_chars\": 3}\n]").field() == "prompt_tokens");
  CHECK(read_error<cachepawl_reader>("[\n  {\"prompt_tokens\": 3},\n  {\"prompt_tokens\": \"4\"}\n]").line() == 3);
  CHECK(read_error<cachepawl_reader>("[\n  {\"prompt_tokens\": 3},\n  {\"prompt_tokens\":\n -4}\n]").line() == 4);
  CHECK(read_error<cachepawl_reader>("[\n  {\"prompt_tokens\": 3}\n  {\"prompt_tokens\": 4}\n]").line() == 3);  // missing ','
  CHECK(read_error<cachepawl_reader>("[\n  {\"prompt_tokens\": 3},\n]").line() == 3);                          // trailing ','
  CHECK(read_error<cachepawl_reader>("[\n  {\"prompt_tokens\": 3}\n").line() == 2);                            // no ']'
  CHECK(read_error<cachepawl_reader>("{\"prompt_tokens\": 3}").line() == 1);                                   // not an array
  CHECK(read_error<cachepawl_reader>("[{\"prompt_tokens\": 3}] x").line() == 1);                               // trailing text
  CHECK(read_error<cachepawl_reader>("[1]").field().empty());                                                    // not an object
}

TEST_CASE("real length-only traces parse completely" * doctest::test_suite("shared_data")) {
  const std::filesystem::path azure = hybridcache::test::shared_path("data/traces/azure2023/AzureLLMInferenceTrace_conv.csv");
  const std::filesystem::path pawl = hybridcache::test::shared_path("data/traces/cachepawl/sharegpt_prompts.json");
  // Both checked (not short-circuited), so the output names every missing file.
  const bool have_azure = hybridcache::test::shared_available(azure);
  const bool have_pawl = hybridcache::test::shared_available(pawl);
  if (!have_azure || !have_pawl) return;
  auto a = open_trace(azure, trace_format::azure);
  request r;
  std::int64_t n = 0, context = 0, generated = 0;
  double last = 0;
  while (a.next(r)) {
    ++n;
    context += r.input_tokens;
    generated += r.output_tokens;
    last = r.arrival_s;
  }
  CHECK(n == 19'366);
  CHECK(static_cast<double>(context) / static_cast<double>(n) == doctest::Approx(1155).epsilon(0.01));
  CHECK(static_cast<double>(generated) / static_cast<double>(n) == doctest::Approx(211).epsilon(0.01));
  CHECK(last > 3500.0);
  CHECK(last < 3600.0);

  auto p = open_trace(pawl, trace_format::cachepawl);
  std::int64_t prompts = 0, tokens = 0;
  while (p.next(r)) {
    ++prompts;
    tokens += r.input_tokens;
  }
  CHECK(prompts == 5'000);
  CHECK(static_cast<double>(tokens) / 5000.0 == doctest::Approx(146.1354));
}

TEST_CASE("open_trace: format names, errors for missing files and unknown formats") {
  for (std::string_view name : trace_format_names) CHECK(to_string(parse_trace_format(name)) == name);
  CHECK_THROWS_AS((void)parse_trace_format("csv"), invalid_argument);
  CHECK(has_prefix_ids(trace_format::mooncake));
  CHECK_FALSE(has_prefix_ids(trace_format::azure));
  CHECK_THROWS_WITH_AS((void)open_trace("/nonexistent/x.jsonl", trace_format::marconi), doctest::Contains("/nonexistent/x.jsonl"),
                       invalid_argument);
  CHECK_THROWS_AS((void)open_trace("/nonexistent/x.jsonl", trace_format::mooncake, {.mooncake = {.block_size = 100}}), invalid_argument);
}

TEST_CASE("the one list of trace formats: lookups, kinds and the names messages list") {
  CHECK(find_trace_format("swe-agent") == trace_format::swe_agent);
  CHECK_FALSE(find_trace_format("csv").has_value());
  CHECK(trace_format_list() == "marconi, mooncake, sharegpt, azure, cachepawl, openai, swe-agent, tau-bench, lmsys");
  CHECK(trace_format_list(has_prefix_ids) == "marconi, mooncake, sharegpt, openai, swe-agent, tau-bench, lmsys");
  CHECK(trace_format_list(is_text_format) == "sharegpt, openai, swe-agent, tau-bench, lmsys");
  CHECK(trace_format_list(is_chat_format) == "openai, swe-agent, tau-bench, lmsys");
  const std::string listed = "(known: " + trace_format_list() + ")";
  CHECK_THROWS_WITH_AS((void)parse_trace_format("csv"), doctest::Contains(listed.c_str()), invalid_argument);
}

TEST_CASE("open_trace from a stream: the same reader, and the line it is at") {
  std::istringstream in(R"({"timestamp": 0, "input_length": 700, "output_length": 3, "hash_ids": [0, 1]})" "\n"
                        R"({"timestamp": 10, "input_length": 100, "output_length": 3, "hash_ids": [0]})" "\n");
  auto trace = open_trace(in, trace_format::mooncake, {.mooncake = {.block_size = 256}});
  request r;
  REQUIRE(trace.next(r));
  CHECK(r.input_tokens == 700);
  CHECK(trace.line_number() == 1);
  REQUIRE(trace.next(r));
  CHECK(trace.line_number() == 2);
  CHECK_FALSE(trace.next(r));
  std::istringstream chat(R"({"messages": [{"role": "user", "content": "hi"}]})" "\n");
  auto openai = open_trace(chat, trace_format::openai);
  CHECK(openai.line_number() == 0);  // the chat readers count no lines
}

TEST_CASE("open_trace reads every format from a file") {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "hybridcache_test_sim_open_trace";
  std::filesystem::create_directories(dir);
  auto write = [&dir](const char* name, const std::string& text) {
    const std::filesystem::path p = dir / name;
    std::ofstream(p, std::ios::binary) << text;
    return p;
  };
  struct format_case {
    trace_format format;
    std::filesystem::path path;
    std::size_t requests;
    std::int64_t first_input_tokens;
    bool ids;
  };
  const format_case cases[] = {
      {trace_format::marconi,
       write("m.jsonl", R"({"session_id": 0, "turn_id": 0, "ts": 0.5, "num_input_tokens": 2, "num_output_tokens": 1, "input_tokens": [3, 4], "output_tokens": [5]})" "\n"),
       1, 2, true},
      {trace_format::mooncake,
       write("k.jsonl", "{\"timestamp\": 0, \"input_length\": 700, \"output_length\": 3, \"hash_ids\": [0, 1]}\n"
                        "{\"timestamp\": 10, \"input_length\": 100, \"output_length\": 3, \"hash_ids\": [0]}\n"),
       2, 700, true},
      {trace_format::sharegpt, write("s.jsonl", R"({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]})" "\n"), 1, 2,
       true},
      {trace_format::azure, write("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"), 1, 374, false},
      {trace_format::cachepawl, write("c.json", R"([{"conversation_id": "a", "prompt_tokens": 8, "prompt_chars": 31}])"), 1, 8, false},
  };
  for (const auto& c : cases) {
    CAPTURE(to_string(c.format));
    auto trace = open_trace(c.path, c.format);
    CHECK(trace.format() == c.format);
    const auto requests = collect(trace);
    REQUIRE(requests.size() == c.requests);
    CHECK(requests[0].input_tokens == c.first_input_tokens);
    CHECK(requests[0].has_ids() == c.ids);
    CHECK(requests[0].source_line == (c.format == trace_format::azure ? 2 : 1));  // after the CSV header
  }
  std::filesystem::remove_all(dir);
}
