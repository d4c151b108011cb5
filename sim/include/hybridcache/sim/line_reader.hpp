// hybridcache/sim/line_reader.hpp
//
// Streams a text file line by line through a fixed buffer, so a multi-gigabyte trace is
// never held in memory: only the current line (and at most one buffer of look-ahead).
//
// Lines end at '\n'; a trailing '\r' is dropped (files written on Windows); the last line
// need not end with '\n'. A UTF-8 byte-order mark at the start of the file is skipped. Line numbers are 1-based, for error messages.
// Cost: O(bytes) with one memchr pass; the buffer grows only for a line longer than it.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <istream>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "hybridcache/core/error.hpp"

namespace hybridcache::sim {

/// Opens `path` for binary reading; throws `invalid_argument` naming the path if it cannot.
[[nodiscard]] inline std::unique_ptr<std::istream> open_input_file(const std::filesystem::path& path) {
  auto file = std::make_unique<std::ifstream>(path, std::ios::binary);
  if (!*file) throw invalid_argument("cannot open trace file '" + path.string() + "'");
  return file;
}

/// Buffered line reader over an input stream (owned or borrowed).
class line_reader {
 public:
  /// Reads from `in`, which must outlive the reader.
  explicit line_reader(std::istream& in, std::size_t buffer_bytes = std::size_t{1} << 20)
      : in_(&in), buffer_(buffer_bytes < 64 ? 64 : buffer_bytes) {}

  /// Opens and owns the file at `path` (throws `invalid_argument` if it cannot be opened).
  explicit line_reader(const std::filesystem::path& path, std::size_t buffer_bytes = std::size_t{1} << 20)
      : owned_(open_input_file(path)), in_(owned_.get()), buffer_(buffer_bytes < 64 ? 64 : buffer_bytes) {}

  /// Sets `line` to the next line (without its '\n' or trailing '\r') and returns true, or
  /// returns false at the end of input. The view is valid until the next call.
  bool next(std::string_view& line) {
    for (;;) {
      const char* const begin = buffer_.data() + begin_;
      const char* newline = static_cast<const char*>(std::memchr(begin, '\n', end_ - begin_));
      if (newline != nullptr) {
        const auto length = static_cast<std::size_t>(newline - begin);
        begin_ += length + 1;
        return emit(begin, length, line);
      }
      if (eof_) {
        if (begin_ == end_) return false;
        const std::size_t length = end_ - begin_;
        begin_ = end_;
        return emit(begin, length, line);
      }
      refill();
    }
  }

  /// Like `next`, but skips lines that are empty or only blanks (spaces, tabs, '\r'), which
  /// every trace format ignores. Line numbers still count the skipped lines.
  bool next_nonblank(std::string_view& line) {
    do {
      if (!next(line)) return false;
    } while (line.find_first_not_of(" \t\r") == std::string_view::npos);
    return true;
  }

  /// 1-based number of the line last returned (0 before the first).
  [[nodiscard]] std::int64_t line_number() const noexcept { return line_number_; }

 private:
  bool emit(const char* begin, std::size_t length, std::string_view& line) {
    if (length != 0 && begin[length - 1] == '\r') --length;
    if (line_number_ == 0 && length >= 3 && std::memcmp(begin, "\xEF\xBB\xBF", 3) == 0) {  // UTF-8 BOM
      begin += 3;
      length -= 3;
    }
    line = std::string_view(begin, length);
    ++line_number_;
    return true;
  }

  void refill() {
    // Move the partial line to the front; grow when it fills the whole buffer.
    if (begin_ != 0) {
      std::memmove(buffer_.data(), buffer_.data() + begin_, end_ - begin_);
      end_ -= begin_;
      begin_ = 0;
    }
    if (end_ == buffer_.size()) buffer_.resize(buffer_.size() * 2);
    in_->read(buffer_.data() + end_, static_cast<std::streamsize>(buffer_.size() - end_));
    const auto got = static_cast<std::size_t>(in_->gcount());
    end_ += got;
    if (in_->bad()) throw error("read error while reading a trace");
    if (got == 0 || in_->eof()) eof_ = true;
  }

  std::unique_ptr<std::istream> owned_;
  std::istream* in_;
  std::vector<char> buffer_;
  std::size_t begin_ = 0;
  std::size_t end_ = 0;
  bool eof_ = false;
  std::int64_t line_number_ = 0;
};

}  // namespace hybridcache::sim
