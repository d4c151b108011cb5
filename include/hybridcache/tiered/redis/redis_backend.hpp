// hybridcache/tiered/redis/redis_backend.hpp
//
// `redis_backend<Scorer>`: a cluster-wide tier on a Redis server or a Redis Cluster (or
// Valkey, or a managed Redis that speaks the same protocol), a `storage_backend`
// (concepts/storage_backend.hpp). Several serving nodes configured with the same servers
// share one prefix cache: what one publishes, the others find by its content key.
//
// OPT-IN: this header needs hiredis (Debian libhiredis-dev). Link the CMake target
// `hybridcache::redis`, which exists only when hiredis was found at configure time; the
// rest of the library never includes this folder.
//
// Layout in Redis (tiered/redis_protocol.hpp): a value is its 64-byte header (the format of
// tiered/storage_format.hpp) under `<key_prefix>{<32 hex>}:0` and its payload split into
// chunks of at most `chunk_bytes` under `...:1`, `...:2`, ... The braces are a hash tag:
// every chunk of a value lives on the same shard, so one pipeline on one connection reads
// or writes a whole value. A put sends the payload chunks first and the header last, in one
// pipeline: a value is visible (EXISTS on chunk 0) only after all its chunks were accepted.
//
// Behaviour:
//   - pipelines (tiered/redis/redis_pipeline.hpp): a put is one round trip (its evictions'
//     DELs ride along; the payload is written from the caller's buffer, not copied); a get
//     is one round trip when the buffer's size covers the value (chunks are fetched up to
//     the buffer's size; a value written with another chunk size costs a second one); an
//     exists over any number of keys is one round trip (one per shard, all in parallel);
//   - a pool of 2 x `connections` connections per server: one per worker thread, and one
//     per helper seat (a thread waiting on an operation no worker has started runs it
//     itself on a pooled connection: tiered/io_queue.hpp), each with connect and I/O
//     timeouts;
//   - a server that goes away (connection refused, reset, timed out) turns the operations
//     that needed it into `unavailable` results, counted, never an exception; the
//     connection is retried after `retry_after`; `reconnects` counts the connections
//     re-established;
//   - Redis Cluster (`server.cluster = true`): slot map from CLUSTER SLOTS, MOVED / ASK
//     followed (`redirects`);
//   - capacity: Redis's own maxmemory is not enough (it evicts chunks independently and
//     knows nothing of the scorer), so the backend counts the bytes it wrote (header +
//     payload) and, past `capacity_bytes`, deletes its scorer's victims (LRU by default)
//     in the same pipeline as the put. The budget is per writer: N nodes sharing a server
//     may store N x capacity_bytes. A value deleted behind its back (maxmemory, another
//     node) is a miss and leaves the index when found missing;
//   - every get checks header, key, chunk sizes and CRC-32C; a value that fails is
//     `corrupt` (a miss, counted) and is deleted.
// Pointing it at Valkey or a managed Redis: docs/storage.md.
//
// Costs: O(bytes) network transfer plus O(log n) index work per put/get; exists O(keys) on
// the wire. Thread-safe.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "hybridcache/concepts/demotion.hpp"
#include "hybridcache/concepts/storage_backend.hpp"
#include "hybridcache/core/error.hpp"
#include "hybridcache/tiered/backend_base.hpp"
#include "hybridcache/tiered/backend_index.hpp"
#include "hybridcache/tiered/demotion_policy.hpp"
#include "hybridcache/tiered/io_queue.hpp"
#include "hybridcache/tiered/redis/redis_pipeline.hpp"
#include "hybridcache/tiered/redis_protocol.hpp"
#include "hybridcache/tiered/storage_format.hpp"

