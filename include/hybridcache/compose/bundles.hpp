// hybridcache/compose/bundles.hpp
//
// The common compositions of `prefix_cache`, named after the systems whose policy they
// reproduce, so that a runtime names its store (the parameter it changes most) and, rarely,
// a lock, instead of spelling five template arguments:
//
//   marconi_cache<Store, Lock>   judicious admission (Marconi: checkpoints at the branch point
//                                and after the last decoded token) + FLOP-aware eviction
//   sglang_cache<Store, Lock>    judicious admission + LRU eviction (SGLang+ in Marconi's
//                                evaluation: SGLang's radix cache extended with SSM states)
//   vllm_cache<Store, Block, Lock>  a checkpoint every `Block` tokens + LRU eviction (vLLM+:
//                                vLLM's block-granular prefix caching with a state per block;
//                                32 tokens by default, Marconi's setting)
//   marconi_adaptive_cache<Store, Lock>  judicious admission + the adaptive selector: the
//                                cache follows whichever of SGLang+'s rule, Marconi's FLOP-aware
//                                rule (several alphas) and GDSF its metadata-only shadows rank
//                                first (adaptive_scorer.hpp; build the scorer with
//                                make_marconi_adaptive_scorer(model)); what `hcbench --alpha auto` runs
//   marconi_tuned_cache<Store, Lock>  marconi_cache with Marconi's one-shot alpha tuning
//                                (alpha_tuner.hpp), as the reference does
//   gdsf_cache<Store, Lock>      judicious admission + GreedyDual-Size-Frequency over FLOPs
//                                saved per byte (gdsf_scorer.hpp)
//
// Each is an alias: the cache's API, costs and guarantees are `prefix_cache`'s. With no
// `Store` the alias uses counting_store (bytes only, for simulation).
//
//   hybridcache::compose::marconi_cache<pool_state_store<...>> cache(
//       cost_model(presets::jamba_1_5_mini()), store, flop_aware_scorer(costs, {.alpha = 1.0}));
#pragma once

#include <cstdint>

#include "hybridcache/compose/adaptive_scorer.hpp"
#include "hybridcache/compose/alpha_tuner.hpp"
#include "hybridcache/model/cost_model.hpp"
#include "hybridcache/prefix/admission.hpp"
#include "hybridcache/prefix/flop_aware_scorer.hpp"
#include "hybridcache/prefix/gdsf_scorer.hpp"
#include "hybridcache/prefix/lock_policy.hpp"
#include "hybridcache/prefix/lru_scorer.hpp"
#include "hybridcache/prefix/prefix_cache.hpp"
#include "hybridcache/stores/counting_store.hpp"

namespace hybridcache::compose {

/// Marconi: judicious admission + FLOP-aware eviction.
template <state_store Store = stores::counting_store, lock_policy Lock = prefix::no_lock>
using marconi_cache = prefix::prefix_cache<cost_model, prefix::judicious_admission, prefix::flop_aware_scorer, Store, Lock>;

/// Marconi with the adaptive selector over SGLang+'s rule, FLOP-aware alphas and GDSF.
template <state_store Store = stores::counting_store, lock_policy Lock = prefix::no_lock>
using marconi_adaptive_cache = prefix::prefix_cache<cost_model, prefix::judicious_admission, marconi_adaptive_scorer, Store, Lock>;

/// Marconi with alpha tuned once online (Marconi §4.3).
template <state_store Store = stores::counting_store, lock_policy Lock = prefix::no_lock>
using marconi_tuned_cache = alpha_tuned_cache<marconi_cache<Store, Lock>>;

/// GDSF: judicious admission + GreedyDual-Size-Frequency over FLOPs saved per byte.
template <state_store Store = stores::counting_store, lock_policy Lock = prefix::no_lock>
using gdsf_cache = prefix::prefix_cache<cost_model, prefix::judicious_admission, prefix::gdsf_scorer, Store, Lock>;

/// SGLang+: judicious admission + LRU eviction.
template <state_store Store = stores::counting_store, lock_policy Lock = prefix::no_lock>
using sglang_cache = prefix::prefix_cache<cost_model, prefix::judicious_admission, prefix::lru_scorer, Store, Lock>;

/// vLLM+: a checkpoint every `Block` tokens + LRU eviction.
template <state_store Store = stores::counting_store, std::int64_t Block = 32, lock_policy Lock = prefix::no_lock>
using vllm_cache = prefix::prefix_cache<cost_model, prefix::every_block_admission<Block>, prefix::lru_scorer, Store, Lock>;

}  // namespace hybridcache::compose
