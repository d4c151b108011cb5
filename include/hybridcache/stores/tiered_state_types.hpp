// hybridcache/stores/tiered_state_types.hpp
//
// The plain types a runtime exchanges with `tiered_state_store` (tiered_state_store.hpp):
// its configuration (`tiered_state_store_config`, `write_policy`), what `lookup` found
// below HBM (`tiered_hit`), what `load` staged (`staged_entry`) and its counters.
// Aggregates; kept apart so that code that only configures a store or reads its counters
// does not compile the store.
#pragma once

#include <algorithm>
#include <array>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "hybridcache/concepts/ids.hpp"
#include "hybridcache/concepts/tier_entry.hpp"
#include "hybridcache/core/byte_count.hpp"
#include "hybridcache/core/enum_names.hpp"
#include "hybridcache/tiered/offload_engine.hpp"
#include "hybridcache/tiered/tier.hpp"

namespace hybridcache::stores {

/// When an HBM entry gets a copy in the tier below (SGLang HiCache's three policies).
enum class write_policy : std::uint8_t {
  write_back,               ///< only when the prefix cache evicts it (the copy is on the eviction path)
  write_through,            ///< as soon as its request finishes: eviction then drops a clean copy
  write_through_selective,  ///< once it has been hit `write_through_hits` times (back up hot data only)
};

[[nodiscard]] constexpr std::string_view to_string(write_policy w) noexcept {
  constexpr std::array<std::string_view, 3> names{"write_back", "write_through", "write_through_selective"};
  static_assert(names_every_enumerator(names, write_policy::write_through_selective));
  return enum_name(w, names);
}

/// Configuration of a `tiered_state_store`. Aggregate: use designated initializers; the
/// layout comes from the cost model (kv_bytes_per_token, attention and recurrent layers).
struct tiered_state_store_config {
  byte_count capacity_bytes = 0;        ///< the prefix cache's byte budget (HBM tier)
  byte_count host_capacity_bytes = 0;   ///< one host tier of this size (when `lower_tiers` is empty)
  byte_count kv_bytes_per_token = 0;    ///< cost_model::kv_bytes_per_token()
  byte_count checkpoint_bytes = 0;      ///< cost_model::ssm_checkpoint_bytes()
  double link_gbps = 50.0;              ///< that host tier's link to HBM
  /// HBM room for entries `load` brings back before prefill, beyond the cache's budget
  /// (`capacity_bytes`). 0: `load` is unavailable (the runtime loads on its own).
  byte_count staging_bytes = 0;
  /// Tiers below HBM, fastest first (host, CXL, ...), each with its size and link. Empty:
  /// one host tier of `host_capacity_bytes` at `link_gbps`. At most `max_hit_tiers` - 1 (7).
  std::vector<tiered::tier_config> lower_tiers{};
  /// Layer segments of an entry (layer-major layout): KV entries have one segment per
  /// attention layer, checkpoints one per recurrent layer; each must divide its byte size.
  std::int32_t attention_layers = 1;
  std::int32_t recurrent_layers = 1;
  write_policy write = write_policy::write_back;
  std::int32_t write_through_hits = 2;  ///< write_through_selective: hits before the copy
  /// `offload()`: at or above `high` of `capacity_bytes` in use by the cache, copy the coldest
  /// dirty entries down (clean replicas) until the entries that would leave first, down to
  /// `low`, are clean, so eviction frees HBM without a copy on the request path. high = 1
  /// turns the cleaner off.
  tiered::watermarks offload{};
  /// Content-key seed (core/hash.hpp): stores of one model agree. Use
  /// `model_identity(spec, weights)` (tiered/storage_format.hpp) to share keys with storage backends.
  std::uint64_t model_id = 0;
};

/// KV of a run of tokens: its entry in the tiered store (`no_entry` = empty) and its length.
/// Move-only; a moved-from handle is empty, so a handle is freed at most once.
struct tiered_kv_extent {
  entry_id id = no_entry;
  std::int64_t tokens = 0;
  tiered_kv_extent() = default;
  tiered_kv_extent(entry_id i, std::int64_t t) noexcept : id(i), tokens(t) {}
  tiered_kv_extent(tiered_kv_extent&& o) noexcept : id(std::exchange(o.id, no_entry)), tokens(std::exchange(o.tokens, 0)) {}
  tiered_kv_extent& operator=(tiered_kv_extent&& o) noexcept {
    id = std::exchange(o.id, no_entry);
    tokens = std::exchange(o.tokens, 0);
    return *this;
  }
  tiered_kv_extent(const tiered_kv_extent&) = delete;
  tiered_kv_extent& operator=(const tiered_kv_extent&) = delete;
};
/// An SSM checkpoint: its entry in the tiered store (`no_entry` for a model without
/// recurrent layers, whose checkpoints hold 0 bytes) and whether it holds one at all
/// (`held`: false = the empty handle). Move-only.
struct tiered_checkpoint_handle {
  entry_id id = no_entry;
  bool held = false;
  tiered_checkpoint_handle() = default;
  explicit tiered_checkpoint_handle(entry_id i) noexcept : id(i), held(true) {}
  tiered_checkpoint_handle(tiered_checkpoint_handle&& o) noexcept
      : id(std::exchange(o.id, no_entry)), held(std::exchange(o.held, false)) {}
  tiered_checkpoint_handle& operator=(tiered_checkpoint_handle&& o) noexcept {
    id = std::exchange(o.id, no_entry);
    held = std::exchange(o.held, false);
    return *this;
  }
  tiered_checkpoint_handle(const tiered_checkpoint_handle&) = delete;
  tiered_checkpoint_handle& operator=(const tiered_checkpoint_handle&) = delete;
};

/// One entry `load` brought into the HBM staging room: tokens [begin, end) of the input, and
/// its entry in `table()` (pages in the HBM arena, layer-major: segment l = attention layer
/// l). `checkpoint`: the recurrent state at `end` (segment r = recurrent layer r).
struct staged_entry {
  entry_id id = no_entry;
  std::int64_t begin = 0;
  std::int64_t end = 0;
  bool checkpoint = false;
  std::int64_t loaded_bytes = 0;  ///< bytes this hit brought over a link (0: joined another load)
};

/// The most tiers a `tiered_state_store` takes (HBM and up to seven below it: host, CXL, local
/// and remote disks, Redis): `tiered_hit::tier_tokens` has a slot per tier, so a hit's split
/// is exact without an allocation. A longer tier list is refused at construction.
inline constexpr std::size_t max_hit_tiers = 8;

/// What `lookup` found for one input below HBM.
struct tiered_hit {
  std::int64_t reusable_tokens = 0;  ///< prefill starts here (HBM + lower-tier hit)
  std::int64_t hbm_tokens = 0;       ///< of which reusable from HBM alone (= match_result::reusable_tokens)
  std::int64_t host_tokens = 0;      ///< reusable_tokens - hbm_tokens: loaded from a lower tier
  /// The first token whose KV the hit brings (HBM holds the KV before it: the match's common
  /// prefix); `load` stages the KV of [kv_first, reusable_tokens).
  std::int64_t kv_first = 0;
  /// Bytes the load moves from lower tiers: the KV of the tokens HBM lacks up to
  /// `reusable_tokens`, plus one checkpoint (less what another request's load in flight
  /// already brings: see `staged_entry::loaded_bytes`).
  std::int64_t bytes_to_load = 0;
  std::int64_t kv_entries = 0;       ///< lower-tier KV entries used
  bool host_checkpoint = false;      ///< the checkpoint comes from a lower tier
  /// The slowest (deepest) tier the load reads a byte from; 0 (HBM) when nothing is loaded
  /// from below. A runtime deciding between loading and recomputing prices the load with
  /// this tier's link (the other sources are faster).
  tier_id source_tier{0};
  /// How far the input's KV is found in any tier (HBM or below). Beyond the resume point it
  /// marks where the input leaves a cached sequence: the branch point a request should keep
  /// a checkpoint at (judicious admission's rule, applied to what was demoted; the lifecycle
  /// does it).
  std::int64_t kv_reach = 0;
  std::uint64_t ticket = 0;          ///< pins to hand back to `settle` / `release_hit` (0 = nothing pinned)
  cache_salt salt = std::nullopt;  ///< the match's namespace: `settle` names the path's entries in it
  /// `host_tokens` split by the tier each token is read from (index: tier; they sum to
  /// `host_tokens`): a KV entry's tokens under the tier of the copy the hit reads (0 when that
  /// copy is still in HBM, a demoted entry not dropped yet); the tokens before `kv_first`
  /// (their KV in HBM, resumable only through the checkpoint) under the checkpoint's tier.
  /// A fixed array, filled as lookup walks the entries: no allocation, 64 bytes more to copy.
  std::array<std::int64_t, max_hit_tiers> tier_tokens{};
  /// The tier the hit's last token is read from (0: none below HBM): where a caller that
  /// rounds tokens to blocks takes the rounding off.
  tier_id end_tier{0};

