// Chat and agent traces (chat_trace.hpp): the openai, swe-agent and tau-bench readers give
// the same requests for the same conversations; rendering, arrivals, observation collapsing,
// templates and bad input.
#include <doctest/doctest.h>

#include <charconv>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <utility>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <hybridcache/core/hash.hpp>
#include <hybridcache/sim/json_value.hpp>
#include <hybridcache/sim/trace.hpp>

using namespace hybridcache;
using namespace hybridcache::sim;

namespace {

const std::filesystem::path examples = std::filesystem::path(HYBRIDCACHE_SOURCE_DIR) / "docs" / "examples";

// Writes a parsed JSON value back as JSON (for converting the bundled trace).
void write_json(std::string& out, const json_value& v) {
  switch (v.kind()) {
    case json_kind::null: out += "null"; return;
    case json_kind::boolean: out += v.as_bool() ? "true" : "false"; return;
    case json_kind::number:
      if (v.is_integer()) {
        out += std::to_string(v.as_int());
      } else {
        char buf[64];
        auto r = std::to_chars(buf, buf + sizeof buf, v.as_double());
        out.append(buf, r.ptr);
      }
      return;
    case json_kind::string: detail::append_json_string(out, v.as_string()); return;
    case json_kind::array: {
      out += "[";
      bool first = true;
      for (const auto& e : v.as_array()) {
        if (!first) out += ", ";
        first = false;
        write_json(out, e);
      }
      out += "]";
      return;
    }
    case json_kind::object: {
      out += "{";
      bool first = true;
      for (const auto& [k, e] : v.as_object()) {
        if (!first) out += ", ";
        first = false;
        detail::append_json_string(out, k);
        out += ": ";
        write_json(out, e);
      }
      out += "}";
      return;
    }
  }
}

std::vector<std::string> read_lines(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);)
    if (!l.empty()) lines.push_back(l);
  return lines;
}

template <class Reader, class... A>
std::vector<request> all(A&&... args) {
  Reader reader(std::forward<A>(args)...);
  return collect(reader);
}

void check_same(const std::vector<request>& a, const std::vector<request>& b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    CAPTURE(i);
    CHECK(a[i].arrival_s == b[i].arrival_s);
    CHECK(a[i].session_id == b[i].session_id);
    CHECK(a[i].turn_id == b[i].turn_id);
    CHECK(a[i].input == b[i].input);
    CHECK(a[i].output == b[i].output);
  }
}

format_error openai_error(const std::string& text, chat_options o = {}) {
  std::istringstream in(text);
  openai_reader reader(in, std::move(o));
  request r;
  try {
    while (reader.next(r)) {
    }
  } catch (const format_error& e) {
    return e;
  }
  FAIL("no format_error");
  return format_error(0, "", "");
}

}  // namespace

