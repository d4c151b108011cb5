// hybridcache/tiered/shared_prefix_store.hpp
//
// `shared_prefix_store`: sequence prefixes published to a storage backend (a disk directory,
// a Redis server: concepts/storage_backend.hpp) by content key, so that a prefix one process
// computed is loaded, not prefilled, by any process serving the same model: the cross-process
// tier of a runtime (the llama.cpp program's `--tiers disk@...`/`redis@...`, two servers on one
// Redis).
//
// What a published position b holds: two values,
//   - value_kind::kv          the KV of tokens [0, b), token-major (`kv_bytes_per_token` per
//                             token, the caller's row layout), span_begin 0;
//   - value_kind::checkpoint  the recurrent state after token b - 1 (`state_bytes`).
// Keys: storage_key{model, content-key chain of tokens [0, b) seeded by the model and the
// request's cache salt, b, kind}: two processes serving the same model file agree on every key,
// two tenants (salts) never share one. The checkpoint is put after its KV, and a lookup asks
// for checkpoints, so a reader never finds a checkpoint whose KV was refused.
//
// `find` asks the backend which candidate positions it holds (one `exists`: one round trip to
// Redis; the disk tier answers from its index) and reads the deepest pair whose two values come
// back intact and of the right size and layout (the backend verifies their CRC); a value that
// does not is a miss (counted): the caller computes those tokens. `publish` hands a pair to the
// backend, which writes it on its own threads: at most `max_pending` publishes are in flight
// (the oldest is waited for beyond that); a position this store already published is skipped
// (the memory of those is bounded: forgetting costs a repeated put).
//
// Costs: find = one exists over the candidates + two gets of the deepest found (O(|prompt|)
// hashing); publish = O(b) hashing + the caller's fill + two puts; drain waits for every
// publish in flight. Buffers are reused across calls. Not thread-safe: one thread (the
// runtime's engine thread) calls it; the backend's own threads do the I/O.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include "hybridcache/concepts/ids.hpp"
#include "hybridcache/concepts/storage_backend.hpp"
#include "hybridcache/core/error.hpp"
#include "hybridcache/core/hash.hpp"

namespace hybridcache::tiered {

/// Sizes and identity of a `shared_prefix_store`. Aggregate with defaults.
struct shared_prefix_config {
  std::uint64_t model = 0;             ///< `model_identity` (weights included): every key's model
  std::int64_t kv_bytes_per_token = 0; ///< one token's KV row over all attention layers (> 0)
  std::int64_t state_bytes = 0;        ///< the recurrent state after a position (> 0)
  std::uint32_t kv_layers = 0;         ///< recorded in the KV value's layout, checked at read
  std::uint32_t state_layers = 0;      ///< recorded in the checkpoint's layout, checked at read
  std::size_t max_pending = 8;         ///< publishes in flight before the oldest is waited for (>= 1)
  std::size_t max_remembered = std::size_t{1} << 16;  ///< published positions remembered (>= 1)
};

/// What a `shared_prefix_store` did since construction.
struct shared_prefix_counters {
  std::int64_t lookups = 0;           ///< `find` calls that asked the backend
  std::int64_t hits = 0;              ///< of those, a pair read back
  std::int64_t dropped = 0;           ///< pairs found but unusable (missing half, corrupt, wrong size or layout)
  std::int64_t publishes = 0;         ///< pairs handed to the backend
  std::int64_t publish_failures = 0;  ///< pairs the backend refused or failed to store
  std::int64_t skipped = 0;           ///< publishes of a position this store had published already
};

/// See the file comment. `Backend` must outlive the store.
template <storage_backend Backend>
class shared_prefix_store {
 public:
  /// @throws invalid_argument for a size <= 0, max_pending or max_remembered 0.
  shared_prefix_store(Backend& backend, const shared_prefix_config& c) : backend_(&backend), c_(c) {
    HYBRIDCACHE_EXPECTS(c_.kv_bytes_per_token > 0 && c_.state_bytes > 0, invalid_argument,
                        "shared_prefix_store: kv_bytes_per_token and state_bytes must be > 0");
    HYBRIDCACHE_EXPECTS(c_.max_pending >= 1 && c_.max_remembered >= 1, invalid_argument,
                        "shared_prefix_store: max_pending and max_remembered must be >= 1");
  }
  shared_prefix_store(const shared_prefix_store&) = delete;
  shared_prefix_store& operator=(const shared_prefix_store&) = delete;
  /// Waits for the publishes in flight (their buffers are the backend's until then).
  ~shared_prefix_store() { drain(); }

