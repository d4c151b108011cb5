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
// Layout in Redis (tiered/redis_keys.hpp): a value is its 64-byte header (the format of
// tiered/storage_format.hpp) under `<key_prefix>{<32 hex>}:0` and its payload split into
// chunks of at most `chunk_bytes` under `...:1`, `...:2`, ... The braces are a hash tag:
// every chunk of a value lives on the same shard, so one pipeline on one connection reads
// or writes a whole value. A put sends the payload chunks first and the header last, in one
// pipeline: a value is visible (EXISTS on chunk 0) only after all its chunks were accepted.
//
// Behaviour:
//   - pipelines: a put is one round trip (its evictions' DELs ride along); a get is one
//     round trip when the buffer's size covers the value (chunks are fetched up to the
//     buffer's size; a value written with another chunk size costs a second one); an exists
//     over any number of keys is one round trip (one per shard, all shards in parallel);
//   - a pool of 2 x `connections` connections per server: one per worker thread, and one
//     per helper seat (a thread waiting on an operation no worker has started runs it
//     itself on a pooled connection: tiered/io_queue.hpp), each with connect and I/O
//     timeouts;
//   - a server that goes away (connection refused, reset, timed out) turns the operations
//     that needed it into `unavailable` results, counted, never an exception; the
//     connection is retried after `retry_after`, so a dead server costs nothing per call in
//     between; `reconnects` counts the connections re-established;
//   - Redis Cluster (`cluster = true`): the slot map comes from CLUSTER SLOTS of any
//     reachable endpoint; a MOVED answer updates the map and the command is resent to the
//     new owner; an ASK answer resends it once to the named node after ASKING;
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

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <sys/time.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "hybridcache/concepts/demotion.hpp"
#include "hybridcache/concepts/storage_backend.hpp"
#include "hybridcache/core/error.hpp"
#include "hybridcache/tiered/backend_index.hpp"
#include "hybridcache/tiered/demotion_policy.hpp"
#include "hybridcache/tiered/io_queue.hpp"
#include "hybridcache/tiered/redis_keys.hpp"
#include "hybridcache/tiered/storage_format.hpp"

namespace hybridcache::tiered {

/// One Redis server (or cluster node) to reach.
struct redis_endpoint {
  std::string host = "127.0.0.1";
  int port = 6379;
};

/// Configuration of a Redis tier. Aggregate: designated initializers.
struct redis_backend_config {
  /// The server, or for a cluster any of its nodes (the others are found by CLUSTER SLOTS).
  std::vector<redis_endpoint> endpoints{};
  bool cluster = false;                       ///< Redis Cluster: route by slot, follow MOVED/ASK
  std::string key_prefix = "hc:";             ///< prefix of every key (no braces)
  std::int64_t capacity_bytes = 0;            ///< bytes this node may keep stored (header + payload)
  std::int64_t chunk_bytes = std::int64_t{1} << 20;  ///< a value is split into chunks of at most this
  int connections = 2;                        ///< connections per server = worker threads
  std::int32_t queue_depth = 64;              ///< operations outstanding at most (submit is busy beyond)
  std::chrono::milliseconds connect_timeout{500};
  std::chrono::milliseconds io_timeout{2000};  ///< per read or write on a connection
  std::chrono::milliseconds retry_after{200};  ///< a failed connection is retried after this
  std::string username{};                      ///< AUTH user (ACL); empty: AUTH with password only
  std::string password{};                      ///< empty: no AUTH
  int database = 0;                            ///< SELECT (standalone servers only)
};

template <demotion_scorer Scorer = lru_demotion>
class redis_backend {
 public:
  /// Validates the configuration and starts the workers. Connects lazily: a server that is
  /// down at start-up is not an error (its operations are `unavailable` until it is up).
  /// @throws invalid_argument naming the field: no endpoint, a bad port, capacity <= 0,
  /// chunk_bytes outside [4 KiB, 512 MiB], connections or queue_depth < 1, a timeout <= 0,
  /// braces in key_prefix, a database != 0 with a cluster or < 0.
  explicit redis_backend(redis_backend_config config, Scorer scorer = Scorer{})
      : config_(std::move(config)), index_(config_.capacity_bytes, std::move(scorer)) {
    validate();
    workers_.resize(2 * static_cast<std::size_t>(config_.connections));  // workers, then helper seats
    queue_ = std::make_unique<io_queue<job>>(config_.queue_depth, config_.connections,
                                             [this](job& j, std::size_t w) { return run(j, workers_[w]); },
                                             /*helpers=*/config_.connections);
  }
  ~redis_backend() {
    if (queue_) queue_->shutdown();
    for (worker& w : workers_)
      for (auto& [node, c] : w.conns)
        if (c.ctx != nullptr) redisFree(c.ctx);
  }
  redis_backend(const redis_backend&) = delete;
  redis_backend& operator=(const redis_backend&) = delete;

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