TEST_CASE("the bundled agent trace converted to swe-agent and tau-bench gives the same requests") {
  const auto lines = read_lines(examples / "openai_agent.jsonl");
  REQUIRE(lines.size() == 3);
  const auto dir = std::filesystem::temp_directory_path() / ("hc_chat_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / "trajs" / "nested");
  std::string tau = "[\n";
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const json_value conv = parse_json(lines[i]);
    const json_value* messages = conv.find("messages");
    REQUIRE(messages != nullptr);
    std::string traj = "{\"environment\": \"swe_main\", \"trajectory\": [], \"history\": ";
    write_json(traj, *messages);
    traj += ", \"info\": {\"exit_status\": \"submitted\"}}";
    // Directory order is by path: put one in a subfolder to check the recursive, sorted walk.
    std::ofstream(dir / "trajs" / (i == 2 ? "nested/c.traj" : (i == 0 ? "a.traj" : "b.traj"))) << traj;
    tau += std::string(i > 0 ? ",\n" : "") + "{\"task_id\": " + std::to_string(i) + ", \"reward\": 1.0, \"traj\": ";
    write_json(tau, *messages);
    tau += "}";
  }
  tau += "\n]\n";
  std::ofstream(dir / "tau.json") << tau;

  for (const bool collapse : {false, true}) {
    chat_options o;
    if (collapse) o.collapse_observations = 1;
    const auto openai = all<openai_reader>(examples / "openai_agent.jsonl", o);
    const auto swe = all<swe_agent_reader>(dir / "trajs", o);
    const auto taub = all<tau_bench_reader>(dir / "tau.json", o);
    const auto tau_example = all<tau_bench_reader>(examples / "tau_bench_results.json", o);
    // 5 + 5 + 6 assistant messages
    CHECK(openai.size() == 16);
    check_same(openai, swe);
    check_same(openai, taub);
    check_same(openai, tau_example);
    // The example .traj is the first session.
    const auto one = all<swe_agent_reader>(examples / "swe_agent_example.traj", o);
    REQUIRE(one.size() == 5);
    std::size_t j = 0;
    for (const auto& r : openai)
      if (r.session_id == 0) {
        CHECK(r.input == one[j].input);
        CHECK(r.output == one[j].output);
        ++j;
      }
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("rendering: each call's prompt extends the previous prompt and output; the system prompt is shared") {
  const auto reqs = all<openai_reader>(examples / "openai_agent.jsonl", chat_options{});
  std::vector<const request*> last(3, nullptr);
  for (const auto& r : reqs) {
    const auto s = static_cast<std::size_t>(r.session_id);
    if (last[s] != nullptr) {
      std::vector<token_id> prev = last[s]->input;
      prev.insert(prev.end(), last[s]->output.begin(), last[s]->output.end());
      REQUIRE(r.input.size() > prev.size());
      CHECK(std::equal(prev.begin(), prev.end(), r.input.begin()));
      CHECK(r.turn_id == last[s]->turn_id + 1);
      CHECK(r.arrival_s >= last[s]->arrival_s);
    } else {
      CHECK(r.turn_id == 0);
      CHECK(r.arrival_s == doctest::Approx(static_cast<double>(r.session_id)));
    }
    last[s] = &r;
  }
  // Sessions 0 and 1 share the system message: their first prompts share a long prefix.
  const request* a = nullptr;
  const request* b = nullptr;
  for (const auto& r : reqs) {
    if (r.session_id == 0 && r.turn_id == 0) a = &r;
    if (r.session_id == 1 && r.turn_id == 0) b = &r;
  }
  REQUIRE((a != nullptr && b != nullptr));
  std::size_t common = 0;
  while (common < a->input.size() && common < b->input.size() && a->input[common] == b->input[common]) ++common;
  CHECK(common > 40);
}

TEST_CASE("the text of a message: content parts, tool calls, roles") {
  chat_conversation c;
  parse_openai_line(
      R"({"messages": [{"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": "b"}]},)"
      R"({"role": "assistant", "content": "hi", "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f\"x", "arguments": "{\"q\": 1}"}}]},)"
      R"({"role": "assistant", "content": null, "tool_calls": [{"function": {"name": "g", "arguments": {"k": [1, 2]}}}]},)"
      R"({"role": "function", "name": "g", "content": "out"}]})",
      7, c);
  REQUIRE(c.messages.size() == 4);
  CHECK(c.messages[0].role == chat_role::system);
  CHECK(c.messages[0].text == "a\n<image_url>\nb");
  CHECK(c.messages[1].text == "hi\n<tool_call>\n{\"name\": \"f\\\"x\", \"arguments\": {\"q\": 1}}\n</tool_call>");
  CHECK(c.messages[2].text == "<tool_call>\n{\"name\": \"g\", \"arguments\": {\"k\": [1, 2]}}\n</tool_call>");
  CHECK(c.messages[3].role == chat_role::tool);
  CHECK(c.messages[3].observation);
  CHECK(c.line == 7);
  // SWE-agent: observations are user messages with message_type "observation".
  parse_swe_agent_traj(R"({"history": [{"role": "user", "content": "obs", "message_type": "observation"}, {"role": "user", "content": "task"}]})", c);
  CHECK(c.messages[0].observation);
  CHECK_FALSE(c.messages[1].observation);
}

