// hybridcache/tiered/redis/redis_pipeline.hpp
//
// `redis_pipeline`: the connections of the Redis tier (tiered/redis/redis_backend.hpp) and
// the one thing it does with them: run a batch of commands as pipelines, every node in
// parallel, and hand back each command's reply. OPT-IN: needs hiredis (target
// hybridcache::redis).
//
// - Seats: the pool holds one set of connections per seat (a worker thread or a helper
//   seat of the backend's io_queue), one connection per node; a seat is used by one thread
//   at a time, so connections need no lock.
// - A batch: every command is routed (standalone: the one server; cluster: the slot map),
//   written to its node's connection with writev (tiered/redis_protocol.hpp `resp_writer`:
//   large arguments are sent from the caller's memory), all nodes are flushed before any
//   reply is read, then the replies are read in order with hiredis's reader. One batch is
//   one round trip (`round_trips`), whatever the number of commands and nodes.
// - Cluster: the slot map comes from CLUSTER SLOTS of the first node that answers; a MOVED
//   answer refreshes it and resends the command to the new owner; an ASK answer resends it
//   once to the named node after ASKING (`redirects`); at most four rounds.
// - Failures: a node that refuses the connection, resets it or times out marks its
//   commands `failed` (no reply, never an exception); its connection is dropped and retried
//   no sooner than `retry_after`, so a dead node costs nothing per call in between;
//   `reconnects` counts connections re-established after a failure. Every command, AUTH and
//   CLUSTER SLOTS included, is written with sendmsg(MSG_NOSIGNAL) (hiredis only parses
//   replies), so a closed connection is an error return, never a SIGPIPE, and no thread's
//   signal mask is touched.
//
// Costs: O(commands + bytes) per batch plus one connect per node after a failure; the slot
// map is a 16,384-entry table behind a mutex (one lookup per command).
#pragma once

#include <hiredis/hiredis.h>
#include <sys/time.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "hybridcache/tiered/redis_protocol.hpp"

namespace hybridcache::tiered {

/// One Redis server (or cluster node) to reach.
struct redis_endpoint {
  std::string host = "127.0.0.1";
  int port = 6379;
};

/// How to reach a Redis deployment. Aggregate: designated initializers.
struct redis_connection_options {
  std::vector<redis_endpoint> endpoints{};  ///< the server, or any nodes of a cluster
  bool cluster = false;                     ///< Redis Cluster: route by slot, follow MOVED/ASK
  std::chrono::milliseconds connect_timeout{500};
  std::chrono::milliseconds io_timeout{2000};
  std::chrono::milliseconds retry_after{200};
  std::string username{};  ///< AUTH user (ACL); empty: AUTH with the password only
  std::string password{};  ///< empty: no AUTH
  int database = 0;        ///< SELECT (standalone servers only)
};

/// One command of a batch and, after `execute`, its reply.
struct redis_command {
  struct reply_deleter {
    void operator()(redisReply* r) const noexcept {
      if (r != nullptr) freeReplyObject(r);
    }
  };
  std::vector<std::string_view> args;  ///< the caller keeps the bytes alive during execute
  std::uint16_t slot = 0;
  std::string target{};  ///< "host:port" after a redirect; empty: route by slot
  bool asking = false;
  bool failed = false;  ///< its connection failed: no reply
  std::unique_ptr<redisReply, reply_deleter> reply{};
};

class redis_pipeline {
 public:
  /// Connects lazily. Validation of `options` is the caller's (redis_backend's).
  redis_pipeline(redis_connection_options options, std::size_t seats)
      : options_(std::move(options)), seats_(seats) {
    slot_owner_.fill(no_owner);
  }
  ~redis_pipeline() {
    for (seat& s : seats_)
      for (auto& [node, c] : s.conns)
        if (c.ctx != nullptr) redisFree(c.ctx);
  }
  redis_pipeline(const redis_pipeline&) = delete;
  redis_pipeline& operator=(const redis_pipeline&) = delete;

