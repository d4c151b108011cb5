// hybridcache/sim/tiered_replay_real_bytes.hpp
//
// The timed multi-tier replay's real-bytes validation mode (`hcbench replay --tiers ...
// --real-bytes`): the same replay as `run_tiered_replay` (sim/tiered_replay.hpp), the same
// prefix cache and store, with a copy engine that also moves real bytes
// (sim/real_bytes_copy_engine.hpp): memory tiers as host arenas, disk and redis tiers
// through their storage backends, every loaded byte checked. The modelled time still
// decides when each copy lands, so the cache's decisions, and its hits, are those of the
// modelled run unless a real copy fails (a backend miss, a wrong byte): then that copy
// fails as an injected fault does, the entry is a miss, and `result.real` counts it.
//
// Sizes: the memory tiers' arenas are allocated for real (scale them down to fit the
// machine); storage tiers hold one value per entry copy.
// Costs: the replay's, plus O(bytes) per copy and the backends' calls.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "hybridcache/sim/real_bytes_copy_engine.hpp"
#include "hybridcache/sim/tiered_replay.hpp"
#include "hybridcache/tiered/storage_format.hpp"
#include "hybridcache/tiered/storage_tier_io.hpp"

namespace hybridcache::sim {

/// `run_tiered_replay` with real bytes: `storage` holds one `tiered::storage_tier_io` per disk
/// or redis tier of `options.tiers`, in order (`tiered::storage_io_of(backend)`);
/// `engine_options` are the engine's (tests: a read hook).
/// @throws invalid_argument as run_tiered_replay, for a storage count that does not match
///         the tiers, or for `sparsify = profile` (a compacted copy is not the entry's
///         bytes, so it cannot be checked).
template <class Admission, class Scorer, prefill_time_model Prefill = linear_prefill_time>
[[nodiscard]] tiered_replay_result run_tiered_replay_real_bytes(std::span<const sim::request> requests,
                                                                const cost_model& model,
                                                                const tiered_replay_options& options,
                                                                std::vector<tiered::storage_tier_io> storage,
                                                                Scorer scorer, const Prefill& prefill = {},
                                                                Admission admission = {},
                                                                sim::real_bytes_engine_options engine_options = {}) {
  HYBRIDCACHE_EXPECTS(options.sparsify == sparsify_kind::off, invalid_argument,
                      "tiered replay with real bytes: sparsification stores a compacted copy that cannot be checked "
                      "against the entry's bytes; run it modelled only");
  const std::size_t engines = detail::checked_engines(requests, options, prefill);
  const std::int32_t per_id = requests.empty() ? 1 : requests.front().tokens_per_id;
  const std::uint64_t model_id = tiered::model_identity(model.spec(), "hybridcache real-bytes validation");
  return detail::replay_with<sim::real_bytes_copy_engine>(
      requests, model, options, std::move(scorer), std::move(admission), prefill, per_id, engines,
      [&](std::vector<tiered::tier_config> t, std::int64_t page, sim::timed_copy_options to) {
        return std::make_unique<sim::real_bytes_copy_engine>(std::move(t), page, to, std::move(storage), model_id,
                                                             std::move(engine_options));
      });
}

}  // namespace hybridcache::sim
