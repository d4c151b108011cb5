// examples/llama_cpp/shared_tier.hpp
//
// The tier below the pool and its host tier: a `storage_backend` (a directory: disk_backend;
// a Redis server: redis_backend) holding sequence prefixes by content key, so a prefix that
// left memory, or that another process computed, is loaded instead of prefilled.
//
// What it holds: at the positions the engine names (the end of the system message, the
// prompt's end and the position before it), two values per position b:
//   - value_kind::kv, token-major: for each token p < b, each attention layer l, K row then
//     V row (V as a plain row even when llama.cpp keeps it transposed);
//   - value_kind::checkpoint: for each recurrent layer, the conv row then the SSM row, the
//     state after token b - 1.
// They are written when prefill reaches b (write-through), so a second process sees them as
// soon as the backend has stored them. The position before the prompt's end is kept so an
// identical prompt in another process computes one token: logits need at least one token
// computed, and a recurrent state cannot be rewound from b to b - 1.
//
// Keys, lookups and stores are the library's `tiered::shared_prefix_store`
// (tiered/shared_prefix_store.hpp): storage_key{model identity, content-key chain of tokens
// [0, b) seeded by the model and the request's cache salt, b, kind}, so two processes serving
// the same model file agree on every key and two tenants never share one; a value whose
// checksum, size or layout does not verify is a miss (counted): the request computes those
// tokens. What is left here is llama.cpp's side: the rows of a sequence state.
//
// The backend itself is opened once (`open_lower_backend`, a `lower_backend`): with a host
// tier, the pool store's host tier also moves its victims down into it (engine_impl.hpp).
//
// Costs: a lookup is one `exists` over the candidate positions (one round trip to Redis; the
// disk tier answers from its index) and two `get`s of the deepest pair found (KV bytes of b
// tokens plus one snapshot); a store copies the sequence's rows once and hands them to the
// backend, which writes them on its own threads (at most `max_pending` stores in flight; the
// oldest is waited for beyond that). Not thread-safe: the engine's thread calls it.
#pragma once

#include <llama.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "hybridcache/concepts/storage_backend.hpp"
#include "hybridcache/core/hash.hpp"
#include "hybridcache/tiered/disk_backend.hpp"
#include "hybridcache/tiered/shared_prefix_store.hpp"
#include "hybridcache/tiered/storage_format.hpp"
#include "hybridcache/tiered/storage_tier_io.hpp"
#include "hybridcache/tiered/tier.hpp"
#include "llama_state.hpp"
#if HYBRIDCACHE_LLAMA_REDIS
#include "hybridcache/tiered/redis/redis_backend.hpp"
#endif

namespace hybridcache_llama {

/// Running totals of the shared tier (all monotone).
struct shared_tier_counters {
  std::int64_t lookups = 0;          ///< admissions that asked the tier
  std::int64_t loads = 0;            ///< hits loaded into a sequence
  std::int64_t stores = 0;           ///< prefixes handed to the backend
  std::int64_t store_failures = 0;   ///< stores the backend refused or failed (busy, no space, too large, unavailable)
  std::int64_t dropped = 0;          ///< values found but not usable (corrupt, unavailable, wrong size): recomputed
  double lookup_ms = 0, store_ms = 0;
};

/// A hit: the deepest stored position below the prompt's end, its rows.
struct shared_hit {
  std::int64_t tokens = 0;         ///< b: the rows cover tokens [0, b); 0: no hit
  std::vector<std::byte> kv, rec;  ///< the two values' payloads (layouts in the file comment)
};

/// The tier as the engine sees it (one implementation per backend type).
class shared_tier {
 public:
  virtual ~shared_tier() = default;
  /// The deepest position in `candidates` (ascending, each in [1, |prompt|)) whose two values
  /// the backend holds and returns intact; `hit.tokens` = 0 when none. Candidates at or below
  /// `at_least` are not asked for.
  virtual void lookup(std::span<const llama_token> prompt, hc::cache_salt salt, std::span<const std::int64_t> candidates,
                      std::int64_t at_least, shared_hit& hit) = 0;
  /// Stores the prefix [0, b) of `tokens` from a sequence state `view` holding at least those
  /// cells with the recurrent state after b - 1 (a `read_full_state` of the sequence when
  /// prefill just reached b). Positions already stored by this process are skipped.
  virtual void store(std::span<const llama_token> tokens, hc::cache_salt salt, std::int64_t b, const full_state_view& view) = 0;
  /// Waits for every store in flight (the end of a run, or before the process exits).
  virtual void drain() = 0;
  [[nodiscard]] virtual shared_tier_counters counters() const = 0;
  [[nodiscard]] virtual hc::backend_counters backend_counters() const = 0;
  [[nodiscard]] virtual std::string describe() const = 0;
};

/// The shared tier over backend `B` (a `hc::storage_backend`, which must outlive it): the
/// library's `tiered::shared_prefix_store` (keys, exists, verified reads, bounded puts) plus
/// the rows of a llama.cpp sequence state.
template <hc::storage_backend B>
class backend_shared_tier final : public shared_tier {
 public:
  /// `model_id`: `tiered::model_identity` of the model and its weights file; `layout`: the
  /// session's state layout (row sizes); `name`: what `describe` says (e.g. "disk /tmp/x 1 GiB").
  backend_shared_tier(B& backend, std::uint64_t model_id, const state_layout& layout, std::string name, std::size_t max_pending = 8)
      : backend_(backend), layout_(layout), name_(std::move(name)), store_(backend_, config_for(model_id, layout, max_pending)) {}
  ~backend_shared_tier() override { store_.drain(); }

