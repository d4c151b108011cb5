// hybridcache/model/cost_model.hpp
//
// Bytes and FLOPs of a model, from its `model_spec`.
//
// Byte counts and FLOP counts are exact int64 (overflow throws `overflow_error`). The FLOP
// formulas are Marconi's (anchors/marconi.md 1(d)), forward pass only, for L tokens of
// one layer:
//
//   attention  F_a(L) = 8·L·D² + 4·L²·D        (QKV + output projections, QKᵀ and AV)
//   recurrent  F_r(L) = 12·L·D² + 16·L·D·N + 10·L·D
//   MLP        F_m(L) = 16·L·D²                (two matmuls of D x 4D)
//
// `saved_flops(p, L)` is the correct marginal form for a node whose parent prefix has p
// tokens and which ends at token L: recurrent and MLP terms are linear in the node's own
// L - p tokens, attention pays F_a(L) - F_a(p). (The reference subtracts F_a(p) from the MLP
// term, a typo we do not copy.) Node efficiency divides by the node's own bytes — its
// checkpoint plus the KV of its own tokens — not the KV of the whole root-to-node path.
//
// Every accessor is O(1) and allocation-free; the layer counts are cached at construction.
#pragma once

#include <cstdint>
#include <utility>

#include "hybridcache/core/checked_math.hpp"
#include "hybridcache/model/model_spec.hpp"

namespace hybridcache {

class cost_model {
 public:
  /// Validates `spec` (throws invalid_argument / overflow_error naming the field).
  explicit cost_model(model_spec spec) : spec_(std::move(spec)) {
    spec_.validate();
    n_attn_ = spec_.count(layer_kind::attention);
    n_rec_ = spec_.count(layer_kind::recurrent);
    n_mlp_ = spec_.count(layer_kind::mlp);
    kv_per_token_per_layer_ = n_attn_ > 0 ? 2 * spec_.kv_heads * spec_.head_dim * spec_.kv_dtype_bytes : 0;
    kv_per_token_ = kv_per_token_per_layer_ * n_attn_;
    if (n_rec_ > 0) {
      const bool mamba = spec_.recurrent == recurrent_family::mamba1 || spec_.recurrent == recurrent_family::mamba2;
      rec_state_per_layer_ = mamba ? spec_.ssm_state_rows * spec_.d_state * spec_.state_dtype_bytes
                                   : spec_.gdn_value_heads * spec_.gdn_key_dim * spec_.gdn_value_dim *
                                         spec_.state_dtype_bytes;
      conv_state_per_layer_ = spec_.conv_channels * spec_.conv_kernel * spec_.conv_dtype_bytes;
    }
    checkpoint_ = (rec_state_per_layer_ + conv_state_per_layer_) * n_rec_;
  }

  [[nodiscard]] const model_spec& spec() const noexcept { return spec_; }
  [[nodiscard]] std::int64_t attention_layers() const noexcept { return n_attn_; }
  [[nodiscard]] std::int64_t recurrent_layers() const noexcept { return n_rec_; }
  [[nodiscard]] std::int64_t mlp_layers() const noexcept { return n_mlp_; }

  // --- bytes -------------------------------------------------------------------------

  /// KV bytes of one token in one attention layer: 2 (K and V) · kv_heads · head_dim · dtype.
  [[nodiscard]] std::int64_t kv_bytes_per_token_per_layer() const noexcept { return kv_per_token_per_layer_; }
  /// KV bytes of one token over all attention layers.
  [[nodiscard]] std::int64_t kv_bytes_per_token() const noexcept { return kv_per_token_; }
  /// KV bytes of `tokens` tokens over all attention layers. @throws overflow_error.
  [[nodiscard]] std::int64_t kv_bytes(std::int64_t tokens) const { return checked_mul(tokens, kv_per_token_, "KV bytes"); }

  /// Recurrent state (the SSM h, or the GDN matrix state) of one layer of one sequence.
  [[nodiscard]] std::int64_t recurrent_state_bytes_per_layer() const noexcept { return rec_state_per_layer_; }
  /// Short-convolution state of one layer of one sequence (0 when conv_kernel is 0).
  [[nodiscard]] std::int64_t conv_state_bytes_per_layer() const noexcept { return conv_state_per_layer_; }
  /// Everything a checkpoint holds for one recurrent layer: recurrent + conv state.
  [[nodiscard]] std::int64_t ssm_checkpoint_bytes_per_layer() const noexcept {
    return rec_state_per_layer_ + conv_state_per_layer_;
  }
  /// One SSM checkpoint over all recurrent layers (the state after one token position).
  [[nodiscard]] std::int64_t ssm_checkpoint_bytes() const noexcept { return checkpoint_; }
  /// Whole-model state of a cached prefix of `tokens` tokens with one checkpoint at its end.
  [[nodiscard]] std::int64_t state_bytes(std::int64_t tokens) const {
    return checked_add(checkpoint_, kv_bytes(tokens), "state bytes");
  }

