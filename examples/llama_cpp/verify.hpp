// examples/llama_cpp/verify.hpp
//
// What `--verify` checks: a request served with the cache against the same prompt computed
// from token 0 without it (run_uncached), output token by output token, logit row by logit row.
//
// Why not "the tokens are identical": llama.cpp's CPU kernels are not batch-invariant. A
// token's logits depend on how many tokens shared its micro-batch: flash attention takes a
// tiled f32 GEMM path for 64 or more queries, one row at a time with Q rounded to f16 below
// that, and splits the cells across threads for a single query over 512 or more cells;
// matrix products go through tinyBLAS for two or more columns and ggml's dot products for
// one. A cached run starts at the hit and cuts its prefill at checkpoint sites, so its
// micro-batches differ from the uncached run's, and so do its logits, in the last bits (the
// bytes a hit puts back are exactly the ones computed; the difference comes from the shapes
// the later tokens are computed in). llama-server's own prompt cache has the same property.
// Greedy decoding then picks a different token only where two logits are that close.
//
// The rule, per output step i while the tokens agree: the largest logit difference d_i,
// relative to the largest reference logit, is at most `max_relative_deviation`. At the first
// step where the tokens differ the same bound must hold (then the flip is a near tie: the
// reference's margin between the two tokens is at most 2 d_i, since each moved by at most
// d_i), and the comparison stops there (the continuations see different inputs). A state from
// other tokens moves the logits far more: one prompt token changed in the reference moved them
// by up to 0.11-0.20 (token 1) and 0.026-0.033 (token 100) on the test models
// (docs/llama_cpp.md, "What is exact, and why").
//
// Cost: O(steps * n_vocab) per request. No dependency on llama.h (tests include it alone).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>

namespace hybridcache_llama {

/// How far a cached run's logits may be from the uncached run's (aggregate).
struct verify_tolerance {
  /// max |cached - reference| over a row, over max |reference| of that row.
  double max_relative_deviation = 1e-2;
};

/// One request's comparison.
struct verify_result {
  bool ok = true;                ///< every compared step within the tolerance
  bool tokens_identical = true;  ///< every output token equal
  bool logits_identical = true;  ///< every compared logit bit-equal
  std::int32_t flip_at = -1;     ///< the first step whose tokens differ (-1: none); a near tie when ok
  double max_relative_deviation = 0;  ///< over the compared steps
  std::string why;               ///< when !ok: the step and its deviation
};

/// Compares a run (`tokens`, one logit row of `n_vocab` floats per token in `logits`) with the
/// reference's. A reference or run whose rows do not match its tokens is not ok (`why` says).
inline verify_result compare_with_reference(std::span<const std::int32_t> tokens, std::span<const float> logits,
                                            std::span<const std::int32_t> ref_tokens, std::span<const float> ref_logits,
                                            std::int32_t n_vocab, const verify_tolerance& tol = {}) {
  verify_result r;
  const auto rows = static_cast<std::size_t>(n_vocab);
  if (n_vocab <= 0 || logits.size() != tokens.size() * rows || ref_logits.size() != ref_tokens.size() * rows) {
    r.ok = false;
    r.why = "logit rows do not match the output tokens";
    return r;
  }
  const std::size_t steps = std::min(tokens.size(), ref_tokens.size());
  for (std::size_t i = 0; i < steps; ++i) {
    const auto a = logits.subspan(i * rows, rows), b = ref_logits.subspan(i * rows, rows);
    double diff = 0, scale = 0;
    for (std::size_t j = 0; j < rows; ++j) {
      diff = std::max(diff, std::abs(static_cast<double>(a[j]) - static_cast<double>(b[j])));
      scale = std::max(scale, std::abs(static_cast<double>(b[j])));
      r.logits_identical = r.logits_identical && a[j] == b[j];
    }
    const double rel = scale > 0 ? diff / scale : (diff > 0 ? INFINITY : 0.0);
    r.max_relative_deviation = std::max(r.max_relative_deviation, rel);
    const bool flip = tokens[i] != ref_tokens[i];
    if (rel > tol.max_relative_deviation || !std::isfinite(rel)) {
      r.ok = false;
      r.why = "output " + std::to_string(i) + ": logits deviate by " + std::to_string(rel) + " of the largest (bound " +
              std::to_string(tol.max_relative_deviation) + ")" + (flip ? ", and the token differs" : "");
    }
    if (flip) {
      r.tokens_identical = false;
      r.flip_at = static_cast<std::int32_t>(i);
      return r;
    }
    if (!r.ok) return r;
  }
  if (tokens.size() != ref_tokens.size()) {  // equal tokens, yet one run ended earlier
    r.tokens_identical = false;
    r.ok = false;
    r.why = "the runs generated " + std::to_string(tokens.size()) + " and " + std::to_string(ref_tokens.size()) + " tokens";
  }
  return r;
}

}  // namespace hybridcache_llama
