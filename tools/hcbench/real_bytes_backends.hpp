// tools/hcbench/real_bytes_backends.hpp
//
// The storage backends of `hcbench replay --tiers ... --real-bytes`: one per disk or redis
// tier, in tier order, for sim/tiered_replay_real_bytes.hpp. A disk tier's values go under
// DIR/hcbench-real-PID (removed when the object dies, or by a constructor that fails after
// making some; DIR itself is the caller's: tier_directories.hpp); a redis tier's under the key prefix
// `hcbench-real-PID:` (its values stay until the server evicts them or is flushed). Each
// backend may hold twice its tier's capacity, so that values of copies the store has
// dropped (the engine is not told of drops) do not push out live ones.
#pragma once

#include <memory>
#include <vector>

#include <hybridcache/tiered/storage_tier_io.hpp>
#include <hybridcache/tiered/tier.hpp>

namespace hcbench {

class real_bytes_backends {
 public:
  /// @throws hybridcache::error when a backend cannot be made (an unusable directory), a
  ///         redis tier is given to an hcbench built without hiredis, or the memory tiers'
  ///         arenas would take more than half of this machine's memory.
  explicit real_bytes_backends(const std::vector<hybridcache::tiered::tier_config>& tiers);
  ~real_bytes_backends();
  real_bytes_backends(const real_bytes_backends&) = delete;
  real_bytes_backends& operator=(const real_bytes_backends&) = delete;

  /// The calls of every backend, in tier order (valid while this object lives).
  [[nodiscard]] std::vector<hybridcache::tiered::storage_tier_io> io() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace hcbench