TEST_CASE("arrivals: timestamps, think time from the user's words, Poisson tool time") {
  const std::string conv =
      R"({"messages": [{"role": "user", "content": "one two three"}, {"role": "assistant", "content": "x"},)"
      R"({"role": "user", "content": "four five six seven eight nine"}, {"role": "assistant", "content": "y"},)"
      R"({"role": "tool", "content": "r"}, {"role": "assistant", "content": "z"}]})";
  std::istringstream in(conv + "\n" + conv + "\n");
  chat_options o;
  o.tool_time_mean_s = 0;
  openai_reader reader(in, o);
  auto reqs = collect(reader);
  REQUIRE(reqs.size() == 6);
  CHECK(reqs[0].arrival_s == 0.0);
  CHECK(reqs[1].arrival_s == 1.0);  // session 1 starts at 1 s
  CHECK(reqs[2].arrival_s == doctest::Approx(6.0 / 1.5));  // 6 words at 90 wpm
  CHECK(reqs[3].arrival_s == doctest::Approx(4.0));        // tool time 0
  CHECK(reqs[3].session_id == 0);
  // Explicit timestamps.
  std::istringstream ts(R"({"timestamp": 10, "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}, {"role": "user", "content": "q2"}, {"role": "assistant", "content": "b", "timestamp": 12.5}]})");
  auto t = all<openai_reader>(ts, chat_options{});
  REQUIRE(t.size() == 2);
  CHECK(t[0].arrival_s == 10.0);
  CHECK(t[1].arrival_s == 12.5);
  // Poisson draws: deterministic, mean close to the configured one.
  double sum = 0;
  for (int i = 0; i < 4000; ++i) sum += static_cast<double>(chat_poisson(5.0, 42, i, 1));
  CHECK(sum / 4000 == doctest::Approx(5.0).epsilon(0.05));
  CHECK(chat_poisson(5.0, 42, 3, 2) == chat_poisson(5.0, 42, 3, 2));
}

TEST_CASE("observation collapsing keeps the last K observations whole") {
  std::string line = R"({"messages": [{"role": "user", "content": "task"})";
  for (int i = 0; i < 4; ++i)
    line += R"(, {"role": "assistant", "content": "act"}, {"role": "tool", "content": "the first line of a long tool output with many words\nand a second line that is just as long as the first\nthen a third"})";
  line += R"(, {"role": "assistant", "content": "done"}]})";
  chat_options o;
  o.collapse_observations = 2;
  std::istringstream a(line), b(line);
  const auto full = all<openai_reader>(a, chat_options{});
  const auto collapsed = all<openai_reader>(b, o);
  REQUIRE(full.size() == 5);
  REQUIRE(collapsed.size() == 5);
  for (std::size_t i = 0; i < 3; ++i) CHECK(full[i].input == collapsed[i].input);  // at most 2 observations so far
  CHECK(collapsed[3].input.size() < full[3].input.size());
  CHECK(collapsed[4].input.size() < full[4].input.size());
  // Collapsing rewrites history, so a prompt no longer extends the previous one.
  CHECK_FALSE(std::equal(collapsed[3].input.begin(), collapsed[3].input.end(), collapsed[4].input.begin()));
  std::vector<token_id> marker;
  tokenize_text("Old environment output: (3 lines omitted)", marker);
  CHECK(std::search(collapsed[4].input.begin(), collapsed[4].input.end(), marker.begin(), marker.end()) != collapsed[4].input.end());
}

