// hcbench: replay traces through hybridcache's policies and compare them.
#include <algorithm>
#include <cstdio>
#include <exception>

#include <hybridcache/core/error.hpp>

#include "command.hpp"

int main(int argc, char** argv) {
  CLI::App app{"hcbench: replay LLM request traces through hybridcache's cache and allocator policies"};
  app.require_subcommand(1);
  auto& cmds = hcbench::registry();
  std::sort(cmds.begin(), cmds.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  for (auto& c : cmds) c.setup(*app.add_subcommand(c.name, c.help));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const hybridcache::error& e) {
    std::fprintf(stderr, "hcbench: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hcbench: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
