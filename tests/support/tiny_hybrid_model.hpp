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

}  // namespace hybridcache::test
