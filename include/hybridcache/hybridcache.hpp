// hybridcache/hybridcache.hpp — umbrella header for the host library (no CUDA).
//
// Includes the cost model, the prefix cache with its policies and stores, and the memory
// pools. Trace readers and replay engines (`hybridcache/sim/`) and the tiered cache
// (`hybridcache/tiered/`) are included on their own; device code lives under
// `hybridcache/cuda/` and needs nvcc.
#pragma once

#include "hybridcache/core/checked_math.hpp"
#include "hybridcache/core/config.hpp"
#include "hybridcache/core/cost_model.hpp"
#include "hybridcache/core/error.hpp"
#include "hybridcache/core/expected.hpp"
#include "hybridcache/core/handle.hpp"
#include "hybridcache/core/logical_clock.hpp"
#include "hybridcache/core/model_spec.hpp"
#include "hybridcache/core/prefill_time.hpp"
#include "hybridcache/core/presets.hpp"

#include "hybridcache/prefix/admission.hpp"
#include "hybridcache/prefix/counting_store.hpp"
#include "hybridcache/prefix/flop_aware_scorer.hpp"
#include "hybridcache/prefix/lock_policy.hpp"
#include "hybridcache/prefix/lru_scorer.hpp"
#include "hybridcache/prefix/prefix_cache.hpp"
#include "hybridcache/prefix/reference_scorer.hpp"

#include "hybridcache/memory/asymmetric_pool.hpp"
#include "hybridcache/memory/fixed_dual_pool.hpp"
#include "hybridcache/memory/padded_unified_pool.hpp"
#include "hybridcache/memory/pool_state_store.hpp"
