// python/src/caches.hpp: what `PrefixCache` runs, behind one interface. The policy (the
// admission and the scorer, as hcbench's --policy names them) and the store (a pool holding
// real bytes, or a byte-counting store) are template arguments of the library's
// `prefix_cache`; Python picks them at run time, so each combination is instantiated once
// (cache_impl.hpp; caches_pool.cpp and caches_bytes.cpp, one translation unit per store) and
// reached through `cache_base`'s virtual calls (one indirect call per Python call).
//
// Nothing here touches Python objects: the bindings (runtime.cpp) turn the plain results
// into dicts and arrays. Errors are thrown: a library refusal as library_error (errors.hpp),
// a bad option as hybridcache::invalid_argument.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <hybridcache/model/cost_model.hpp>
#include <hybridcache/prefix/lifecycle.hpp>

namespace hybridcache::python {

/// The policies PrefixCache offers: hcbench's --policy names (docs/python.md).
inline const std::vector<std::string>& policy_names() {
  static const std::vector<std::string> names{"sglang+", "marconi", "gdsf", "lru", "vllm+"};
  return names;
}

/// PrefixCache's constructor arguments, checked (`check_options`) before anything is built.
struct cache_options {
  std::int64_t capacity_bytes = 0;
  std::string policy = "sglang+";
  std::optional<double> alpha;  ///< marconi only: the FLOP weight; none: the adaptive selector
  std::string store = "pool";   ///< "pool" (real bytes) or "bytes" (counting only)
  // pool only:
  std::int64_t tokens_per_page = 16;
  std::int64_t granularity_bytes = 0;
  double ssm_fraction = 0.5;
  bool compaction = false;
  std::int64_t host_tier_bytes = 0;  ///< 0: no host tier; else half KV pages, half checkpoint blocks
  /// A disk tier below the host tier (a directory this cache owns; empty: none): the host
  /// tier's victims move down into it and a begin brings them back. Needs a host tier.
  std::string disk_tier_dir;
  std::int64_t disk_tier_bytes = 0;
  /// A Redis tier below the host tier (and below the disk tier when both are given):
  /// "HOST:PORT" of a redis-server (empty: none). Values are keyed by a random per-cache salt,
  /// so caches sharing one server do not see each other's entries.
  std::string redis_tier;
  std::int64_t redis_tier_bytes = 0;
};


/// What `state(ticket)` reports.
struct request_view {
  std::int64_t prompt_tokens = 0, reusable_tokens = 0, prefill_start = 0, kv_from = 0, reserved_tokens = 0, loaded_at = 0;
  std::optional<std::uint64_t> salt;
  std::vector<std::int64_t> sites, slots;
};

/// A prefix cache with its request lifecycle, whatever its policy and store.
class cache_base {
 public:
  virtual ~cache_base() = default;

  [[nodiscard]] virtual const cost_model& model() const = 0;
  [[nodiscard]] virtual const cache_options& options() const = 0;
  /// Whether the store holds real bytes (the pool): block tables, checkpoints, kv_pages.
  [[nodiscard]] virtual bool has_memory() const = 0;

  virtual prefix::request_ticket begin(const std::vector<token_id>& prompt, const prefix::begin_options& o) = 0;
  [[nodiscard]] virtual request_view state(prefix::request_ticket t) = 0;
  virtual void grow(prefix::request_ticket t, std::int64_t tokens) = 0;
  virtual prefix::finish_result finish(prefix::request_ticket t, const std::vector<token_id>& sequence,
                                       const std::vector<std::int64_t>& captured) = 0;
  virtual void abort(prefix::request_ticket t) = 0;
  virtual void clear() = 0;
  /// `prefix_cache::peek`: what a begin of `prompt` would reuse, changing nothing.
  [[nodiscard]] virtual std::int64_t peek(const std::vector<token_id>& prompt, const cache_salt& salt) = 0;

  // The pool's memory (has_memory() only; the bindings check first).
  [[nodiscard]] virtual std::vector<std::int64_t> block_table(prefix::request_ticket t, std::int64_t layer) = 0;
  /// One pointer per recurrent layer's block; `found` false on a miss.
  [[nodiscard]] virtual std::vector<std::byte*> resume_checkpoint(prefix::request_ticket t, bool& found) = 0;
  [[nodiscard]] virtual std::vector<std::byte*> checkpoint_slot(prefix::request_ticket t, std::int64_t index) = 0;
  [[nodiscard]] virtual std::byte* arena_base() = 0;
  [[nodiscard]] virtual std::uint64_t arena_bytes() = 0;
  /// The host tier's arena (empty without one): its entries' KV pages and SSM blocks.
  [[nodiscard]] virtual std::span<std::byte> host_memory() = 0;
  [[nodiscard]] virtual std::int64_t page_bytes() const = 0;
  [[nodiscard]] virtual std::int64_t block_bytes() const = 0;

  [[nodiscard]] virtual std::uint64_t in_flight() const = 0;
  [[nodiscard]] virtual std::int64_t tokens_cached() const = 0;
  [[nodiscard]] virtual std::int64_t checkpoints_cached() const = 0;
  [[nodiscard]] virtual std::int64_t used_bytes() const = 0;
  /// The cache's counters, then the store's (pool occupancy and host tier; zeros for bytes).
  [[nodiscard]] virtual std::vector<std::pair<std::string, std::int64_t>> counters() const = 0;
  /// The FLOP weight the scorer runs with (none: a rule without one, LRU or GDSF).
  [[nodiscard]] virtual std::optional<double> alpha() const = 0;
  /// The adaptive selector's followed rule ("sglang+", "marconi:0.5", "gdsf"); empty otherwise.
  [[nodiscard]] virtual std::string followed() const = 0;

  /// bench/python_costs.py: seconds of a begin + finish loop run in C++ (see runtime.cpp).
  [[nodiscard]] virtual double bench_begin_finish(const std::vector<std::vector<token_id>>& prompts, std::int64_t rounds) = 0;
};

std::unique_ptr<cache_base> make_pool_cache(const cost_model& model, const cache_options& o);
std::unique_ptr<cache_base> make_bytes_cache(const cost_model& model, const cache_options& o);

}  // namespace hybridcache::python