namespace hybridcache::tiered {

/// Configuration of a Redis tier. Aggregate: designated initializers.
struct redis_backend_config {
  redis_connection_options server{};          ///< where the servers are, timeouts, AUTH (redis_pipeline.hpp)
  std::string key_prefix = "hc:";             ///< prefix of every key (no braces)
  std::int64_t capacity_bytes = 0;            ///< bytes this node may keep stored (header + payload)
  std::int64_t chunk_bytes = std::int64_t{1} << 20;  ///< payload chunks of at most this
  int connections = 2;                        ///< worker threads (and as many helper seats), each
                                              ///< with one connection per server
  std::int32_t queue_depth = 64;              ///< operations outstanding at most (submit is busy beyond)
};

namespace detail {
/// One queued operation of the Redis tier.
struct redis_job {
  enum class kind_t : std::uint8_t { none, put, get, exists, remove };
  kind_t kind = kind_t::none;
  storage_key key{};
  value_meta meta{};
  std::span<const std::byte> src{};
  std::span<std::byte> dst{};
  std::span<const storage_key> keys{};
  std::span<std::uint8_t> found{};
};
}  // namespace detail

template <demotion_scorer Scorer = lru_demotion>
class redis_backend : public backend_base<detail::redis_job, Scorer> {
 public:
  /// Validates the configuration and starts the workers. Connects lazily: a server that is
  /// down at start-up is not an error (its operations are `unavailable` until it is up).
  /// @throws invalid_argument naming the field: no endpoint, a bad port, capacity <= 0,
  /// chunk_bytes outside [4 KiB, 512 MiB], connections or queue_depth < 1, a timeout <= 0,
  /// braces in key_prefix, a database != 0 with a cluster or < 0.
  explicit redis_backend(redis_backend_config config, Scorer scorer = Scorer{})
      : base((validate(config), config.capacity_bytes), std::move(scorer)),
        config_(std::move(config)),
        pool_(config_.server, 2 * static_cast<std::size_t>(config_.connections)) {  // workers, then helper seats
    this->start(config_.queue_depth, config_.connections, [this](job& j, std::size_t seat) { return run(j, seat); },
                /*helpers=*/config_.connections);
  }
  ~redis_backend() {
    this->stop();  // queued jobs run first: they point into caller buffers
  }

  // --- storage_backend -----------------------------------------------------------------

  /// Publishes `payload` under `key` (replacing what is there). `payload` must stay valid
  /// until the ticket is waited on.
  [[nodiscard]] expected<io_ticket> put(const storage_key& key, const value_meta& meta,
                                        std::span<const std::byte> payload) {
    if (!valid_key(key) || !valid_meta(key, meta)) return unexpected(errc::invalid_argument);
    if (static_cast<std::int64_t>(value_header_bytes + payload.size()) > config_.capacity_bytes) {
      std::lock_guard lock(mu_);
      auto t = complete_now({io_status::too_large, 0, {}});
      if (t) counters_.put_failures += 1;
      return t;
    }
    return submit(job{job_kind::put, key, meta, payload, {}, {}, {}});
  }
  /// Reads the value under `key` into `into` (valid until the ticket is waited on).
  [[nodiscard]] expected<io_ticket> get(const storage_key& key, std::span<std::byte> into) {
    if (!valid_key(key)) return unexpected(errc::invalid_argument);
    auto t = submit(job{job_kind::get, key, {}, {}, into, {}, {}});
    if (t) {
      std::lock_guard lock(mu_);
      counters_.gets += 1;
      index_.touch(key);
    }
    return t;
  }
  /// found[i] = 1 when the servers hold a value under keys[i] (whoever wrote it): one
  /// pipelined round trip per shard.
  [[nodiscard]] expected<io_ticket> exists(std::span<const storage_key> keys, std::span<std::uint8_t> found) {
    if (keys.size() != found.size()) return unexpected(errc::invalid_argument);
    if (keys.empty()) {
      std::lock_guard lock(mu_);
      auto t = complete_now({io_status::ok, 0, {}});
      if (t) counters_.exists_calls += 1;
      return t;
    }
    return submit(job{job_kind::exists, {}, {}, {}, {}, keys, found});
  }
  /// Deletes the value under `key` (whoever wrote it).
  [[nodiscard]] expected<io_ticket> remove(const storage_key& key) {
    if (!valid_key(key)) return unexpected(errc::invalid_argument);
    return submit(job{job_kind::remove, key, {}, {}, {}, {}, {}});
  }

  /// The counters, with the connection pool's round trips, reconnects and redirects.
  [[nodiscard]] backend_counters counters() const {
    backend_counters c = base::counters();
    c.round_trips = pool_.round_trips();
    c.reconnects = pool_.reconnects();
    c.redirects = pool_.redirects();
    return c;
  }
  // poll, wait, wait_for, capacity_bytes, used_bytes (what this node wrote and still
  // counts), entries, set_score: backend_base.

  // --- beyond the concept ----------------------------------------------------------------

  /// The Redis key of chunk `i` of `key`'s value (for tools and tests).
  [[nodiscard]] std::string chunk_key_of(const storage_key& key, std::int64_t i) const {
    return chunk_key(config_.key_prefix, name_of(key), i);
  }
  [[nodiscard]] const redis_backend_config& config() const noexcept { return config_; }

