// hcbench: replay traces through hybridcache's policies and compare them.
//
// Exit status: 0 on success (and for --help, --version), 1 for any error; the error is one
// line on stderr, `hcbench: ...` (see cli_support.hpp).
#include <algorithm>
#include <cstdio>
#include <exception>
#include <new>
#include <string>

#include <hybridcache/core/error.hpp>

#include "cli_support.hpp"
#include "command.hpp"

namespace {
std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}
}  // namespace

int main(int argc, char** argv) {
  for (int i = 0; i < argc; ++i) hcbench::invocation().emplace_back(argv[i]);
  CLI::App app{"hcbench: replay LLM request traces through hybridcache's cache and allocator policies"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "hcbench " + hcbench::version_string());
  app.option_defaults()->always_capture_default();  // --help shows every default
  auto& cmds = hcbench::registry();
  std::sort(cmds.begin(), cmds.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  for (auto& c : cmds) c.setup(*app.add_subcommand(c.name, c.help));
  // A first word that names no subcommand: say so (CLI11 would say "A subcommand is required").
  if (argc > 1 && argv[1][0] != '-' &&
      std::none_of(cmds.begin(), cmds.end(), [&](const auto& c) { return c.name == argv[1]; })) {
    std::string known;
    for (const auto& c : cmds) known += (known.empty() ? "" : ", ") + std::string(c.name);
    std::fprintf(stderr, "hcbench: unknown subcommand '%s' (known: %s)\n", argv[1], known.c_str());
    return 1;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    std::fprintf(stderr, "hcbench: %s\n", one_line(e.what()).c_str());
    return 1;
  } catch (const hcbench::input_error& e) {
    std::fprintf(stderr, "hcbench: %s\n", one_line(e.what()).c_str());
    return 1;
  } catch (const hybridcache::error& e) {
    std::fprintf(stderr, "hcbench: %s\n", one_line(hcbench::strip_library_prefix(e.what())).c_str());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "hcbench: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hcbench: error: %s\n", one_line(e.what()).c_str());
    return 1;
  }
  return 0;
}
