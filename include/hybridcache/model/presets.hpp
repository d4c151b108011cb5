// hybridcache/model/presets.hpp
//
// Model presets. Each states its source; byte counts they must reproduce are pinned in
// tests/core/test_presets.cpp:
//
//   marconi_7b          SSM+conv state 1,116,160 B per layer, 26,787,840 B per checkpoint
//                       (24 layers), 65,536 B of KV per token — the Marconi simulator's counts
//   jamba_1_5_mini      4,096 B KV per token per attention layer, 262,144 B SSM unit (AVMP)
//   mamba2_1b3          4,096 B KV per token per attention layer, 2,097,152 B SSM unit (AVMP)
//   qwen3_next_80b_a3b  2 MiB fp32 GDN state per sequence per layer
//   llama2_7b           pure Transformer
//   mamba2_1b3_pure     pure SSM (the real state-spaces/mamba2-1.3b shapes)
//
// `find_preset(name)` looks one up by name; `preset_names()` lists them.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>

#include "hybridcache/model/model_spec.hpp"

namespace hybridcache::presets {

/// Marconi's default model, "NVIDIA Attention-Mamba2 Hybrid 7B" (arXiv 2406.07887) as the
/// Marconi simulator counts it (ruipeterpan/marconi utils.py; anchors/marconi.md 1(d),(h)):
/// 24 SSM, 4 attention and 28 MLP layers, D 4096, N 128, conv 4, expand 2, fp16.
/// State accounting follows the simulator: the SSM part is D·N elements (the simulator's
/// choice; Mamba-2's true state is d_inner·N) and the conv part (eD + 2N)·k elements.
/// Layer order is illustrative (one attention layer per 7 mixers); no cost depends on it.
[[nodiscard]] inline model_spec marconi_7b() {
  return model_spec{
      .name = "marconi_7b",
      .source = "Marconi (arXiv 2411.19379) default 7B hybrid; byte counts of ruipeterpan/marconi utils.py",
      .layers = layer_pattern("RMRMRMRMRMRMAM", 4),
      .d_model = 4096,
      .attention_heads = 32,
      .kv_heads = 32,
      .head_dim = 128,
      .recurrent = recurrent_family::mamba2,
      .ssm_d_inner = 8192,
      .ssm_state_rows = 4096,
      .d_state = 128,
      .conv_kernel = 4,
      .conv_channels = 8192 + 2 * 128,
      .kv_dtype_bytes = 2,
      .state_dtype_bytes = 2,
      .conv_dtype_bytes = 2,
      .activation_dtype_bytes = 2,
      .scan_chunk = 256,
  };
}

/// AI21 Jamba-1.5-Mini (HF ai21labs/AI21-Jamba-1.5-Mini config.json): 32 layers, one
/// attention layer per 8 (attn_layer_period 8, offset 4), every layer followed by an MLP
/// (MoE on odd layers; counted as a dense MLP of width 4D by the FLOP formulas), D 4096,
/// 32 query / 8 KV heads of dim 128, Mamba-1 with expand 2 (d_inner 8192), d_state 16,
/// d_conv 4, bf16. The AVMP reference (codepawl/cachepawl models/spec.py) counts the same
/// shapes: 4,096 B KV per token per attention layer and a 262,144 B SSM unit (state only).
[[nodiscard]] inline model_spec jamba_1_5_mini() {
  return model_spec{
      .name = "jamba_1_5_mini",
      .source = "ai21labs/AI21-Jamba-1.5-Mini config.json; AVMP reference models/spec.py",
      .layers = layer_pattern("RMRMRMRMAMRMRMRM", 4),
      .d_model = 4096,
      .attention_heads = 32,
      .kv_heads = 8,
      .head_dim = 128,
      .recurrent = recurrent_family::mamba1,
      .ssm_d_inner = 8192,
      .ssm_state_rows = 8192,
      .d_state = 16,
      .conv_kernel = 4,
      .conv_channels = 8192,
      .kv_dtype_bytes = 2,
      .state_dtype_bytes = 2,
      .conv_dtype_bytes = 2,
      .activation_dtype_bytes = 2,
      .scan_chunk = 2048,  // selective-scan kernels process the sequence in 2048-token chunks
  };
}

/// The AVMP reference's `mamba2_1b3` (codepawl/cachepawl models/spec.py): a synthetic
/// hybrid with Jamba's layout and Mamba-2's d_state 128 (d_inner 8192), giving a 2 MiB
/// SSM unit per layer per sequence. Not the real state-spaces/mamba2-1.3b; that one is
/// `mamba2_1b3_pure`.
[[nodiscard]] inline model_spec mamba2_1b3() {
  return model_spec{
      .name = "mamba2_1b3",
      .source = "AVMP reference (codepawl/cachepawl) models/spec.py: Jamba layout + Mamba-2 d_state",
      .layers = layer_pattern("AMRMRMRMRMRMRMRM", 4),  // attention at i % 8 == 0, as the reference
      .d_model = 4096,
      .attention_heads = 32,
      .kv_heads = 8,
      .head_dim = 128,
      .recurrent = recurrent_family::mamba2,
      .ssm_d_inner = 8192,
      .ssm_state_rows = 8192,
      .d_state = 128,
      .conv_kernel = 4,
      .conv_channels = 8192 + 2 * 128,
      .kv_dtype_bytes = 2,
      .state_dtype_bytes = 2,
      .conv_dtype_bytes = 2,
      .activation_dtype_bytes = 2,
      .scan_chunk = 256,
  };
}

/// Qwen3-Next-80B-A3B (HF Qwen/Qwen3-Next-80B-A3B-Instruct config.json): 48 layers in
/// 12 groups of 3 Gated DeltaNet + 1 gated attention, each followed by a MoE MLP; D 2048;
/// attention 16 query / 2 KV heads of dim 256; GDN 16 key heads and 32 value heads of dim
/// 128, conv 4 over q,k,v (2·16·128 + 32·128 = 8192 channels); fp32 recurrent state
/// (32·128·128·4 B = 2 MiB per sequence per layer), bf16 KV and conv state; chunk 64.
/// The FLOP formula of recurrent layers uses N = d_k = 128.
[[nodiscard]] inline model_spec qwen3_next_80b_a3b() {
  return model_spec{
      .name = "qwen3_next_80b_a3b",
      .source = "Qwen/Qwen3-Next-80B-A3B-Instruct config.json (linear_* and full-attention fields)",
      .layers = layer_pattern("RMRMRMAM", 12),
      .d_model = 2048,
      .attention_heads = 16,
      .kv_heads = 2,
      .head_dim = 256,
      .recurrent = recurrent_family::gated_deltanet,
      .d_state = 128,
      .conv_kernel = 4,
      .conv_channels = 2 * 16 * 128 + 32 * 128,
      .gdn_key_heads = 16,
      .gdn_value_heads = 32,
      .gdn_key_dim = 128,
      .gdn_value_dim = 128,
      .kv_dtype_bytes = 2,
      .state_dtype_bytes = 4,
      .conv_dtype_bytes = 2,
      .activation_dtype_bytes = 2,
      .scan_chunk = 64,
  };
}

/// Pure Transformer: Llama-2-7B (HF meta-llama/Llama-2-7b-hf config.json): 32 layers,
/// D 4096, 32 heads of dim 128 (MHA), fp16. 524,288 B of KV per token.
[[nodiscard]] inline model_spec llama2_7b() {
  return model_spec{
      .name = "llama2_7b",
      .source = "meta-llama/Llama-2-7b-hf config.json",
      .layers = layer_pattern("AM", 32),
      .d_model = 4096,
      .attention_heads = 32,
      .kv_heads = 32,
      .head_dim = 128,
      .kv_dtype_bytes = 2,
      .state_dtype_bytes = 2,
      .conv_dtype_bytes = 2,
      .activation_dtype_bytes = 2,
      .scan_chunk = 1,
  };
}

/// Pure SSM: state-spaces/mamba2-1.3b (config.json): 48 Mamba-2 layers, no MLP, D 2048,
/// expand 2 (d_inner 4096), d_state 128, head dim 64, 1 group, conv 4 over
/// d_inner + 2·N = 4352 channels, fp16; chunk 256.
[[nodiscard]] inline model_spec mamba2_1b3_pure() {
  return model_spec{
      .name = "mamba2_1b3_pure",
      .source = "state-spaces/mamba2-1.3b config.json",
      .layers = layer_pattern("R", 48),
      .d_model = 2048,
      .recurrent = recurrent_family::mamba2,
      .ssm_d_inner = 4096,
      .ssm_state_rows = 4096,
      .d_state = 128,
      .conv_kernel = 4,
      .conv_channels = 4096 + 2 * 128,
      .kv_dtype_bytes = 2,
      .state_dtype_bytes = 2,
      .conv_dtype_bytes = 2,
      .activation_dtype_bytes = 2,
      .scan_chunk = 256,
  };
}

/// Names of all presets, in the order the docs list them.
[[nodiscard]] constexpr std::array<std::string_view, 6> preset_names() noexcept {
  return {"marconi_7b", "jamba_1_5_mini", "mamba2_1b3", "qwen3_next_80b_a3b", "llama2_7b", "mamba2_1b3_pure"};
}

/// The preset called `name`, or nullopt.
[[nodiscard]] inline std::optional<model_spec> find_preset(std::string_view name) {
  if (name == "marconi_7b") return marconi_7b();
  if (name == "jamba_1_5_mini") return jamba_1_5_mini();
  if (name == "mamba2_1b3") return mamba2_1b3();
  if (name == "qwen3_next_80b_a3b") return qwen3_next_80b_a3b();
  if (name == "llama2_7b") return llama2_7b();
  if (name == "mamba2_1b3_pure") return mamba2_1b3_pure();
  return std::nullopt;
}

/// The preset called `name`; throws invalid_argument listing the known names otherwise.
[[nodiscard]] inline model_spec preset(std::string_view name) {
  if (auto p = find_preset(name)) return *p;
  std::string known;
  for (auto n : preset_names()) known += (known.empty() ? "" : ", ") + std::string(n);
  throw invalid_argument("unknown model preset '" + std::string(name) + "' (known: " + known + ")");
}

}  // namespace hybridcache::presets
