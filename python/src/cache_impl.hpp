// python/src/cache_impl.hpp: `cache_base` for one policy and one store (caches.hpp). Included
// by caches_pool.cpp and caches_bytes.cpp only, each instantiating its store's policies.
//
// The policies are hcbench's (tools/hcbench/replay_run.cpp), with the library's defaults:
//   sglang+  judicious admission + LRU (ties by node id: the library's default, not the
//            reference's heapq order that hcbench uses unless --lru-ties node-id)
//   marconi  judicious admission + FLOP-aware eviction with `alpha` (branch points protected,
//            the bounded walk: hcbench's defaults); without alpha the adaptive selector
//            (compose::make_marconi_adaptive_scorer, what hcbench --policy marconi runs)
//   gdsf     judicious admission + GDSF over FLOPs saved per byte
//   lru      last-token admission (only the state after the last token) + LRU
//   vllm+    a checkpoint every 32 tokens + LRU
#pragma once

#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <hybridcache/compose/adaptive_scorer.hpp>
#include <hybridcache/memory/asymmetric_pool.hpp>
#include <hybridcache/prefix/admission.hpp>
#include <hybridcache/prefix/flop_aware_scorer.hpp>
#include <hybridcache/prefix/gdsf_scorer.hpp>
#include <hybridcache/prefix/lifecycle.hpp>
#include <hybridcache/prefix/lock_policy.hpp>
#include <hybridcache/prefix/lru_scorer.hpp>
#include <hybridcache/prefix/prefix_cache.hpp>
#include <hybridcache/stores/counting_store.hpp>
#include <hybridcache/stores/pool_state_store.hpp>
#include <hybridcache/tiered/disk_backend.hpp>
#if HCBENCH_HAS_REDIS
#include <hybridcache/tiered/redis/redis_backend.hpp>
#include <hybridcache/tiered/redis/redis_probe.hpp>
#endif
#include <hybridcache/tiered/storage_tier_io.hpp>
#include <hybridcache/tiered/tier.hpp>

#include "caches.hpp"
#include "errors.hpp"

// hcbench's name of a selector candidate ("sglang+", "marconi:0.5", "gdsf"): the module links
// hcbench_core, so PrefixCache reports the followed rule as `hcbench replay --json` does.
namespace hcbench {
[[nodiscard]] std::string candidate_name(const hybridcache::compose::candidate_rule& c);
}

