// What every storage backend writes: CRC-32C (three implementations against the bitwise
// definition and the published check values), the 64-byte value header, content keys and
// storage names, and the Redis key/slot functions (CRC16 check value, hash tags, redirects)
// and wire format (resp_writer).
#include <doctest/doctest.h>

#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "hybridcache/core/crc32c.hpp"
#include "hybridcache/core/hash.hpp"
#include "hybridcache/model/presets.hpp"
#include "hybridcache/tiered/redis_protocol.hpp"
#include "hybridcache/tiered/storage_format.hpp"

using namespace hybridcache;
using namespace hybridcache::tiered;

namespace {

std::vector<std::byte> bytes_of(std::string_view s) {
  std::vector<std::byte> v;
  for (const char c : s) v.push_back(static_cast<std::byte>(c));
  return v;
}

}  // namespace

TEST_CASE("CRC-32C: published check values and the three implementations agree on random data") {
  CHECK(crc32c(bytes_of("123456789")) == 0xE3069283u);  // the CRC catalogue's check value
  CHECK(crc32c_bitwise(bytes_of("123456789")) == 0xE3069283u);
  // RFC 3720 (iSCSI) appendix B.4: 32 bytes of 0x00, of 0xFF, and ascending 0..31.
  std::vector<std::byte> zeros(32, std::byte{0}), ones(32, std::byte{0xff}), up(32);
  for (std::size_t i = 0; i < 32; ++i) up[i] = static_cast<std::byte>(i);
  CHECK(crc32c(zeros) == 0x8A9136AAu);
  CHECK(crc32c(ones) == 0x62A8AB43u);
  CHECK(crc32c(up) == 0x46DD794Eu);
  CHECK(crc32c(std::span<const std::byte>{}) == 0u);

  std::mt19937_64 rng(3);
  for (int it = 0; it < 200; ++it) {
    // Sizes around the three-stream block (3 x 4096) and odd alignments.
    const std::size_t n = it < 100 ? rng() % 40000 : 12288 * (1 + rng() % 3) + rng() % 17;
    const std::size_t offset = rng() % 8;
    std::vector<std::byte> buf(n + offset);
    for (auto& b : buf) b = static_cast<std::byte>(rng());
    const std::span<const std::byte> d(buf.data() + offset, n);
    const std::uint32_t want = crc32c_bitwise(d);
    CAPTURE(n);
    CHECK(crc32c_software(d) == want);
    CHECK(crc32c(d) == want);
    const std::size_t cut = n == 0 ? 0 : rng() % n;  // continuing a running CRC
    CHECK(crc32c(d.subspan(cut), crc32c(d.first(cut))) == want);
    CHECK(crc32c_software(d.subspan(cut), crc32c_software(d.first(cut))) == want);
    std::vector<std::byte> copy(n + 3, std::byte{0x5a});  // copies exactly n bytes, any alignment
    CHECK(crc32c_copy(std::span<std::byte>(copy.data() + 1, n), d) == want);
    CHECK(std::equal(d.begin(), d.end(), copy.begin() + 1));
    CHECK(copy[0] == std::byte{0x5a});
    CHECK(copy[n + 1] == std::byte{0x5a});
  }
  const std::string hw = crc32c_hardware() ? "yes" : "no";
  MESSAGE("crc32c uses the crc32 instruction here: " << hw);
}

TEST_CASE("CRC-32C catches every single flipped bit of a value") {
  std::mt19937_64 rng(4);
  std::vector<std::byte> v(3000);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  const std::uint32_t good = crc32c(v);
  for (std::size_t i = 0; i < v.size(); i += 7)
    for (int bit = 0; bit < 8; ++bit) {
      v[i] ^= static_cast<std::byte>(1u << bit);
      CHECK(crc32c(v) != good);
      v[i] ^= static_cast<std::byte>(1u << bit);
    }
  CHECK(crc32c(v) == good);
}

