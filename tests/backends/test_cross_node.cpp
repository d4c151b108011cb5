// Cross-node sharing (ctest backends.cross_node): two serving nodes, two processes, one
// Redis. A branching conversation trace (synth-v1 chat: five shared system prompts, many
// multi-turn sessions) is split between them turn by turn, so every second turn of a
// conversation lands on the other node (a router without session affinity), round by round
// in turn order.
//
// Each node is a small standalone driver of the runtime's side of a remote tier (the lead's
// N-tier store replaces it): for a request it asks the tier, in one batched `exists`, for
// the KV of every 64-token block of its input and for the recurrent checkpoint at each
// block boundary; it loads the longest prefix that has the KV of every block up to a
// boundary and a checkpoint there (the joint-min rule of a hybrid model), verifies every
// loaded byte, "prefills" the rest (deterministic bytes: the same tokens give the same KV
// on every node, as a real model would), and publishes the new blocks and the checkpoint
// at the last boundary of input + output (write-through). Keys are the content keys of
// tiered/storage_format.hpp in one tenant's namespace.
//
// Checked: node B's hits on prefixes node A computed (and the other way round) are counted
// and every loaded byte verified; each node's hits equal those of an in-process replay of
// the same rounds over the reference model (tests/support/memory_storage_backend.hpp);
// another tenant's keys find nothing.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "hybridcache/core/hash.hpp"
#include "hybridcache/model/presets.hpp"
#include "hybridcache/sim/synth_v1.hpp"
#include "hybridcache/tiered/redis/redis_backend.hpp"
#include "hybridcache/tiered/storage_format.hpp"
#include "../support/memory_storage_backend.hpp"
#include "../support/redis_server.hpp"

using namespace hybridcache;
using namespace hybridcache::tiered;

