// tests/support/fake_cuda/cuda.h — stands in for the CUDA driver header (see fake_gpu.hpp).
#pragma once
#include "fake_gpu.hpp"
