// `--format lmsys` (lmsys_trace.hpp): LMSys-Chat-1M rows read on the hand-written fixture
// docs/examples/lmsys_chat_example.jsonl (the dataset card's fields: conversation_id, model,
// conversation [{content, role}], turn, language, openai_moderation, redacted).
// Reference: the same conversations written by hand as openai lines give the same requests;
// counts and arrivals are checked against the fixture directly (Marconi's timing rule).
#include <doctest/doctest.h>

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include <hybridcache/sim/trace.hpp>

using namespace hybridcache;
using namespace hybridcache::sim;

namespace {

const std::filesystem::path fixture =
    std::filesystem::path(HYBRIDCACHE_SOURCE_DIR) / "docs" / "examples" / "lmsys_chat_example.jsonl";

std::vector<request> read_all(trace_reader t) {
  std::vector<request> out;
  request r;
  while (t.next(r)) out.push_back(r);
  return out;
}

std::vector<request> read_text(const std::string& text, trace_format f, chat_options o = {}) {
  std::istringstream in(text);
  return read_all(open_trace(in, f, {.chat = std::move(o)}));
}

format_error lmsys_error(const std::string& text) {
  try {
    (void)read_text(text, trace_format::lmsys);
  } catch (const format_error& e) {
    return e;
  }
  FAIL("no format_error");
  return format_error(0, "", "");
}

}  // namespace

TEST_CASE("lmsys: --format lmsys is listed and opens the reader") {
  CHECK(parse_trace_format("lmsys") == trace_format::lmsys);
  CHECK(to_string(trace_format::lmsys) == "lmsys");
  CHECK(is_chat_format(trace_format::lmsys));
  CHECK(is_text_format(trace_format::lmsys));
  CHECK(has_prefix_ids(trace_format::lmsys));
}

TEST_CASE("lmsys: the fixture's 3 rows give one request per assistant message, at Marconi's arrivals") {
  const auto reqs = read_all(open_trace(fixture, trace_format::lmsys));
  // 2 + 1 + 3 assistant messages.
  REQUIRE(reqs.size() == 6);
  std::vector<std::int64_t> per_session(3, 0);
  for (const auto& r : reqs) {
    REQUIRE(r.session_id >= 0);
    REQUIRE(r.session_id < 3);
    CHECK(r.turn_id == per_session[static_cast<std::size_t>(r.session_id)]++);
    CHECK(r.input_tokens == static_cast<std::int64_t>(r.input.size()));
    CHECK(r.output_tokens > 0);
  }
  CHECK(per_session == std::vector<std::int64_t>{2, 1, 3});
  // Session s starts at s / sessions_per_second (1); a later turn arrives after the user's
  // words at 90 words per minute: "How does a prefix cache use one?" is 7 words = 4.667 s.
  for (const auto& r : reqs) {
    if (r.turn_id == 0) CHECK(r.arrival_s == doctest::Approx(static_cast<double>(r.session_id)));
    if (r.session_id == 0 && r.turn_id == 1) CHECK(r.arrival_s == doctest::Approx(0.0 + 7.0 / 1.5));
    // 8 words, then "Thanks, NAME_1!": 3 (count_words counts letter and digit runs).
    if (r.session_id == 2 && r.turn_id == 2) CHECK(r.arrival_s == doctest::Approx(2.0 + 8.0 / 1.5 + 3.0 / 1.5));
  }
}

TEST_CASE("lmsys: the same conversations as openai lines give the same requests") {
  // The fixture's conversations with their text, as the openai format writes them.
  const std::string openai =
      R"({"messages": [{"role": "user", "content": "What is a radix tree?"}, {"role": "assistant", "content": "A radix tree is a compressed trie: each edge holds a run of characters, so a chain of single-child nodes becomes one edge."}, {"role": "user", "content": "How does a prefix cache use one?"}, {"role": "assistant", "content": "It stores the token ids of past prompts on the edges; a new prompt walks down from the root and reuses the cached state of the longest matching prefix."}]})"
      "\n"
      R"({"messages": [{"role": "user", "content": "Write a haiku about caches."}, {"role": "assistant", "content": "Warm lines wait in rows\nold prompts whisper their answers\nthe miss pays the toll"}]})"
      "\n"
      R"({"messages": [{"role": "user", "content": "Explain state space models in one sentence."}, {"role": "assistant", "content": "They carry a fixed-size hidden state forward token by token, updating it with learned linear dynamics."}, {"role": "user", "content": "And why is their state hard to cache?"}, {"role": "assistant", "content": "It is overwritten in place at every token, so only the state at the exact end of a cached prefix can be reused."}, {"role": "user", "content": "Thanks, NAME_1!"}, {"role": "assistant", "content": "You are welcome."}]})"
      "\n";
  const chat_options o{.sessions_per_second = 0.5};
  const auto expect = read_text(openai, trace_format::openai, o);
  const auto got = read_all(open_trace(fixture, trace_format::lmsys, {.chat = o}));
  REQUIRE(got.size() == expect.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    CHECK(got[i].input == expect[i].input);
    CHECK(got[i].output == expect[i].output);
    CHECK(got[i].arrival_s == expect[i].arrival_s);
    CHECK(got[i].session_id == expect[i].session_id);
    CHECK(got[i].turn_id == expect[i].turn_id);
  }
}

TEST_CASE("lmsys: bad rows name the line and the field") {
  const auto e1 = lmsys_error("{\"conversation_id\": \"x\", \"turn\": 1}\n");
  CHECK(e1.line() == 1);
  CHECK(e1.field() == "conversation");
  CHECK(std::string(e1.what()).find("missing required key") != std::string::npos);

  const auto e2 = lmsys_error("\n{\"conversation\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"bot\", \"content\": \"x\"}]}\n");
  CHECK(e2.line() == 2);
  CHECK(e2.field() == "conversation[1].role");

  const auto e3 = lmsys_error("{\"conversation\": [], \"turn\": -1}\n");
  CHECK(e3.field() == "turn");
  const auto e4 = lmsys_error("{\"conversation\": [], \"turn\": 1.5}\n");
  CHECK(e4.field() == "turn");
  const auto e5 = lmsys_error("{\"conversation\": [], \"model\": 7}\n");
  CHECK(e5.field() == "model");
  const auto e6 = lmsys_error("{\"conversation\": [], \"conversation\": []}\n");
  CHECK(std::string(e6.what()).find("duplicate key") != std::string::npos);

  const auto e7 = lmsys_error("[{\"conversation\": []}]\n");
  CHECK(std::string(e7.what()).find("jq -c '.[]'") != std::string::npos);
}
