// Invalid model specs are rejected with an error naming the field.
#include <doctest/doctest.h>

#include <string>

#include <hybridcache/model/cost_model.hpp>
#include <hybridcache/model/presets.hpp>

using namespace hybridcache;

namespace {
// The message of the exception `f` throws (and checks its type).
template <class E, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  FAIL("expected an exception");
  return {};
}
bool contains(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }
}  // namespace

TEST_CASE("zero layers") {
  auto s = presets::marconi_7b();
  s.layers.clear();
  CHECK(contains(message_of<invalid_argument>([&] { s.validate(); }), "'layers'"));
  CHECK_THROWS_AS(cost_model{s}, invalid_argument);
}

TEST_CASE("only MLP layers") {
  auto s = presets::marconi_7b();
  s.layers = layer_pattern("M", 4);
  CHECK(contains(message_of<invalid_argument>([&] { s.validate(); }), "no attention and no recurrent"));
}

TEST_CASE("zero or negative dims name the field") {
  struct bad {
    const char* field;
    void (*mutate)(model_spec&);
  };
  const bad cases[] = {
      {"'d_model'", [](model_spec& s) { s.d_model = 0; }},
      {"'d_model'", [](model_spec& s) { s.d_model = -4096; }},
      {"'kv_heads'", [](model_spec& s) { s.kv_heads = 0; }},
      {"'head_dim'", [](model_spec& s) { s.head_dim = -1; }},
      {"'attention_heads'", [](model_spec& s) { s.attention_heads = 0; }},
      {"'d_state'", [](model_spec& s) { s.d_state = 0; }},
      {"'ssm_state_rows'", [](model_spec& s) { s.ssm_state_rows = 0; }},
      {"'ssm_d_inner'", [](model_spec& s) { s.ssm_d_inner = -2; }},
      {"'conv_kernel'", [](model_spec& s) { s.conv_kernel = -4; }},
      {"'conv_channels'", [](model_spec& s) { s.conv_channels = 0; }},
      {"'kv_dtype_bytes'", [](model_spec& s) { s.kv_dtype_bytes = 0; }},
      {"'state_dtype_bytes'", [](model_spec& s) { s.state_dtype_bytes = 0; }},
      {"'scan_chunk'", [](model_spec& s) { s.scan_chunk = 0; }},
      {"'kv_heads' must divide", [](model_spec& s) { s.kv_heads = 5; }},
      {"'recurrent' is none", [](model_spec& s) { s.recurrent = recurrent_family::none; }},
  };
  for (const auto& c : cases) {
    CAPTURE(c.field);
    auto s = presets::marconi_7b();
    c.mutate(s);
    CHECK(contains(message_of<invalid_argument>([&] { s.validate(); }), c.field));
  }
}

TEST_CASE("GDN fields are required for GDN models") {
  auto s = presets::qwen3_next_80b_a3b();
  s.gdn_value_heads = 0;
  CHECK(contains(message_of<invalid_argument>([&] { s.validate(); }), "'gdn_value_heads'"));
  s = presets::qwen3_next_80b_a3b();
  s.gdn_value_heads = 24;  // not a multiple of 16 key heads
  CHECK(contains(message_of<invalid_argument>([&] { s.validate(); }), "multiple of gdn_key_heads"));
}

TEST_CASE("overflow in byte counts is an overflow_error naming the quantity") {
  auto s = presets::marconi_7b();
  s.ssm_state_rows = std::int64_t{1} << 40;
  s.d_state = std::int64_t{1} << 30;
  const auto msg = message_of<overflow_error>([&] { s.validate(); });
  CHECK(contains(msg, "SSM checkpoint bytes"));
  s = presets::marconi_7b();
  s.head_dim = std::int64_t{1} << 62;
  CHECK(contains(message_of<overflow_error>([&] { s.validate(); }), "KV bytes per token"));
}

TEST_CASE("errors derive from the one base") {
  auto s = presets::marconi_7b();
  s.d_model = 0;
  CHECK_THROWS_AS(s.validate(), error);
  CHECK_THROWS_AS(s.validate(), std::runtime_error);
}
