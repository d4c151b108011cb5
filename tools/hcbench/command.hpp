// hcbench sub-command registry. Each sub-command lives in its own .cpp and registers
// itself at static-initialisation time:
//
//   static const bool registered = hcbench::register_command(
//       {"replay", "replay a trace through one policy", [](CLI::App& sub) { ... }});
//
// `setup` adds the sub-command's options and its callback. Callbacks report failure by
// throwing (hybridcache::error or std::exception); main prints one line naming the problem
// and exits non-zero.
#pragma once

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace hcbench {

struct command {
  std::string name;
  std::string help;
  std::function<void(CLI::App&)> setup;
};

inline std::vector<command>& registry() {
  static std::vector<command> commands;
  return commands;
}

inline bool register_command(command c) {
  registry().push_back(std::move(c));
  return true;
}

}  // namespace hcbench
