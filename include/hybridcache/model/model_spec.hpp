// hybridcache/model/model_spec.hpp
//
// `model_spec`: what the caches and allocators need to know about a hybrid model — its
// layer composition and order, and the shapes and dtypes that fix how many bytes a token
// of KV and a recurrent-state checkpoint take. Presets for real models are in presets.hpp;
// the byte and FLOP arithmetic built on a spec is in cost_model.hpp.
//
// A spec is plain data (aggregate, designated initializers). `validate()` checks it once
// and throws `invalid_argument` naming the first bad field; every consumer in the library
// validates the spec it is given.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "hybridcache/core/checked_math.hpp"
#include "hybridcache/core/enum_names.hpp"
#include "hybridcache/core/error.hpp"

namespace hybridcache {

/// The kind of a layer. `recurrent` covers every fixed-size-state mixer: Mamba-1/2 SSMs,
/// linear attention and Gated DeltaNet (the family is `model_spec::recurrent`).
enum class layer_kind : std::uint8_t { attention, recurrent, mlp };

/// Which recurrent mixer the model uses; decides how the state size is computed.
enum class recurrent_family : std::uint8_t {
  none,              ///< no recurrent layers (pure Transformer)
  mamba1,            ///< state [ssm_state_rows][d_state] per layer (selective scan)
  mamba2,            ///< state [ssm_state_rows][d_state] per layer (SSD, chunked scan)
  linear_attention,  ///< state [gdn_value_heads][key_dim][value_dim], like GDN
  gated_deltanet,    ///< state [gdn_value_heads][key_dim][value_dim] per layer
};

[[nodiscard]] constexpr std::string_view to_string(recurrent_family f) noexcept {
  constexpr std::array<std::string_view, 5> names{"none", "mamba1", "mamba2", "linear_attention", "gated_deltanet"};
  static_assert(names_every_enumerator(names, recurrent_family::gated_deltanet));
  return enum_name(f, names);
}

/// Shapes, dtypes and layer order of a (hybrid) model.
///
/// Fields that do not apply to a model are 0 (e.g. the GDN heads of a Mamba model).
struct model_spec {
  std::string name;    ///< preset name, e.g. "marconi_7b"
  std::string source;  ///< where the numbers come from (paper, config file)

  /// Layers in model order. Counts per kind are derived from it.
  std::vector<layer_kind> layers;

  std::int64_t d_model = 0;  ///< model width D (used by the FLOP formulas)

  // --- attention layers ---------------------------------------------------------------
  std::int64_t attention_heads = 0;  ///< query heads
  std::int64_t kv_heads = 0;         ///< key/value heads (GQA when < attention_heads)
  std::int64_t head_dim = 0;         ///< per-head dim of K and V

  // --- recurrent layers ----------------------------------------------------------------
  recurrent_family recurrent = recurrent_family::none;
  std::int64_t ssm_d_inner = 0;     ///< expanded width (expand x D) of a Mamba layer
  std::int64_t ssm_state_rows = 0;  ///< rows of a Mamba state [rows][d_state]
  std::int64_t d_state = 0;         ///< SSM state size N
  std::int64_t conv_kernel = 0;     ///< short-conv width; 0 = the conv state is not counted
  std::int64_t conv_channels = 0;   ///< channels kept in the conv state
  std::int64_t gdn_key_heads = 0;   ///< GDN / linear-attention key heads (H)
  std::int64_t gdn_value_heads = 0; ///< GDN / linear-attention value heads (HV >= H)
  std::int64_t gdn_key_dim = 0;     ///< d_k
  std::int64_t gdn_value_dim = 0;   ///< d_v

  // --- dtypes (bytes per element) ------------------------------------------------------
  std::int64_t kv_dtype_bytes = 2;
  std::int64_t state_dtype_bytes = 2;       ///< recurrent state
  std::int64_t conv_dtype_bytes = 2;        ///< conv state
  std::int64_t activation_dtype_bytes = 2;

  /// Chunk size of the chunked scan used in prefill (Mamba-2 SSD, GDN chunkwise). States
  /// can be read directly only at multiples of it; elsewhere prefill rolls forward.
  std::int64_t scan_chunk = 0;

  /// Number of layers of kind `k`. O(layers).
  [[nodiscard]] std::int64_t count(layer_kind k) const noexcept {
    return static_cast<std::int64_t>(std::count(layers.begin(), layers.end(), k));
  }