  /// Runs `cmds` on `seat`'s connections (see the file comment); every command ends with a
  /// reply or `failed`.
  void execute(std::size_t seat_index, std::vector<redis_command>& cmds) {
    seat& s = seats_.at(seat_index);
    std::unordered_map<std::string, resp_writer> wire;
    for (int round = 0; round < 4; ++round) {
      std::vector<std::pair<std::string, redis_command*>> sent;
      wire.clear();
      for (redis_command& c : cmds) {
        if (c.reply || c.failed) continue;
        std::string node = c.target.empty() ? route(s, c.slot) : c.target;
        if (connect(s, node) == nullptr) {
          c.failed = true;
          continue;
        }
        resp_writer& w = wire[node];
        if (c.asking) w.command({"ASKING"});
        w.command(c.args.begin(), c.args.end());
        sent.emplace_back(std::move(node), &c);
      }
      if (sent.empty()) return;
      for (auto& [node, w] : wire)  // flush every node before reading any reply
        if (w.send(s.conns[node].ctx->fd) != 0) drop(s, node);
      round_trips_.fetch_add(1, std::memory_order_relaxed);
      bool moved = false;
      for (auto& [node, c] : sent) {
        redisContext* ctx = s.conns[node].ctx;
        void* raw = nullptr;
        if (ctx != nullptr && c->asking) {  // the ASKING reply
          if (redisGetReply(ctx, &raw) == REDIS_OK) freeReplyObject(raw);
          else drop(s, node);
          ctx = s.conns[node].ctx;
          raw = nullptr;
        }
        if (ctx == nullptr || redisGetReply(ctx, &raw) != REDIS_OK) {
          if (ctx != nullptr) drop(s, node);
          c->failed = true;
          continue;
        }
        reply_ptr r(static_cast<redisReply*>(raw));
        c->asking = false;
        if (r->type == REDIS_REPLY_ERROR && options_.cluster) {
          if (auto redirect = parse_redirect(std::string_view(r->str, r->len)); redirect) {
            if (redirect->host.empty()) redirect->host = split_node(node).first;
            c->target = node_name(redirect->host, redirect->port);
            c->asking = redirect->ask;
            moved = moved || !redirect->ask;
            redirects_.fetch_add(1, std::memory_order_relaxed);
            continue;  // resent next round
          }
        }
        c->reply = std::move(r);
      }
      if (moved) refresh_slots(s);
    }
    for (redis_command& c : cmds)
      if (!c.reply) c.failed = true;  // still redirected after four rounds
  }

  [[nodiscard]] std::int64_t round_trips() const noexcept { return round_trips_.load(std::memory_order_relaxed); }
  [[nodiscard]] std::int64_t reconnects() const noexcept { return reconnects_.load(std::memory_order_relaxed); }
  [[nodiscard]] std::int64_t redirects() const noexcept { return redirects_.load(std::memory_order_relaxed); }

 private:
  static constexpr std::uint16_t no_owner = 0xffff;

  struct connection {
    redisContext* ctx = nullptr;
    std::chrono::steady_clock::time_point retry_at{};
    bool ever_connected = false;
  };
  struct seat {
    std::unordered_map<std::string, connection> conns;  // by "host:port"
  };

  using reply_ptr = std::unique_ptr<redisReply, redis_command::reply_deleter>;

  /// One command outside a batch (AUTH, SELECT, CLUSTER SLOTS): sent with sendmsg, reply
  /// parsed by hiredis. nullptr when the connection failed.
  static reply_ptr call(redisContext* ctx, std::initializer_list<std::string_view> args) {
    resp_writer w;
    w.command(args);
    void* raw = nullptr;
    if (w.send(ctx->fd) != 0 || redisGetReply(ctx, &raw) != REDIS_OK) return nullptr;
    return reply_ptr(static_cast<redisReply*>(raw));
  }
  static std::string node_name(const std::string& host, int port) { return host + ":" + std::to_string(port); }
  static std::pair<std::string, int> split_node(const std::string& node) {
    const std::size_t colon = node.rfind(':');
    int port = 0;
    std::from_chars(node.data() + colon + 1, node.data() + node.size(), port);
    return {node.substr(0, colon), port};
  }
  static timeval to_timeval(std::chrono::milliseconds ms) {
    timeval tv{};
    tv.tv_sec = static_cast<decltype(tv.tv_sec)>(ms.count() / 1000);
    tv.tv_usec = static_cast<decltype(tv.tv_usec)>((ms.count() % 1000) * 1000);
    return tv;
  }