  [[nodiscard]] expected<bool> poll(io_ticket t) const { return queue_->poll(t); }
  [[nodiscard]] expected<io_result> wait(io_ticket t) { return queue_->wait(t); }
  [[nodiscard]] expected<io_result> wait_for(io_ticket t, std::chrono::nanoseconds timeout) {
    return queue_->wait_for(t, timeout);
  }

  [[nodiscard]] backend_counters counters() const {
    std::lock_guard lock(mu_);
    return counters_;
  }
  [[nodiscard]] std::int64_t capacity_bytes() const {
    std::lock_guard lock(mu_);
    return index_.capacity_bytes();
  }
  /// Bytes this node wrote and still counts (header + payload), plus those being written.
  [[nodiscard]] std::int64_t used_bytes() const {
    std::lock_guard lock(mu_);
    return index_.used_bytes() + writing_bytes_;
  }

  // --- beyond the concept ----------------------------------------------------------------

  /// Values this node wrote and still counts.
  [[nodiscard]] std::int64_t entries() const {
    std::lock_guard lock(mu_);
    return static_cast<std::int64_t>(index_.size());
  }
  /// Sets a value's score (read by `car_score_demotion`). No-op for a key not written here.
  void set_score(const storage_key& key, double score) {
    std::lock_guard lock(mu_);
    index_.set_score(key, score);
  }
  /// The Redis key of chunk `i` of `key`'s value (for tools and tests).
  [[nodiscard]] std::string chunk_key_of(const storage_key& key, std::int64_t i) const {
    return chunk_key(config_.key_prefix, name_of(key), i);
  }
  [[nodiscard]] const redis_backend_config& config() const noexcept { return config_; }

 private:
  enum class job_kind : std::uint8_t { none, put, get, exists, remove };
  struct job {
    job_kind kind = job_kind::none;
    storage_key key{};
    value_meta meta{};
    std::span<const std::byte> src{};
    std::span<std::byte> dst{};
    std::span<const storage_key> keys{};
    std::span<std::uint8_t> found{};
  };

  /// One connection of one worker to one node ("host:port").
  struct connection {
    redisContext* ctx = nullptr;
    std::chrono::steady_clock::time_point retry_at{};
    bool ever_connected = false;
  };
  struct reply_deleter {
    void operator()(redisReply* r) const noexcept {
      if (r != nullptr) freeReplyObject(r);
    }
  };
  using reply_ptr = std::unique_ptr<redisReply, reply_deleter>;

  /// One command of a pipeline: its arguments (pointers into `owned` or caller memory),
  /// its slot, where it went, and its reply.
  struct command {
    std::vector<const char*> argv;
    std::vector<std::size_t> len;
    std::uint16_t slot = 0;
    std::string target;  ///< "host:port" of a redirect, empty: route by slot
    bool asking = false;
    bool failed = false;  ///< the connection failed: no reply
    reply_ptr reply;
  };
  /// The connections of one worker thread or helper seat, by node.
  struct worker {
    std::unordered_map<std::string, connection> conns;
  };

