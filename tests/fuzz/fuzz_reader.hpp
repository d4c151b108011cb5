// tests/fuzz/fuzz_reader.hpp: the shared body of the trace-reader fuzz targets.
//
// Each input is a whole trace file. A reader may reject it with a hybridcache::error
// (format_error, invalid_argument, overflow_error), which is the contract; anything else
// (a crash, a sanitizer report, std::bad_alloc, a non-finite arrival time, a request over
// the documented caps) is a finding.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>

#include <hybridcache/core/error.hpp>
#include <hybridcache/sim/request.hpp>

namespace hybridcache_fuzz {

inline void check_request(const hybridcache::sim::request& r) {
  namespace sim = hybridcache::sim;
  if (!std::isfinite(r.arrival_s) || r.arrival_s < 0 || r.arrival_s > sim::max_arrival_seconds) std::abort();
  if (r.input_tokens < 0 || r.input_tokens > sim::max_request_tokens) std::abort();
  if (r.output_tokens < 0 || r.output_tokens > sim::max_request_tokens) std::abort();
  if (static_cast<std::int64_t>(r.input.size()) > sim::max_request_tokens) std::abort();
}

template <class MakeReader>
int run_reader(const std::uint8_t* data, std::size_t size, MakeReader make) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  try {
    auto reader = make(in);
    hybridcache::sim::request r;
    for (int n = 0; n < 100000 && reader.next(r); ++n) check_request(r);
  } catch (const hybridcache::error&) {
  }
  return 0;
}

}  // namespace hybridcache_fuzz