namespace hybridcache::python {

using pool_t = memory::host_asymmetric_pool<memory::threshold_rebalancer>;
using pool_store_t = stores::pool_state_store<pool_t>;
using bytes_store_t = stores::counting_store;

/// The pool behind a pool store, and the disk tier below its host tier (none: nullptr): built
/// before the cache, destroyed after it.
struct pool_holder {
  std::unique_ptr<pool_t> pool;
  std::unique_ptr<tiered::disk_backend<>> disk;
#if HCBENCH_HAS_REDIS
  std::unique_ptr<tiered::redis_backend<>> redis;
#endif
};

inline std::unique_ptr<tiered::disk_backend<>> open_disk_tier(const cache_options& c) {
  if (c.disk_tier_dir.empty()) return nullptr;
  return std::make_unique<tiered::disk_backend<>>(
      tiered::disk_backend_config{.directory = c.disk_tier_dir, .capacity_bytes = c.disk_tier_bytes});
}


inline memory::asymmetric_pool_config pool_config(const cost_model& model, const cache_options& c) {
  memory::asymmetric_pool_config p;
  p.capacity_bytes = c.capacity_bytes;
  p.kv_page_bytes = memory::kv_page_bytes(model, c.tokens_per_page);
  p.ssm_block_bytes = memory::checkpoint_block_bytes(model);
  if (c.granularity_bytes > 0) p.granularity_bytes = c.granularity_bytes;
  p.ssm_fraction = c.ssm_fraction;
  p.compaction = c.compaction;
  return p;
}

/// The pool and its storage tiers, opened in that order (a failure closes what was opened).
inline pool_holder open_pool(const cost_model& model, const cache_options& c) {
  pool_holder h;
  h.pool = std::make_unique<pool_t>(pool_config(model, c));
  h.disk = open_disk_tier(c);
  if (!c.redis_tier.empty()) {
#if HCBENCH_HAS_REDIS
    const tiered::redis_host_port ep = tiered::parse_redis_endpoint(c.redis_tier, "redis_tier");
    tiered::redis_backend_config r{.key_prefix = "hcpy:", .capacity_bytes = c.redis_tier_bytes};
    r.server.endpoints.push_back({ep.host, ep.port});
    // A server that cannot be reached is refused here, naming the endpoint (the backend
    // itself connects lazily and would only count every write as failed).
    (void)tiered::probe_redis(c.redis_tier, {.pings = 1, .rounds = 1, .value_bytes = 1, .timeout = std::chrono::milliseconds(1000)});
    h.redis = std::make_unique<tiered::redis_backend<>>(std::move(r));
#else
    throw hybridcache::invalid_argument("redis_tier: this build has no Redis tier (hiredis, Debian libhiredis-dev, was not found)");
#endif
  }
  return h;
}

/// The host tier's slots: half of `host_tier_bytes` in KV pages, half in checkpoint blocks
/// (the tiny runtime's split). A size that makes no tier is refused, never taken as "none".
inline stores::host_tier_config host_tier(const cost_model& model, const cache_options& c) {
  if (c.host_tier_bytes == 0) return {};
  const std::int64_t page = memory::kv_page_bytes(model, c.tokens_per_page), block = memory::checkpoint_block_bytes(model);
  const stores::host_tier_config h{.kv_pages = c.host_tier_bytes / 2 / page, .checkpoint_blocks = c.host_tier_bytes / 2 / block};
  if (h.kv_pages == 0 || h.checkpoint_blocks < model.recurrent_layers())
    throw hybridcache::invalid_argument("host_tier_bytes " + std::to_string(c.host_tier_bytes) +
                                        " holds no KV page or no checkpoint: half of it must hold a " + std::to_string(page) +
                                        "-byte page and half " + std::to_string(model.recurrent_layers()) + " blocks of " +
                                        std::to_string(block) + " bytes");
  return h;
}

/// The scorer of `o.policy` (the caller picks the matching Scorer type).
template <class Scorer>
Scorer make_scorer(const cost_model& model, const cache_options& o) {
  if constexpr (std::is_same_v<Scorer, prefix::flop_aware_scorer>) {
    return prefix::flop_aware_scorer(model, {.alpha = *o.alpha,
                                             .candidates = prefix::flop_candidates::protect_branches,
                                             .index = prefix::flop_index::bounded_walk});
  } else if constexpr (std::is_same_v<Scorer, compose::marconi_adaptive_scorer>) {
    return compose::make_marconi_adaptive_scorer(model);
  } else if constexpr (std::is_same_v<Scorer, prefix::gdsf_scorer>) {
    return prefix::gdsf_scorer(model);
  } else {
    static_assert(std::is_same_v<Scorer, prefix::lru_scorer>);
    return prefix::lru_scorer{};
  }
}

template <class Admission, class Scorer, class Store>
class cache_impl final : private pool_holder, public cache_base {
  static constexpr bool pooled = std::is_same_v<Store, pool_store_t>;
  // mutex_lock: Python threads may share one cache (the calls hold the GIL, but a future
  // GIL-free build or a C++ caller on another thread must not race the bookkeeping).
  using cache_t = prefix::prefix_cache<cost_model, Admission, Scorer, Store, prefix::mutex_lock>;
  using lifecycle_t = prefix::request_lifecycle<cache_t>;

 public:
  cache_impl(const cost_model& model, const cache_options& o)
      : pool_holder{pooled ? open_pool(model, o) : pool_holder{}},
        model_(model),
        options_(o),
        cache_(model_, make_store(model_, o), make_scorer<Scorer>(model_, o), Admission{}, prefix::prefix_cache_config{}),
        requests_(cache_) {
    if constexpr (pooled) {
      page_bytes_ = pool->stats(pool_kind::kv).unit_bytes;
      block_bytes_ = pool->stats(pool_kind::ssm).unit_bytes;
      // Block tables are page numbers in `kv_pages`, the arena cut into pages: that needs
      // every chunk to hold whole pages.
      if (pool->arena().chunk_bytes() % static_cast<std::uint64_t>(page_bytes_) != 0)
        throw hybridcache::invalid_argument("PrefixCache: granularity_bytes " + std::to_string(pool->arena().chunk_bytes()) +
                                            " is not a multiple of the KV page (" + std::to_string(page_bytes_) +
                                            " B): block tables index the arena in pages");
    }
  }

  const cost_model& model() const override { return model_; }
  const cache_options& options() const override { return options_; }
  bool has_memory() const override { return pooled; }

  prefix::request_ticket begin(const std::vector<token_id>& prompt, const prefix::begin_options& o) override {
    return check(requests_.begin(prompt, o));
  }

  request_view state(prefix::request_ticket t) override {
    const auto& s = *check(requests_.state(t));
    request_view v;
    v.prompt_tokens = s.prompt_tokens;
    v.reusable_tokens = s.match.reusable_tokens;
    v.prefill_start = s.plan.prefill_start;
    v.kv_from = s.kv_from;
    v.reserved_tokens = s.reserved_tokens;
    v.loaded_at = s.loaded_at;
    v.salt = s.match.salt;
    for (const auto& site : s.plan.sites) v.sites.push_back(site.position);
    for (const auto& slot : s.checkpoints) v.slots.push_back(slot.position);
    return v;
  }

