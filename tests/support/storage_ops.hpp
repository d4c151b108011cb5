// Submit-and-wait helpers over any `storage_backend`, for the conformance laws and the
// backends' own tests: each call must be accepted (REQUIRE) and its ticket is waited on.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "hybridcache/concepts/storage_backend.hpp"

namespace hybridcache::test::storage_ops {

using namespace hybridcache::tiered;
using namespace hybridcache;

inline std::vector<std::byte> random_bytes(std::mt19937_64& rng, std::size_t n) {
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(rng() & 0xffu);
  return v;
}

inline storage_key random_key(std::mt19937_64& rng, value_kind kind = value_kind::kv) {
  return {rng(), rng(), static_cast<std::int64_t>(1 + rng() % 100000), kind};
}

inline value_meta meta_for(const storage_key& k, std::mt19937_64& rng) {
  if (k.kind == value_kind::checkpoint) return {k.tokens, {layer_order::layer_major, 24}};
  return {static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(k.tokens + 1)),
          {static_cast<layer_order>(rng() % 3), static_cast<std::uint32_t>(rng() % 64)}};
}

/// Submits and waits; the call itself must be accepted.
template <class B, class Submit>
io_result run(B& b, Submit&& submit) {
  const expected<io_ticket> t = submit();
  REQUIRE(t.has_value());
  const expected<io_result> r = b.wait(*t);
  REQUIRE(r.has_value());
  CHECK(r->status != io_status::pending);
  return *r;
}

template <class B>
io_result put(B& b, const storage_key& k, const value_meta& m, const std::vector<std::byte>& v) {
  return run(b, [&] { return b.put(k, m, v); });
}
/// put with the meta every test can use: span from 0 (KV) or the key's end (checkpoint).
template <class B>
io_result put(B& b, const storage_key& k, const std::vector<std::byte>& v) {
  return put(b, k, value_meta{k.kind == value_kind::checkpoint ? k.tokens : 0, {}}, v);
}
template <class B>
io_result get(B& b, const storage_key& k, std::vector<std::byte>& into) {
  return run(b, [&] { return b.get(k, into); });
}
template <class B>
io_result remove(B& b, const storage_key& k) {
  return run(b, [&] { return b.remove(k); });
}
template <class B>
std::vector<std::uint8_t> exists(B& b, const std::vector<storage_key>& keys) {
  std::vector<std::uint8_t> found(keys.size(), 7);
  const io_result r = run(b, [&] { return b.exists(keys, found); });
  CHECK(r.status == io_status::ok);
  CHECK(r.bytes == std::count(found.begin(), found.end(), std::uint8_t{1}));
  return found;
}

}  // namespace hybridcache::test::storage_ops