  void validate() const {
    const auto& c = config_;
    auto fail = [](const std::string& what) { throw invalid_argument("redis_backend: " + what); };
    if (c.endpoints.empty()) fail("field 'endpoints' is empty");
    for (const auto& e : c.endpoints)
      if (e.host.empty() || e.port <= 0 || e.port > 65535)
        fail("field 'endpoints': bad endpoint '" + e.host + ":" + std::to_string(e.port) + "'");
    if (c.capacity_bytes <= 0) fail("field 'capacity_bytes' must be > 0, got " + std::to_string(c.capacity_bytes));
    if (c.chunk_bytes < 4096 || c.chunk_bytes > (std::int64_t{512} << 20))
      fail("field 'chunk_bytes' must be in [4096, 512 MiB], got " + std::to_string(c.chunk_bytes));
    if (c.connections < 1) fail("field 'connections' must be >= 1, got " + std::to_string(c.connections));
    if (c.queue_depth < 1) fail("field 'queue_depth' must be >= 1, got " + std::to_string(c.queue_depth));
    if (c.connect_timeout.count() <= 0 || c.io_timeout.count() <= 0 || c.retry_after.count() < 0)
      fail("fields 'connect_timeout' and 'io_timeout' must be > 0 and 'retry_after' >= 0");
    if (c.key_prefix.find_first_of("{}") != std::string::npos) fail("field 'key_prefix' must not contain braces");
    if (c.database < 0 || (c.cluster && c.database != 0)) fail("field 'database' must be >= 0, and 0 with a cluster");
  }

  expected<io_ticket> submit(job&& j) {
    auto t = queue_->submit(std::move(j));
    if (!t) {
      std::lock_guard lock(mu_);
      counters_.rejected_busy += 1;
    }
    return t;
  }
  expected<io_ticket> complete_now(const io_result& r) {  // callers hold mu_
    auto t = queue_->complete_now(r);
    if (!t) counters_.rejected_busy += 1;
    return t;
  }

  // --- connections and routing -----------------------------------------------------------

  static std::string node_name(const std::string& host, int port) { return host + ":" + std::to_string(port); }
  static std::pair<std::string, int> split_node(const std::string& node) {
    const std::size_t colon = node.rfind(':');
    int port = 0;
    std::from_chars(node.data() + colon + 1, node.data() + node.size(), port);
    return {node.substr(0, colon), port};
  }

  /// The connection of `w` to `node`, connecting when needed; nullptr when the node is
  /// unreachable (or was, less than `retry_after` ago).
  redisContext* connect(worker& w, const std::string& node) {
    connection& c = w.conns[node];
    if (c.ctx != nullptr) return c.ctx;
    const auto now = std::chrono::steady_clock::now();
    if (now < c.retry_at) return nullptr;
    const auto [host, port] = split_node(node);
    redisContext* ctx = redisConnectWithTimeout(host.c_str(), port, to_timeval(config_.connect_timeout));
    bool ok = ctx != nullptr && ctx->err == 0 && redisSetTimeout(ctx, to_timeval(config_.io_timeout)) == REDIS_OK;
    if (ok) (void)redisEnableKeepAlive(ctx);
    if (ok && !config_.password.empty()) {
      reply_ptr r(static_cast<redisReply*>(
          config_.username.empty()
              ? redisCommand(ctx, "AUTH %b", config_.password.data(), config_.password.size())
              : redisCommand(ctx, "AUTH %b %b", config_.username.data(), config_.username.size(),
                             config_.password.data(), config_.password.size())));
      ok = r && r->type == REDIS_REPLY_STATUS;
    }
    if (ok && config_.database != 0) {
      reply_ptr r(static_cast<redisReply*>(redisCommand(ctx, "SELECT %d", config_.database)));
      ok = r && r->type == REDIS_REPLY_STATUS;
    }
    if (!ok) {
      if (ctx != nullptr) redisFree(ctx);
      c.retry_at = now + config_.retry_after;
      return nullptr;
    }
    if (c.ever_connected) {
      std::lock_guard lock(mu_);
      counters_.reconnects += 1;
    }
    c.ever_connected = true;
    c.ctx = ctx;
    return ctx;
  }
  void drop(worker& w, const std::string& node) {
    connection& c = w.conns[node];
    if (c.ctx != nullptr) redisFree(c.ctx);
    c.ctx = nullptr;
    c.retry_at = std::chrono::steady_clock::now() + config_.retry_after;
  }
  static timeval to_timeval(std::chrono::milliseconds ms) {
    timeval tv{};
    tv.tv_sec = static_cast<decltype(tv.tv_sec)>(ms.count() / 1000);
    tv.tv_usec = static_cast<decltype(tv.tv_usec)>((ms.count() % 1000) * 1000);
    return tv;
  }

