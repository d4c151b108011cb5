// Marconi's architecture ablations (model/model_overrides.hpp): no override reproduces every
// preset's cost model exactly; the attention:SSM ratio and the state dimension change the
// bytes and FLOPs as cost_model.hpp's formulas say (values computed by hand below); bad
// values are refused naming the override and the value.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>

#include <hybridcache/model/cost_model.hpp>
#include <hybridcache/model/model_overrides.hpp>
#include <hybridcache/model/presets.hpp>

using namespace hybridcache;

namespace {

void check_same_costs(const cost_model& a, const cost_model& b) {
  CHECK(a.attention_layers() == b.attention_layers());
  CHECK(a.recurrent_layers() == b.recurrent_layers());
  CHECK(a.mlp_layers() == b.mlp_layers());
  CHECK(a.kv_bytes_per_token() == b.kv_bytes_per_token());
  CHECK(a.ssm_checkpoint_bytes() == b.ssm_checkpoint_bytes());
  CHECK(a.conv_state_bytes_per_layer() == b.conv_state_bytes_per_layer());
  for (const std::int64_t L : {1, 1000, 32768}) {
    CHECK(a.prefill_flops(L) == b.prefill_flops(L));
    CHECK(a.saved_flops(L / 2, L) == b.saved_flops(L / 2, L));
    CHECK(a.flop_efficiency(L) == b.flop_efficiency(L));
  }
}

std::string error_of(const model_spec& s, const model_overrides& o) {
  try {
    (void)with_overrides(s, o);
  } catch (const invalid_argument& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("no override: every preset's spec and cost model, exactly") {
  for (const auto name : presets::preset_names()) {
    CAPTURE(name);
    const model_spec p = presets::preset(name);
    const model_spec s = with_overrides(p, {});
    CHECK(s.name == p.name);
    CHECK(s.layers == p.layers);
    check_same_costs(cost_model(s), cost_model(p));
  }
}

TEST_CASE("a preset's own ratio gives back its layers (marconi_7b 1:6, jamba 1:7 counts)") {
  const model_spec m = with_overrides(presets::marconi_7b(), {.attention_ratio = layer_ratio{1, 6}});
  CHECK(m.layers == presets::marconi_7b().layers);
  CHECK(m.name == "marconi_7b[attn:ssm=1:6]");
  check_same_costs(cost_model(m), cost_model(presets::marconi_7b()));
  const cost_model j(with_overrides(presets::jamba_1_5_mini(), {.attention_ratio = layer_ratio{1, 7}}));
  check_same_costs(j, cost_model(presets::jamba_1_5_mini()));
}

// marconi_7b: D = 4096, N = 128; 28 mixers. KV per attention layer per token 2·32·128·2 =
// 16,384 B; checkpoint per SSM layer 1,116,160 B (anchors/marconi.md 1(d)).
//   F_a(1000) = 150,601,728,000; F_r(1000) = 209,756,160,000; F_m(1000) = 268,435,456,000
TEST_CASE("attention:SSM ratio: layer counts, bytes and FLOPs by the formulas") {
  SUBCASE("1:2 -> round(28 / 3) = 9 groups: 9 attention, 18 SSM, 27 MLP") {
    const cost_model m(with_overrides(presets::marconi_7b(), {.attention_ratio = layer_ratio{1, 2}}));
    CHECK(m.attention_layers() == 9);
    CHECK(m.recurrent_layers() == 18);
    CHECK(m.mlp_layers() == 27);
    CHECK(m.kv_bytes_per_token() == 9 * 16'384);
    CHECK(m.ssm_checkpoint_bytes() == 18 * 1'116'160);
    CHECK(m.prefill_flops(1000) == 12'378'783'744'000);  // 9·F_a + 18·F_r + 27·F_m
  }
  SUBCASE("0:1 -> pure SSM, 28 + 28 MLP; 1:0 -> pure attention, recurrent family none") {
    const cost_model ssm(with_overrides(presets::marconi_7b(), {.attention_ratio = layer_ratio{0, 1}}));
    CHECK(ssm.attention_layers() == 0);
    CHECK(ssm.kv_bytes_per_token() == 0);
    CHECK(ssm.ssm_checkpoint_bytes() == 28 * 1'116'160);
    CHECK(ssm.prefill_flops(1000) == 13'389'365'248'000);  // 28·F_r + 28·F_m
    const cost_model attn(with_overrides(presets::marconi_7b(), {.attention_ratio = layer_ratio{1, 0}}));
    CHECK(attn.spec().recurrent == recurrent_family::none);
    CHECK(attn.ssm_checkpoint_bytes() == 0);
    CHECK(attn.prefill_flops(1000) == 11'733'041'152'000);  // 28·F_a + 28·F_m
  }
  SUBCASE("a preset without MLPs keeps none") {
    const cost_model m(with_overrides(presets::mamba2_1b3_pure(), {.attention_ratio = layer_ratio{0, 1}}));
    CHECK(m.mlp_layers() == 0);
    CHECK(m.recurrent_layers() == 48);
  }
}

// N = 16 on marconi_7b (Mamba-2): state 4096·16·2 = 131,072 B, conv (8192 + 2·16)·4·2 =
// 65,792 B per layer -- the anchors' S_ssm = 2·D·N + 2·k·(eD + 2N) at N = 16 -- and
// F_r per token = 12·D² + 16·D·16 + 10·D = 202,416,128.
TEST_CASE("state dimension: Mamba-2 state and conv bytes, recurrent FLOPs") {
  const cost_model m(with_overrides(presets::marconi_7b(), {.state_dim = 16}));
  CHECK(m.spec().name == "marconi_7b[d_state=16]");
  CHECK(m.recurrent_state_bytes_per_layer() == 131'072);
  CHECK(m.conv_state_bytes_per_layer() == 65'792);
  CHECK(m.ssm_checkpoint_bytes() == 24 * 196'864);
  CHECK(m.kv_bytes_per_token() == 65'536);  // attention untouched
  CHECK(m.recurrent_flops(1) == 202'416'128);
  CHECK(m.prefill_flops(1000) == 12'976'586'752'000);
  // Mamba-1 (jamba): the conv runs over d_inner only, so only the state moves.
  const cost_model j(with_overrides(presets::jamba_1_5_mini(), {.state_dim = 128}));
  const cost_model j0(presets::jamba_1_5_mini());
  CHECK(j.conv_state_bytes_per_layer() == j0.conv_state_bytes_per_layer());
  CHECK(j.recurrent_state_bytes_per_layer() == 8192 * 128 * 2);
  // Both overrides together.
  const model_spec both =
      with_overrides(presets::marconi_7b(), {.attention_ratio = layer_ratio{1, 2}, .state_dim = 16});
  CHECK(both.name == "marconi_7b[attn:ssm=1:2,d_state=16]");
  CHECK(cost_model(both).ssm_checkpoint_bytes() == 18 * 196'864);
}

TEST_CASE("bad overrides are refused naming the override and the value") {
  CHECK(parse_layer_ratio("1:6") == layer_ratio{1, 6});
  for (const char* bad : {"16", "1:", ":6", "0:0", "-1:6", "1:x", "1:6:2", "1:2000"}) {
    CAPTURE(bad);
    std::string what;
    try {
      (void)parse_layer_ratio(bad);
    } catch (const invalid_argument& e) {
      what = e.what();
    }
    CHECK(what.find("attention_ratio '" + std::string(bad) + "'") != std::string::npos);
  }
  CHECK(error_of(presets::llama2_7b(), {.attention_ratio = layer_ratio{1, 6}}).find("attention only") != std::string::npos);
  CHECK(error_of(presets::mamba2_1b3_pure(), {.attention_ratio = layer_ratio{1, 6}}).find("no attention shapes") !=
        std::string::npos);
  CHECK(error_of(presets::qwen3_next_80b_a3b(), {.state_dim = 64}).find("state_dim 64 on 'qwen3_next_80b_a3b'") !=
        std::string::npos);
  CHECK(error_of(presets::llama2_7b(), {.state_dim = 16}).find("no recurrent layer") != std::string::npos);
  CHECK(error_of(presets::marconi_7b(), {.state_dim = 0}).find("state_dim 0") != std::string::npos);
  CHECK(error_of(presets::marconi_7b(), {.attention_ratio = layer_ratio{0, 0}}).find("not both 0") != std::string::npos);
  // A pure-attention result cannot then take a state dimension.
  CHECK(error_of(presets::marconi_7b(), {.attention_ratio = layer_ratio{1, 0}, .state_dim = 16})
            .find("no recurrent layer") != std::string::npos);
}
