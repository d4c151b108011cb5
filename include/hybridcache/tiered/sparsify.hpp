// hybridcache/tiered/sparsify.hpp
//
// Quality-aware KV sparsification (CaR §III-D), applied when attention KV pages are
// demoted to a slower tier or loaded back.
//
// CaR's observation: count an attention score as zero when it is below 1 % of its row's
// maximum; the fraction of zeros (the layer's sparsity) rises from about 60 % in the first
// layer to about 95 % in the last. So each layer keeps a different share of its tokens:
// `keep_l = 1 − sparsity_l`, measured once per model on calibration prompts
// (`measure_row_sparsity` / `sparsity_profile::from_measurements`) or taken from the
// paper's linear profile (`sparsity_profile::car_linear`).
//
// Which tokens: H2O's heavy hitters — the tokens with the largest attention *accumulated*
// over the queries seen so far — plus a window of the most recent tokens, which are always
// kept (anchors/multitier.md §2.6). `select_tokens` returns the kept positions, ascending.
//
// Scope: attention KV only. Recurrent (SSM / GDN) states and conv states are never
// sparsified: they are a fixed-size summary of the whole prefix, with no tokens to drop.
// `sparsified_node_bytes` keeps the checkpoint bytes as they are.
//
// Calibration (`sparsity_calibration`): every attention row the model computes on the
// calibration prompts adds its sparsity to its layer's mean; `profile()` is the measured
// profile. sparse_kv.hpp stores and serves entries sparsified by such a profile.
//
// Costs: select_tokens O(T log T) with one allocation; the byte helpers O(layers);
// sparsity_calibration::add_row O(row).
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "hybridcache/model/cost_model.hpp"
#include "hybridcache/core/error.hpp"
#include "hybridcache/concepts/demotion.hpp"

namespace hybridcache::tiered {

/// Fraction of a row's entries below `relative_threshold` × the row maximum (CaR: 1 %).
[[nodiscard]] inline double measure_row_sparsity(std::span<const double> row, double relative_threshold = 0.01) {
  if (row.empty()) return 0.0;
  const double mx = *std::max_element(row.begin(), row.end());
  std::size_t zeros = 0;
  for (double x : row) zeros += x < relative_threshold * mx;
  return static_cast<double>(zeros) / static_cast<double>(row.size());
}

/// The same for a row of fp32 attention weights (a runtime's softmax output).
[[nodiscard]] inline double measure_row_sparsity(std::span<const float> row, double relative_threshold = 0.01) {
  if (row.empty()) return 0.0;
  const double mx = *std::max_element(row.begin(), row.end());
  std::size_t zeros = 0;
  for (float x : row) zeros += static_cast<double>(x) < relative_threshold * mx;
  return static_cast<double>(zeros) / static_cast<double>(row.size());
}

/// Per-attention-layer sparsity (fraction of tokens that may be dropped).
struct sparsity_profile {
  std::vector<double> sparsity;  ///< one value in [0, 1) per attention layer, model order

  /// CaR's profile: linear from `first` (≈ 0.60) to `last` (≈ 0.95) over `layers` layers.
  /// @throws invalid_argument for layers <= 0 or values outside [0, 1).
  [[nodiscard]] static sparsity_profile car_linear(std::int64_t layers, double first = 0.60, double last = 0.95) {
    HYBRIDCACHE_EXPECTS(layers > 0, invalid_argument, "sparsity_profile: layers must be > 0");
    HYBRIDCACHE_EXPECTS(first >= 0 && first < 1 && last >= 0 && last < 1, invalid_argument,
                        "sparsity_profile: sparsity must be in [0, 1)");
    sparsity_profile p;
    for (std::int64_t l = 0; l < layers; ++l)
      p.sparsity.push_back(layers == 1 ? first : first + (last - first) * static_cast<double>(l) / static_cast<double>(layers - 1));
    return p;
  }

  /// Profile from measured per-layer sparsities (e.g. averaged `measure_row_sparsity`).
  [[nodiscard]] static sparsity_profile from_measurements(std::vector<double> per_layer) {
    for (double s : per_layer)
      HYBRIDCACHE_EXPECTS(s >= 0 && s < 1, invalid_argument, "sparsity_profile: sparsity must be in [0, 1)");
    HYBRIDCACHE_EXPECTS(!per_layer.empty(), invalid_argument, "sparsity_profile: no layers");
    return {std::move(per_layer)};
  }