  /// The node serving `slot` ("host:port").
  std::string route(worker& w, std::uint16_t slot) {
    if (!config_.cluster) return node_name(config_.endpoints.front().host, config_.endpoints.front().port);
    {
      std::lock_guard lock(map_mu_);
      if (map_ready_ && slot_owner_[slot] != no_owner) return nodes_[slot_owner_[slot]];
    }
    refresh_slots(w);
    std::lock_guard lock(map_mu_);
    if (map_ready_ && slot_owner_[slot] != no_owner) return nodes_[slot_owner_[slot]];
    return node_name(config_.endpoints.front().host, config_.endpoints.front().port);
  }

  /// Reloads the slot map from CLUSTER SLOTS of the first node that answers.
  void refresh_slots(worker& w) {
    std::vector<std::string> candidates;
    {
      std::lock_guard lock(map_mu_);
      candidates = nodes_;
    }
    for (const auto& e : config_.endpoints) candidates.push_back(node_name(e.host, e.port));
    for (const std::string& node : candidates) {
      redisContext* ctx = connect(w, node);
      if (ctx == nullptr) continue;
      reply_ptr r(static_cast<redisReply*>(redisCommand(ctx, "CLUSTER SLOTS")));
      if (!r) {
        drop(w, node);
        continue;
      }
      if (r->type != REDIS_REPLY_ARRAY) continue;
      std::lock_guard lock(map_mu_);
      slot_owner_.fill(no_owner);
      for (std::size_t i = 0; i < r->elements; ++i) {
        const redisReply* range = r->element[i];
        if (range->type != REDIS_REPLY_ARRAY || range->elements < 3) continue;
        const redisReply* master = range->element[2];
        if (master->type != REDIS_REPLY_ARRAY || master->elements < 2 || master->element[0]->type != REDIS_REPLY_STRING)
          continue;
        std::string host(master->element[0]->str, master->element[0]->len);
        if (host.empty()) host = split_node(node).first;  // "": the node we asked
        const std::string name = node_name(host, static_cast<int>(master->element[1]->integer));
        auto it = std::find(nodes_.begin(), nodes_.end(), name);
        if (it == nodes_.end()) it = nodes_.insert(nodes_.end(), name);
        const auto owner = static_cast<std::uint16_t>(it - nodes_.begin());
        for (long long s = range->element[0]->integer; s <= range->element[1]->integer && s < cluster_slots; ++s)
          slot_owner_[static_cast<std::size_t>(s)] = owner;
      }
      map_ready_ = true;
      return;
    }
  }