  void grow(prefix::request_ticket t, std::int64_t tokens) override { check(requests_.grow(t, tokens)); }
  prefix::finish_result finish(prefix::request_ticket t, const std::vector<token_id>& sequence,
                               const std::vector<std::int64_t>& captured) override {
    return check(requests_.finish(t, sequence, captured));
  }
  void abort(prefix::request_ticket t) override { check(requests_.abort(t)); }
  void clear() override { requests_.clear(); }
  std::int64_t peek(const std::vector<token_id>& prompt, const cache_salt& salt) override {
    return cache_.peek(prompt, salt).reusable_tokens;
  }

  std::vector<std::int64_t> block_table(prefix::request_ticket t, std::int64_t layer) override {
    std::vector<std::int64_t> out;
    if constexpr (pooled) {
      std::vector<packed_handle> table;
      check(requests_.block_table(t, layer, table));
      out.reserve(table.size());
      for (const packed_handle h : table) {
        const std::byte* p = check(pool->resolve(h));
        out.push_back(static_cast<std::int64_t>((p - arena_base()) / page_bytes_));
      }
    }
    return out;
  }
  std::vector<std::byte*> resume_checkpoint(prefix::request_ticket t, bool& found) override {
    found = false;
    if constexpr (pooled) {
      const auto* h = check(requests_.resume_checkpoint(t));
      if (h == nullptr) return {};
      found = true;
      return blocks(*h);
    }
    return {};
  }
  std::vector<std::byte*> checkpoint_slot(prefix::request_ticket t, std::int64_t i) override {
    if constexpr (pooled) {
      const auto& s = *check(requests_.state(t));
      if (i < 0 || i >= static_cast<std::int64_t>(s.checkpoints.size()))
        throw hybridcache::invalid_argument("checkpoint_slot: index must lie in [0, " + std::to_string(s.checkpoints.size()) +
                                            "), got " + std::to_string(i));
      return blocks(s.checkpoints[static_cast<std::size_t>(i)].handle);
    }
    return {};
  }
  std::byte* arena_base() override {
    if constexpr (pooled) return pool->arena().chunk_pointer(0);
    return nullptr;
  }
  std::uint64_t arena_bytes() override {
    if constexpr (pooled) return pool->arena().reserved_bytes();
    return 0;
  }
  std::span<std::byte> host_memory() override {
    if constexpr (pooled) return cache_.store().host_memory();
    return {};
  }
  std::int64_t page_bytes() const override { return page_bytes_; }
  std::int64_t block_bytes() const override { return block_bytes_; }

  std::uint64_t in_flight() const override { return requests_.in_flight(); }
  std::int64_t tokens_cached() const override { return cache_.tokens_cached(); }
  std::int64_t checkpoints_cached() const override { return cache_.checkpoints_cached(); }
  std::int64_t used_bytes() const override { return cache_.store().used_bytes(); }

  std::vector<std::pair<std::string, std::int64_t>> counters() const override {
    const auto& k = cache_.counters();
    std::vector<std::pair<std::string, std::int64_t>> d{
        {"matches", k.matches},
        {"hits", k.hits},
        {"tokens_matched", k.tokens_matched},
        {"tokens_skipped", k.tokens_skipped},
        {"commits", k.commits},
        {"checkpoints_admitted", k.checkpoints_admitted},
        {"checkpoints_reused", k.checkpoints_reused},
        {"checkpoints_evicted", k.checkpoints_evicted},
        {"kv_bytes_admitted", k.kv_bytes_admitted},
        {"evictions", k.evictions},
        {"bytes_evicted", k.bytes_evicted},
    };
    if constexpr (pooled) {
      d.emplace_back("pool_rebalances", pool->counters().rebalances);
      d.emplace_back("kv_pages_used", pool->stats(pool_kind::kv).used_units);
      d.emplace_back("blocks_used", pool->stats(pool_kind::ssm).used_units);
      const auto& h = cache_.store().host_counters();
      d.emplace_back("host_demotions", h.demotions);
      d.emplace_back("host_demotions_dropped", h.demotions_dropped);
      d.emplace_back("host_evictions", h.host_evictions);
      d.emplace_back("host_loads", h.loads);
      d.emplace_back("host_tokens_loaded", h.tokens_loaded);
      d.emplace_back("host_corrupt_dropped", h.corrupt_dropped);
      d.emplace_back("host_entries", cache_.store().host_entries());
      d.emplace_back("host_moved_down", h.moved_down);
      d.emplace_back("host_brought_up", h.brought_up);
      d.emplace_back("host_storage_dropped", h.storage_dropped);
    }
    return d;
  }