 private:
  using base = backend_base<detail::redis_job, Scorer>;
  using base::complete_now, base::counters_, base::index_, base::mu_, base::submit, base::writing_bytes_;
  using job = detail::redis_job;
  using job_kind = detail::redis_job::kind_t;

  static void validate(const redis_backend_config& c) {
    auto fail = [](const std::string& what) { throw invalid_argument("redis_backend: " + what); };
    const redis_connection_options& o = c.server;
    if (o.endpoints.empty()) fail("field 'server.endpoints' is empty");
    for (const auto& e : o.endpoints)
      if (e.host.empty() || e.port <= 0 || e.port > 65535)
        fail("field 'server.endpoints': bad endpoint '" + e.host + ":" + std::to_string(e.port) + "'");
    if (o.connect_timeout.count() <= 0 || o.io_timeout.count() <= 0 || o.retry_after.count() < 0)
      fail("fields 'server.connect_timeout' and 'server.io_timeout' must be > 0, 'server.retry_after' >= 0");
    if (o.database < 0 || (o.cluster && o.database != 0)) fail("field 'server.database' must be >= 0, and 0 with a cluster");
    if (c.capacity_bytes <= 0) fail("field 'capacity_bytes' must be > 0, got " + std::to_string(c.capacity_bytes));
    if (c.chunk_bytes < 4096 || c.chunk_bytes > (std::int64_t{512} << 20))
      fail("field 'chunk_bytes' must be in [4096, 512 MiB], got " + std::to_string(c.chunk_bytes));
    if (c.connections < 1) fail("field 'connections' must be >= 1, got " + std::to_string(c.connections));
    if (c.queue_depth < 1) fail("field 'queue_depth' must be >= 1, got " + std::to_string(c.queue_depth));
    if (c.key_prefix.find_first_of("{}") != std::string::npos) fail("field 'key_prefix' must not contain braces");
  }

  static redis_command make_command(std::uint16_t slot, std::initializer_list<std::string_view> args) {
    redis_command c;
    c.slot = slot;
    c.args.assign(args.begin(), args.end());
    return c;
  }

  // --- the operations --------------------------------------------------------------------

  io_result run(job& j, std::size_t seat) {
    switch (j.kind) {
      case job_kind::put: return run_put(j, seat);
      case job_kind::get: return run_get(j, seat);
      case job_kind::exists: return run_exists(j, seat);
      case job_kind::remove: return run_remove(j, seat);
      case job_kind::none: break;
    }
    return {io_status::unavailable, 0, {}};
  }

  io_result run_put(job& j, std::size_t seat) {
    const storage_name name = name_of(j.key);
    const std::uint16_t slot = cluster_slot(name);
    const auto len = static_cast<std::int64_t>(j.src.size());
    const std::int64_t need = static_cast<std::int64_t>(value_header_bytes) + len;
    const std::int64_t chunk = config_.chunk_bytes;
    const std::int64_t n = chunk_count(len, chunk);
    // Room: the replaced value's row goes first, then the scorer's victims.
    std::vector<std::pair<storage_key, std::int64_t>> victims;
    {
      std::lock_guard lock(mu_);
      (void)index_.erase(j.key);
      while (index_.used_bytes() + writing_bytes_ + need > index_.capacity_bytes()) {
        auto v = index_.pop_victim();
        if (!v) break;
        counters_.evictions += 1;
        counters_.evicted_bytes += v->second.stored_bytes;
        victims.emplace_back(v->first, v->second.stored_bytes);
      }
      writing_bytes_ += need;
    }
    std::deque<std::string> keys;  // owns every key string the commands point to (stable addresses)
    std::vector<redis_command> cmds;
    for (const auto& [vk, bytes] : victims)
      append_delete(cmds, keys, vk, chunk_count(bytes - static_cast<std::int64_t>(value_header_bytes), chunk));
    const std::size_t first_set = cmds.size();
    // Payload chunks straight from the caller's buffer, then the header (chunk 0) last.
    std::array<std::byte, value_header_bytes> head{};
    encode_header({j.key, j.meta, crc32c(j.src), static_cast<std::uint32_t>(chunk), len}, head);
    for (std::int64_t i = n - 1; i >= 0; --i) {
      keys.push_back(chunk_key(config_.key_prefix, name, i));
      const std::byte* data = i == 0 ? head.data() : j.src.data() + (i - 1) * chunk;
      const std::int64_t size = i == 0 ? static_cast<std::int64_t>(value_header_bytes) : std::min(chunk, len - (i - 1) * chunk);
      cmds.push_back(make_command(slot, {"SET", keys.back(), {reinterpret_cast<const char*>(data), static_cast<std::size_t>(size)}}));
    }
    pool_.execute(seat, cmds);
    bool failed = false, refused = false;
    for (std::size_t i = first_set; i < cmds.size(); ++i) {
      failed = failed || cmds[i].failed;
      refused = refused || (!cmds[i].failed && cmds[i].reply->type != REDIS_REPLY_STATUS);  // e.g. OOM
    }
    if (refused && !failed) {  // leave no partial value behind
      std::vector<redis_command> del;
      append_delete(del, keys, j.key, n);
      pool_.execute(seat, del);
    }
    std::lock_guard lock(mu_);
    writing_bytes_ -= need;
    if (failed || refused) {
      counters_.put_failures += 1;
      if (failed) counters_.unavailable += 1;
      if (refused && !failed) counters_.no_space += 1;
      return {failed ? io_status::unavailable : io_status::no_space, 0, {}};
    }
    try {
      index_.insert(j.key, j.meta, need);
    } catch (...) {  // no memory for the row: stored but not counted; the next get finds it
    }
    counters_.puts += 1;
    counters_.put_bytes += len;
    return {io_status::ok, len, {}};
  }

