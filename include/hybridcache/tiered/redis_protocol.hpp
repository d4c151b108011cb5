// hybridcache/tiered/redis_protocol.hpp
//
// The parts of the Redis tier that need no client library, so that they compile and are
// tested in every build (the tier itself, tiered/redis/redis_backend.hpp, needs hiredis):
//
//   - key names: a value is stored as chunks `<prefix>{<32 hex>}:<i>`, i = 0 .. n-1: chunk 0
//     is the 64-byte header alone, chunks 1 .. n-1 the payload; the braces are a Redis
//     Cluster hash tag, so every chunk of a value hashes to the same slot and lives on one
//     shard (one pipeline reads or writes a whole value);
//   - `chunk_count`: how many chunks a value takes (the header's, then the payload's);
//   - `crc16_xmodem` and `cluster_slot`: the key-to-slot function of the Redis Cluster
//     specification (CRC16, polynomial 0x1021, initial value 0, no reflection, modulo
//     16384; only the part between the first '{' and the next '}' is hashed when that part
//     is not empty). Check value of "123456789": 0x31C3. Written from the specification;
//   - `parse_redirect`: reads the MOVED / ASK errors a cluster node answers for a slot it
//     does not serve ("MOVED 3999 127.0.0.1:6381");
//   - `resp_writer`: commands in the Redis protocol (RESP arrays of bulk strings), sent with
//     sendmsg (MSG_NOSIGNAL: a closed connection is an error, never a SIGPIPE): framing and small arguments are copied into one buffer, large arguments (a
//     value's chunks) are sent from where they are, so a put copies its payload nowhere
//     before the kernel (a client library that formats whole commands copies it twice and,
//     for MB-sized values, faults fresh pages in for each copy).
//
// Costs: keys, slots, redirects O(key length), no allocation except `chunk_key`'s string;
// resp_writer O(arguments) plus the copy of small arguments; `send` one sendmsg per 1,024
// pieces.
#pragma once

#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hybridcache/tiered/storage_format.hpp"

namespace hybridcache::tiered {

/// Slots of a Redis Cluster.
inline constexpr std::uint16_t cluster_slots = 16384;

/// CRC16/XMODEM over `s` (the Redis Cluster key hash).
[[nodiscard]] constexpr std::uint16_t crc16_xmodem(std::string_view s) noexcept {
  std::uint16_t crc = 0;
  for (const char c : s) {
    crc = static_cast<std::uint16_t>(crc ^ (static_cast<std::uint16_t>(static_cast<unsigned char>(c)) << 8));
    for (int i = 0; i < 8; ++i)
      crc = static_cast<std::uint16_t>((crc & 0x8000u) != 0 ? (crc << 1) ^ 0x1021u : crc << 1);
  }
  return crc;
}

/// The cluster slot of `key`, honouring a hash tag.
[[nodiscard]] constexpr std::uint16_t cluster_slot(std::string_view key) noexcept {
  if (const std::size_t open = key.find('{'); open != std::string_view::npos) {
    const std::size_t close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1) key = key.substr(open + 1, close - open - 1);
  }
  return static_cast<std::uint16_t>(crc16_xmodem(key) % cluster_slots);
}

/// Chunks a value of `payload_bytes` takes: its header, then the payload in chunks of at
/// most `chunk_bytes`.
[[nodiscard]] constexpr std::int64_t chunk_count(std::int64_t payload_bytes, std::int64_t chunk_bytes) noexcept {
  return 1 + (payload_bytes + chunk_bytes - 1) / chunk_bytes;
}

/// `<prefix>{<name>}:<chunk>`.
[[nodiscard]] inline std::string chunk_key(std::string_view prefix, const storage_name& name, std::int64_t chunk) {
  std::string k;
  k.reserve(prefix.size() + name.size() + 24);
  k.append(prefix);
  k.push_back('{');
  k.append(name.data(), name.size());
  k.append("}:");
  k.append(std::to_string(chunk));
  return k;
}

/// The slot of every chunk of `name` (they share it: the hash tag).
[[nodiscard]] constexpr std::uint16_t cluster_slot(const storage_name& name) noexcept {
  return static_cast<std::uint16_t>(crc16_xmodem(std::string_view(name.data(), name.size())) % cluster_slots);
}

/// A MOVED or ASK answer: the slot now lives at host:port (MOVED: for good; ASK: for this
/// one command, to be preceded by ASKING).
struct cluster_redirect {
  bool ask = false;
  std::uint16_t slot = 0;
  std::string host;
  int port = 0;
};