  [[nodiscard]] const shared_prefix_config& config() const noexcept { return c_; }

  /// The keys of position b of `tokens` under `salt` (the KV's; the checkpoint's differs in kind).
  [[nodiscard]] storage_key key_of(std::span<const token_id> tokens, cache_salt salt, std::int64_t b) const noexcept {
    std::uint64_t h = content_key::seed(c_.model, salt);
    for (std::int64_t p = 0; p < b; ++p) h = content_key::next(h, tokens[static_cast<std::size_t>(p)]);
    return {c_.model, h, b, value_kind::kv};
  }

  /// The deepest position b among `candidates` (ascending, in [1, |prompt|]) above
  /// `at_least` whose pair the backend holds and returns intact: its KV (b ·
  /// kv_bytes_per_token bytes) in `kv`, its state in `state`. 0 when there is none (the
  /// buffers' contents are then unspecified).
  [[nodiscard]] std::int64_t find(std::span<const token_id> prompt, cache_salt salt, std::span<const std::int64_t> candidates,
                                  std::int64_t at_least, std::vector<std::byte>& kv, std::vector<std::byte>& state) {
    keys_.clear();
    positions_.clear();
    std::uint64_t h = content_key::seed(c_.model, salt);
    std::size_t next = 0;
    for (std::int64_t p = 0; p < static_cast<std::int64_t>(prompt.size()) && next < candidates.size(); ++p) {
      h = content_key::next(h, prompt[static_cast<std::size_t>(p)]);
      while (next < candidates.size() && candidates[next] < p + 1) ++next;
      if (next < candidates.size() && candidates[next] == p + 1 && p + 1 > at_least) {
        positions_.push_back(p + 1);
        keys_.push_back({c_.model, h, p + 1, value_kind::checkpoint});
      }
    }
    if (keys_.empty()) return 0;
    ++counters_.lookups;
    found_.assign(keys_.size(), 0);
    const auto t = backend_->exists(keys_, found_);
    const auto r = t ? backend_->wait(*t) : expected<io_result>(unexpected(t.error()));
    if (!r || r->status != io_status::ok) return 0;
    for (std::size_t i = keys_.size(); i-- > 0;)
      if (found_[i] != 0 && read_pair(keys_[i], positions_[i], kv, state)) {
        ++counters_.hits;
        return positions_[i];
      }
    return 0;
  }

  /// Publishes position b of `tokens` (at least b of them) under `salt`: `fill_kv(span)`
  /// writes the KV of [0, b) (b · kv_bytes_per_token bytes), `fill_state(span)` the state
  /// after b - 1. Skipped (false) when this store published that position already; false too
  /// when the backend refused the submission (counted). invalid_argument for b outside
  /// [1, |tokens|]. The fills run before anything is handed over (an exception from one
  /// leaves nothing published).
  template <class FillKv, class FillState>
  bool publish(std::span<const token_id> tokens, cache_salt salt, std::int64_t b, FillKv&& fill_kv, FillState&& fill_state) {
    HYBRIDCACHE_EXPECTS(b >= 1 && b <= static_cast<std::int64_t>(tokens.size()), invalid_argument,
                        "shared_prefix_store::publish: position " + std::to_string(b) + " outside [1, " +
                            std::to_string(tokens.size()) + "]");
    const storage_key kv_key = key_of(tokens, salt, b);
    const std::uint64_t name = kv_key.prefix ^ static_cast<std::uint64_t>(b) * 0x9e3779b97f4a7c15ULL;
    if (published_.count(name)) {
      ++counters_.skipped;
      return false;
    }
    reap(c_.max_pending - 1);
    pending& job = spare();
    job.kv.resize(static_cast<std::size_t>(b * c_.kv_bytes_per_token));
    job.state.resize(static_cast<std::size_t>(c_.state_bytes));
    fill_kv(std::span<std::byte>(job.kv));
    fill_state(std::span<std::byte>(job.state));
    if (published_.size() >= c_.max_remembered) published_.clear();
    published_.insert(name);
    ++counters_.publishes;
    const storage_key state_key{kv_key.model, kv_key.prefix, b, value_kind::checkpoint};
    const auto kt = backend_->put(kv_key, {.span_begin = 0, .layout = {layer_order::token_major, c_.kv_layers}}, job.kv);
    if (kt) job.tickets.push_back(*kt);
    const auto st = kt ? backend_->put(state_key, {.span_begin = b, .layout = {layer_order::unspecified, c_.state_layers}}, job.state)
                       : expected<io_ticket>(unexpected(kt.error()));
    if (st) job.tickets.push_back(*st);
    if (!kt || !st) {
      ++counters_.publish_failures;
      published_.erase(name);
      return false;
    }
    return true;
  }