  void append_delete(std::vector<redis_command>& cmds, std::deque<std::string>& keys, const storage_key& k, std::int64_t n) {
    const storage_name name = name_of(k);
    redis_command c = make_command(cluster_slot(name), {"DEL"});
    const std::size_t base = keys.size();
    for (std::int64_t i = 0; i < n; ++i) keys.push_back(chunk_key(config_.key_prefix, name, i));
    for (std::size_t i = base; i < keys.size(); ++i) c.args.emplace_back(keys[i]);
    cmds.push_back(std::move(c));
  }

  /// GETs chunks [0, n) of `name`; false when a connection failed.
  bool fetch(std::size_t seat, const storage_name& name, std::int64_t n, std::deque<std::string>& keys, std::vector<redis_command>& cmds) {
    const std::uint16_t slot = cluster_slot(name);
    keys.clear();
    cmds.clear();
    for (std::int64_t i = 0; i < n; ++i) keys.push_back(chunk_key(config_.key_prefix, name, i));
    for (const std::string& k : keys) cmds.push_back(make_command(slot, {"GET", k}));
    pool_.execute(seat, cmds);
    return std::none_of(cmds.begin(), cmds.end(), [](const redis_command& c) { return c.failed; });
  }

  io_result run_get(job& j, std::size_t seat) {
    const storage_name name = name_of(j.key);
    const std::int64_t chunk = config_.chunk_bytes;
    // Up to 4096 chunks in the first round: what the buffer can take, at this node's chunk
    // size (one round trip when the value was written with it).
    const std::int64_t guess = std::min<std::int64_t>(chunk_count(static_cast<std::int64_t>(j.dst.size()), chunk), 4096);
    std::deque<std::string> keys;
    std::vector<redis_command> cmds;
    const io_result r = read_value(seat, j, name, guess, keys, cmds);
    std::lock_guard lock(mu_);
    switch (r.status) {
      case io_status::ok:
        counters_.hits += 1;
        counters_.hit_bytes += r.bytes;
        break;
      case io_status::not_found:
        counters_.misses += 1;
        (void)index_.erase(j.key);
        break;
      case io_status::corrupt:
        counters_.corrupt += 1;
        (void)index_.erase(j.key);
        break;
      case io_status::unavailable: counters_.unavailable += 1; break;
      default: break;
    }
    return r;
  }

