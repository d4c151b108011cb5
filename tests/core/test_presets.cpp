// Byte counts of every preset, pinned against the references named in presets.hpp.
#include <doctest/doctest.h>

#include <hybridcache/model/cost_model.hpp>
#include <hybridcache/model/presets.hpp>

using namespace hybridcache;

TEST_CASE("marconi_7b reproduces the Marconi simulator's byte counts") {
  const cost_model m(presets::marconi_7b());
  CHECK(m.attention_layers() == 4);
  CHECK(m.recurrent_layers() == 24);
  CHECK(m.mlp_layers() == 28);
  // 2·D·N + 2·k·(e·D + 2N) = 1,048,576 + 67,584
  CHECK(m.recurrent_state_bytes_per_layer() == 1'048'576);
  CHECK(m.conv_state_bytes_per_layer() == 67'584);
  CHECK(m.ssm_checkpoint_bytes_per_layer() == 1'116'160);
  CHECK(m.ssm_checkpoint_bytes() == 26'787'840);
  CHECK(m.kv_bytes_per_token() == 65'536);
  CHECK(m.kv_bytes_per_token_per_layer() == 16'384);  // 4·D
  // One checkpoint costs about 409 tokens of KV (anchors/marconi.md 1(d)).
  CHECK(m.ssm_checkpoint_bytes() / m.kv_bytes_per_token() == 408);
}

TEST_CASE("jamba_1_5_mini reproduces the AVMP reference's byte counts") {
  const cost_model m(presets::jamba_1_5_mini());
  CHECK(m.attention_layers() == 4);
  CHECK(m.recurrent_layers() == 28);
  CHECK(m.kv_bytes_per_token_per_layer() == 4'096);
  CHECK(m.kv_bytes_per_token() == 16'384);
  CHECK(16 * m.kv_bytes_per_token_per_layer() == 65'536);  // AVMP KV page of 16 tokens
  CHECK(m.recurrent_state_bytes_per_layer() == 262'144);  // AVMP SSM unit
  CHECK(28 * m.recurrent_state_bytes_per_layer() == 7 * 1024 * 1024);
  CHECK(m.conv_state_bytes_per_layer() == 8192 * 4 * 2);
}

TEST_CASE("mamba2_1b3 reproduces the AVMP reference's byte counts") {
  const cost_model m(presets::mamba2_1b3());
  CHECK(m.attention_layers() == 4);
  CHECK(m.recurrent_layers() == 28);
  CHECK(m.kv_bytes_per_token_per_layer() == 4'096);
  CHECK(16 * m.kv_bytes_per_token_per_layer() == 65'536);
  CHECK(m.recurrent_state_bytes_per_layer() == 2'097'152);
  CHECK(28 * m.recurrent_state_bytes_per_layer() == 56 * 1024 * 1024);
  // attention at i % 8 == 0, as the reference lays it out
  const auto& layers = m.spec().layers;
  int mixer = 0;
  for (auto k : layers) {
    if (k == layer_kind::mlp) continue;
    CHECK((k == layer_kind::attention) == (mixer % 8 == 0));
    ++mixer;
  }
}

TEST_CASE("qwen3_next_80b_a3b: 36 GDN + 12 attention layers, 2 MiB fp32 state per layer") {
  const cost_model m(presets::qwen3_next_80b_a3b());
  CHECK(m.recurrent_layers() == 36);
  CHECK(m.attention_layers() == 12);
  CHECK(m.mlp_layers() == 48);
  CHECK(m.recurrent_state_bytes_per_layer() == 2 * 1024 * 1024);  // 32 · 128 · 128 · 4
  CHECK(m.conv_state_bytes_per_layer() == 8192 * 4 * 2);
  CHECK(m.kv_bytes_per_token_per_layer() == 2 * 2 * 256 * 2);
  CHECK(m.kv_bytes_per_token() == 12 * 2048);
}

TEST_CASE("pure presets") {
  const cost_model llama(presets::llama2_7b());
  CHECK(llama.recurrent_layers() == 0);
  CHECK(llama.ssm_checkpoint_bytes() == 0);
  CHECK(llama.kv_bytes_per_token() == 524'288);  // 2 · 32 · 128 · 2 · 32 layers

  const cost_model mamba(presets::mamba2_1b3_pure());
  CHECK(mamba.attention_layers() == 0);
  CHECK(mamba.kv_bytes_per_token() == 0);
  CHECK(mamba.recurrent_state_bytes_per_layer() == 4096 * 128 * 2);
  CHECK(mamba.conv_state_bytes_per_layer() == 4352 * 4 * 2);
  CHECK(mamba.ssm_checkpoint_bytes() == 48 * (4096 * 128 * 2 + 4352 * 4 * 2));
}

TEST_CASE("every preset validates and is found by name") {
  for (auto name : presets::preset_names()) {
    CAPTURE(name);
    const auto spec = presets::preset(name);
    CHECK(spec.name == name);
    CHECK_FALSE(spec.source.empty());
    CHECK_NOTHROW(spec.validate());
  }
  CHECK_FALSE(presets::find_preset("gpt5").has_value());
  CHECK_THROWS_AS((void)presets::preset("gpt5"), invalid_argument);
}