  /// `host_tokens` read from tier `t` (0 for a tier the store does not have).
  [[nodiscard]] std::int64_t tokens_from(tier_id t) const noexcept {
    return t.value < max_hit_tiers ? tier_tokens[t.value] : 0;
  }
  /// Index of tier `t` in `tier_tokens` (the store has at most `max_hit_tiers` tiers).
  [[nodiscard]] static constexpr std::size_t slot_of(tier_id t) noexcept {
    assert(t.value < max_hit_tiers);
    return t.value;
  }
};

/// Σ `hit.tier_tokens`: `hit.host_tokens` (lookup and shorten_hit keep it so).
[[nodiscard]] inline std::int64_t tier_token_sum(const tiered_hit& hit) noexcept {
  std::int64_t sum = 0;
  for (const std::int64_t n : hit.tier_tokens) sum += n;
  return sum;
}

/// What a hit below HBM would bring, from `tiered_state_store::probe_hit` (nothing pinned,
/// nothing counted): for a scheduler or a prefetcher that prices a load before making it.
struct tiered_probe {
  std::int64_t resume_tokens = 0;  ///< where the hit would resume (the HBM match's reusable tokens: no hit)
  tier_id source_tier{0};          ///< the slowest tier it would read from (0: nothing below HBM)
  std::int64_t kv_entries = 0;     ///< lower-tier KV entries it would read
  bool checkpoint = false;         ///< its checkpoint comes from a lower tier
};

/// Counters of a `tiered_state_store` (bytes are logical: tokens x bytes per token).
struct tiered_state_counters {
  std::int64_t demoted_entries = 0, demoted_bytes = 0;      ///< named entries the cache evicted from HBM
  std::int64_t write_backs = 0, write_back_bytes = 0;       ///< of those, copied down on eviction
  std::int64_t sparsified_bytes = 0;                        ///< write-back bytes the sizer saved (CaR sparsification)
  std::int64_t clean_drops = 0;                             ///< of those, dropped from HBM for free (a clean copy below)
  std::int64_t replicas = 0, replica_bytes = 0;             ///< clean copies made ahead (write-through, offload())
  std::int64_t cascades = 0, cascade_bytes = 0;             ///< moved between lower tiers to make room
  /// Named entries that left the store on their way down: no room below (or the last tier
  /// full), a failed copy down, or a demotion whose content key a lower tier already holds
  /// (nothing is lost then: the copy below is found instead).
  std::int64_t dropped_entries = 0, dropped_bytes = 0;
  std::int64_t promoted_entries = 0, promoted_bytes = 0;    ///< lower-tier entries superseded by an HBM copy
  std::int64_t host_hits = 0, host_hit_tokens = 0, loaded_bytes = 0;
  std::int64_t staged_entries = 0, staged_bytes = 0;  ///< copied into HBM staging by `load`
  std::int64_t joined_loads = 0;  ///< loads that joined another hit's copy (copied in HBM after it) or claimed a prefetch's
  std::int64_t adopted_entries = 0;                   ///< staged entries whose pages the tree took
  std::int64_t copy_failures = 0;                     ///< copies the engine reported failed
  std::int64_t write_back_waits = 0;                  ///< allocations that waited for a write-back to free HBM
};

}  // namespace hybridcache::stores