  io_result read_value(std::size_t seat, job& j, const storage_name& name, std::int64_t guess, std::deque<std::string>& keys,
                       std::vector<redis_command>& cmds) {
    if (!fetch(seat, name, guess, keys, cmds)) return {io_status::unavailable, 0, {}};
    const redisReply* c0 = cmds[0].reply.get();
    if (c0->type == REDIS_REPLY_NIL) return {io_status::not_found, 0, {}};
    auto discard = [&](std::int64_t n) {  // a value that fails its check is deleted
      std::vector<redis_command> del;
      std::deque<std::string> del_keys;
      append_delete(del, del_keys, j.key, std::max<std::int64_t>(n, 1));
      pool_.execute(seat, del);
      return io_result{io_status::corrupt, 0, {}};
    };
    if (c0->type != REDIS_REPLY_STRING || c0->len != value_header_bytes) return discard(1);
    const auto h = decode_header(std::span<const std::byte, value_header_bytes>(
        reinterpret_cast<const std::byte*>(c0->str), value_header_bytes));
    if (!h || h->key != j.key || h->chunk_bytes == 0) return discard(1);
    if (h->length > static_cast<std::int64_t>(j.dst.size())) return {io_status::too_large, h->length, {}};
    const std::int64_t hc = h->chunk_bytes;
    const std::int64_t n = chunk_count(h->length, hc);
    if (hc != config_.chunk_bytes || n > guess) {  // written with another chunk size
      if (!fetch(seat, name, n, keys, cmds)) return {io_status::unavailable, 0, {}};
      if (cmds[0].reply->type != REDIS_REPLY_STRING) return {io_status::not_found, 0, {}};
    }
    for (std::int64_t i = 1; i < n; ++i) {
      const redisReply* c = cmds[static_cast<std::size_t>(i)].reply.get();
      const std::int64_t size = std::min(hc, h->length - (i - 1) * hc);
      if (c->type != REDIS_REPLY_STRING || static_cast<std::int64_t>(c->len) != size) return discard(n);
      std::memcpy(j.dst.data() + (i - 1) * hc, c->str, static_cast<std::size_t>(size));
    }
    if (crc32c(std::span<const std::byte>(j.dst.data(), static_cast<std::size_t>(h->length))) != h->payload_crc)
      return discard(n);
    return {io_status::ok, h->length, h->meta};
  }

  io_result run_exists(job& j, std::size_t seat) {
    std::deque<std::string> keys;
    std::vector<redis_command> cmds;
    cmds.reserve(j.keys.size());
    for (const storage_key& k : j.keys) {
      const storage_name name = name_of(k);
      keys.push_back(chunk_key(config_.key_prefix, name, 0));
      cmds.push_back(make_command(cluster_slot(name), {"EXISTS", keys.back()}));
    }
    pool_.execute(seat, cmds);
    std::int64_t found = 0;
    bool failed = false;
    for (std::size_t i = 0; i < cmds.size(); ++i) {
      const bool yes = !cmds[i].failed && cmds[i].reply->type == REDIS_REPLY_INTEGER && cmds[i].reply->integer == 1;
      failed = failed || cmds[i].failed;
      j.found[i] = yes ? 1 : 0;
      found += yes;
    }
    std::lock_guard lock(mu_);
    counters_.exists_calls += 1;
    counters_.exists_keys += static_cast<std::int64_t>(j.keys.size());
    counters_.exists_found += found;
    if (failed) {
      counters_.unavailable += 1;
      return {io_status::unavailable, found, {}};
    }
    return {io_status::ok, found, {}};
  }

  io_result run_remove(job& j, std::size_t seat) {
    const storage_name name = name_of(j.key);
    std::deque<std::string> keys;
    std::vector<redis_command> cmds;
    if (!fetch(seat, name, 1, keys, cmds)) return unavailable_result();
    const redisReply* c0 = cmds[0].reply.get();
    std::int64_t n = 1;
    if (c0->type == REDIS_REPLY_NIL) {
      std::lock_guard lock(mu_);
      (void)index_.erase(j.key);
      return {io_status::not_found, 0, {}};
    }
    if (c0->type == REDIS_REPLY_STRING && c0->len == value_header_bytes)
      if (const auto h = decode_header(std::span<const std::byte, value_header_bytes>(
              reinterpret_cast<const std::byte*>(c0->str), value_header_bytes));
          h && h->chunk_bytes > 0)
        n = chunk_count(h->length, h->chunk_bytes);
    std::vector<redis_command> del;
    append_delete(del, keys, j.key, n);
    pool_.execute(seat, del);
    if (del[0].failed) return unavailable_result();
    std::lock_guard lock(mu_);
    (void)index_.erase(j.key);
    counters_.removes += 1;
    return {io_status::ok, 1, {}};
  }
  io_result unavailable_result() {
    std::lock_guard lock(mu_);
    counters_.unavailable += 1;
    return {io_status::unavailable, 0, {}};
  }

  redis_backend_config config_;
  redis_pipeline pool_;
};

static_assert(storage_backend<redis_backend<>>);

}  // namespace hybridcache::tiered