  void lookup(std::span<const llama_token> prompt, hc::cache_salt salt, std::span<const std::int64_t> candidates,
              std::int64_t at_least, shared_hit& hit) override {
    const auto t0 = std::chrono::steady_clock::now();
    ++lookups_;
    hit.tokens = store_.find(prompt, salt, candidates, at_least, hit.kv, hit.rec);
    lookup_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }

  void store(std::span<const llama_token> tokens, hc::cache_salt salt, std::int64_t b, const full_state_view& view) override {
    const auto t0 = std::chrono::steady_clock::now();
    const std::uint64_t kv_token_bytes = store_.config().kv_bytes_per_token;
    (void)store_.publish(
        tokens, salt, b,
        [&](std::span<std::byte> kv) {  // token-major: for each token p < b, each attention layer, K row then V row
          for (std::int64_t c = 0; c < static_cast<std::int64_t>(view.pos.size()); ++c) {
            const std::int64_t p = view.pos[static_cast<std::size_t>(c)];
            if (p >= b) continue;
            std::byte* row = kv.data() + static_cast<std::uint64_t>(p) * kv_token_bytes;
            for (std::size_t l = 0; l < layout_.kv.size(); ++l) {
              std::memcpy(row, view.k[l] + static_cast<std::uint64_t>(c) * layout_.kv[l].k_row, layout_.kv[l].k_row);
              copy_v_row(layout_, view, l, static_cast<std::size_t>(c), row + layout_.kv[l].k_row);
              row += layout_.kv[l].k_row + layout_.kv[l].v_row;
            }
          }
        },
        [&](std::span<std::byte> rec) {  // for each recurrent layer: the conv row, then the SSM row
          std::byte* r = rec.data();
          for (std::size_t i = 0; i < layout_.rec.size(); ++i) {
            std::memcpy(r, view.r[i], layout_.rec[i].r_row);
            std::memcpy(r + layout_.rec[i].r_row, view.s[i], layout_.rec[i].s_row);
            r += layout_.rec[i].r_row + layout_.rec[i].s_row;
          }
        });
    store_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }

  void drain() override { store_.drain(); }

  [[nodiscard]] shared_tier_counters counters() const override {
    const auto& c = store_.counters();
    return {.lookups = lookups_, .loads = c.hits, .stores = c.publishes, .store_failures = c.publish_failures,
            .dropped = c.dropped, .lookup_ms = lookup_ms_, .store_ms = store_ms_};
  }
  [[nodiscard]] hc::backend_counters backend_counters() const override { return backend_.counters(); }
  [[nodiscard]] std::string describe() const override { return name_; }

 private:
  static hc::tiered::shared_prefix_config config_for(std::uint64_t model_id, const state_layout& layout, std::size_t max_pending) {
    hc::tiered::shared_prefix_config c{.model = model_id,
                                       .kv_layers = static_cast<std::uint32_t>(layout.kv.size()),
                                       .state_layers = static_cast<std::uint32_t>(layout.rec.size()),
                                       .max_pending = max_pending};
    for (const auto& l : layout.kv) c.kv_bytes_per_token += static_cast<std::int64_t>(l.k_row + l.v_row);
    for (const auto& r : layout.rec) c.state_bytes += static_cast<std::int64_t>(r.r_row + r.s_row);
    return c;
  }

  B& backend_;
  state_layout layout_;
  std::string name_;
  hc::tiered::shared_prefix_store<B> store_;
  std::int64_t lookups_ = 0;
  double lookup_ms_ = 0, store_ms_ = 0;
};

/// Where the shared tier lives (from `--tiers`): none, a directory, or a Redis server.
struct shared_tier_options {
  enum class kind_t : std::uint8_t { none, disk, redis } kind = kind_t::none;
  std::string location;          ///< the directory, or HOST:PORT
  std::int64_t capacity_bytes = 0;
};

/// What names the weights in content keys: the model file's size and a digest of its first
/// and last MiB (GGUF keeps its metadata and tensor index at the front). Two processes that
/// load the same file agree. @throws invalid_argument when the file cannot be read.
inline std::string weights_identity(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) throw hc::invalid_argument("shared tier: cannot read the model file '" + path + "'");
  const auto size = static_cast<std::int64_t>(f.tellg());
  std::uint64_t h = hc::splitmix64_mix(static_cast<std::uint64_t>(size));
  std::vector<char> buf(std::size_t{1} << 20);
  for (const std::int64_t at : {std::int64_t{0}, std::max<std::int64_t>(0, size - static_cast<std::int64_t>(buf.size()))}) {
    f.seekg(at);
    f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const auto got = static_cast<std::size_t>(f.gcount());
    f.clear();
    for (std::size_t i = 0; i < got; ++i) h = hc::splitmix64_mix(h ^ static_cast<unsigned char>(buf[i]));
  }
  return "gguf:" + std::to_string(size) + ":" + std::to_string(h);
}