  /// Runs `cmds` as pipelines, all nodes in parallel: append everything, flush every
  /// connection, then read the replies in order. MOVED/ASK answers are resent (at most
  /// three rounds). A command whose connection fails is marked `failed`.
  void execute(worker& w, std::vector<command>& cmds) {
    for (int round = 0; round < 4; ++round) {
      std::vector<std::pair<std::string, command*>> sent;
      std::vector<std::string> used;
      for (command& c : cmds) {
        if (c.reply || c.failed) continue;
        std::string node = c.target.empty() ? route(w, c.slot) : c.target;
        redisContext* ctx = connect(w, node);
        bool ok = ctx != nullptr;
        if (ok && c.asking) ok = redisAppendCommand(ctx, "ASKING") == REDIS_OK;
        ok = ok && redisAppendCommandArgv(ctx, static_cast<int>(c.argv.size()), c.argv.data(), c.len.data()) == REDIS_OK;
        if (!ok) {
          c.failed = true;
          continue;
        }
        if (std::find(used.begin(), used.end(), node) == used.end()) used.push_back(node);
        sent.emplace_back(std::move(node), &c);
      }
      if (sent.empty()) return;
      for (const std::string& node : used) {  // flush every connection before reading any
        redisContext* ctx = w.conns[node].ctx;
        int done = 0;
        while (done == 0)
          if (redisBufferWrite(ctx, &done) != REDIS_OK) {
            drop(w, node);
            break;
          }
      }
      {
        std::lock_guard lock(mu_);
        counters_.round_trips += 1;
      }
      bool redirected = false;
      for (auto& [node, c] : sent) {
        redisContext* ctx = w.conns[node].ctx;
        if (ctx == nullptr) {
          c->failed = true;
          continue;
        }
        void* raw = nullptr;
        if (c->asking) {  // the ASKING reply
          if (redisGetReply(ctx, &raw) != REDIS_OK) {
            drop(w, node);
            c->failed = true;
            continue;
          }
          freeReplyObject(raw);
          raw = nullptr;
        }
        if (redisGetReply(ctx, &raw) != REDIS_OK) {
          drop(w, node);
          c->failed = true;
          continue;
        }
        reply_ptr r(static_cast<redisReply*>(raw));
        c->asking = false;
        if (r->type == REDIS_REPLY_ERROR && config_.cluster) {
          if (auto redirect = parse_redirect(std::string_view(r->str, r->len)); redirect) {
            if (redirect->host.empty()) redirect->host = split_node(node).first;
            c->target = node_name(redirect->host, redirect->port);
            c->asking = redirect->ask;
            if (!redirect->ask) redirected = true;
            std::lock_guard lock(mu_);
            counters_.redirects += 1;
            continue;  // resent next round
          }
        }
        c->reply = std::move(r);
      }
      if (redirected) refresh_slots(w);
    }
    for (command& c : cmds)
      if (!c.reply) c.failed = true;  // still redirected after four rounds
  }

  static command make_command(std::uint16_t slot, std::initializer_list<std::string_view> args) {
    command c;
    c.slot = slot;
    for (std::string_view a : args) {
      c.argv.push_back(a.data());
      c.len.push_back(a.size());
    }
    return c;
  }

  // --- the operations --------------------------------------------------------------------

  io_result run(job& j, worker& w) {
    // Writing to a connection the server closed raises SIGPIPE, which would end the
    // process; blocked in the worker threads (a thread's own mask, nothing process-wide),
    // the write fails with EPIPE and the operation is `unavailable`.
    static thread_local const bool sigpipe_blocked = [] {
      sigset_t set;
      sigemptyset(&set);
      sigaddset(&set, SIGPIPE);
      return pthread_sigmask(SIG_BLOCK, &set, nullptr) == 0;
    }();
    (void)sigpipe_blocked;
    switch (j.kind) {
      case job_kind::put: return run_put(j, w);
      case job_kind::get: return run_get(j, w);
      case job_kind::exists: return run_exists(j, w);
      case job_kind::remove: return run_remove(j, w);
      case job_kind::none: break;
    }
    return {io_status::unavailable, 0, {}};
  }

