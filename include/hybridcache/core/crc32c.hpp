// hybridcache/core/crc32c.hpp
//
// CRC-32C (Castagnoli), the checksum of every value the storage backends write
// (tiered/storage_format.hpp). Written from the polynomial, not from another library:
//
//   generator 0x1EDC6F41, bit-reflected 0x82F63B78; register starts at 0xFFFFFFFF and the
//   result is inverted (the iSCSI / ext4 / SSE4.2 convention). Check value of the ASCII
//   string "123456789": 0xE3069283.
//
// Why CRC-32C and not a hash: it detects every burst error up to 32 bits and every odd
// number of flipped bits, which is what a torn write or a flipped byte on disk produces, and
// x86-64 has an instruction for it, so verifying a 9.2 MB checkpoint costs a fraction of
// reading it (docs/storage.md has the measured numbers).
//
// Three ways to compute it, all giving the same value:
//   crc32c_bitwise   one bit at a time, the definition; the reference in the tests
//   crc32c_software  slicing-by-8 over tables built at compile time (~1 byte per cycle)
//   crc32c           the entry point: on x86-64 with g++/clang++ and a CPU that has SSE4.2
//                    (checked once at run time), three independent `crc32` instruction
//                    streams over three thirds of each block, joined by multiplying the
//                    earlier streams' registers by x^(8n) mod P (the CRC is linear, so
//                    crc(A ++ B) = crc(A) * x^(8|B|) + crc(B) over the raw register);
//                    elsewhere the slicing-by-8 code.
//   crc32c_copy      copies while it checksums: each 8-byte word is loaded once, fed to the
//                    CRC and stored, so verifying a value costs about what copying it costs
//                    (the disk tier reads large values from the page cache this way).
//
// The instruction path uses compiler builtins (`__builtin_ia32_crc32di`, a per-function
// `target("sse4.2")` attribute and `__builtin_cpu_supports`), no library and no intrinsic
// header, so a build for any x86-64 CPU still runs on one without SSE4.2.
//
// Costs: O(n) time, O(1) space, no allocation; `crc32c_extend` continues a running CRC.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