  /// Share of tokens layer `l` keeps.
  [[nodiscard]] double keep_ratio(std::size_t l) const { return 1.0 - sparsity.at(l); }
  /// Mean keep ratio over layers.
  [[nodiscard]] double mean_keep() const {
    return sparsity.empty() ? 1.0 : 1.0 - std::accumulate(sparsity.begin(), sparsity.end(), 0.0) / static_cast<double>(sparsity.size());
  }
};

/// CaR's calibration: the model runs predefined prompts once, and every attention row it
/// computes (the softmax weights of one query head over its keys) adds its sparsity to
/// its layer's mean. Rows over fewer than `min_keys` keys are skipped (a first token's row
/// of one weight says nothing). O(row) per row, no allocation after construction.
struct calibration_options {
  double relative_threshold = 0.01;  ///< CaR: below 1 % of the row maximum counts as zero
  std::int64_t min_keys = 16;        ///< shorter rows are not counted
  double max_sparsity = 0.99;        ///< `profile` caps a layer here (a profile value must be < 1)
};
class sparsity_calibration {
 public:
  /// @throws invalid_argument for layers == 0, a threshold outside [0, 1] or a cap outside [0, 1).
  explicit sparsity_calibration(std::size_t layers, calibration_options o = {}) : o_(o), sum_(layers, 0.0), rows_(layers, 0) {
    HYBRIDCACHE_EXPECTS(layers > 0, invalid_argument, "sparsity_calibration: layers must be > 0");
    HYBRIDCACHE_EXPECTS(o.relative_threshold >= 0 && o.relative_threshold <= 1 && o.max_sparsity >= 0 && o.max_sparsity < 1,
                        invalid_argument, "sparsity_calibration: threshold must be in [0, 1] and the cap in [0, 1)");
  }
  /// Counts one attention row of layer `l` (std::out_of_range for an unknown layer).
  template <class T>
  void add_row(std::size_t l, std::span<const T> row) {
    if (static_cast<std::int64_t>(row.size()) < o_.min_keys) return;
    sum_.at(l) += measure_row_sparsity(row, o_.relative_threshold);
    rows_[l] += 1;
  }
  [[nodiscard]] std::int64_t rows(std::size_t l) const { return rows_.at(l); }
  /// Mean sparsity of layer l's rows (0 before any).
  [[nodiscard]] double mean(std::size_t l) const { return rows_.at(l) > 0 ? sum_[l] / static_cast<double>(rows_[l]) : 0.0; }
  /// The measured profile, each layer capped at max_sparsity.
  /// @throws invalid_argument naming a layer that counted no row.
  [[nodiscard]] sparsity_profile profile() const {
    std::vector<double> s;
    for (std::size_t l = 0; l < sum_.size(); ++l) {
      HYBRIDCACHE_EXPECTS(rows_[l] > 0, invalid_argument, "sparsity_calibration: layer " + std::to_string(l) + " counted no row");
      s.push_back(std::min(mean(l), o_.max_sparsity));
    }
    return sparsity_profile::from_measurements(std::move(s));
  }