  /// `s`'s connection to `node`, connecting when needed; nullptr when the node is
  /// unreachable (or was, less than `retry_after` ago).
  redisContext* connect(seat& s, const std::string& node) {
    connection& c = s.conns[node];
    if (c.ctx != nullptr) return c.ctx;
    const auto now = std::chrono::steady_clock::now();
    if (now < c.retry_at) return nullptr;
    const auto [host, port] = split_node(node);
    redisContext* ctx = redisConnectWithTimeout(host.c_str(), port, to_timeval(options_.connect_timeout));
    bool ok = ctx != nullptr && ctx->err == 0 && redisSetTimeout(ctx, to_timeval(options_.io_timeout)) == REDIS_OK;
    if (ok) {
      (void)redisEnableKeepAlive(ctx);
      ctx->reader->maxbuf = 0;  // keep the read buffer: no fresh pages faulted in per reply
    }
    auto simple = [](const reply_ptr& r) { return r && r->type == REDIS_REPLY_STATUS; };
    if (ok && !options_.password.empty())
      ok = simple(options_.username.empty() ? call(ctx, {"AUTH", options_.password})
                                            : call(ctx, {"AUTH", options_.username, options_.password}));
    if (ok && options_.database != 0) ok = simple(call(ctx, {"SELECT", std::to_string(options_.database)}));
    if (!ok) {
      if (ctx != nullptr) redisFree(ctx);
      c.retry_at = now + options_.retry_after;
      return nullptr;
    }
    if (c.ever_connected) reconnects_.fetch_add(1, std::memory_order_relaxed);
    c.ever_connected = true;
    c.ctx = ctx;
    return ctx;
  }
  void drop(seat& s, const std::string& node) {
    connection& c = s.conns[node];
    if (c.ctx != nullptr) redisFree(c.ctx);
    c.ctx = nullptr;
    c.retry_at = std::chrono::steady_clock::now() + options_.retry_after;
  }

  /// The node serving `slot`.
  std::string route(seat& s, std::uint16_t slot) {
    const std::string first = node_name(options_.endpoints.front().host, options_.endpoints.front().port);
    if (!options_.cluster) return first;
    for (int attempt = 0; attempt < 2; ++attempt) {
      {
        std::lock_guard lock(map_mu_);
        if (slot_owner_[slot] != no_owner) return nodes_[slot_owner_[slot]];
      }
      if (attempt == 0) refresh_slots(s);
    }
    return first;  // no map: the seed answers MOVED if it is not the owner
  }

  /// Reloads the slot map from CLUSTER SLOTS of the first node that answers.
  void refresh_slots(seat& s) {
    std::vector<std::string> candidates;
    {
      std::lock_guard lock(map_mu_);
      candidates = nodes_;
    }
    for (const auto& e : options_.endpoints) candidates.push_back(node_name(e.host, e.port));
    for (const std::string& node : candidates) {
      redisContext* ctx = connect(s, node);
      if (ctx == nullptr) continue;
      const reply_ptr r = call(ctx, {"CLUSTER", "SLOTS"});
      if (!r) {
        drop(s, node);
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
        if (host.empty()) host = split_node(node).first;  // "": the node asked
        const std::string name = node_name(host, static_cast<int>(master->element[1]->integer));
        auto it = std::find(nodes_.begin(), nodes_.end(), name);
        if (it == nodes_.end()) it = nodes_.insert(nodes_.end(), name);
        const auto owner = static_cast<std::uint16_t>(it - nodes_.begin());
        for (long long slot = range->element[0]->integer; slot <= range->element[1]->integer && slot < cluster_slots; ++slot)
          slot_owner_[static_cast<std::size_t>(slot)] = owner;
      }
      return;
    }
  }

  redis_connection_options options_;
  std::vector<seat> seats_;
  std::mutex map_mu_;  // the cluster slot map
  std::vector<std::string> nodes_;
  std::array<std::uint16_t, cluster_slots> slot_owner_{};
  std::atomic<std::int64_t> round_trips_{0}, reconnects_{0}, redirects_{0};
};

}  // namespace hybridcache::tiered