TEST_CASE("value header: round trip, and any damage or foreign key is refused") {
  std::mt19937_64 rng(5);
  for (int it = 0; it < 100; ++it) {
    value_header h;
    h.key = {rng(), rng(), static_cast<std::int64_t>(rng() % 100000), it % 2 ? value_kind::kv : value_kind::checkpoint};
    h.meta.span_begin = h.key.kind == value_kind::checkpoint ? h.key.tokens : static_cast<std::int64_t>(rng() % (h.key.tokens + 1));
    h.meta.layout = {static_cast<layer_order>(rng() % 3), static_cast<std::uint32_t>(rng() % 100)};
    h.payload_crc = static_cast<std::uint32_t>(rng());
    h.chunk_bytes = static_cast<std::uint32_t>(rng() % (1u << 30));
    h.length = static_cast<std::int64_t>(rng() % (std::uint64_t{1} << 40));
    std::array<std::byte, value_header_bytes> buf{};
    encode_header(h, buf);
    const auto back = decode_header(buf);
    REQUIRE(back.has_value());
    CHECK(back->key == h.key);
    CHECK(back->meta == h.meta);
    CHECK(back->payload_crc == h.payload_crc);
    CHECK(back->chunk_bytes == h.chunk_bytes);
    CHECK(back->length == h.length);
    // One flipped byte anywhere (the magic, the version, a field, the CRC itself) fails.
    const std::size_t at = rng() % value_header_bytes;
    buf[at] ^= std::byte{0x01};
    CHECK_FALSE(decode_header(buf).has_value());
  }
  // The exact layout: magic "HCV1", version 1 at offset 4, length at offset 56.
  value_header h;
  h.key = {1, 2, 3, value_kind::kv};
  h.length = 0x0102030405;
  std::array<std::byte, value_header_bytes> buf{};
  encode_header(h, buf);
  CHECK(buf[0] == std::byte{'H'});
  CHECK(buf[1] == std::byte{'C'});
  CHECK(buf[2] == std::byte{'V'});
  CHECK(buf[3] == std::byte{'1'});
  CHECK(buf[4] == std::byte{1});
  CHECK(buf[56] == std::byte{0x05});
  CHECK(buf[60] == std::byte{0x01});
  // Another format version is refused even with a valid header CRC.
  buf[4] = std::byte{2};
  buf[8] = buf[9] = buf[10] = buf[11] = std::byte{0};
  const std::uint32_t crc = crc32c(std::span<const std::byte>(buf));
  for (int i = 0; i < 4; ++i) buf[8 + static_cast<std::size_t>(i)] = static_cast<std::byte>((crc >> (8 * i)) & 0xffu);
  CHECK_FALSE(decode_header(buf).has_value());

  // check_payload: the key asked for, the length and the CRC must all hold.
  const auto payload = bytes_of("some payload bytes");
  value_header v{{7, 8, 9, value_kind::kv}, {0, {}}, crc32c(payload), 0, static_cast<std::int64_t>(payload.size())};
  CHECK(check_payload(v, v.key, payload));
  CHECK_FALSE(check_payload(v, {7, 8, 10, value_kind::kv}, payload));
  CHECK_FALSE(check_payload(v, v.key, std::span<const std::byte>(payload).first(payload.size() - 1)));
  auto flipped = payload;
  flipped[3] ^= std::byte{0x40};
  CHECK_FALSE(check_payload(v, v.key, flipped));
}