TEST_CASE("chat templates") {
  const auto t = chat_template::from_file(examples / "chatml_template.json");
  const auto d = chat_template::chatml();
  CHECK(t.prefix == d.prefix);
  CHECK(t.suffix == d.suffix);
  const auto p = chat_template::from_json(R"({"user": {"prefix": "U: "}, "assistant": {"prefix": "A: ", "suffix": "\n"}})");
  CHECK(p.prefix[1] == "U: ");
  CHECK(p.suffix[2] == "\n");
  CHECK(p.prefix[0].empty());
  CHECK(p.begin.empty());
  // "begin" opens every prompt (Llama 3's BOS); prompts still extend each other.
  const auto l3 = chat_template::from_file(examples / "llama3_template.json");
  CHECK(l3.begin == "<|begin_of_text|>");
  CHECK(l3.prefix[2] == "<|start_header_id|>assistant<|end_header_id|>\n\n");
  chat_options with_begin;
  with_begin.chat = chat_template::from_json(R"({"begin": "BOS", "user": {"prefix": "U: "}, "assistant": {"prefix": "A: "}})");
  const auto plain = all<openai_reader>(examples / "openai_agent.jsonl", chat_options{});
  const auto begun = all<openai_reader>(examples / "openai_agent.jsonl", with_begin);
  std::vector<token_id> bos;
  tokenize_text("BOS", bos);
  REQUIRE(begun.size() == plain.size());
  REQUIRE(begun.size() >= 2);
  for (const auto& r : begun) {
    REQUIRE(r.input.size() > bos.size());
    CHECK(std::equal(bos.begin(), bos.end(), r.input.begin()));
    CHECK(r.input_tokens == static_cast<std::int64_t>(r.input.size()));
  }
  for (std::size_t i = 1; i < begun.size(); ++i) {
    if (begun[i].session_id != begun[i - 1].session_id) continue;
    std::vector<token_id> before = begun[i - 1].input;
    before.insert(before.end(), begun[i - 1].output.begin(), begun[i - 1].output.end());
    CHECK(std::equal(before.begin(), before.end(), begun[i].input.begin()));
  }
  CHECK_THROWS_AS((void)chat_template::from_json(R"({"begin": "a", "begin": "b"})"), format_error);
  CHECK_THROWS_AS((void)chat_template::from_json(R"({"begin": {}})"), format_error);
  CHECK_THROWS_AS((void)chat_template::from_json(R"({"robot": {}})"), format_error);
  CHECK_THROWS_AS((void)chat_template::from_json(R"({"user": {"middle": "x"}})"), format_error);
  CHECK_THROWS_AS((void)chat_template::from_file("/nonexistent/t.json"), invalid_argument);
}

TEST_CASE("chat readers: bad input is a format_error naming line and field") {
  CHECK(openai_error("{\"messages\": []}\n\n{\"x\": 1}\n").line() == 3);
  CHECK(openai_error("{\"x\": 1}").field() == "messages");
  CHECK(openai_error(R"({"messages": [{"content": "x"}]})").field() == "messages[0].role");
  CHECK(openai_error(R"({"messages": [{"role": "robot"}]})").field() == "messages[0].role");
  CHECK(openai_error(R"({"messages": [{"role": "user", "content": 5}]})").field() == "messages[0].content");
  CHECK(openai_error(R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}]})").field() ==
        "messages[0].tool_calls[0].function.name");
  CHECK(openai_error(R"({"messages": [{"role": "assistant", "content": [{"foo": 1}]}]})").field() == "messages[0].content[0]");
  CHECK(openai_error(R"({"timestamp": -1, "messages": []})").field() == "timestamp");
  CHECK(openai_error("{\"timestamp\": 5, \"messages\": []}\n{\"timestamp\": 4, \"messages\": []}\n").line() == 2);
  CHECK(openai_error(R"({"timestamp": 5, "messages": [{"role": "assistant", "content": "a", "timestamp": 4}]})").field() ==
        "messages[0].timestamp");
  CHECK(openai_error(R"({"messages": [)").line() == 1);
  std::istringstream bad_swe(R"({"trajectory": []})");
  CHECK_THROWS_AS((void)all<swe_agent_reader>(bad_swe, chat_options{}), format_error);
  std::istringstream bad_tau("[{\"traj\": [{\"role\": \"user\"}]},\n {\"task_id\": 1}]");
  try {
    (void)all<tau_bench_reader>(bad_tau, chat_options{});
    FAIL("no error");
  } catch (const format_error& e) {
    CHECK(e.line() == 2);
    CHECK(e.field() == "traj");
  }
  CHECK_THROWS_AS((void)all<swe_agent_reader>(std::filesystem::path("/nonexistent/dir"), chat_options{}), invalid_argument);
  chat_options o;
  o.tool_time_mean_s = -1;
  std::istringstream empty("");
  CHECK_THROWS_AS((void)openai_reader(empty, o), invalid_argument);
}