/// The backend below the host tier (`--tiers disk@DIR=SIZE` or `redis@HOST:PORT=SIZE`),
/// opened once and used twice: the pool store's host tier moves its victims into it
/// (`storage_tier()` + `storage_io()` in `host_tier_config`; values keyed by a per-process
/// serial and salt: private to this process), and the shared tier writes prefixes through to it
/// (`make_shared_tier`; values keyed by content: shared between processes). One capacity and
/// one LRU (the backend's) for both: a spilled value the backend evicted to make room is a miss
/// when the host tier asks for it back (counted in `host_corrupt_dropped`, recomputed). Outlives the
/// store and the shared tier that use it.
class lower_backend {
 public:
  virtual ~lower_backend() = default;
  /// The backend as the pool store's storage tier below its host tier.
  [[nodiscard]] virtual hc::tiered::tier_config storage_tier() const = 0;
  /// Its calls (`tiered::storage_io_of`), valid while this object lives.
  [[nodiscard]] virtual hc::tiered::storage_tier_io storage_io() = 0;
  /// The shared tier over it.
  [[nodiscard]] virtual std::unique_ptr<shared_tier> make_shared_tier(std::uint64_t model_id, const state_layout& layout) = 0;
};

template <hc::storage_backend B>
class lower_backend_of final : public lower_backend {
 public:
  lower_backend_of(std::unique_ptr<B> backend, hc::tiered::tier_config tier, std::string name)
      : backend_(std::move(backend)), tier_(std::move(tier)), name_(std::move(name)) {}
  [[nodiscard]] hc::tiered::tier_config storage_tier() const override { return tier_; }
  [[nodiscard]] hc::tiered::storage_tier_io storage_io() override { return hc::tiered::storage_io_of(*backend_); }
  [[nodiscard]] std::unique_ptr<shared_tier> make_shared_tier(std::uint64_t model_id, const state_layout& layout) override {
    return std::make_unique<backend_shared_tier<B>>(*backend_, model_id, layout, name_);
  }

 private:
  std::unique_ptr<B> backend_;
  hc::tiered::tier_config tier_;
  std::string name_;
};

/// Opens the backend `o` names (nullptr for none). @throws invalid_argument for a directory
/// the disk tier cannot own, a Redis tier in a build without hiredis, or a bad endpoint.
inline std::unique_ptr<lower_backend> open_lower_backend(const shared_tier_options& o) {
  using kind_t = shared_tier_options::kind_t;
  const std::string size = std::to_string(o.capacity_bytes >> 20) + " MiB";
  if (o.kind == kind_t::none) return nullptr;
  if (o.kind == kind_t::disk) {
    auto b = std::make_unique<hc::tiered::disk_backend<>>(
        hc::tiered::disk_backend_config{.directory = o.location, .capacity_bytes = o.capacity_bytes});
    return std::make_unique<lower_backend_of<hc::tiered::disk_backend<>>>(
        std::move(b), hc::tiered::tier_config{.kind = hc::tiered::tier_kind::disk, .capacity_bytes = o.capacity_bytes, .location = o.location},
        "disk " + o.location + " " + size);
  }
#if HYBRIDCACHE_LLAMA_REDIS
  const hc::tiered::redis_host_port ep = hc::tiered::parse_redis_endpoint(o.location, "--tiers redis@");
  hc::tiered::redis_backend_config c{.key_prefix = "hcl:", .capacity_bytes = o.capacity_bytes};
  c.server.endpoints.push_back({ep.host, ep.port});
  auto b = std::make_unique<hc::tiered::redis_backend<>>(std::move(c));
  return std::make_unique<lower_backend_of<hc::tiered::redis_backend<>>>(
      std::move(b), hc::tiered::tier_config{.kind = hc::tiered::tier_kind::redis, .capacity_bytes = o.capacity_bytes, .location = o.location},
      "redis " + o.location + " " + size);
#else
  throw hc::invalid_argument("--tiers redis@" + o.location + ": this build has no Redis tier (Debian libhiredis-dev)");
#endif
}

}  // namespace hybridcache_llama
