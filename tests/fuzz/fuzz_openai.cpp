// libFuzzer target: the openai chat/agent trace reader (sim/include/hybridcache/sim/chat_trace.hpp).
#include <hybridcache/sim/chat_trace.hpp>

#include "fuzz_reader.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return hybridcache_fuzz::run_reader(data, size, [](std::istream& in) { return hybridcache::sim::openai_reader(in); });
}
