// tests/emulated/emulated_kernels.hpp — which `__global__` kernels of the library the emulated
// tests ran, and the launch helper they share.
//
// Every test that runs a kernel body under the CTA emulator records the kernel's name here;
// the test main (main.cpp) compares that set with the `__global__` functions it finds in the
// library's sources and prints `emulated kernels: k/K` (failing when k < K), so a kernel added
// without an emulated test fails this test.
#pragma once

#include <mutex>
#include <set>
#include <string>

#include "hybridcache/attention/kernel_context.hpp"
#include "../support/cta_emulator.hpp"

namespace hctest {

inline std::set<std::string>& emulated_kernels() {
  static std::set<std::string> names;
  return names;
}

/// Runs `body(lane)` for every thread of `shape` (the launcher's own shape function) and
/// records `kernel` as emulated.
template <class Body>
void emulate(const char* kernel, const hybridcache::attention::kernel_launch_shape& shape, Body&& body,
             const emu::options& opt = {}) {
  emu::launch({shape.blocks, shape.threads, shape.shared_bytes}, body, opt);
  emulated_kernels().insert(kernel);
}

}  // namespace hctest