TEST_CASE("open_trace knows the chat formats") {
  CHECK(parse_trace_format("swe-agent") == trace_format::swe_agent);
  CHECK(parse_trace_format("tau-bench") == trace_format::tau_bench);
  CHECK(has_prefix_ids(trace_format::openai));
  auto t = open_trace(examples / "tau_bench_results.json", trace_format::tau_bench, {.chat = {.max_requests_per_session = 2}});
  request r;
  int n = 0;
  while (t.next(r)) ++n;
  CHECK(n == 6);
}

TEST_CASE("chat readers and the tokenizer loader: mutated inputs throw only hybridcache errors") {
  // A deterministic stand-in for the fuzz targets: byte flips, insertions and truncations of
  // the bundled examples through each reader's whole-input entry point.
  std::string openai, tau, traj;
  for (auto [path, out] : {std::pair{"openai_agent.jsonl", &openai}, {"tau_bench_results.json", &tau}, {"swe_agent_example.traj", &traj}}) {
    std::ifstream in(examples / path, std::ios::binary);
    *out = std::string(std::istreambuf_iterator<char>(in), {});
  }
  std::uint64_t state = 19;
  auto next = [&state] { return splitmix64_mix(state += splitmix64_gamma); };
  const char specials[] = "{}[]\",:\\0-1e.nt \n\xff\xc3";
  auto mutate = [&](std::string s) {
    const int edits = 1 + static_cast<int>(next() % 4);
    for (int e = 0; e < edits && !s.empty(); ++e) {
      const std::size_t at = next() % s.size();
      switch (next() % 4) {
        case 0: s[at] = specials[next() % (sizeof specials - 1)]; break;
        case 1: s.insert(at, 1, specials[next() % (sizeof specials - 1)]); break;
        case 2: s.erase(at, 1 + next() % 8); break;
        default: s.resize(at); break;
      }
    }
    return s;
  };
  int errors = 0, ok = 0;
  for (int i = 0; i < 600; ++i) {
    const int which = i % 3;
    const std::string input = mutate(which == 0 ? openai : which == 1 ? tau : traj);
    std::istringstream in(input);
    try {
      request r;
      if (which == 0) {
        openai_reader reader(in);
        while (reader.next(r)) {
        }
      } else if (which == 1) {
        tau_bench_reader reader(in);
        while (reader.next(r)) {
        }
      } else {
        swe_agent_reader reader(in);
        while (reader.next(r)) {
        }
      }
      ++ok;
    } catch (const hybridcache::error&) {
      ++errors;
    }
  }
  CHECK(errors + ok == 600);
  CHECK(errors > 100);
  // The tokenizer: mutated template files and tokenizer.json fragments, random bytes to encode.
  const std::string json = R"({"added_tokens":[{"id":3,"content":"<s>","special":true}],"normalizer":null,)"
                           R"("pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"use_regex":true},"post_processor":null,)"
                           R"("model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]}})";
  auto tok = bpe_tokenizer::from_json(json);
  for (int i = 0; i < 400; ++i) {
    try {
      auto t = bpe_tokenizer::from_json(mutate(json));
      (void)t.encode(mutate("ab<s>ba \xff ab"));
    } catch (const hybridcache::error&) {
    }
    std::string bytes(next() % 40, '\0');
    for (auto& c : bytes) c = static_cast<char>(next());
    (void)tok.encode(bytes);
  }
  CHECK(tok.encode("ab<s>") == std::vector<token_id>{2, 3});
}

TEST_CASE("chat readers: caps on timestamps and request sizes") {
  CHECK(openai_error(R"({"timestamp": 1e11, "messages": []})").field() == "timestamp");
  CHECK(openai_error(R"({"messages": [{"role": "assistant", "content": "a", "timestamp": 2e10}]})").field() == "messages[0].timestamp");
  chat_options slow;
  slow.words_per_minute = 1e-9;  // a typing time beyond the arrival cap
  CHECK(openai_error(R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}, {"role": "user", "content": "many words here"}, {"role": "assistant", "content": "b"}]})",
                     slow)
            .field() == "messages[3]");
}