namespace hybridcache {

/// The reflected CRC-32C polynomial.
inline constexpr std::uint32_t crc32c_polynomial = 0x82F63B78u;

namespace detail {

/// One table per byte position of an 8-byte word (slicing-by-8): tables[0][b] is the raw
/// register after feeding byte b into a zero register; tables[k][b] is that register
/// advanced by k more zero bytes.
inline constexpr std::array<std::array<std::uint32_t, 256>, 8> crc32c_tables = [] {
  std::array<std::array<std::uint32_t, 256>, 8> t{};
  for (std::uint32_t b = 0; b < 256; ++b) {
    std::uint32_t c = b;
    for (int i = 0; i < 8; ++i) c = (c & 1u) != 0 ? (c >> 1) ^ crc32c_polynomial : c >> 1;
    t[0][b] = c;
  }
  for (std::size_t k = 1; k < 8; ++k)
    for (std::uint32_t b = 0; b < 256; ++b) t[k][b] = t[0][t[k - 1][b] & 0xffu] ^ (t[k - 1][b] >> 8);
  return t;
}();

/// a * b mod P in the reflected representation (bit 31 is x^0). Used to shift a register
/// over n zero bytes: multiply by x^(8n) mod P. 32 steps at most.
[[nodiscard]] constexpr std::uint32_t crc32c_multiply(std::uint32_t a, std::uint32_t b) noexcept {
  std::uint32_t product = 0;
  for (std::uint32_t bit = 1u << 31; bit != 0; bit >>= 1) {
    if ((a & bit) != 0) product ^= b;
    b = (b & 1u) != 0 ? (b >> 1) ^ crc32c_polynomial : b >> 1;  // b *= x
  }
  return product;
}

/// x^(8 * bytes) mod P, reflected.
[[nodiscard]] constexpr std::uint32_t crc32c_shift_constant(std::size_t bytes) noexcept {
  std::uint32_t result = 1u << 31;  // x^0
  std::uint32_t power = 1u << 23;   // x^8
  for (std::size_t n = bytes; n != 0; n >>= 1) {
    if ((n & 1u) != 0) result = crc32c_multiply(result, power);
    power = crc32c_multiply(power, power);
  }
  return result;
}

/// Raw register update (no inversion), slicing-by-8.
[[nodiscard]] inline std::uint32_t crc32c_raw_software(std::uint32_t crc, const unsigned char* p, std::size_t n) noexcept {
  const auto& t = crc32c_tables;
  for (; n >= 8; n -= 8, p += 8) {
    std::uint64_t w = 0;
    if constexpr (std::endian::native == std::endian::little) {
      std::memcpy(&w, p, 8);
    } else {
      for (int i = 7; i >= 0; --i) w = (w << 8) | p[i];  // little-endian load
    }
    w ^= crc;
    crc = t[7][w & 0xffu] ^ t[6][(w >> 8) & 0xffu] ^ t[5][(w >> 16) & 0xffu] ^ t[4][(w >> 24) & 0xffu] ^
          t[3][(w >> 32) & 0xffu] ^ t[2][(w >> 40) & 0xffu] ^ t[1][(w >> 48) & 0xffu] ^ t[0][w >> 56];
  }
  for (; n > 0; --n, ++p) crc = t[0][(crc ^ *p) & 0xffu] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HYBRIDCACHE_CRC32C_SSE42 1

/// Bytes per stream per block of the three-stream loop; the joining constant is computed
/// at compile time for this length.
inline constexpr std::size_t crc32c_stream_bytes = 4096;
inline constexpr std::uint32_t crc32c_stream_shift = crc32c_shift_constant(crc32c_stream_bytes);

__attribute__((target("sse4.2"))) inline std::uint32_t crc32c_raw_sse42(std::uint32_t crc, const unsigned char* p,
                                                                         std::size_t n) noexcept {
  auto word = [](const unsigned char* q) {
    std::uint64_t w;
    std::memcpy(&w, q, 8);  // x86-64 is little-endian
    return w;
  };
  // Three independent streams hide the instruction's 3-cycle latency.
  while (n >= 3 * crc32c_stream_bytes) {
    std::uint64_t a = crc, b = 0, c = 0;
    const unsigned char* pb = p + crc32c_stream_bytes;
    const unsigned char* pc = pb + crc32c_stream_bytes;
    for (std::size_t i = 0; i < crc32c_stream_bytes; i += 8) {
      a = __builtin_ia32_crc32di(a, word(p + i));
      b = __builtin_ia32_crc32di(b, word(pb + i));
      c = __builtin_ia32_crc32di(c, word(pc + i));
    }
    std::uint32_t r = crc32c_multiply(crc32c_stream_shift, static_cast<std::uint32_t>(a)) ^ static_cast<std::uint32_t>(b);
    crc = crc32c_multiply(crc32c_stream_shift, r) ^ static_cast<std::uint32_t>(c);
    p += 3 * crc32c_stream_bytes;
    n -= 3 * crc32c_stream_bytes;
  }
  std::uint64_t r = crc;
  for (; n >= 8; n -= 8, p += 8) r = __builtin_ia32_crc32di(r, word(p));
  crc = static_cast<std::uint32_t>(r);
  for (; n > 0; --n, ++p) crc = __builtin_ia32_crc32qi(crc, *p);
  return crc;
}

/// Copies n bytes from p to dst and returns the raw register advanced over them.
__attribute__((target("sse4.2"))) inline std::uint32_t crc32c_copy_raw_sse42(std::uint32_t crc, std::byte* dst,
                                                                              const unsigned char* p,
                                                                              std::size_t n) noexcept {
  constexpr std::size_t l = crc32c_stream_bytes;
  while (n >= 3 * l) {
    std::uint64_t a = crc, b = 0, c = 0;
    for (std::size_t i = 0; i < l; i += 8) {
      std::uint64_t wa, wb, wc;
      std::memcpy(&wa, p + i, 8);
      std::memcpy(&wb, p + l + i, 8);
      std::memcpy(&wc, p + 2 * l + i, 8);
      a = __builtin_ia32_crc32di(a, wa);
      b = __builtin_ia32_crc32di(b, wb);
      c = __builtin_ia32_crc32di(c, wc);
      std::memcpy(dst + i, &wa, 8);
      std::memcpy(dst + l + i, &wb, 8);
      std::memcpy(dst + 2 * l + i, &wc, 8);
    }
    const std::uint32_t r = crc32c_multiply(crc32c_stream_shift, static_cast<std::uint32_t>(a)) ^ static_cast<std::uint32_t>(b);
    crc = crc32c_multiply(crc32c_stream_shift, r) ^ static_cast<std::uint32_t>(c);
    p += 3 * l;
    dst += 3 * l;
    n -= 3 * l;
  }
  std::memcpy(dst, p, n);
  return crc32c_raw_sse42(crc, p, n);
}

[[nodiscard]] inline bool crc32c_has_sse42() noexcept {
  static const bool has = __builtin_cpu_supports("sse4.2") != 0;
  return has;
}
#endif

}  // namespace detail

/// CRC-32C one bit at a time: the definition (reference for tests; ~50x slower).
[[nodiscard]] constexpr std::uint32_t crc32c_bitwise(std::span<const std::byte> data, std::uint32_t crc = 0) noexcept {
  crc = ~crc;
  for (const std::byte b : data) {
    crc ^= static_cast<std::uint32_t>(b);
    for (int i = 0; i < 8; ++i) crc = (crc & 1u) != 0 ? (crc >> 1) ^ crc32c_polynomial : crc >> 1;
  }
  return ~crc;
}

/// CRC-32C with the slicing-by-8 tables only (portable; the fallback of `crc32c`).
[[nodiscard]] inline std::uint32_t crc32c_software(std::span<const std::byte> data, std::uint32_t crc = 0) noexcept {
  return ~detail::crc32c_raw_software(~crc, reinterpret_cast<const unsigned char*>(data.data()), data.size());
}

/// Whether `crc32c` uses the CPU's crc32 instruction on this machine.
[[nodiscard]] inline bool crc32c_hardware() noexcept {
#if defined(HYBRIDCACHE_CRC32C_SSE42)
  return detail::crc32c_has_sse42();
#else
  return false;
#endif
}

/// CRC-32C of `data`, continuing the CRC `crc` of the bytes before it (0 to start):
/// crc32c(b, crc32c(a)) == crc32c(a ++ b).
[[nodiscard]] inline std::uint32_t crc32c(std::span<const std::byte> data, std::uint32_t crc = 0) noexcept {
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
#if defined(HYBRIDCACHE_CRC32C_SSE42)
  if (detail::crc32c_has_sse42()) return ~detail::crc32c_raw_sse42(~crc, p, data.size());
#endif
  return ~detail::crc32c_raw_software(~crc, p, data.size());
}

/// Copies `src` into `dst` (which must be at least as long) and returns crc32c(src, crc),
/// reading each byte once when the CPU has the crc32 instruction.
inline std::uint32_t crc32c_copy(std::span<std::byte> dst, std::span<const std::byte> src, std::uint32_t crc = 0) noexcept {
  const auto* p = reinterpret_cast<const unsigned char*>(src.data());
#if defined(HYBRIDCACHE_CRC32C_SSE42)
  if (detail::crc32c_has_sse42()) return ~detail::crc32c_copy_raw_sse42(~crc, dst.data(), p, src.size());
#endif
  if (!src.empty()) std::memcpy(dst.data(), src.data(), src.size());
  return ~detail::crc32c_raw_software(~crc, p, src.size());
}

}  // namespace hybridcache