  io_result run_put(job& j, worker& w) {
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
    std::vector<command> cmds;
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
    execute(w, cmds);
    bool failed = false, refused = false;
    for (std::size_t i = first_set; i < cmds.size(); ++i) {
      failed = failed || cmds[i].failed;
      refused = refused || (!cmds[i].failed && cmds[i].reply->type != REDIS_REPLY_STATUS);  // e.g. OOM
    }
    if (refused && !failed) {  // leave no partial value behind
      std::vector<command> del;
      append_delete(del, keys, j.key, n);
      execute(w, del);
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

  void append_delete(std::vector<command>& cmds, std::deque<std::string>& keys, const storage_key& k, std::int64_t n) {
    const storage_name name = name_of(k);
    command c = make_command(cluster_slot(name), {"DEL"});
    const std::size_t base = keys.size();
    for (std::int64_t i = 0; i < n; ++i) keys.push_back(chunk_key(config_.key_prefix, name, i));
    for (std::size_t i = base; i < keys.size(); ++i) {
      c.argv.push_back(keys[i].data());
      c.len.push_back(keys[i].size());
    }
    cmds.push_back(std::move(c));
  }

  /// GETs chunks [0, n) of `name`; false when a connection failed.
  bool fetch(worker& w, const storage_name& name, std::int64_t n, std::deque<std::string>& keys, std::vector<command>& cmds) {
    const std::uint16_t slot = cluster_slot(name);
    keys.clear();
    cmds.clear();
    for (std::int64_t i = 0; i < n; ++i) keys.push_back(chunk_key(config_.key_prefix, name, i));
    for (const std::string& k : keys) cmds.push_back(make_command(slot, {"GET", k}));
    execute(w, cmds);
    return std::none_of(cmds.begin(), cmds.end(), [](const command& c) { return c.failed; });
  }

  io_result run_get(job& j, worker& w) {
    const storage_name name = name_of(j.key);
    const std::int64_t chunk = config_.chunk_bytes;
    // Up to 4096 chunks in the first round: what the buffer can take, at this node's chunk
    // size (one round trip when the value was written with it).
    const std::int64_t guess = std::min<std::int64_t>(chunk_count(static_cast<std::int64_t>(j.dst.size()), chunk), 4096);
    std::deque<std::string> keys;
    std::vector<command> cmds;
    const io_result r = read_value(w, j, name, guess, keys, cmds);
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

  io_result read_value(worker& w, job& j, const storage_name& name, std::int64_t guess, std::deque<std::string>& keys,
                       std::vector<command>& cmds) {
    if (!fetch(w, name, guess, keys, cmds)) return {io_status::unavailable, 0, {}};
    const redisReply* c0 = cmds[0].reply.get();
    if (c0->type == REDIS_REPLY_NIL) return {io_status::not_found, 0, {}};
    auto discard = [&](std::int64_t n) {  // a value that fails its check is deleted
      std::vector<command> del;
      std::deque<std::string> del_keys;
      append_delete(del, del_keys, j.key, std::max<std::int64_t>(n, 1));
      execute(w, del);
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
      if (!fetch(w, name, n, keys, cmds)) return {io_status::unavailable, 0, {}};
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

  io_result run_exists(job& j, worker& w) {
    std::deque<std::string> keys;
    std::vector<command> cmds;
    cmds.reserve(j.keys.size());
    for (const storage_key& k : j.keys) {
      const storage_name name = name_of(k);
      keys.push_back(chunk_key(config_.key_prefix, name, 0));
      cmds.push_back(make_command(cluster_slot(name), {"EXISTS", keys.back()}));
    }
    execute(w, cmds);
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

  io_result run_remove(job& j, worker& w) {
    const storage_name name = name_of(j.key);
    std::deque<std::string> keys;
    std::vector<command> cmds;
    if (!fetch(w, name, 1, keys, cmds)) return unavailable_result();
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
    std::vector<command> del;
    append_delete(del, keys, j.key, n);
    execute(w, del);
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

  static constexpr std::uint16_t no_owner = 0xffff;

  redis_backend_config config_;
  mutable std::mutex mu_;
  backend_index<Scorer> index_;
  std::int64_t writing_bytes_ = 0;
  backend_counters counters_;
  std::mutex map_mu_;  // the cluster slot map
  std::vector<std::string> nodes_;
  std::array<std::uint16_t, cluster_slots> slot_owner_{};
  bool map_ready_ = false;
  std::vector<worker> workers_;
  std::unique_ptr<io_queue<job>> queue_;  // last: its workers use everything above
};

static_assert(storage_backend<redis_backend<>>);

}  // namespace hybridcache::tiered
