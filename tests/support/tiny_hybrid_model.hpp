// tests/support/tiny_hybrid_model.hpp
//
// A hybrid model with tiny shapes for tests that move real bytes: one Mamba-2 and one
// attention layer, 64 B of KV per token (2 x 1 KV head x 16 x 2 B) and a 96 B recurrent
// checkpoint (4 x 12 x 2 B), so page = gcd = 32 B and arenas stay a few kilobytes.
#pragma once

#include "hybridcache/model/cost_model.hpp"
#include "hybridcache/model/model_spec.hpp"

namespace hybridcache::test {

[[nodiscard]] inline model_spec tiny_hybrid_spec() {
  model_spec s;
  s.name = "tiny_hybrid";
  s.source = "tests: one attention and one Mamba-2 layer with tiny shapes";
  s.layers = {layer_kind::recurrent, layer_kind::mlp, layer_kind::attention, layer_kind::mlp};
  s.d_model = 64;
  s.attention_heads = 2;
  s.kv_heads = 1;
  s.head_dim = 16;
  s.recurrent = recurrent_family::mamba2;
  s.ssm_d_inner = 128;
  s.ssm_state_rows = 4;
  s.d_state = 12;
  s.conv_kernel = 0;
  s.scan_chunk = 16;
  return s;
}

/// The tiny runtime's Gated DeltaNet hybrid (examples/tiny_hybrid_runtime.cpp): `repeat` times
/// the layer `pattern` ("RA": a GDN and an attention layer), d_model 64, 2 query heads and 1
/// KV head of 32, GDN 2 x 2 heads of 32, fp32: a KV page of 16 tokens is 4 KiB, a state block
/// 8 KiB. For tests of the lifecycle over a real pool.
[[nodiscard]] inline model_spec tiny_gdn_spec(const char* name, const char* pattern = "RA", int repeat = 2) {
  model_spec s;
  s.name = name;
  s.source = "tests: the tiny runtime's shapes";
  s.layers = layer_pattern(pattern, repeat);
  s.d_model = 64;
  s.attention_heads = 2;
  s.kv_heads = 1;
  s.head_dim = 32;
  s.recurrent = recurrent_family::gated_deltanet;
  s.gdn_key_heads = 2;
  s.gdn_value_heads = 2;
  s.gdn_key_dim = 32;
  s.gdn_value_dim = 32;
  s.kv_dtype_bytes = 4;
  s.state_dtype_bytes = 4;
  s.activation_dtype_bytes = 4;
  s.scan_chunk = 16;
  return s;
}

}  // namespace hybridcache::test
