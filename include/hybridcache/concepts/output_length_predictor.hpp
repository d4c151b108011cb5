// hybridcache/concepts/output_length_predictor.hpp
//
// `output_length_predictor`: how many tokens a request will generate, predicted from what is
// known when it is queued (its prompt length), and refined online from the requests that
// finish. CaR's deadline prefetch (papers/003 §III-B2) needs it: the GPU frees up for the
// next request after min_i (TPOT·len_i − (t − timer_i)), len_i being request i's predicted
// output length. Models: tiered/length_predictor.hpp (`running_mean_predictor`,
// `bucketed_length_predictor`); a conformance suite checks every model
// (tests/conformance/test_output_length_predictor.cpp).
//
// Contract:
//   - `predict(prompt_tokens)` is const, returns a finite value >= 0, and depends only on the
//     observations made so far (two copies fed the same observations predict the same);
//   - `observe(prompt_tokens, output_tokens)` records one finished request (both >= 0);
//   - both are O(1) and do not allocate, so a scheduler may call them per request.
#pragma once

#include <concepts>
#include <cstdint>

namespace hybridcache {

/// Predicts how many tokens a request will generate, and learns from finished requests.
template <class P>
concept output_length_predictor = std::copyable<P> &&
    requires(P& p, const P& cp, std::int64_t prompt_tokens, std::int64_t output_tokens) {
      { cp.predict(prompt_tokens) } -> std::convertible_to<double>;
      p.observe(prompt_tokens, output_tokens);
    };

}  // namespace hybridcache
