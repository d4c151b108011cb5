// Test support: damage a stored value at rest. `flip_byte_in_largest_file(dir, back, mask)`
// xors one byte `back` bytes before the end of the largest regular file under `dir` (a disk
// tier's value files: the largest is the value a test made largest) and returns that file's
// size (0 when there is no file).
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>

namespace hybridcache::test {

inline std::uintmax_t flip_byte_in_largest_file(const std::filesystem::path& dir, std::uintmax_t back, unsigned char mask) {
  std::filesystem::path biggest;
  std::uintmax_t size = 0;
  for (const auto& f : std::filesystem::recursive_directory_iterator(dir))
    if (f.is_regular_file() && f.file_size() > size) size = f.file_size(), biggest = f.path();
  if (size == 0 || back == 0 || back > size) return size;
  std::fstream f(biggest, std::ios::in | std::ios::out | std::ios::binary);
  const auto at = static_cast<std::streamoff>(size - back);
  f.seekg(at);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(static_cast<unsigned char>(c) ^ mask);
  f.seekp(at);
  f.write(&c, 1);
  return size;
}

}  // namespace hybridcache::test
