// hybridcache/sim/alloc_workloads.hpp
//
// The AVMP reference's allocator-benchmark workloads (uniform_short, mixed_long,
// agentic_burst, sharegpt_replay; anchor avmp.md 1.9), bundled in the library so a replay
// needs no file and no Python. The traces were generated with numpy's Generator by
// scripts/export_alloc_workloads.py and match the anchor's sha16 fingerprints; the
// bundled seeds are each workload's base seed + {0, 1, 2}, the reference's replicates.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "hybridcache/core/error.hpp"
#include "hybridcache/sim/data/alloc_traces.hpp"

namespace hybridcache::sim {

/// One request of an allocator workload (virtual ticks; prefill costs prompt_tokens ticks).
struct alloc_request {
  std::int64_t prompt_tokens = 0;
  std::int64_t gen_tokens = 0;
  std::int64_t arrival_tick = 0;
  [[nodiscard]] std::int64_t departure_tick() const noexcept { return arrival_tick + prompt_tokens + gen_tokens; }
};

/// A named, seeded request stream; request id = index.
struct alloc_workload {
  std::string name;
  std::uint64_t seed = 0;
  std::string sha16;  ///< fingerprint of the trace (anchor avmp.md 1.9)
  std::vector<alloc_request> requests;
};

/// The four workload names, in the reference's order.
[[nodiscard]] inline std::vector<std::string_view> alloc_workload_names() {
  return {"uniform_short", "mixed_long", "agentic_burst", "sharegpt_replay"};
}

/// The bundled seeds of `name` (empty for an unknown workload).
[[nodiscard]] inline std::vector<std::uint64_t> alloc_workload_seeds(std::string_view name) {
  std::vector<std::uint64_t> seeds;
  for (const auto& t : alloc_traces::all)
    if (t.workload == name) seeds.push_back(t.seed);
  return seeds;
}

/// The bundled trace of `name` and `seed`.
/// @throws invalid_argument naming the known workloads or the bundled seeds.
[[nodiscard]] inline alloc_workload bundled_alloc_workload(std::string_view name, std::uint64_t seed) {
  bool known = false;
  std::string seeds;
  for (const auto& t : alloc_traces::all) {
    if (t.workload != name) continue;
    known = true;
    seeds += (seeds.empty() ? "" : ", ") + std::to_string(t.seed);
    if (t.seed != seed) continue;
    alloc_workload w{std::string(t.workload), t.seed, std::string(t.sha16), {}};
    w.requests.reserve(t.rows.size() / 3);
    for (std::size_t i = 0; i + 2 < t.rows.size(); i += 3)
      w.requests.push_back({t.rows[i], t.rows[i + 1], t.rows[i + 2]});
    return w;
  }
  if (!known)
    throw invalid_argument("alloc workload '" + std::string(name) +
                           "' is unknown (uniform_short, mixed_long, agentic_burst, sharegpt_replay)");
  throw invalid_argument("alloc workload '" + std::string(name) + "' has no bundled seed " + std::to_string(seed) +
                         " (bundled: " + seeds + "; scripts/export_alloc_workloads.py makes more)");
}

}  // namespace hybridcache::sim
