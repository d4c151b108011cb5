// tools/hcbench/trace_input.hpp
//
// Where a trace comes from: `--trace -` reads stdin, a name ending in `.gz` is inflated
// through zlib on the fly (gzip streams, concatenated members too), anything else is opened
// as a file: regular files, FIFOs and process substitutions alike (only a directory or a
// missing path is refused). The readers take the resulting std::istream.
#pragma once

#include <array>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <streambuf>
#include <string>

#include <zlib.h>

#include <hybridcache/core/error.hpp>

namespace hcbench {

/// A read-only streambuf over a gzip file (zlib's gzread).
class gzip_streambuf : public std::streambuf {
 public:
  explicit gzip_streambuf(const std::string& path) : file_(gzopen(path.c_str(), "rb")) {}
  ~gzip_streambuf() override {
    if (file_ != nullptr) gzclose(file_);
  }
  gzip_streambuf(const gzip_streambuf&) = delete;
  gzip_streambuf& operator=(const gzip_streambuf&) = delete;
  [[nodiscard]] bool is_open() const noexcept { return file_ != nullptr; }

 protected:
  int_type underflow() override {
    if (gptr() < egptr()) return traits_type::to_int_type(*gptr());
    const int n = gzread(file_, buffer_.data(), static_cast<unsigned>(buffer_.size()));
    if (n < 0) {
      int err = 0;
      const char* msg = gzerror(file_, &err);
      throw hybridcache::invalid_argument(std::string("gzip: ") + (msg != nullptr ? msg : "read error"));
    }
    if (n == 0) return traits_type::eof();
    setg(buffer_.data(), buffer_.data(), buffer_.data() + n);
    return traits_type::to_int_type(*gptr());
  }

 private:
  gzFile file_;
  std::array<char, 1 << 16> buffer_{};
};

/// An opened trace input; `stream()` is valid while this lives.
class trace_input {
 public:
  /// Opens `path` ("-" = stdin). @throws hybridcache::invalid_argument naming the path.
  explicit trace_input(const std::string& path) {
    namespace fs = std::filesystem;
    if (path == "-") {
      owned_ = std::make_unique<std::istream>(std::cin.rdbuf());
      return;
    }
    std::error_code ec;
    const auto st = fs::status(path, ec);
    if (ec || !fs::exists(st)) throw hybridcache::invalid_argument("trace file '" + path + "' does not exist");
    if (fs::is_directory(st)) throw hybridcache::invalid_argument("trace file '" + path + "' is a directory");
    if (path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0) {
      gz_ = std::make_unique<gzip_streambuf>(path);
      if (!gz_->is_open()) throw hybridcache::invalid_argument("cannot open trace file '" + path + "'");
      owned_ = std::make_unique<std::istream>(gz_.get());
      return;
    }
    auto f = std::make_unique<std::ifstream>(path, std::ios::binary);
    if (!*f) throw hybridcache::invalid_argument("cannot open trace file '" + path + "'");
    owned_ = std::move(f);
  }
  [[nodiscard]] std::istream& stream() { return *owned_; }

 private:
  std::unique_ptr<gzip_streambuf> gz_;
  std::unique_ptr<std::istream> owned_;
};

}  // namespace hcbench