  /// Checks every field; throws `invalid_argument` naming the first bad one (or
  /// `overflow_error` when a derived byte count does not fit in int64).
  void validate() const;
};

namespace detail {
/// A field's value and name, for the checks below.
struct named_field {
  std::int64_t value;
  std::string_view name;
};
/// Throws invalid_argument naming the first of `fields` that is not > 0.
inline void expect_positive(std::string_view spec, std::initializer_list<named_field> fields) {
  for (const named_field& f : fields)
    if (f.value <= 0)
      throw invalid_argument("model_spec '" + std::string(spec) + "': field '" + std::string(f.name) +
                             "' must be > 0, got " + std::to_string(f.value));
}
/// Throws invalid_argument naming the first of `fields` that is negative.
inline void expect_non_negative(std::string_view spec, std::initializer_list<named_field> fields) {
  for (const named_field& f : fields)
    if (f.value < 0)
      throw invalid_argument("model_spec '" + std::string(spec) + "': field '" + std::string(f.name) +
                             "' must be >= 0, got " + std::to_string(f.value));
}
}  // namespace detail

inline void model_spec::validate() const {
  using detail::expect_non_negative;
  using detail::expect_positive;
  const std::string_view n = name.empty() ? std::string_view("<unnamed>") : std::string_view(name);
  if (layers.empty()) throw invalid_argument("model_spec '" + std::string(n) + "': field 'layers' is empty (zero layers)");
  const std::int64_t n_attn = count(layer_kind::attention);
  const std::int64_t n_rec = count(layer_kind::recurrent);
  if (n_attn + n_rec == 0)
    throw invalid_argument("model_spec '" + std::string(n) +
                           "': field 'layers' has no attention and no recurrent layer");
  expect_positive(n, {{d_model, "d_model"},
                      {kv_dtype_bytes, "kv_dtype_bytes"},
                      {state_dtype_bytes, "state_dtype_bytes"},
                      {conv_dtype_bytes, "conv_dtype_bytes"},
                      {activation_dtype_bytes, "activation_dtype_bytes"},
                      {scan_chunk, "scan_chunk"}});
  if (n_attn > 0) {
    expect_positive(n, {{attention_heads, "attention_heads"}, {kv_heads, "kv_heads"}, {head_dim, "head_dim"}});
    if (attention_heads % kv_heads != 0)
      throw invalid_argument("model_spec '" + std::string(n) +
                             "': field 'kv_heads' must divide attention_heads");
    (void)checked_product("model_spec '" + std::string(n) + "': KV bytes per token", 2, kv_heads, head_dim,
                          kv_dtype_bytes, n_attn);
  }
  if (n_rec > 0) {
    if (recurrent == recurrent_family::none)
      throw invalid_argument("model_spec '" + std::string(n) +
                             "': field 'recurrent' is none but the model has recurrent layers");
    if (recurrent == recurrent_family::mamba1 || recurrent == recurrent_family::mamba2) {
      expect_positive(n, {{ssm_d_inner, "ssm_d_inner"}, {ssm_state_rows, "ssm_state_rows"}, {d_state, "d_state"}});
    } else {
      expect_positive(n, {{gdn_key_heads, "gdn_key_heads"},
                          {gdn_value_heads, "gdn_value_heads"},
                          {gdn_key_dim, "gdn_key_dim"},
                          {gdn_value_dim, "gdn_value_dim"}});
      if (gdn_value_heads % gdn_key_heads != 0)
        throw invalid_argument("model_spec '" + std::string(n) +
                               "': field 'gdn_value_heads' must be a multiple of gdn_key_heads");
    }
    expect_non_negative(n, {{d_state, "d_state"}, {conv_kernel, "conv_kernel"}});
    if (conv_kernel > 0) expect_positive(n, {{conv_channels, "conv_channels"}});
    const std::string what = "model_spec '" + std::string(n) + "': SSM checkpoint bytes";
    const std::int64_t state =
        (recurrent == recurrent_family::mamba1 || recurrent == recurrent_family::mamba2)
            ? checked_product(what, ssm_state_rows, d_state, state_dtype_bytes)
            : checked_product(what, gdn_value_heads, gdn_key_dim, gdn_value_dim, state_dtype_bytes);
    const std::int64_t conv = checked_product(what, conv_channels, conv_kernel, conv_dtype_bytes);
    (void)checked_mul(checked_add(state, conv, what), n_rec, what);
  } else if (recurrent != recurrent_family::none) {
    throw invalid_argument("model_spec '" + std::string(n) +
                           "': field 'recurrent' names a family but the model has no recurrent layer");
  }
  // The FLOP formulas square L·D terms; D itself must leave room for them.
  if (d_model > (std::int64_t{1} << 24))
    throw invalid_argument("model_spec '" + std::string(n) + "': field 'd_model' is implausibly large (> 2^24)");
}

/// Builds a layer list from a repeating pattern string: 'A' attention, 'R' recurrent,
/// 'M' MLP; other characters are ignored. E.g. layer_pattern("RM", 3) = R M R M R M.
/// @throws invalid_argument on an empty pattern.
[[nodiscard]] inline std::vector<layer_kind> layer_pattern(std::string_view pattern, int repeat = 1) {
  std::vector<layer_kind> out;
  for (int r = 0; r < repeat; ++r)
    for (char c : pattern) {
      if (c == 'A') out.push_back(layer_kind::attention);
      else if (c == 'R') out.push_back(layer_kind::recurrent);
      else if (c == 'M') out.push_back(layer_kind::mlp);
    }
  if (out.empty()) throw invalid_argument("layer_pattern: pattern has no 'A', 'R' or 'M'");
  return out;
}

}  // namespace hybridcache
