// hybridcache/tiered/storage_format.hpp
//
// What the storage backends (disk_backend, redis_backend) write, shared by both so that a
// value is the same bytes wherever it is stored:
//
//   - content keys: `model_identity(spec, weights)` names a model (shapes, dtypes, layer
//     order and the weights the caller names); `storage_keys_for(model, tokens, salt, kind)`
//     gives the key of every prefix of a token sequence, on the same chain the tiered state
//     store names its lower-tier entries with (core/hash.hpp `content_key`, seeded by
//     the model: a store whose `model_id` is `model` computes the same keys);
//   - the storage name of a key: 32 hex digits of a 128-bit digest, the file name on disk
//     and the hash-tagged Redis key (`{name}` keeps all chunks of a value on one shard);
//   - the value header: 64 bytes before the payload, little-endian whatever the host:
//
//       off  size  field
//         0     4  magic "HCV1" (0x31564348)
//         4     2  format version (1)
//         6     1  value kind (1 kv, 2 checkpoint)
//         7     1  layer order (0 unspecified, 1 token-major, 2 layer-major)
//         8     4  CRC-32C of the 64 header bytes with this field zero
//        12     4  CRC-32C of the payload
//        16     8  model identity
//        24     8  prefix chain value
//        32     8  prefix length in tokens
//        40     8  first token the value covers (span_begin)
//        48     4  layers
//        52     4  chunk size the writer split the value into (Redis; 0 on disk)
//        56     8  payload length in bytes
//
//     A reader accepts a value only when the magic, version and header CRC hold, the key
//     fields equal the key it asked for, the stored length equals the header's and the
//     payload CRC holds (`check_payload`). Anything else is a miss.
//
// Costs: keys O(tokens) for a whole sequence (one mix per token); names O(1); header
// encode/decode O(1); `check_payload` O(bytes) (CRC-32C, core/crc32c.hpp). No allocation
// except the key vector.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "hybridcache/concepts/ids.hpp"
#include "hybridcache/concepts/storage_backend.hpp"
#include "hybridcache/core/crc32c.hpp"
#include "hybridcache/core/expected.hpp"
#include "hybridcache/core/hash.hpp"
#include "hybridcache/model/model_spec.hpp"

namespace hybridcache::tiered {

/// Bytes of the header in front of every stored payload.
inline constexpr std::size_t value_header_bytes = 64;
/// "HCV1" read as a little-endian 32-bit word.
inline constexpr std::uint32_t value_magic = 0x31564348u;
/// The header format this code writes and reads.
inline constexpr std::uint16_t value_format_version = 1;

namespace detail {
[[nodiscard]] constexpr std::uint64_t mix_into(std::uint64_t h, std::uint64_t v) noexcept {
  return splitmix64_mix(h ^ (v + splitmix64_gamma));
}
[[nodiscard]] constexpr std::uint64_t mix_string(std::uint64_t h, std::string_view s) noexcept {
  h = mix_into(h, s.size());
  for (const char c : s) h = mix_into(h, static_cast<unsigned char>(c));
  return h;
}
}  // namespace detail

/// A model's identity for content keys: its name, layer order, every shape and dtype field,
/// and `weights` (the checkpoint the caller serves, e.g. "org/model@revision"): two nodes
/// serving the same weights agree; a fine-tune with the same shapes but other weights does
/// not share entries as long as `weights` differs. `source` is not part of it. O(layers).
[[nodiscard]] inline std::uint64_t model_identity(const model_spec& m, std::string_view weights) noexcept {
  std::uint64_t h = detail::mix_string(0x686362636b657973ULL, m.name);
  h = detail::mix_string(h, weights);
  h = detail::mix_into(h, m.layers.size());
  for (const layer_kind k : m.layers) h = detail::mix_into(h, static_cast<std::uint64_t>(k));
  for (const std::int64_t v : {m.d_model, m.attention_heads, m.kv_heads, m.head_dim,
                               static_cast<std::int64_t>(m.recurrent), m.ssm_d_inner, m.ssm_state_rows, m.d_state,
                               m.conv_kernel, m.conv_channels, m.gdn_key_heads, m.gdn_value_heads, m.gdn_key_dim,
                               m.gdn_value_dim, m.kv_dtype_bytes, m.state_dtype_bytes, m.conv_dtype_bytes,
                               m.scan_chunk})
    h = detail::mix_into(h, static_cast<std::uint64_t>(v));
  return h;
}

/// The key of the prefix [0, n) of `tokens` for every n in [0, tokens.size()] (n + 1 keys),
/// in namespace `salt`, for values of `kind` of model `model`. Key n names the KV ending at
/// token n or the checkpoint after token n. O(n).
[[nodiscard]] inline std::vector<storage_key> storage_keys_for(std::uint64_t model, std::span<const token_id> tokens,
                                                               const cache_salt& salt, value_kind kind) {
  std::vector<storage_key> out(tokens.size() + 1);
  std::uint64_t h = content_key::seed(model, salt);
  out[0] = {model, h, 0, kind};
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    h = content_key::next(h, tokens[i]);
    out[i + 1] = {model, h, static_cast<std::int64_t>(i + 1), kind};
  }
  return out;
}