  // --- FLOPs (per layer, L tokens, forward) -------------------------------------------

  [[nodiscard]] std::int64_t attention_flops(std::int64_t L) const {
    const std::int64_t D = spec_.d_model;
    return checked_add(checked_product("attention FLOPs", 8, L, D, D), checked_product("attention FLOPs", 4, L, L, D),
                       "attention FLOPs");
  }
  [[nodiscard]] std::int64_t recurrent_flops(std::int64_t L) const {
    const std::int64_t D = spec_.d_model, N = spec_.d_state;
    const char* w = "recurrent FLOPs";
    return checked_add(checked_add(checked_product(w, 12, L, D, D), checked_product(w, 16, L, D, N), w),
                       checked_product(w, 10, L, D), w);
  }
  [[nodiscard]] std::int64_t mlp_flops(std::int64_t L) const {
    const std::int64_t D = spec_.d_model;
    return checked_product("MLP FLOPs", 16, L, D, D);
  }

  /// Prefill FLOPs of `L` tokens over the whole model.
  [[nodiscard]] std::int64_t prefill_flops(std::int64_t L) const {
    const char* w = "prefill FLOPs";
    std::int64_t f = 0;
    if (n_attn_) f = checked_add(f, checked_mul(n_attn_, attention_flops(L), w), w);
    if (n_rec_) f = checked_add(f, checked_mul(n_rec_, recurrent_flops(L), w), w);
    if (n_mlp_) f = checked_add(f, checked_mul(n_mlp_, mlp_flops(L), w), w);
    return f;
  }

  /// FLOPs saved by a cache hit that skips the first `s` tokens of a prefill (equal to
  /// prefill_flops(s); named for the metric).
  [[nodiscard]] std::int64_t hit_flops(std::int64_t s) const { return prefill_flops(s); }

  /// FLOPs saved by reusing a node that extends a cached prefix of `p` tokens to `L`
  /// tokens (0 <= p <= L), i.e. what recomputing exactly that node's tokens would cost.
  [[nodiscard]] std::int64_t saved_flops(std::int64_t p, std::int64_t L) const {
    const char* w = "saved FLOPs";
    const std::int64_t own = L - p;
    std::int64_t f = 0;
    if (n_attn_) f = checked_add(f, checked_mul(n_attn_, attention_flops(L) - attention_flops(p), w), w);
    if (n_rec_) f = checked_add(f, checked_mul(n_rec_, recurrent_flops(own), w), w);
    if (n_mlp_) f = checked_add(f, checked_mul(n_mlp_, mlp_flops(own), w), w);
    return f;
  }

  /// FLOP efficiency of a whole cached prefix of L tokens: prefill FLOPs per byte of state.
  [[nodiscard]] double flop_efficiency(std::int64_t L) const {
    return static_cast<double>(prefill_flops(L)) / static_cast<double>(state_bytes(L));
  }

  /// FLOP efficiency of one tree node spanning tokens (p, L]: its saved FLOPs per byte of
  /// its own state (one checkpoint if it holds one, plus the KV of its own L - p tokens).
  [[nodiscard]] double node_flop_efficiency(std::int64_t p, std::int64_t L, bool has_checkpoint = true) const {
    const std::int64_t bytes = checked_add(has_checkpoint ? checkpoint_ : 0, kv_bytes(L - p), "node bytes");
    return bytes > 0 ? static_cast<double>(saved_flops(p, L)) / static_cast<double>(bytes) : 0.0;
  }

 private:
  model_spec spec_;
  std::int64_t n_attn_ = 0, n_rec_ = 0, n_mlp_ = 0;
  std::int64_t kv_per_token_per_layer_ = 0, kv_per_token_ = 0;
  std::int64_t rec_state_per_layer_ = 0, conv_state_per_layer_ = 0, checkpoint_ = 0;
};

}  // namespace hybridcache