 private:
  calibration_options o_;
  std::vector<double> sum_;
  std::vector<std::int64_t> rows_;
};

/// Knobs of the token selection. Aggregate with defaults.
struct sparsify_options {
  std::int64_t recent_window = 32;  ///< most recent tokens, always kept
};

/// Tokens layer `l` keeps out of `tokens`: ceil(keep_ratio · tokens), at least the recent
/// window, at most all of them.
[[nodiscard]] inline std::int64_t kept_tokens(const sparsity_profile& p, std::size_t l, std::int64_t tokens,
                                              const sparsify_options& o = {}) {
  // The epsilon keeps 0.05 · 1000 at 50 (1 − 0.95 is 0.05000000000000004 in binary).
  const auto k = static_cast<std::int64_t>(std::ceil(p.keep_ratio(l) * static_cast<double>(tokens) - 1e-9));
  return std::min(tokens, std::max(k, std::min(tokens, o.recent_window)));
}

/// H2O selection: the last `recent_window` positions plus the `keep − window` positions
/// with the largest accumulated attention among the rest (ties: earlier first). Returns
/// positions ascending. keep >= size keeps everything.
[[nodiscard]] inline std::vector<std::int32_t> select_tokens(std::span<const double> accumulated, std::int64_t keep,
                                                             std::int64_t recent_window) {
  const auto n = static_cast<std::int64_t>(accumulated.size());
  keep = std::clamp<std::int64_t>(keep, 0, n);
  const std::int64_t recent = std::min(std::max<std::int64_t>(recent_window, 0), keep);
  std::vector<std::int32_t> idx(static_cast<std::size_t>(n - recent));
  std::iota(idx.begin(), idx.end(), 0);
  const std::int64_t heavy = keep - recent;
  std::partial_sort(idx.begin(), idx.begin() + heavy, idx.end(), [&](std::int32_t a, std::int32_t b) {
    return accumulated[static_cast<std::size_t>(a)] > accumulated[static_cast<std::size_t>(b)] ||
           (accumulated[static_cast<std::size_t>(a)] == accumulated[static_cast<std::size_t>(b)] && a < b);
  });
  idx.resize(static_cast<std::size_t>(heavy));
  for (std::int64_t t = n - recent; t < n; ++t) idx.push_back(static_cast<std::int32_t>(t));
  std::sort(idx.begin(), idx.end());
  return idx;
}

/// Attention-KV bytes of `tokens` tokens after sparsification: Σ over attention layers of
/// kept_tokens × KV bytes per token per layer. The profile must have one value per
/// attention layer. @throws invalid_argument on a size mismatch.
[[nodiscard]] inline std::int64_t sparsified_kv_bytes(const cost_model& m, const sparsity_profile& p, std::int64_t tokens,
                                                      const sparsify_options& o = {}) {
  HYBRIDCACHE_EXPECTS(static_cast<std::int64_t>(p.sparsity.size()) == m.attention_layers(), invalid_argument,
                      "sparsified_kv_bytes: profile needs one value per attention layer");
  std::int64_t b = 0;
  for (std::size_t l = 0; l < p.sparsity.size(); ++l) b += kept_tokens(p, l, tokens, o) * m.kv_bytes_per_token_per_layer();
  return b;
}

/// Bytes of a node (its tokens' KV plus, if it has one, its recurrent checkpoint) after
/// sparsification: only the KV shrinks; the checkpoint is never sparsified.
[[nodiscard]] inline std::int64_t sparsified_node_bytes(const cost_model& m, const sparsity_profile& p, std::int64_t tokens,
                                                        bool has_checkpoint, const sparsify_options& o = {}) {
  return sparsified_kv_bytes(m, p, tokens, o) + (has_checkpoint ? m.ssm_checkpoint_bytes() : 0);
}

/// Demote entries whole.
struct keep_size {
  [[nodiscard]] std::int64_t stored_bytes(const cache_entry& e) const noexcept { return e.bytes(); }
};
static_assert(demotion_sizer<keep_size>);

/// Sparsify KV on demotion: an entry spanning tokens (prefix_begin, prefix_end] keeps
/// `sparsified_node_bytes` of them (its checkpoint whole); never more than it has. An
/// entry already smaller (sparsified before) keeps its size.
class sparsify_on_demotion {
 public:
  /// @throws invalid_argument when the profile does not have one value per attention layer.
  sparsify_on_demotion(const cost_model& model, sparsity_profile profile, sparsify_options options = {})
      : model_(&model), profile_(std::move(profile)), options_(options) {
    HYBRIDCACHE_EXPECTS(static_cast<std::int64_t>(profile_.sparsity.size()) == model.attention_layers(), invalid_argument,
                        "sparsify_on_demotion: profile needs one value per attention layer");
  }
  [[nodiscard]] std::int64_t stored_bytes(const cache_entry& e) const {
    const std::int64_t tokens = e.info.prefix_end - e.info.prefix_begin;
    if (tokens <= 0) return e.bytes();
    return std::min(e.bytes(), sparsified_node_bytes(*model_, profile_, tokens, e.info.has_checkpoint, options_));
  }

 private:
  const cost_model* model_;  // not owned
  sparsity_profile profile_;
  sparsify_options options_;
};
static_assert(demotion_sizer<sparsify_on_demotion>);

}  // namespace hybridcache::tiered
