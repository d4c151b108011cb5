// doctest main of the device tests: exits 77 (ctest SKIP_RETURN_CODE) when no CUDA device
// is present, so machines without a GPU report the device tests as skipped, not passed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cstdio>

int main(int argc, char** argv) {
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess || devices == 0) {
    std::printf("hybridcache device tests: no CUDA device (%s); skipped\n",
                status == cudaSuccess ? "0 devices" : cudaGetErrorString(status));
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
