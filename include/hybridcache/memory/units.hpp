// hybridcache/memory/units.hpp
//
// Unit sizes of the asymmetric memory pools, derived from a model's cost model.
//
// A KV page holds `tokens_per_page` tokens of K and V for the attention layers it serves
// (one layer by default, as the AVMP reference allocates per layer); an SSM block holds
// the recurrent state of one layer of one sequence. Both are rounded up to 128 B, the
// coalesced-load width the reference also uses (`align128`), so every unit offset is
// 128 B aligned. For the AVMP presets this gives 65,536 B KV pages and 262,144 B
// (jamba_1_5_mini) or 2,097,152 B (mamba2_1b3) SSM blocks, exactly the reference's sizes.
//
// Everything here is O(1).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "hybridcache/concepts/pool.hpp"
#include "hybridcache/core/checked_math.hpp"
#include "hybridcache/model/cost_model.hpp"
#include "hybridcache/core/error.hpp"

namespace hybridcache::memory {

/// Alignment of every unit size and unit offset (bytes).
inline constexpr byte_count unit_alignment = 128;

/// Default physical chunk: the CUDA VMM allocation granularity of current NVIDIA GPUs.
inline constexpr byte_count default_granularity_bytes = byte_count{2} << 20;

/// Rounds `bytes` up to a multiple of `alignment`.
/// @throws invalid_argument if `bytes` or `alignment` is not positive.
/// @throws overflow_error when the result does not fit a byte_count.
[[nodiscard]] inline byte_count align_up(byte_count bytes, byte_count alignment = unit_alignment) {
  HYBRIDCACHE_EXPECTS(bytes > 0, invalid_argument,
                      "align_up: size must be > 0 bytes, got " + std::to_string(bytes));
  HYBRIDCACHE_EXPECTS(alignment > 0, invalid_argument, "align_up: alignment must be > 0");
  return checked_product("align_up", (bytes - 1) / alignment + 1, alignment);
}

/// KV page bytes: `tokens_per_page` x KV bytes per token of `layers_per_page` attention
/// layers, rounded up to 128 B. @throws invalid_argument on non-positive arguments or a
/// model without attention layers.
[[nodiscard]] inline byte_count kv_page_bytes(const cost_model& model, std::int64_t tokens_per_page = 16,
                                              std::int64_t layers_per_page = 1) {
  HYBRIDCACHE_EXPECTS(tokens_per_page > 0, invalid_argument, "kv_page_bytes: tokens_per_page must be > 0");
  HYBRIDCACHE_EXPECTS(layers_per_page > 0, invalid_argument, "kv_page_bytes: layers_per_page must be > 0");
  HYBRIDCACHE_EXPECTS(model.kv_bytes_per_token_per_layer() > 0, invalid_argument,
                      "kv_page_bytes: model '" + model.spec().name + "' has no attention layers");
  return align_up(checked_product("KV page bytes", tokens_per_page, layers_per_page,
                                  model.kv_bytes_per_token_per_layer()));
}

/// SSM block bytes as the AVMP reference sizes them: the recurrent state of one layer of
/// one sequence, rounded up to 128 B, without the conv state (the allocator replay uses it
/// to reproduce the reference's rows). A pool that holds prefix-cache checkpoints uses
/// `checkpoint_block_bytes`. @throws invalid_argument for a model without recurrent layers.
[[nodiscard]] inline byte_count ssm_block_bytes(const cost_model& model) {
  HYBRIDCACHE_EXPECTS(model.recurrent_state_bytes_per_layer() > 0, invalid_argument,
                      "ssm_block_bytes: model '" + model.spec().name + "' has no recurrent layers");
  return align_up(model.recurrent_state_bytes_per_layer());
}

/// Checkpoint block bytes: everything a checkpoint holds for one recurrent layer, the
/// recurrent state and the short-convolution state (`cost_model::ssm_checkpoint_bytes_per_layer`),
/// rounded up to 128 B. A pool whose SSM unit is this size gives `pool_state_store` the
/// same checkpoint size as the cost model (`ssm_checkpoint_bytes`) whenever the per-layer
/// size is a multiple of 128 B (every preset). @throws invalid_argument for a model without
/// recurrent layers.
[[nodiscard]] inline byte_count checkpoint_block_bytes(const cost_model& model) {
  HYBRIDCACHE_EXPECTS(model.recurrent_state_bytes_per_layer() > 0, invalid_argument,
                      "checkpoint_block_bytes: model '" + model.spec().name + "' has no recurrent layers");
  return align_up(model.ssm_checkpoint_bytes_per_layer());
}

}  // namespace hybridcache::memory
