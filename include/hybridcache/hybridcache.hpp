// hybridcache/hybridcache.hpp — umbrella header for the host library (no CUDA).
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
