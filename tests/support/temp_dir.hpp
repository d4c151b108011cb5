// A fresh directory under the system's temporary directory (mkdtemp), removed with
// everything in it when the object goes away, also when a test fails.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

namespace hybridcache::test {

class temp_dir {
 public:
  explicit temp_dir(const std::string& tag = "hc") {
    std::string pattern = (std::filesystem::temp_directory_path() / (tag + "_XXXXXX")).string();
    std::vector<char> buf(pattern.begin(), pattern.end());
    buf.push_back('\0');
    if (::mkdtemp(buf.data()) == nullptr) throw std::runtime_error("temp_dir: mkdtemp failed for " + pattern);
    path_ = buf.data();
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;

  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
  [[nodiscard]] std::string str() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace hybridcache::test