  std::optional<double> alpha() const override {
    if constexpr (std::is_same_v<Scorer, prefix::flop_aware_scorer>) {
      return cache_.alpha();
    } else if constexpr (std::is_same_v<Scorer, compose::marconi_adaptive_scorer>) {
      const auto& sel = cache_.scorer();
      if (sel.config().candidates[sel.followed()].rule != 1) return std::nullopt;  // sglang+ or gdsf followed
      return cache_.alpha();
    }
    return std::nullopt;
  }
  std::string followed() const override {
    if constexpr (std::is_same_v<Scorer, compose::marconi_adaptive_scorer>) {
      const auto& sel = cache_.scorer();
      return hcbench::candidate_name(sel.config().candidates[sel.followed()]);
    }
    return {};
  }

  // Round r begins each prompt with one output token reserved and finishes it as prompt + [r]
  // with the end state captured (a new sequence every round: a whole-prompt hit could
  // capture nothing). The same loop as bench/python_costs.py's Python caller.
  double bench_begin_finish(const std::vector<std::vector<token_id>>& prompts, std::int64_t rounds) override {
    std::vector<std::int64_t> captured(1);
    std::vector<token_id> sequence;
    const auto t0 = std::chrono::steady_clock::now();
    for (std::int64_t r = 0; r < rounds; ++r)
      for (const auto& p : prompts) {
        const prefix::request_ticket t = check(requests_.begin(p, {.output_tokens = 1}));
        sequence.assign(p.begin(), p.end());
        sequence.push_back(static_cast<token_id>(r));
        captured[0] = static_cast<std::int64_t>(sequence.size());
        (void)check(requests_.finish(t, sequence, captured));
      }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

 private:
  Store make_store(const cost_model& model, const cache_options& o) {
    if constexpr (pooled) {
      stores::host_tier_config h = host_tier(model, o);
      if (disk) {  // the host tier's victims move down to disk
        h.storage_tiers.push_back({.kind = tiered::tier_kind::disk, .capacity_bytes = o.disk_tier_bytes, .location = o.disk_tier_dir});
        h.storage_io.push_back(tiered::storage_io_of(*disk));
      }
#if HCBENCH_HAS_REDIS
      if (redis) {  // below the disk tier when both are there: the slower tier last
        h.storage_tiers.push_back({.kind = tiered::tier_kind::redis, .capacity_bytes = o.redis_tier_bytes, .location = o.redis_tier});
        h.storage_io.push_back(tiered::storage_io_of(*redis));
      }
#endif
      return Store(*pool, model, {.tokens_per_page = o.tokens_per_page, .host_tier = std::move(h)});
    } else {
      // hcbench's replay store (sim::replay_store with tokens_per_id 1, strict capacity).
      return Store(o.capacity_bytes, model.kv_bytes_per_token(), model.ssm_checkpoint_bytes());
    }
  }

  template <class Handle>
  std::vector<std::byte*> blocks(const Handle& h) {
    std::vector<std::byte*> out;
    for (const packed_handle b : h.blocks) out.push_back(check(pool->resolve(b)));
    return out;
  }

  cost_model model_;
  cache_options options_;
  cache_t cache_;
  lifecycle_t requests_;
  std::int64_t page_bytes_ = 0, block_bytes_ = 0;
};

/// The cache of `o.policy` over `Store`.
template <class Store>
std::unique_ptr<cache_base> make_cache(const cost_model& model, const cache_options& o) {
  using namespace prefix;
  if (o.policy == "sglang+") return std::make_unique<cache_impl<judicious_admission, lru_scorer, Store>>(model, o);
  if (o.policy == "marconi") {
    if (o.alpha) return std::make_unique<cache_impl<judicious_admission, flop_aware_scorer, Store>>(model, o);
    return std::make_unique<cache_impl<judicious_admission, compose::marconi_adaptive_scorer, Store>>(model, o);
  }
  if (o.policy == "gdsf") return std::make_unique<cache_impl<judicious_admission, gdsf_scorer, Store>>(model, o);
  if (o.policy == "lru") return std::make_unique<cache_impl<last_token_admission, lru_scorer, Store>>(model, o);
  if (o.policy == "vllm+") return std::make_unique<cache_impl<every_block_admission<32>, lru_scorer, Store>>(model, o);
  throw hybridcache::invalid_argument("policy '" + o.policy + "': expected sglang+, marconi, gdsf, lru or vllm+");
}

}  // namespace hybridcache::python
