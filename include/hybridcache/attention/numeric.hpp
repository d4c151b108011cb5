// hybridcache/attention/numeric.hpp
//
// 16-bit storage types for kernel inputs and outputs, with round-to-nearest-even
// conversions that give the same bits on the host (g++/clang++) and on the device (nvcc).
//
// `half_t` (IEEE binary16) and `bfloat16_t` are plain 16-bit storage: arithmetic always
// happens in fp32 after `to_float`, and results are rounded once by `from_float<T>`. Being
// ours (not `__half`), they need no CUDA header, so the per-head math that uses them is
// also the host reference in tests. The bit layouts equal `__half`/`__nv_bfloat16`, so a
// device buffer of either type can be reinterpreted as ours.
//
// Cost: a few integer operations per conversion; no tables, no allocation.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "hybridcache/core/config.hpp"

namespace hybridcache::attention {

/// IEEE 754 binary16 storage (same bits as `__half`).
struct half_t {
  std::uint16_t bits = 0;
};

/// bfloat16 storage: the upper 16 bits of an fp32 (same bits as `__nv_bfloat16`).
struct bfloat16_t {
  std::uint16_t bits = 0;
};

namespace detail {

HYBRIDCACHE_HD_INLINE std::uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

HYBRIDCACHE_HD_INLINE float bits_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

}  // namespace detail

/// Identity, so generic code can call `to_float` on any I/O type.
HYBRIDCACHE_HD_INLINE float to_float(float x) { return x; }

/// Exact widening of a bfloat16.
HYBRIDCACHE_HD_INLINE float to_float(bfloat16_t x) {
  return detail::bits_float(static_cast<std::uint32_t>(x.bits) << 16);
}

/// Exact widening of a binary16 (normals, subnormals, infinities and NaNs).
HYBRIDCACHE_HD_INLINE float to_float(half_t x) {
  const std::uint32_t sign = static_cast<std::uint32_t>(x.bits & 0x8000u) << 16;
  std::uint32_t exp = (x.bits >> 10) & 0x1Fu;
  std::uint32_t man = x.bits & 0x3FFu;
  if (exp == 0x1Fu) return detail::bits_float(sign | 0x7F800000u | (man << 13));  // inf / nan
  if (exp == 0) {
    if (man == 0) return detail::bits_float(sign);  // signed zero
    // Subnormal: value = man * 2^-24, exact in fp32.
    const float mag = static_cast<float>(man) * 5.9604644775390625e-8f;
    return sign ? -mag : mag;
  }
  return detail::bits_float(sign | ((exp + 112u) << 23) | (man << 13));
}

/// Rounds an fp32 to `T` (float, half_t or bfloat16_t), round-to-nearest-even.
template <class T>
HYBRIDCACHE_HD_INLINE T from_float(float f) {
  if constexpr (std::is_same_v<T, float>) {
    return f;
  } else if constexpr (std::is_same_v<T, bfloat16_t>) {
    const std::uint32_t u = detail::float_bits(f);
    if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu) != 0)
      return bfloat16_t{static_cast<std::uint16_t>((u >> 16) | 0x0040u)};  // quiet NaN
    const std::uint32_t rounded = u + 0x7FFFu + ((u >> 16) & 1u);
    return bfloat16_t{static_cast<std::uint16_t>(rounded >> 16)};
  } else {
    static_assert(std::is_same_v<T, half_t>, "from_float: T must be float, half_t or bfloat16_t");
    const std::uint32_t u = detail::float_bits(f);
    const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
    const std::uint32_t abs = u & 0x7FFFFFFFu;
    if (abs >= 0x7F800000u)  // inf or nan
      return half_t{static_cast<std::uint16_t>(sign | 0x7C00u | (abs > 0x7F800000u ? 0x0200u : 0u))};
    if (abs >= 0x477FF000u) return half_t{static_cast<std::uint16_t>(sign | 0x7C00u)};  // rounds to inf
    if (abs < 0x38800000u) {
      // Result is subnormal (or zero) in binary16: units of 2^-24, rounded to nearest even.
      if (abs < 0x33000000u) return half_t{sign};  // below half the smallest subnormal
      const std::uint32_t exp = abs >> 23;
      const std::uint32_t man = (abs & 0x7FFFFFu) | 0x800000u;
      const std::uint32_t shift = 126u - exp;  // 14 + (113 - exp) + ... : value = man * 2^(exp-150)
      const std::uint32_t keep = man >> shift;
      const std::uint32_t rest = man & ((1u << shift) - 1u);
      const std::uint32_t halfway = 1u << (shift - 1u);
      std::uint32_t r = keep + ((rest > halfway || (rest == halfway && (keep & 1u))) ? 1u : 0u);
      return half_t{static_cast<std::uint16_t>(sign | r)};
    }
    // Normal: rebias the exponent, round the 13 dropped mantissa bits to nearest even.
    const std::uint32_t rebased = abs - 0x38000000u;  // exponent 127 -> 15
    const std::uint32_t rounded = rebased + 0x0FFFu + ((rebased >> 13) & 1u);
    return half_t{static_cast<std::uint16_t>(sign | (rounded >> 13))};
  }
}

/// True for the I/O element types the per-head forms accept.
template <class T>
inline constexpr bool is_io_type_v =
    std::is_same_v<T, float> || std::is_same_v<T, half_t> || std::is_same_v<T, bfloat16_t>;

/// True unless `x` is NaN or infinite (works under -ffast-math too: tests the bits).
HYBRIDCACHE_HD_INLINE bool is_finite(float x) {
  return (detail::float_bits(x) & 0x7F800000u) != 0x7F800000u;
}

}  // namespace hybridcache::attention
