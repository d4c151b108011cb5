// hybridcache/model/model_overrides.hpp
//
// A preset with Marconi's architecture ablations applied (papers/000 §5.4, Fig. 12): the
// attention:SSM layer ratio and the SSM state dimension N. `with_overrides(preset, o)`
// returns a new, validated `model_spec`; an empty `model_overrides` returns the preset
// unchanged, so its cost model is the preset's exactly.
//
//   attention_ratio A:S  the mixer layers (attention + recurrent) become G groups of A
//                        attention and S recurrent layers, G = round(mixers / (A + S)) >= 1,
//                        so the ratio is exact and the preset's mixer count is kept as
//                        nearly as the ratio allows (marconi_7b's 28 mixers: 1:6 -> 4 + 24,
//                        its own layers; 1:2 -> 9 + 18; 0:1 -> 28 SSM). Each group is laid
//                        out as S recurrent layers then A attention layers; a preset that
//                        follows every mixer with an MLP keeps doing so (one without MLPs
//                        keeps none). Costs do not depend on the order.
//   state_dim N          d_state of a Mamba-1/2 preset. It enters the recurrent FLOPs
//                        (16·L·D·N) and the state bytes (rows·N); a Mamba-2 short conv also
//                        runs over B and C (d_inner + 2N channels), so Mamba-2 presets'
//                        conv_channels move by 2·ΔN. A Gated DeltaNet preset's state is
//                        heads x d_k x d_v, not N: refused there, and on a preset without
//                        recurrent layers.
//
// Why a ratio over the preset's mixer count rather than free layer counts: the paper's
// ablation changes the mix at a fixed model size, and keeping the preset's total keeps the
// comparison to the preset (same depth, same D) one variable at a time.
//
// Every error is an `invalid_argument` naming the override ("attention_ratio",
// "state_dim") and the value; the CLI adds its flag name.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "hybridcache/core/error.hpp"
#include "hybridcache/model/model_spec.hpp"

namespace hybridcache {

/// An attention:recurrent layer ratio, e.g. {1, 6} for one attention layer per six SSM layers.
struct layer_ratio {
  std::int64_t attention = 0;
  std::int64_t recurrent = 0;
  friend bool operator==(const layer_ratio&, const layer_ratio&) = default;
};

/// The ablation overrides; nullopt keeps the preset's value.
struct model_overrides {
  std::optional<layer_ratio> attention_ratio{};
  std::optional<std::int64_t> state_dim{};
  [[nodiscard]] bool empty() const noexcept { return !attention_ratio && !state_dim; }
};

/// Largest count either side of a ratio may name (a model with more layers is not plausible).
inline constexpr std::int64_t max_ratio_layers = 1024;
/// Largest SSM state dimension accepted (Mamba-2 uses 128; 2^16 leaves room for ablations).
inline constexpr std::int64_t max_state_dim = 65536;

/// Parses "A:S" (two non-negative integers, not both 0, each <= max_ratio_layers).
/// @throws invalid_argument naming the text.
[[nodiscard]] inline layer_ratio parse_layer_ratio(std::string_view text) {
  const auto bad = [&](const std::string& why) {
    return invalid_argument("attention_ratio '" + std::string(text) + "': " + why);
  };
  const auto colon = text.find(':');
  if (colon == std::string_view::npos) throw bad("expected ATTENTION:RECURRENT, e.g. 1:6");
  auto number = [&](std::string_view s, const char* side) {
    std::int64_t v = -1;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || ec != std::errc() || end != s.data() + s.size())
      throw bad(std::string("the ") + side + " count must be a non-negative integer");
    if (v < 0 || v > max_ratio_layers)
      throw bad(std::string("the ") + side + " count must be in [0, " + std::to_string(max_ratio_layers) + "]");
    return v;
  };
  const layer_ratio r{number(text.substr(0, colon), "attention"), number(text.substr(colon + 1), "recurrent")};
  if (r.attention == 0 && r.recurrent == 0) throw bad("at least one side must be > 0");
  return r;
}