/// Reads "MOVED <slot> <host>:<port>" or "ASK <slot> <host>:<port>"; nullopt for any other
/// error text.
[[nodiscard]] inline std::optional<cluster_redirect> parse_redirect(std::string_view error) {
  cluster_redirect r;
  if (error.starts_with("MOVED ")) error.remove_prefix(6);
  else if (error.starts_with("ASK ")) {
    r.ask = true;
    error.remove_prefix(4);
  } else {
    return std::nullopt;
  }
  const std::size_t space = error.find(' ');
  const std::size_t colon = error.rfind(':');
  if (space == std::string_view::npos || colon == std::string_view::npos || colon < space) return std::nullopt;
  unsigned slot = 0;
  const std::string_view slot_text = error.substr(0, space), port_text = error.substr(colon + 1);
  if (std::from_chars(slot_text.data(), slot_text.data() + slot_text.size(), slot).ptr != slot_text.data() + slot_text.size() ||
      slot >= cluster_slots)
    return std::nullopt;
  if (std::from_chars(port_text.data(), port_text.data() + port_text.size(), r.port).ptr != port_text.data() + port_text.size() ||
      r.port <= 0 || r.port > 65535)
    return std::nullopt;
  r.slot = static_cast<std::uint16_t>(slot);
  r.host = std::string(error.substr(space + 1, colon - space - 1));
  return r;
}

/// Commands in the Redis wire protocol, queued for one connection and sent in one go.
class resp_writer {
 public:
  /// Arguments at least this long are sent from the caller's memory, not copied.
  static constexpr std::size_t copy_limit = 4096;

  /// Queues one command. Large arguments must stay valid until `send` returned.
  void command(std::initializer_list<std::string_view> args) { command(args.begin(), args.end()); }
  template <class It>
  void command(It first, It last) {
    append_count('*', static_cast<std::size_t>(last - first));
    for (; first != last; ++first) {
      const std::string_view a = *first;
      append_count('$', a.size());
      if (a.size() >= copy_limit) {
        pieces_.push_back({a.data(), 0, a.size()});
      } else {
        append_text(a);
      }
      append_text("\r\n");
    }
  }
  [[nodiscard]] bool empty() const noexcept { return pieces_.empty(); }
  void clear() noexcept {
    text_.clear();
    pieces_.clear();
  }
  /// Writes everything queued to the socket `fd` (blocking; partial writes are resumed) with
  /// sendmsg(MSG_NOSIGNAL): a connection the peer closed is EPIPE, never a SIGPIPE.
  /// Returns 0 or the errno of the failed write (EAGAIN: the socket's send timeout).
  [[nodiscard]] int send(int fd) {
    std::vector<iovec> iov;
    iov.reserve(pieces_.size());
    for (const piece& p : pieces_)
      iov.push_back({const_cast<char*>(p.external != nullptr ? p.external : text_.data() + p.offset), p.length});
    std::size_t first = 0;
    while (first < iov.size()) {
      msghdr msg{};
      msg.msg_iov = iov.data() + first;
      msg.msg_iovlen = std::min<std::size_t>(iov.size() - first, 1024);
      const ssize_t w = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) return errno;
      auto done = static_cast<std::size_t>(w);
      while (first < iov.size() && done >= iov[first].iov_len) done -= iov[first++].iov_len;
      if (first < iov.size()) {
        iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + done;
        iov[first].iov_len -= done;
      }
    }
    return 0;
  }

 private:
  struct piece {
    const char* external;  ///< nullptr: bytes [offset, offset + length) of text_
    std::size_t offset, length;
  };
  void append_text(std::string_view s) {
    if (!pieces_.empty() && pieces_.back().external == nullptr) {
      pieces_.back().length += s.size();  // extends the text piece before it
    } else {
      pieces_.push_back({nullptr, text_.size(), s.size()});
    }
    text_.append(s);
  }
  void append_count(char kind, std::size_t n) {
    char buf[24];
    buf[0] = kind;
    const auto end = std::to_chars(buf + 1, buf + sizeof buf - 2, n).ptr;
    append_text(std::string_view(buf, static_cast<std::size_t>(end - buf)));
    append_text("\r\n");
  }

  std::string text_;
  std::vector<piece> pieces_;
};

}  // namespace hybridcache::tiered
