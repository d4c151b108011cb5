// libFuzzer target: the marconi trace reader (sim/include/hybridcache/sim/marconi_trace.hpp).
#include <hybridcache/sim/marconi_trace.hpp>

#include "fuzz_reader.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return hybridcache_fuzz::run_reader(data, size, [](std::istream& in) { return hybridcache::sim::marconi_reader(in); });
}
