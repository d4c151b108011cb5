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
// Keys: storage_key{model identity, content-key chain of tokens [0, b) seeded by the model
// and the request's cache salt, b, kind} (tiered/storage_format.hpp): two processes serving
// the same model file agree on every key; two tenants never share one. A value whose
// checksum or header does not verify is a miss (the backend counts it and removes it): the
// request computes those tokens.
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
#include <deque>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include "hybridcache/concepts/storage_backend.hpp"
#include "hybridcache/core/hash.hpp"
#include "hybridcache/tiered/disk_backend.hpp"
#include "hybridcache/tiered/storage_format.hpp"
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

/// The shared tier over backend `B` (a `hc::storage_backend`).
template <hc::storage_backend B>
class backend_shared_tier final : public shared_tier {
 public:
  /// `model_id`: `tiered::model_identity` of the model and its weights file; `layout`: the
  /// session's state layout (row sizes); `name`: what `describe` says (e.g. "disk /tmp/x 1 GiB").
  backend_shared_tier(std::unique_ptr<B> backend, std::uint64_t model_id, const state_layout& layout, std::string name,
                      std::size_t max_pending = 8)
      : backend_(std::move(backend)), model_(model_id), layout_(layout), name_(std::move(name)), max_pending_(max_pending) {
    for (const auto& l : layout_.kv) kv_token_bytes_ += l.k_row + l.v_row;
    for (const auto& r : layout_.rec) rec_bytes_ += r.r_row + r.s_row;
  }
  ~backend_shared_tier() override { drain(); }

  void lookup(std::span<const llama_token> prompt, hc::cache_salt salt, std::span<const std::int64_t> candidates,
              std::int64_t at_least, shared_hit& hit) override {
    const auto t0 = std::chrono::steady_clock::now();
    hit.tokens = 0;
    ++counters_.lookups;
    keys_.clear();
    positions_.clear();
    std::uint64_t h = hc::content_key::seed(model_, salt);
    std::size_t next = 0;
    for (std::int64_t p = 0; p < static_cast<std::int64_t>(prompt.size()) && next < candidates.size(); ++p) {
      h = hc::content_key::next(h, prompt[static_cast<std::size_t>(p)]);
      while (next < candidates.size() && candidates[next] < p + 1) ++next;
      if (next < candidates.size() && candidates[next] == p + 1 && p + 1 > at_least) {
        positions_.push_back(p + 1);
        keys_.push_back({model_, h, p + 1, hc::value_kind::checkpoint});
      }
    }
    if (!keys_.empty()) {
      found_.assign(keys_.size(), 0);
      auto t = backend_->exists(keys_, found_);
      auto r = t ? backend_->wait(*t) : hc::expected<hc::io_result>(hc::unexpected(t.error()));
      if (r && r->status == hc::io_status::ok) {
        for (std::size_t i = keys_.size(); i-- > 0 && hit.tokens == 0;)
          if (found_[i] != 0 && load(keys_[i], positions_[i], hit)) hit.tokens = positions_[i];
      }
    }
    if (hit.tokens > 0) ++counters_.loads;
    counters_.lookup_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }

  void store(std::span<const llama_token> tokens, hc::cache_salt salt, std::int64_t b, const full_state_view& view) override {
    const auto t0 = std::chrono::steady_clock::now();
    std::uint64_t h = hc::content_key::seed(model_, salt);
    for (std::int64_t p = 0; p < b; ++p) h = hc::content_key::next(h, tokens[static_cast<std::size_t>(p)]);
    const std::uint64_t name = h ^ static_cast<std::uint64_t>(b) * 0x9e3779b97f4a7c15ULL;
    if (stored_.size() >= max_remembered) stored_.clear();  // bounded: forgetting only costs a repeated put
    if (!stored_.insert(name).second) return;
    reap(max_pending_ - 1);
    pending_.push_back({});
    auto& job = pending_.back();
    job.kv.resize(static_cast<std::size_t>(b) * kv_token_bytes_);
    std::byte* out = job.kv.data();
    for (std::int64_t c = 0; c < static_cast<std::int64_t>(view.pos.size()); ++c) {
      const std::int64_t p = view.pos[static_cast<std::size_t>(c)];
      if (p >= b) continue;
      std::byte* row = out + static_cast<std::uint64_t>(p) * kv_token_bytes_;
      for (std::size_t l = 0; l < layout_.kv.size(); ++l) {
        std::memcpy(row, view.k[l] + static_cast<std::uint64_t>(c) * layout_.kv[l].k_row, layout_.kv[l].k_row);
        copy_v_row(layout_, view, l, static_cast<std::size_t>(c), row + layout_.kv[l].k_row);
        row += layout_.kv[l].k_row + layout_.kv[l].v_row;
      }
    }
    job.rec.resize(rec_bytes_);
    std::byte* r = job.rec.data();
    for (std::size_t i = 0; i < layout_.rec.size(); ++i) {
      std::memcpy(r, view.r[i], layout_.rec[i].r_row);
      std::memcpy(r + layout_.rec[i].r_row, view.s[i], layout_.rec[i].s_row);
      r += layout_.rec[i].r_row + layout_.rec[i].s_row;
    }
    const hc::storage_key kv_key{model_, h, b, hc::value_kind::kv}, rec_key{model_, h, b, hc::value_kind::checkpoint};
    auto kt = backend_->put(kv_key, {.span_begin = 0, .layout = {hc::layer_order::token_major, static_cast<std::uint32_t>(layout_.kv.size())}},
                            job.kv);
    // The checkpoint goes second: a lookup asks for checkpoints, so a reader never finds one
    // whose KV was refused.
    if (kt) job.tickets.push_back(*kt);
    auto rt = kt ? backend_->put(rec_key, {.span_begin = b, .layout = {hc::layer_order::unspecified,
                                                                        static_cast<std::uint32_t>(layout_.rec.size())}},
                                 job.rec)
                 : hc::expected<hc::io_ticket>(hc::unexpected(kt.error()));
    if (rt) job.tickets.push_back(*rt);
    if (!kt || !rt) {
      ++counters_.store_failures;
      stored_.erase(name);
    }
    ++counters_.stores;
    counters_.store_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }

  void drain() override { reap(0); }

  [[nodiscard]] shared_tier_counters counters() const override { return counters_; }
  [[nodiscard]] hc::backend_counters backend_counters() const override { return backend_->counters(); }
  [[nodiscard]] std::string describe() const override { return name_; }

 private:
  struct pending_store {
    std::vector<std::byte> kv, rec;   // what the backend reads until its tickets are waited on
    std::vector<hc::io_ticket> tickets;
  };

  // Reads key's checkpoint and the KV of [0, b) into `hit`; false (counted) when either is
  // missing, damaged or not the size the layout says.
  bool load(const hc::storage_key& rec_key, std::int64_t b, shared_hit& hit) {
    hit.rec.resize(rec_bytes_);
    hit.kv.resize(static_cast<std::size_t>(b) * kv_token_bytes_);
    const hc::storage_key kv_key{rec_key.model, rec_key.prefix, b, hc::value_kind::kv};
    auto rt = backend_->get(rec_key, hit.rec);
    auto kt = backend_->get(kv_key, hit.kv);
    auto rr = rt ? backend_->wait(*rt) : hc::expected<hc::io_result>(hc::unexpected(rt.error()));
    auto kr = kt ? backend_->wait(*kt) : hc::expected<hc::io_result>(hc::unexpected(kt.error()));
    const bool ok = rr && kr && rr->status == hc::io_status::ok && kr->status == hc::io_status::ok &&
                    rr->bytes == static_cast<std::int64_t>(hit.rec.size()) && kr->bytes == static_cast<std::int64_t>(hit.kv.size()) &&
                    kr->meta.span_begin == 0 && kr->meta.layout.order == hc::layer_order::token_major;
    if (!ok) ++counters_.dropped;
    return ok;
  }

  // Waits for the oldest stores until at most `keep` are in flight.
  void reap(std::size_t keep) {
    while (pending_.size() > keep) {
      bool failed = false;
      for (const auto t : pending_.front().tickets) {
        auto r = backend_->wait(t);
        failed = failed || !r || r->status != hc::io_status::ok;
      }
      if (failed) ++counters_.store_failures;
      pending_.pop_front();
    }
  }

  static constexpr std::size_t max_remembered = std::size_t{1} << 16;

  std::unique_ptr<B> backend_;
  std::uint64_t model_;
  state_layout layout_;
  std::string name_;
  std::size_t max_pending_;
  std::uint64_t kv_token_bytes_ = 0, rec_bytes_ = 0;
  std::deque<pending_store> pending_;
  std::unordered_set<std::uint64_t> stored_;  // positions this process stored (by key)
  std::vector<hc::storage_key> keys_;
  std::vector<std::int64_t> positions_;
  std::vector<std::uint8_t> found_;
  shared_tier_counters counters_;
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

/// The shared tier `o` names (nullptr for none). @throws invalid_argument for a directory
/// the disk tier cannot own, a Redis tier in a build without hiredis, or a bad endpoint.
inline std::unique_ptr<shared_tier> make_shared_tier(const shared_tier_options& o, std::uint64_t model_id,
                                                     const state_layout& layout) {
  using kind_t = shared_tier_options::kind_t;
  const std::string size = std::to_string(o.capacity_bytes >> 20) + " MiB";
  if (o.kind == kind_t::none) return nullptr;
  if (o.kind == kind_t::disk) {
    auto b = std::make_unique<hc::tiered::disk_backend<>>(
        hc::tiered::disk_backend_config{.directory = o.location, .capacity_bytes = o.capacity_bytes});
    return std::make_unique<backend_shared_tier<hc::tiered::disk_backend<>>>(std::move(b), model_id, layout,
                                                                            "disk " + o.location + " " + size);
  }
#if HYBRIDCACHE_LLAMA_REDIS
  const std::size_t colon = o.location.rfind(':');
  hc::tiered::redis_backend_config c{.key_prefix = "hcl:", .capacity_bytes = o.capacity_bytes};
  c.server.endpoints.push_back({o.location.substr(0, colon), std::stoi(o.location.substr(colon + 1))});
  auto b = std::make_unique<hc::tiered::redis_backend<>>(std::move(c));
  return std::make_unique<backend_shared_tier<hc::tiered::redis_backend<>>>(std::move(b), model_id, layout,
                                                                           "redis " + o.location + " " + size);
#else
  throw hc::invalid_argument("--tiers redis@" + o.location + ": this build has no Redis tier (Debian libhiredis-dev)");
#endif
}

}  // namespace hybridcache_llama