/// "A:S".
[[nodiscard]] inline std::string to_string(const layer_ratio& r) {
  return std::to_string(r.attention) + ":" + std::to_string(r.recurrent);
}

/// `preset` with `o` applied (see the header comment), validated; its name gains the
/// overrides ("marconi_7b[attn:ssm=1:2,d_state=16]") so reports say what ran.
/// @throws invalid_argument naming the override and value when it cannot apply.
[[nodiscard]] inline model_spec with_overrides(model_spec preset, const model_overrides& o) {
  if (o.empty()) return preset;
  model_spec s = std::move(preset);
  const std::string base = s.name;
  std::string suffix;
  if (o.attention_ratio) {
    const layer_ratio r = *o.attention_ratio;
    const std::string what = "attention_ratio " + to_string(r) + " on '" + base + "': ";
    if (r.attention < 0 || r.recurrent < 0 || r.attention > max_ratio_layers || r.recurrent > max_ratio_layers ||
        (r.attention == 0 && r.recurrent == 0))
      throw invalid_argument(what + "each side must be in [0, " + std::to_string(max_ratio_layers) + "], not both 0");
    const std::int64_t n_attn = s.count(layer_kind::attention), n_rec = s.count(layer_kind::recurrent);
    const std::int64_t n_mlp = s.count(layer_kind::mlp), mixers = n_attn + n_rec;
    if (r.recurrent > 0 && s.recurrent == recurrent_family::none)
      throw invalid_argument(what + "the preset has no recurrent layer kind to add (it is attention only)");
    if (r.attention > 0 && (s.attention_heads <= 0 || s.kv_heads <= 0 || s.head_dim <= 0))
      throw invalid_argument(what + "the preset has no attention shapes to add attention layers with");
    if (n_mlp != 0 && n_mlp != mixers)
      throw invalid_argument(what + "the preset's " + std::to_string(n_mlp) + " MLP layers do not pair with its " +
                             std::to_string(mixers) + " mixer layers");
    const bool mlp = n_mlp > 0;
    const auto groups = std::max<std::int64_t>(
        1, std::llround(static_cast<double>(mixers) / static_cast<double>(r.attention + r.recurrent)));
    std::vector<layer_kind> layers;
    for (std::int64_t g = 0; g < groups; ++g) {
      for (std::int64_t k = 0; k < r.recurrent; ++k) {
        layers.push_back(layer_kind::recurrent);
        if (mlp) layers.push_back(layer_kind::mlp);
      }
      for (std::int64_t k = 0; k < r.attention; ++k) {
        layers.push_back(layer_kind::attention);
        if (mlp) layers.push_back(layer_kind::mlp);
      }
    }
    s.layers = std::move(layers);
    if (r.recurrent == 0) s.recurrent = recurrent_family::none;  // validate() requires it
    suffix += "attn:ssm=" + to_string(r);
  }
  if (o.state_dim) {
    const std::int64_t n = *o.state_dim;
    const std::string what = "state_dim " + std::to_string(n) + " on '" + base + "': ";
    if (n < 1 || n > max_state_dim) throw invalid_argument(what + "must be in [1, " + std::to_string(max_state_dim) + "]");
    if (s.count(layer_kind::recurrent) == 0)
      throw invalid_argument(what + "the model has no recurrent layer whose state it could size");
    if (s.recurrent != recurrent_family::mamba1 && s.recurrent != recurrent_family::mamba2)
      throw invalid_argument(what + "applies to Mamba presets; a " + std::string(to_string(s.recurrent)) +
                             " state is heads x key dim x value dim, not d_state");
    if (s.recurrent == recurrent_family::mamba2 && s.conv_kernel > 0) s.conv_channels += 2 * (n - s.d_state);
    s.d_state = n;
    suffix += std::string(suffix.empty() ? "" : ",") + "d_state=" + std::to_string(n);
  }
  s.name = base + "[" + suffix + "]";
  s.validate();
  return s;
}

}  // namespace hybridcache