TEST_CASE("content keys: same tokens agree, another model, tenant or kind never does") {
  const std::uint64_t jamba = model_identity(presets::jamba_1_5_mini(), "ai21labs/AI21-Jamba-1.5-Mini@main");
  const std::uint64_t jamba_again = model_identity(presets::jamba_1_5_mini(), "ai21labs/AI21-Jamba-1.5-Mini@main");
  const std::uint64_t jamba_ft = model_identity(presets::jamba_1_5_mini(), "someone/jamba-finetune@v2");
  const std::uint64_t marconi = model_identity(presets::marconi_7b(), "ai21labs/AI21-Jamba-1.5-Mini@main");
  CHECK(jamba == jamba_again);
  CHECK(jamba != jamba_ft);
  CHECK(jamba != marconi);
  model_spec wider = presets::jamba_1_5_mini();
  wider.kv_dtype_bytes = 1;  // fp8 KV: other bytes for the same tokens
  CHECK(model_identity(wider, "ai21labs/AI21-Jamba-1.5-Mini@main") != jamba);

  const std::vector<token_id> tokens{5, 17, 99, 3, 3, 1000000, 42};
  const auto a = storage_keys_for(jamba, tokens, std::nullopt, value_kind::kv);
  const auto b = storage_keys_for(jamba, tokens, std::nullopt, value_kind::kv);
  const auto salted = storage_keys_for(jamba, tokens, make_cache_salt("tenant-a"), value_kind::kv);
  const auto other_salt = storage_keys_for(jamba, tokens, make_cache_salt("tenant-b"), value_kind::kv);
  const auto ckpt = storage_keys_for(jamba, tokens, std::nullopt, value_kind::checkpoint);
  REQUIRE(a.size() == tokens.size() + 1);
  CHECK(a == b);
  std::set<storage_name> names;
  for (std::size_t n = 0; n <= tokens.size(); ++n) {
    CHECK(a[n].tokens == static_cast<std::int64_t>(n));
    CHECK(a[n].model == jamba);
    names.insert(name_of(a[n]));
    names.insert(name_of(salted[n]));
    names.insert(name_of(other_salt[n]));
    names.insert(name_of(ckpt[n]));
  }
  CHECK(names.size() == 4 * (tokens.size() + 1));  // all distinct
  // The chain is core/hash.hpp's, the one tiered_state_store names host entries with.
  std::uint64_t h = content_key::seed(jamba);
  for (std::size_t i = 0; i < tokens.size(); ++i) h = content_key::next(h, tokens[i]);
  CHECK(a.back().prefix == h);
  // A prefix's key does not depend on what follows it.
  const std::vector<token_id> longer{5, 17, 99, 3, 3, 1000000, 42, 8, 8};
  const auto c = storage_keys_for(jamba, longer, std::nullopt, value_kind::kv);
  for (std::size_t n = 0; n <= tokens.size(); ++n) CHECK(c[n] == a[n]);
  CHECK(c[tokens.size() + 1] != a.back());
  // Names are 32 hex digits.
  for (const char ch : name_of(a[3])) CHECK(((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f')));
}

TEST_CASE("Redis keys: CRC16 check value, hash tags keep a value's chunks on one slot, redirects parse") {
  CHECK(crc16_xmodem("123456789") == 0x31C3);  // the Redis Cluster specification's check value
  // Hash tags (rules of the specification): only the part between the first '{' and the
  // next '}' counts, when it is not empty.
  CHECK(cluster_slot("{user1000}.following") == cluster_slot("{user1000}.followers"));
  CHECK(cluster_slot("foo{}{bar}") == crc16_xmodem("foo{}{bar}") % 16384);
  CHECK(cluster_slot("foo{{bar}}zap") == crc16_xmodem("{bar") % 16384);
  CHECK(cluster_slot("foo{bar}{zap}") == crc16_xmodem("bar") % 16384);
  const storage_name n = name_of(storage_key{1, 2, 3, value_kind::kv});
  for (int i = 0; i < 20; ++i) CHECK(cluster_slot(chunk_key("hc:", n, i)) == cluster_slot(n));
  CHECK(chunk_key("hc:", n, 7) == "hc:{" + std::string(n.data(), n.size()) + "}:7");
  CHECK(chunk_count(0, 4096) == 1);  // the header alone
  CHECK(chunk_count(1, 4096) == 2);
  CHECK(chunk_count(4096, 4096) == 2);
  CHECK(chunk_count(4097, 4096) == 3);
  CHECK(chunk_count(9200000, 1 << 20) == 10);

  const auto moved = parse_redirect("MOVED 3999 127.0.0.1:6381");
  REQUIRE(moved);
  CHECK_FALSE(moved->ask);
  CHECK(moved->slot == 3999);
  CHECK(moved->host == "127.0.0.1");
  CHECK(moved->port == 6381);
  const auto ask = parse_redirect("ASK 12 ::1:7000");
  REQUIRE(ask);
  CHECK(ask->ask);
  CHECK(ask->host == "::1");
  CHECK(ask->port == 7000);
  const auto same_host = parse_redirect("MOVED 5 :6380");  // Redis 7: "" = the node asked
  REQUIRE(same_host);
  CHECK(same_host->host.empty());
  CHECK_FALSE(parse_redirect("ERR unknown command"));
  CHECK_FALSE(parse_redirect("MOVED 16384 h:1"));
  CHECK_FALSE(parse_redirect("MOVED x h:1"));
  CHECK_FALSE(parse_redirect("MOVED 1 h:0"));
  CHECK_FALSE(parse_redirect("MOVED 1 nocolon"));
}

TEST_CASE("resp_writer: commands in the Redis protocol, large arguments sent from where they are") {
  std::string big(70000, 'x');
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>('a' + i % 26);
  resp_writer w;
  CHECK(w.empty());
  w.command({"SET", "hc:{k}:1", big});
  w.command({"GET", "k"});
  w.command({"ASKING"});
  const std::string want = "*3\r\n$3\r\nSET\r\n$8\r\nhc:{k}:1\r\n$70000\r\n" + big + "\r\n" +
                           "*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*1\r\n$6\r\nASKING\r\n";
  // Through a socket pair with a small buffer, read by another thread: sendmsg resumes its
  // partial writes.
  int fds[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  const int small = 4096;
  REQUIRE(::setsockopt(fds[1], SOL_SOCKET, SO_SNDBUF, &small, sizeof small) == 0);
  std::string got;
  std::thread reader([&] {
    char buf[4096];
    for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) got.append(buf, static_cast<std::size_t>(n));
  });
  CHECK(w.send(fds[1]) == 0);
  ::close(fds[1]);
  reader.join();
  ::close(fds[0]);
  CHECK(got.size() == want.size());
  CHECK(got == want);
  w.clear();
  CHECK(w.empty());
  // A closed peer: EPIPE comes back, and no SIGPIPE ends the process (MSG_NOSIGNAL).
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  ::close(fds[0]);
  w.command({"PING"});
  CHECK(w.send(fds[1]) == EPIPE);
  ::close(fds[1]);
}
