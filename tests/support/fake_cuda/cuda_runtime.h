// tests/support/fake_cuda/cuda_runtime.h — stands in for the CUDA runtime header in the host
// tests that run the library's CUDA host code (VMM backing, copy engine, KVBuffer device
// table) against a model of the driver: see fake_gpu.hpp. Never on a real CUDA build's path.
#pragma once
#include "fake_gpu.hpp"
