// A binary-safe Redis client for the tests' own pokes at a server (hiredis), beside the
// backend under test: read and overwrite chunks, run admin commands, migrate slots.
#pragma once

#include <doctest/doctest.h>
#include <hiredis/hiredis.h>

#include <optional>
#include <string>
#include <vector>

namespace hybridcache::test {

/// A binary-safe client for the test's own pokes at the server.
class raw_redis_client {
 public:
  explicit raw_redis_client(int port) : ctx_(redisConnect("127.0.0.1", port)) { REQUIRE((ctx_ != nullptr && ctx_->err == 0)); }
  ~raw_redis_client() { redisFree(ctx_); }
  raw_redis_client(const raw_redis_client&) = delete;
  raw_redis_client& operator=(const raw_redis_client&) = delete;
  /// The string value of `key` (nullopt when absent).
  std::optional<std::string> get(const std::string& key) {
    auto* r = static_cast<redisReply*>(redisCommand(ctx_, "GET %b", key.data(), key.size()));
    REQUIRE(r != nullptr);
    std::optional<std::string> out;
    if (r->type == REDIS_REPLY_STRING) out = std::string(r->str, r->len);
    freeReplyObject(r);
    return out;
  }
  void set(const std::string& key, const std::string& value) {
    auto* r = static_cast<redisReply*>(redisCommand(ctx_, "SET %b %b", key.data(), key.size(), value.data(), value.size()));
    REQUIRE(r != nullptr);
    freeReplyObject(r);
  }
  long long integer(const std::string& cmd) {
    auto* r = static_cast<redisReply*>(redisCommand(ctx_, cmd.c_str()));
    REQUIRE(r != nullptr);
    const long long v = r->integer;
    freeReplyObject(r);
    return v;
  }
  /// A command given as separate arguments; the reply as text (status, error or string).
  std::string args(const std::vector<std::string>& argv) {
    std::vector<const char*> p;
    std::vector<std::size_t> n;
    for (const auto& a : argv) {
      p.push_back(a.data());
      n.push_back(a.size());
    }
    auto* r = static_cast<redisReply*>(redisCommandArgv(ctx_, static_cast<int>(p.size()), p.data(), n.data()));
    REQUIRE(r != nullptr);
    std::string s = r->str != nullptr ? std::string(r->str, r->len) : std::to_string(r->integer);
    freeReplyObject(r);
    return s;
  }
  std::string text(const std::string& cmd) {
    auto* r = static_cast<redisReply*>(redisCommand(ctx_, cmd.c_str()));
    REQUIRE(r != nullptr);
    std::string s = r->str != nullptr ? std::string(r->str, r->len) : std::string();
    freeReplyObject(r);
    return s;
  }

 private:
  redisContext* ctx_;
};

}  // namespace hybridcache::test
