// tests/support/sha256.hpp
//
// SHA-256 (FIPS 180-4) for tests that pin generated files to published digests. Written
// from the standard's description; checked against the FIPS 180-2 Appendix B vectors in
// tests/sim. Streaming: update() any number of times, then hex_digest().
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace hybridcache::test {

class sha256 {
 public:
  sha256() noexcept { reset(); }

  void reset() noexcept {
    state_ = {0x6a09e667u, 0xbb67ae85u, 0x3c6ef372u, 0xa54ff53au,
              0x510e527fu, 0x9b05688cu, 0x1f83d9abu, 0x5be0cd19u};
    buffered_ = 0;
    total_bytes_ = 0;
  }

  void update(std::string_view data) noexcept {
    const auto* bytes = reinterpret_cast<const unsigned char*>(data.data());
    std::size_t n = data.size();
    total_bytes_ += n;
    if (buffered_ != 0) {
      while (n != 0 && buffered_ < 64) {
        block_[buffered_++] = *bytes++;
        --n;
      }
      if (buffered_ < 64) return;
      compress(block_.data());
      buffered_ = 0;
    }
    while (n >= 64) {
      compress(bytes);
      bytes += 64;
      n -= 64;
    }
    while (n != 0) {
      block_[buffered_++] = *bytes++;
      --n;
    }
  }

  /// Finishes the hash (the object must be reset() before reuse) and returns 64 hex digits.
  [[nodiscard]] std::string hex_digest() {
    const std::uint64_t bit_length = total_bytes_ * 8;
    block_[buffered_++] = 0x80;
    if (buffered_ > 56) {
      while (buffered_ < 64) block_[buffered_++] = 0;
      compress(block_.data());
      buffered_ = 0;
    }
    while (buffered_ < 56) block_[buffered_++] = 0;
    for (int i = 7; i >= 0; --i) block_[buffered_++] = static_cast<unsigned char>(bit_length >> (8 * i));
    compress(block_.data());
    buffered_ = 0;
    static constexpr char hex[] = "0123456789abcdef";
    std::string out;
    for (std::uint32_t word : state_)
      for (int shift = 28; shift >= 0; shift -= 4) out += hex[(word >> shift) & 0xF];
    return out;
  }

 private:
  static constexpr std::uint32_t rotr(std::uint32_t x, int n) noexcept { return (x >> n) | (x << (32 - n)); }

  void compress(const unsigned char* p) noexcept {
    static constexpr std::array<std::uint32_t, 64> k = {
        0x428a2f98u, 0x71374491u, 0xb5c0fbcfu, 0xe9b5dba5u, 0x3956c25bu, 0x59f111f1u, 0x923f82a4u, 0xab1c5ed5u,
        0xd807aa98u, 0x12835b01u, 0x243185beu, 0x550c7dc3u, 0x72be5d74u, 0x80deb1feu, 0x9bdc06a7u, 0xc19bf174u,
        0xe49b69c1u, 0xefbe4786u, 0x0fc19dc6u, 0x240ca1ccu, 0x2de92c6fu, 0x4a7484aau, 0x5cb0a9dcu, 0x76f988dau,
        0x983e5152u, 0xa831c66du, 0xb00327c8u, 0xbf597fc7u, 0xc6e00bf3u, 0xd5a79147u, 0x06ca6351u, 0x14292967u,
        0x27b70a85u, 0x2e1b2138u, 0x4d2c6dfcu, 0x53380d13u, 0x650a7354u, 0x766a0abbu, 0x81c2c92eu, 0x92722c85u,
        0xa2bfe8a1u, 0xa81a664bu, 0xc24b8b70u, 0xc76c51a3u, 0xd192e819u, 0xd6990624u, 0xf40e3585u, 0x106aa070u,
        0x19a4c116u, 0x1e376c08u, 0x2748774cu, 0x34b0bcb5u, 0x391c0cb3u, 0x4ed8aa4au, 0x5b9cca4fu, 0x682e6ff3u,
        0x748f82eeu, 0x78a5636fu, 0x84c87814u, 0x8cc70208u, 0x90befffau, 0xa4506cebu, 0xbef9a3f7u, 0xc67178f2u};
    std::array<std::uint32_t, 64> w{};
    for (int i = 0; i < 16; ++i)
      w[i] = (std::uint32_t{p[4 * i]} << 24) | (std::uint32_t{p[4 * i + 1]} << 16) | (std::uint32_t{p[4 * i + 2]} << 8) |
             std::uint32_t{p[4 * i + 3]};
    for (int i = 16; i < 64; ++i) {
      const std::uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const std::uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    std::uint32_t a = state_[0], b = state_[1], c = state_[2], d = state_[3];
    std::uint32_t e = state_[4], f = state_[5], g = state_[6], h = state_[7];
    for (int i = 0; i < 64; ++i) {
      const std::uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
      const std::uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    state_[0] += a;
    state_[1] += b;
    state_[2] += c;
    state_[3] += d;
    state_[4] += e;
    state_[5] += f;
    state_[6] += g;
    state_[7] += h;
  }

  std::array<std::uint32_t, 8> state_{};
  std::array<unsigned char, 64> block_{};
  std::size_t buffered_ = 0;
  std::uint64_t total_bytes_ = 0;
};

/// SHA-256 of `data` as 64 lowercase hex digits.
[[nodiscard]] inline std::string sha256_hex(std::string_view data) {
  sha256 h;
  h.update(data);
  return h.hex_digest();
}

}  // namespace hybridcache::test