/// Whether a key and meta may be stored: tokens >= 0, a known kind, 0 <= span_begin <=
/// tokens (a checkpoint: span_begin == tokens), a known layer order.
[[nodiscard]] constexpr bool valid_key(const storage_key& k) noexcept {
  return k.tokens >= 0 && (k.kind == value_kind::kv || k.kind == value_kind::checkpoint);
}
[[nodiscard]] constexpr bool valid_meta(const storage_key& k, const value_meta& m) noexcept {
  const bool span_ok = k.kind == value_kind::checkpoint ? m.span_begin == k.tokens
                                                        : m.span_begin >= 0 && m.span_begin <= k.tokens;
  return span_ok && static_cast<std::uint8_t>(m.layout.order) <= 2;
}

/// 32 lowercase hex digits naming a key in storage (file name, Redis hash tag).
using storage_name = std::array<char, 32>;

/// The storage name of `k`: two 64-bit digests of all key fields. Names of different keys
/// collide with probability ~2^-128; a collision still reads as a miss (the header holds
/// the whole key).
[[nodiscard]] constexpr storage_name name_of(const storage_key& k) noexcept {
  std::uint64_t a = detail::mix_into(0x73746f726167655fULL, k.model);
  a = detail::mix_into(a, k.prefix);
  a = detail::mix_into(a, static_cast<std::uint64_t>(k.tokens));
  a = detail::mix_into(a, static_cast<std::uint64_t>(k.kind));
  std::uint64_t b = detail::mix_into(0x6b65795f6e616d65ULL, static_cast<std::uint64_t>(k.kind));
  b = detail::mix_into(b, static_cast<std::uint64_t>(k.tokens));
  b = detail::mix_into(b, k.prefix);
  b = detail::mix_into(b, k.model);
  storage_name out{};
  constexpr char digits[] = "0123456789abcdef";
  for (int i = 0; i < 16; ++i) {
    out[static_cast<std::size_t>(i)] = digits[(a >> (60 - 4 * i)) & 0xfu];
    out[static_cast<std::size_t>(16 + i)] = digits[(b >> (60 - 4 * i)) & 0xfu];
  }
  return out;
}

/// A decoded header.
struct value_header {
  storage_key key{};
  value_meta meta{};
  std::uint32_t payload_crc = 0;
  std::uint32_t chunk_bytes = 0;
  std::int64_t length = 0;  ///< payload bytes
};