namespace {

constexpr std::int64_t block = 64;             // tokens per published KV value
constexpr std::int64_t kv_per_token = 128;     // synthetic model: bytes of KV per token
constexpr std::int64_t checkpoint_bytes = 32 * 1024;
const cache_salt tenant = make_cache_salt("tenant-1");

std::uint64_t model_id() { return model_identity(presets::jamba_1_5_mini(), "cross-node-test-weights"); }

/// What a model computes for a key: the same bytes on every node.
std::vector<std::byte> computed(const storage_key& k, std::int64_t bytes) {
  std::vector<std::byte> v(static_cast<std::size_t>(bytes));
  std::mt19937_64 rng(splitmix64_mix(k.prefix ^ (static_cast<std::uint64_t>(k.kind) << 40) ^ k.model));
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

struct node_stats {
  std::int64_t requests = 0, input_tokens = 0, hit_tokens = 0;
  std::int64_t loaded_values = 0, peer_values = 0, peer_tokens = 0, loaded_bytes = 0;
  std::int64_t mismatches = 0, failed_loads = 0, published = 0;
  std::string line() const {
    return std::to_string(requests) + " " + std::to_string(input_tokens) + " " + std::to_string(hit_tokens) + " " +
           std::to_string(loaded_values) + " " + std::to_string(peer_values) + " " + std::to_string(peer_tokens) + " " +
           std::to_string(loaded_bytes) + " " + std::to_string(mismatches) + " " + std::to_string(failed_loads) + " " +
           std::to_string(published);
  }
  static node_stats parse(const std::string& s) {
    node_stats n;
    std::sscanf(s.c_str(), "%ld %ld %ld %ld %ld %ld %ld %ld %ld %ld", &n.requests, &n.input_tokens, &n.hit_tokens,
                &n.loaded_values, &n.peer_values, &n.peer_tokens, &n.loaded_bytes, &n.mismatches, &n.failed_loads,
                &n.published);
    return n;
  }
};

/// One node's side of the remote tier.
template <class Backend>
class node_driver {
 public:
  explicit node_driver(Backend& b) : b_(b) {}

  void serve(const sim::synth_request& r) {
    stats_.requests += 1;
    stats_.input_tokens += static_cast<std::int64_t>(r.input.size());
    const auto kv_keys = storage_keys_for(model_id(), r.input, tenant, value_kind::kv);
    const auto ck_keys = storage_keys_for(model_id(), r.input, tenant, value_kind::checkpoint);
    const std::int64_t blocks = static_cast<std::int64_t>(r.input.size()) / block;
    // One round trip: the KV of every block and the checkpoint at every boundary.
    std::vector<storage_key> ask;
    for (std::int64_t j = 1; j <= blocks; ++j) ask.push_back(kv_keys[static_cast<std::size_t>(j * block)]);
    for (std::int64_t j = 1; j <= blocks; ++j) ask.push_back(ck_keys[static_cast<std::size_t>(j * block)]);
    std::vector<std::uint8_t> found(ask.size());
    if (!ask.empty()) {
      const auto t = b_.exists(ask, found);
      REQUIRE(t);
      REQUIRE(b_.wait(*t)->status == io_status::ok);
    }
    std::int64_t reuse = 0;  // deepest boundary with all KV before it and a checkpoint there
    for (std::int64_t j = 1; j <= blocks && found[static_cast<std::size_t>(j - 1)] != 0; ++j)
      if (found[static_cast<std::size_t>(blocks + j - 1)] != 0) reuse = j;
    // Load what the hit needs, all at once (a prefetcher would), then verify every byte.
    std::vector<storage_key> load;
    for (std::int64_t j = 1; j <= reuse; ++j) load.push_back(kv_keys[static_cast<std::size_t>(j * block)]);
    if (reuse > 0) load.push_back(ck_keys[static_cast<std::size_t>(reuse * block)]);
    std::vector<std::vector<std::byte>> bufs(load.size());
    std::vector<io_ticket> tickets;
    for (std::size_t i = 0; i < load.size(); ++i) {
      bufs[i].resize(static_cast<std::size_t>(load[i].kind == value_kind::kv ? block * kv_per_token : checkpoint_bytes));
      const auto t = b_.get(load[i], bufs[i]);
      REQUIRE(t);
      tickets.push_back(*t);
    }
    bool intact = true;
    for (std::size_t i = 0; i < load.size(); ++i) {
      const io_result res = b_.wait(tickets[i]).value();
      const bool ok = res.status == io_status::ok && res.bytes == static_cast<std::int64_t>(bufs[i].size()) &&
                      res.meta.span_begin == (load[i].kind == value_kind::kv ? load[i].tokens - block : load[i].tokens);
      if (!ok) {
        stats_.failed_loads += 1;
        intact = false;
        continue;
      }
      if (bufs[i] != computed(load[i], static_cast<std::int64_t>(bufs[i].size()))) stats_.mismatches += 1;
      stats_.loaded_values += 1;
      stats_.loaded_bytes += res.bytes;
      if (!own_.contains(name_of(load[i]))) {
        stats_.peer_values += 1;
        if (load[i].kind == value_kind::kv) stats_.peer_tokens += block;
      }
    }
    const std::int64_t hit = intact ? reuse * block : 0;
    stats_.hit_tokens += hit;
    // Prefill from the hit, decode the output, publish what is new (write-through).
    std::vector<token_id> all = r.input;
    all.insert(all.end(), r.output.begin(), r.output.end());
    const auto all_kv = storage_keys_for(model_id(), all, tenant, value_kind::kv);
    const auto all_ck = storage_keys_for(model_id(), all, tenant, value_kind::checkpoint);
    const std::int64_t end_blocks = static_cast<std::int64_t>(all.size()) / block;
    std::vector<std::pair<storage_key, std::vector<std::byte>>> out;
    for (std::int64_t j = (intact ? reuse : 0) + 1; j <= end_blocks; ++j) {
      const storage_key k = all_kv[static_cast<std::size_t>(j * block)];
      out.emplace_back(k, computed(k, block * kv_per_token));
    }
    if (end_blocks > 0 && end_blocks > (intact ? reuse : 0)) {
      const storage_key k = all_ck[static_cast<std::size_t>(end_blocks * block)];
      out.emplace_back(k, computed(k, checkpoint_bytes));
    }
    tickets.clear();
    for (const auto& [k, v] : out) {
      const value_meta m{k.kind == value_kind::kv ? k.tokens - block : k.tokens, {layer_order::layer_major, 32}};
      const auto t = b_.put(k, m, v);
      REQUIRE(t);
      tickets.push_back(*t);
    }
    for (std::size_t i = 0; i < out.size(); ++i) {
      REQUIRE(b_.wait(tickets[i])->status == io_status::ok);
      own_.insert(name_of(out[i].first));
      stats_.published += 1;
    }
  }
  [[nodiscard]] const node_stats& stats() const noexcept { return stats_; }

 private:
  Backend& b_;
  std::set<storage_name> own_;
  node_stats stats_;
};

/// The trace and its split: turn t of session s goes to node (s + t) % 2, in rounds by turn.
std::vector<sim::synth_request> trace() {
  return sim::generate_synth_v1({.profile = sim::synth_profile::chat, .seed = 3, .sessions = 24, .session_gap_ms = 2000});
}
int node_of(const sim::synth_request& r) { return static_cast<int>((r.session_id + r.turn_id) % 2); }
std::int64_t rounds_of(const std::vector<sim::synth_request>& t) {
  std::int64_t n = 0;
  for (const auto& r : t) n = std::max(n, r.turn_id + 1);
  return n;
}

/// A node process: serves its requests of round r when the parent writes r; writes its
/// stats and exits when the parent writes 255.
[[noreturn]] void node_process(int node, int port, int cmd_fd, int out_fd) {
  int rc = 0;
  {
    redis_backend<> b({.server = {.endpoints = {{"127.0.0.1", port}}}, .capacity_bytes = std::int64_t{1} << 30,
                       .chunk_bytes = 64 * 1024, .connections = 2, .queue_depth = 256});
    node_driver<redis_backend<>> driver(b);
    const auto t = trace();
    unsigned char round = 0;
    while (::read(cmd_fd, &round, 1) == 1 && round != 255) {
      for (const auto& r : t)
        if (r.turn_id == round && node_of(r) == node) driver.serve(r);
      (void)!::write(out_fd, &round, 1);
    }
    const std::string line = driver.stats().line() + "\n";
    (void)!::write(out_fd, line.data(), line.size());
    rc = b.counters().corrupt == 0 && b.counters().unavailable == 0 ? 0 : 3;
  }
  ::_exit(rc);
}

}  // namespace

TEST_CASE("cross-node: node B loads, byte for byte, the prefixes node A computed (two processes, one Redis)") {
  test::redis_server server;
  const auto t = trace();
  const std::int64_t rounds = rounds_of(t);
  REQUIRE(rounds < 255);
  struct child {
    pid_t pid;
    int cmd, out;
  };
  std::vector<child> nodes;
  for (int n = 0; n < 2; ++n) {
    int cmd[2], out[2];
    REQUIRE(::pipe(cmd) == 0);
    REQUIRE(::pipe(out) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(cmd[1]);
      ::close(out[0]);
      node_process(n, server.port(), cmd[0], out[1]);
    }
    ::close(cmd[0]);
    ::close(out[1]);
    nodes.push_back({pid, cmd[1], out[0]});
  }
  for (std::int64_t r = 0; r < rounds; ++r)
    for (const child& c : nodes) {  // node A's round, then node B's
      const auto round = static_cast<unsigned char>(r);
      REQUIRE(::write(c.cmd, &round, 1) == 1);
      unsigned char ack = 0;
      REQUIRE(::read(c.out, &ack, 1) == 1);
      REQUIRE(ack == round);
    }
  std::vector<node_stats> got;
  for (const child& c : nodes) {
    const unsigned char end = 255;
    REQUIRE(::write(c.cmd, &end, 1) == 1);
    std::string line;
    char ch = 0;
    while (::read(c.out, &ch, 1) == 1 && ch != '\n') line.push_back(ch);
    int status = 0;
    REQUIRE(::waitpid(c.pid, &status, 0) == c.pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);  // no corrupt value, no unavailable server
    got.push_back(node_stats::parse(line));
  }

  // The same rounds in one process over the reference model: the expected hits.
  test::memory_storage_backend ref(std::int64_t{1} << 40, 4096);
  std::vector<node_driver<test::memory_storage_backend>> expect{node_driver(ref), node_driver(ref)};
  for (std::int64_t r = 0; r < rounds; ++r)
    for (int n = 0; n < 2; ++n)
      for (const auto& q : t)
        if (q.turn_id == r && node_of(q) == n) expect[static_cast<std::size_t>(n)].serve(q);

  for (int n = 0; n < 2; ++n) {
    const node_stats& g = got[static_cast<std::size_t>(n)];
    const node_stats& e = expect[static_cast<std::size_t>(n)].stats();
    CAPTURE(n);
    CHECK(g.requests > 0);
    CHECK(g.mismatches == 0);
    CHECK(g.failed_loads == 0);
    CHECK(g.peer_values > 0);  // hits on what the other node computed
    CHECK(g.peer_tokens > 0);
    CHECK(g.hit_tokens == e.hit_tokens);
    CHECK(g.peer_values == e.peer_values);
    CHECK(g.loaded_bytes == e.loaded_bytes);
    CHECK(g.published == e.published);
    MESSAGE("node " << (n == 0 ? "A" : "B") << ": " << g.requests << " requests, " << g.hit_tokens << " of "
                    << g.input_tokens << " input tokens loaded from Redis, " << g.peer_values
                    << " values (" << g.peer_tokens << " KV tokens) computed by the other node, " << g.loaded_bytes
                    << " bytes verified");
  }
  // Another tenant's namespace shares nothing.
  redis_backend<> other({.server = {.endpoints = {{"127.0.0.1", server.port()}}}, .capacity_bytes = std::int64_t{1} << 30});
  std::vector<storage_key> keys;
  for (const auto& q : t) {
    const auto k = storage_keys_for(model_id(), q.input, make_cache_salt("tenant-2"), value_kind::kv);
    for (std::size_t p = static_cast<std::size_t>(block); p < k.size(); p += static_cast<std::size_t>(block)) keys.push_back(k[p]);
  }
  std::vector<std::uint8_t> found(keys.size());
  const io_result r = other.wait(*other.exists(keys, found)).value();
  CHECK(r.status == io_status::ok);
  CHECK(r.bytes == 0);
  CHECK(keys.size() > 100);
}
