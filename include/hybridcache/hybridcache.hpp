// hybridcache/hybridcache.hpp — umbrella header for the host library (no CUDA).
//
// Includes the cost model, the prefix cache with its policies and stores, and the memory
// pools. The tiered cache (`hybridcache/tiered/`) is included on its own; device code lives
// under `*/cuda/` and needs nvcc. Trace readers and replay engines are not part of the
// runtime: they are the simulation harness (target `hybridcache::sim`, headers under
// `sim/include/hybridcache/sim/`).
#pragma once

#include "hybridcache/core/byte_size.hpp"
#include "hybridcache/core/checked_math.hpp"
#include "hybridcache/core/config.hpp"
#include "hybridcache/model/cost_model.hpp"
#include "hybridcache/core/error.hpp"
#include "hybridcache/core/expected.hpp"
#include "hybridcache/core/handle.hpp"
#include "hybridcache/core/logical_clock.hpp"
#include "hybridcache/model/model_spec.hpp"
#include "hybridcache/model/prefill_time.hpp"
#include "hybridcache/model/presets.hpp"

#include "hybridcache/prefix/admission.hpp"
#include "hybridcache/stores/counting_store.hpp"
#include "hybridcache/prefix/flop_aware_scorer.hpp"
#include "hybridcache/prefix/lock_policy.hpp"
#include "hybridcache/prefix/lru_scorer.hpp"
#include "hybridcache/compose/bundles.hpp"
#include "hybridcache/prefix/prefix_cache.hpp"

#include "hybridcache/memory/asymmetric_pool.hpp"
#include "hybridcache/memory/fixed_dual_pool.hpp"
#include "hybridcache/memory/padded_unified_pool.hpp"
#include "hybridcache/stores/pool_state_store.hpp"