  /// Waits for every publish in flight (the end of a run, or before the process exits).
  void drain() { reap(0); }

  [[nodiscard]] const shared_prefix_counters& counters() const noexcept { return counters_; }

 private:
  struct pending {
    std::vector<std::byte> kv, state;  // the backend reads them until its tickets are waited for
    std::vector<io_ticket> tickets;
  };

  // Reads the checkpoint under `state_key` and the KV of [0, b) into the buffers; false
  // (counted) when either is missing, damaged, or not the size and layout the config says.
  bool read_pair(const storage_key& state_key, std::int64_t b, std::vector<std::byte>& kv, std::vector<std::byte>& state) {
    state.resize(static_cast<std::size_t>(c_.state_bytes));
    kv.resize(static_cast<std::size_t>(b * c_.kv_bytes_per_token));
    const storage_key kv_key{state_key.model, state_key.prefix, b, value_kind::kv};
    const auto st = backend_->get(state_key, state);
    const auto kt = backend_->get(kv_key, kv);
    const auto sr = st ? backend_->wait(*st) : expected<io_result>(unexpected(st.error()));
    const auto kr = kt ? backend_->wait(*kt) : expected<io_result>(unexpected(kt.error()));
    const bool ok = sr && kr && sr->status == io_status::ok && kr->status == io_status::ok &&
                    sr->bytes == c_.state_bytes && kr->bytes == static_cast<std::int64_t>(kv.size()) &&
                    kr->meta.span_begin == 0 && kr->meta.layout == value_layout{layer_order::token_major, c_.kv_layers} &&
                    sr->meta.span_begin == b && sr->meta.layout == value_layout{layer_order::unspecified, c_.state_layers};
    if (!ok) ++counters_.dropped;
    return ok;
  }

  // A job slot for a new publish: a finished one's buffers are reused.
  pending& spare() {
    if (!done_.empty()) {
      pending_.push_back(std::move(done_.back()));
      done_.pop_back();
    } else {
      pending_.emplace_back();
    }
    pending_.back().tickets.clear();
    return pending_.back();
  }

  // Waits for the oldest publishes until at most `keep` are in flight.
  void reap(std::size_t keep) {
    while (pending_.size() > keep) {
      bool failed = false;
      for (const auto t : pending_.front().tickets) {
        const auto r = backend_->wait(t);
        failed = failed || !r || r->status != io_status::ok;
      }
      if (failed) ++counters_.publish_failures;
      done_.push_back(std::move(pending_.front()));
      pending_.pop_front();
    }
  }

  Backend* backend_;
  shared_prefix_config c_;
  std::deque<pending> pending_;
  std::vector<pending> done_;                    // finished jobs, buffers kept
  std::unordered_set<std::uint64_t> published_;  // positions published by this store (by key)
  std::vector<storage_key> keys_;
  std::vector<std::int64_t> positions_;
  std::vector<std::uint8_t> found_;
  shared_prefix_counters counters_;
};

}  // namespace hybridcache::tiered
