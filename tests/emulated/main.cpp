// The emulated tests' main: runs the doctest cases, then checks that every `__global__`
// kernel of the library (found by reading include/hybridcache/**/*.cuh) was run under the CTA
// emulator and calls the body of the same name, and prints `emulated kernels: k/K`.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>
#include <vector>

#include "emulated_kernels.hpp"

namespace {

struct kernel_decl {
  std::string name, file;
  bool calls_body = false;
};

std::vector<kernel_decl> library_kernels() {
  namespace fs = std::filesystem;
  std::vector<kernel_decl> out;
  const std::regex global(R"(__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\()");
  for (const auto& e : fs::recursive_directory_iterator(fs::path(HYBRIDCACHE_SOURCE_DIR) / "include")) {
    if (!e.is_regular_file() || e.path().extension() != ".cuh") continue;
    std::ifstream in(e.path());
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (auto it = std::sregex_iterator(text.begin(), text.end(), global); it != std::sregex_iterator(); ++it) {
      kernel_decl k{(*it)[1].str(), e.path().filename().string()};
      // The kernel's body: up to its closing brace at column 0.
      const auto from = static_cast<std::size_t>(it->position() + it->length());
      const std::string body = text.substr(from, text.find("\n}", from) - from);
      k.calls_body = body.find("kernel_bodies::" + k.name + "(") != std::string::npos ||
                     body.find("kernel_bodies::" + k.name + "<") != std::string::npos;
      out.push_back(k);
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int rc = context.run();
  if (context.shouldExit()) return rc;
  const auto kernels = library_kernels();
  int covered = 0;
  bool bodies_ok = !kernels.empty();
  for (const auto& k : kernels) {
    const bool ran = hctest::emulated_kernels().count(k.name) != 0;
    covered += ran ? 1 : 0;
    if (!ran) std::printf("kernel %s (%s) has no emulated test\n", k.name.c_str(), k.file.c_str());
    if (!k.calls_body) {
      std::printf("kernel %s (%s) does not call kernel_bodies::%s: the emulated body is not what the GPU runs\n",
                  k.name.c_str(), k.file.c_str(), k.name.c_str());
      bodies_ok = false;
    }
  }
  std::printf("emulated kernels: %d/%zu\n", covered, kernels.size());
  // A filtered run (-tc=..., -ts=...) covers a subset on purpose: only the full run must cover all.
  const bool full_run = argc == 1;
  if (rc != 0) return rc;
  if (!bodies_ok) return 1;
  return full_run && covered != static_cast<int>(kernels.size()) ? 1 : 0;
}