namespace detail {
template <class T>
constexpr void put_le(std::span<std::byte, value_header_bytes> h, std::size_t off, T v) noexcept {
  for (std::size_t i = 0; i < sizeof(T); ++i)
    h[off + i] = static_cast<std::byte>((static_cast<std::uint64_t>(v) >> (8 * i)) & 0xffu);
}
template <class T>
[[nodiscard]] constexpr T get_le(std::span<const std::byte, value_header_bytes> h, std::size_t off) noexcept {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) v |= static_cast<std::uint64_t>(h[off + i]) << (8 * i);
  return static_cast<T>(v);
}
}  // namespace detail

/// Writes the header of a value into `out`.
inline void encode_header(const value_header& v, std::span<std::byte, value_header_bytes> out) noexcept {
  using detail::put_le;
  for (std::byte& b : out) b = std::byte{0};
  put_le<std::uint32_t>(out, 0, value_magic);
  put_le<std::uint16_t>(out, 4, value_format_version);
  put_le<std::uint8_t>(out, 6, static_cast<std::uint8_t>(v.key.kind));
  put_le<std::uint8_t>(out, 7, static_cast<std::uint8_t>(v.meta.layout.order));
  put_le<std::uint32_t>(out, 12, v.payload_crc);
  put_le<std::uint64_t>(out, 16, v.key.model);
  put_le<std::uint64_t>(out, 24, v.key.prefix);
  put_le<std::int64_t>(out, 32, v.key.tokens);
  put_le<std::int64_t>(out, 40, v.meta.span_begin);
  put_le<std::uint32_t>(out, 48, v.meta.layout.layers);
  put_le<std::uint32_t>(out, 52, v.chunk_bytes);
  put_le<std::int64_t>(out, 56, v.length);
  put_le<std::uint32_t>(out, 8, crc32c(std::span<const std::byte>(out)));
}

/// Reads a header; `errc::invalid_argument` when the magic, version, header CRC or a field
/// (kind, layer order, span, negative length) is wrong.
[[nodiscard]] inline expected<value_header> decode_header(std::span<const std::byte, value_header_bytes> in) noexcept {
  using detail::get_le;
  if (get_le<std::uint32_t>(in, 0) != value_magic || get_le<std::uint16_t>(in, 4) != value_format_version)
    return unexpected(errc::invalid_argument);
  std::array<std::byte, value_header_bytes> copy{};
  for (std::size_t i = 0; i < value_header_bytes; ++i) copy[i] = (i >= 8 && i < 12) ? std::byte{0} : in[i];
  if (crc32c(std::span<const std::byte>(copy)) != get_le<std::uint32_t>(in, 8)) return unexpected(errc::invalid_argument);
  value_header v;
  v.key.kind = static_cast<value_kind>(get_le<std::uint8_t>(in, 6));
  v.meta.layout.order = static_cast<layer_order>(get_le<std::uint8_t>(in, 7));
  v.payload_crc = get_le<std::uint32_t>(in, 12);
  v.key.model = get_le<std::uint64_t>(in, 16);
  v.key.prefix = get_le<std::uint64_t>(in, 24);
  v.key.tokens = get_le<std::int64_t>(in, 32);
  v.meta.span_begin = get_le<std::int64_t>(in, 40);
  v.meta.layout.layers = get_le<std::uint32_t>(in, 48);
  v.chunk_bytes = get_le<std::uint32_t>(in, 52);
  v.length = get_le<std::int64_t>(in, 56);
  if (!valid_key(v.key) || !valid_meta(v.key, v.meta) || v.length < 0) return unexpected(errc::invalid_argument);
  return v;
}

/// Whether `payload` is the value `header` describes for the key `asked`: the header's key
/// is `asked`, the length matches and the payload CRC holds. O(bytes).
[[nodiscard]] inline bool check_payload(const value_header& header, const storage_key& asked,
                                        std::span<const std::byte> payload) noexcept {
  return header.key == asked && header.length == static_cast<std::int64_t>(payload.size()) &&
         crc32c(payload) == header.payload_crc;
}

}  // namespace hybridcache::tiered
