// Real Redis servers for the tests, started and stopped by the tests themselves.
//
// `redis_server` runs `redis-server` on a free loopback port with its own temporary
// directory (no persistence), as a child process that the kernel kills if the test process
// dies (PR_SET_PDEATHSIG), and that the destructor stops (SIGTERM, then SIGKILL): a failing
// test leaves no server behind. `kill()` and `start()` let a test take it away and bring it
// back on the same port. `redis_cluster` starts three cluster-enabled servers and joins
// them with `redis-cli --cluster create ... --cluster-yes`, then waits for
// cluster_state:ok on every node.
//
// Talks to the servers over a plain socket (`command`), so it needs no client library.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "temp_dir.hpp"

namespace hybridcache::test {

/// Whether `redis-server` (and `redis-cli`) can be run.
inline bool redis_tools_available() {
  return std::system("command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1") == 0;
}

/// A loopback port nobody listens on now (the kernel's choice for port 0).
inline int free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0) ::close(fd);
    throw std::runtime_error("free_loopback_port: no port");
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

/// Sends one inline command to 127.0.0.1:port and returns the raw reply ("" on failure).
/// Reads until the reply looks complete for simple replies; enough for PING, INFO, CLUSTER INFO.
inline std::string redis_command(int port, const std::string& cmd, int timeout_ms = 1000) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    const std::string line = cmd + "\r\n";
    if (::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size())) {
      char buf[65536];
      for (;;) {
        const ssize_t n = ::read(fd, buf, sizeof buf);
        if (n <= 0) break;
        out.append(buf, static_cast<std::size_t>(n));
        // A bulk reply "$<len>\r\n<data>\r\n" is complete when all of it arrived.
        if (out[0] == '$') {
          const std::size_t eol = out.find("\r\n");
          if (eol != std::string::npos) {
            const long len = std::strtol(out.c_str() + 1, nullptr, 10);
            if (len < 0 || out.size() >= eol + 2 + static_cast<std::size_t>(len) + 2) break;
          }
        } else if (out.size() >= 2 && out.compare(out.size() - 2, 2, "\r\n") == 0) {
          break;
        }
      }
    }
  }
  ::close(fd);
  return out;
}

/// How to start a `redis_server`.
struct redis_server_options {
  bool cluster = false;
  std::string maxmemory{};           ///< e.g. "2mb"; empty: no limit
  std::vector<std::string> extra{};  ///< more "--name value" arguments
};

class redis_server {
 public:
  using options = redis_server_options;

  redis_server() : redis_server(options{}) {}
  explicit redis_server(options o) : options_(std::move(o)) {
    for (int attempt = 0; attempt < 5; ++attempt) {
      port_ = free_loopback_port();
      if (start_process()) return;
    }
    throw std::runtime_error("redis_server: could not start redis-server (see " + dir_.str() + "/log)");
  }
  ~redis_server() { stop(); }
  redis_server(const redis_server&) = delete;
  redis_server& operator=(const redis_server&) = delete;

  [[nodiscard]] int port() const noexcept { return port_; }
  [[nodiscard]] bool running() const noexcept { return pid_ > 0; }

  /// SIGKILL, as a crash would (no shutdown, connections reset).
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  /// Starts it again on the same port (empty: nothing was persisted).
  void start() {
    if (pid_ > 0) return;
    for (int attempt = 0; attempt < 50 && !start_process(); ++attempt)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the port may linger briefly
    if (pid_ <= 0) throw std::runtime_error("redis_server: restart on port " + std::to_string(port_) + " failed");
  }
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 100; ++i) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    kill();
  }
  /// One inline command, raw reply.
  [[nodiscard]] std::string command(const std::string& cmd) const { return redis_command(port_, cmd); }

 private:
  bool start_process() {
    std::vector<std::string> args = {"redis-server",   "--port", std::to_string(port_), "--bind", "127.0.0.1",
                                     "--dir",          dir_.str(), "--save", "", "--appendonly", "no",
                                     "--daemonize",    "no",       "--protected-mode", "no",
                                     "--logfile",      dir_.str() + "/log"};
    if (options_.cluster) {
      // Full coverage off: with one node killed, the others keep serving their slots.
      for (const char* a : {"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout",
                            "2000", "--cluster-require-full-coverage", "no"})
        args.emplace_back(a);
    }
    if (!options_.maxmemory.empty()) {
      args.emplace_back("--maxmemory");
      args.push_back(options_.maxmemory);
      args.emplace_back("--maxmemory-policy");
      args.emplace_back("allkeys-lru");
    }
    args.insert(args.end(), options_.extra.begin(), options_.extra.end());
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) return false;
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(1);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execvp("redis-server", argv.data());
      ::_exit(127);
    }
    pid_ = pid;
    for (int i = 0; i < 250; ++i) {  // up to 5 s
      const std::string pong = redis_command(port_, "PING", 200);
      if (pong.rfind("+PONG", 0) == 0 || pong.rfind("-NOAUTH", 0) == 0) return true;  // up (maybe locked)
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) break;  // exited: port taken?
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (pid_ > 0 && ::waitpid(pid_, nullptr, WNOHANG) == 0) kill();
    pid_ = -1;
    return false;
  }

  options options_;
  temp_dir dir_{"hc_redis"};
  int port_ = 0;
  pid_t pid_ = -1;
};

/// Three cluster-enabled servers joined into one Redis Cluster (no replicas).
class redis_cluster {
 public:
  redis_cluster() {
    for (int i = 0; i < 3; ++i) nodes_.push_back(std::make_unique<redis_server>(redis_server_options{.cluster = true, .maxmemory = {}, .extra = {}}));
    std::string cmd = "redis-cli --cluster create";
    for (const auto& n : nodes_) cmd += " 127.0.0.1:" + std::to_string(n->port());
    cmd += " --cluster-replicas 0 --cluster-yes >/dev/null 2>&1";
    if (std::system(cmd.c_str()) != 0) throw std::runtime_error("redis_cluster: '" + cmd + "' failed");
    for (int i = 0; i < 500; ++i) {  // up to 10 s for every node to see the whole cluster
      bool ok = true;
      for (const auto& n : nodes_) ok = ok && n->command("CLUSTER INFO").find("cluster_state:ok") != std::string::npos;
      if (ok) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    throw std::runtime_error("redis_cluster: cluster_state never became ok");
  }
  [[nodiscard]] redis_server& node(std::size_t i) { return *nodes_.at(i); }
  [[nodiscard]] std::size_t size() const noexcept { return nodes_.size(); }

 private:
  std::vector<std::unique_ptr<redis_server>> nodes_;
};

}  // namespace hybridcache::test
