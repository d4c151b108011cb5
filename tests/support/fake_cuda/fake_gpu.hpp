// tests/support/fake_cuda/fake_gpu.hpp — a host model of the CUDA runtime and of the driver's
// virtual-memory calls, with the signatures the library's CUDA host code uses, so that code
// (memory/cuda/, tiered/cuda/copy_engine.cuh, attention/cuda/kv_buffer_device.cuh) compiles
// with g++ and runs in the host tests, under ASan and TSan, without a GPU.
//
// What it models, and checks:
//   streams   FIFO queues that run LAZILY: nothing a stream holds executes until the host
//             waits for it (cudaStreamSynchronize, cudaEventSynchronize, cudaDeviceSynchronize,
//             a synchronous copy involving host memory) or the test calls `run_all()`. This is
//             the most adversarial schedule the real device allows, so a missing dependency
//             shows up as stale data or as an access to an unmapped range. The legacy default
//             stream (nullptr) is ordered with blocking streams both ways; non-blocking streams
//             are not; cudaStreamWaitEvent waits for the event's record at call time.
//   memory    cudaMalloc / cudaHostAlloc hand out real host memory; cudaHostRegister marks a
//             range pinned; a cudaMemcpyAsync from pageable host memory is staged at the call
//             (as the driver does, synchronously) and counted in `pageable_copies`.
//   VMM       cuMemCreate (physical chunks of the granularity's multiples), cuMemAddressReserve
//             (alignment must be 0 or a power of two, else CUDA_ERROR_INVALID_VALUE),
//             cuMemMap/SetAccess/Unmap on fake addresses that are translated at execution.
//             Unmapping a range that queued work still uses, and any executed access to an
//             unmapped range, is recorded in `violations()`.
//   devices   `devices` devices, the current one global (one test thread); events record on
//             a stream of their own device only.
//   failures  `fail_next(call, error, skip)`: the (skip+1)-th next call of that name fails.
//   counters  live events and streams (leaks), calls by name.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#define CUDART_VERSION 13000

// ---- runtime types ------------------------------------------------------------------------
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorLaunchFailure = 719,
  cudaErrorUnknown = 999,
};
using cudaError = cudaError_t;
struct CUstream_st;
struct CUevent_st;
using cudaStream_t = CUstream_st*;
using cudaEvent_t = CUevent_st*;
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
inline constexpr unsigned int cudaStreamDefault = 0, cudaStreamNonBlocking = 1;
inline constexpr unsigned int cudaEventDefault = 0, cudaEventDisableTiming = 2;
inline constexpr unsigned int cudaHostAllocDefault = 0, cudaHostRegisterDefault = 0;
inline constexpr unsigned long long cudaEnableDefault = 0;
enum cudaDriverEntryPointQueryResult {
  cudaDriverEntryPointSuccess = 0,
  cudaDriverEntryPointSymbolNotFound = 1,
};

// ---- driver types -------------------------------------------------------------------------
enum CUresult {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_OUT_OF_MEMORY = 2,
  CUDA_ERROR_ALREADY_MAPPED = 208,
  CUDA_ERROR_NOT_MAPPED = 211,
  CUDA_ERROR_UNKNOWN = 999,
};
using CUdeviceptr = unsigned long long;
using CUmemGenericAllocationHandle = unsigned long long;
enum CUmemAllocationType { CU_MEM_ALLOCATION_TYPE_INVALID = 0, CU_MEM_ALLOCATION_TYPE_PINNED = 1 };
enum CUmemLocationType { CU_MEM_LOCATION_TYPE_INVALID = 0, CU_MEM_LOCATION_TYPE_DEVICE = 1 };
enum CUmemAccess_flags { CU_MEM_ACCESS_FLAGS_PROT_NONE = 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3 };
enum CUmemAllocationGranularity_flags { CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0 };
struct CUmemLocation {
  CUmemLocationType type;
  int id;
};
struct CUmemAllocationProp {
  CUmemAllocationType type;
  int requestedHandleTypes;
  CUmemLocation location;
  void* win32HandleMetaData;
};
struct CUmemAccessDesc {
  CUmemLocation location;
  CUmemAccess_flags flags;
};

namespace fake_cuda {

/// The modelled device(s). One per process (`get()`); `reset()` between tests.
class gpu {
 public:
  static gpu& get() {
    static gpu g;
    return g;
  }

  /// Forgets everything (memory is freed, streams and events dropped) and starts over.
  void reset(int devices = 1, std::size_t granularity = std::size_t{2} << 20) {
    std::lock_guard lk(mutex());
    gpu fresh;
    *this = std::move(fresh);
    devices_ = devices;
    granularity_ = granularity;
  }

  // ---- what a test inspects ----
  [[nodiscard]] const std::vector<std::string>& violations() const { return violations_; }
  [[nodiscard]] int live_events() const { return static_cast<int>(events_.size()); }
  [[nodiscard]] int live_streams() const { return static_cast<int>(streams_.size()) - 1; }
  [[nodiscard]] int pageable_copies() const { return pageable_copies_; }
  [[nodiscard]] int calls(const std::string& name) const {
    const auto it = calls_.find(name);
    return it == calls_.end() ? 0 : it->second;
  }
  [[nodiscard]] int current_device() const { return current_; }

  /// The `skip`+1-th next call of `name` returns `error` (cudaError_t or CUresult value).
  void fail_next(const std::string& name, int error, int skip = 0) { failures_[name] = {skip, error}; }

  /// Queues a "kernel" on `stream` that touches [ptr, ptr + bytes) (device or VMM addresses);
  /// `body(bytes_at)` runs when it executes, with a translator from device address to host bytes.
  void launch(cudaStream_t stream, std::vector<std::pair<const void*, std::size_t>> touches,
              std::function<void(const std::function<std::byte*(const void*)>&)> body) {
    std::lock_guard lk(mutex());
    op o;
    o.what = "kernel";
    o.touches = std::move(touches);
    o.kernel = std::move(body);
    enqueue(sid(stream), std::move(o));
  }
  /// Host view of a device address now (for a test's checks after synchronising).
  std::byte* bytes_at(const void* p) {
    std::lock_guard lk(mutex());
    return translate(reinterpret_cast<std::uintptr_t>(p), 1, "test read");
  }
  /// Lets the device finish everything queued.
  void run_all() {
    std::lock_guard lk(mutex());
    for (auto& [id, s] : streams_) complete(id, s.ops.size());
  }

  // ---- the API (called by the global functions below) ----
  int call(const char* name) {
    ++calls_[name];
    auto it = failures_.find(name);
    if (it == failures_.end()) return 0;
    if (it->second.first-- > 0) return 0;
    const int e = it->second.second;
    failures_.erase(it);
    return e;
  }
  static std::recursive_mutex& mutex() {
    static std::recursive_mutex m;
    return m;
  }

  cudaError_t set_device(int d) {
    if (d < 0 || d >= devices_) return cudaErrorInvalidDevice;
    current_ = d;
    return cudaSuccess;
  }
  void* device_alloc(std::size_t n, bool pinned_host) {
    auto mem = std::make_unique<std::byte[]>(n == 0 ? 1 : n);
    void* p = mem.get();
    (pinned_host ? host_allocs_ : device_allocs_)[p] = {std::move(mem), n};
    if (pinned_host) pinned_[reinterpret_cast<std::uintptr_t>(p)] = n;
    return p;
  }
  cudaError_t device_free(void* p, bool pinned_host) {
    if (p == nullptr) return cudaSuccess;
    auto& m = pinned_host ? host_allocs_ : device_allocs_;
    if (m.erase(p) == 0) return cudaErrorInvalidValue;
    if (pinned_host) pinned_.erase(reinterpret_cast<std::uintptr_t>(p));
    return cudaSuccess;
  }
  void register_host(void* p, std::size_t n, bool on) {
    if (on) pinned_[reinterpret_cast<std::uintptr_t>(p)] = n;
    else pinned_.erase(reinterpret_cast<std::uintptr_t>(p));
  }

  cudaStream_t create_stream(unsigned int flags) {
    const int id = next_stream_++;
    streams_[id].blocking = (flags & cudaStreamNonBlocking) == 0;
    streams_[id].device = current_;
    return reinterpret_cast<cudaStream_t>(static_cast<std::uintptr_t>(id));
  }
  cudaError_t destroy_stream(cudaStream_t s) {
    const int id = sid(s);
    if (id == 0 || streams_.count(id) == 0) return cudaErrorInvalidResourceHandle;
    complete(id, streams_[id].ops.size());  // the driver lets queued work finish
    streams_.erase(id);
    return cudaSuccess;
  }
  cudaEvent_t create_event(unsigned int flags) {
    const int id = next_event_++;
    events_[id] = event{current_, (flags & cudaEventDisableTiming) == 0, -1, 0};
    return reinterpret_cast<cudaEvent_t>(static_cast<std::uintptr_t>(id));
  }
  cudaError_t destroy_event(cudaEvent_t e) { return events_.erase(eid(e)) ? cudaSuccess : cudaErrorInvalidResourceHandle; }
  cudaError_t record(cudaEvent_t e, cudaStream_t s) {
    auto it = events_.find(eid(e));
    const int id = sid(s);
    if (it == events_.end() || streams_.count(id) == 0) return cudaErrorInvalidResourceHandle;
    if (id != 0 && streams_[id].device != it->second.device) return cudaErrorInvalidResourceHandle;
    op o;
    o.what = "record";
    it->second.stream = id;
    it->second.index = enqueue(id, std::move(o));
    return cudaSuccess;
  }
  cudaError_t wait_event(cudaStream_t s, cudaEvent_t e) {
    auto it = events_.find(eid(e));
    const int id = sid(s);
    if (it == events_.end() || streams_.count(id) == 0) return cudaErrorInvalidResourceHandle;
    op o;
    o.what = "wait";
    if (it->second.stream >= 0) o.deps.push_back({it->second.stream, it->second.index});
    enqueue(id, std::move(o));
    return cudaSuccess;
  }
  cudaError_t query(cudaEvent_t e) {
    auto it = events_.find(eid(e));
    if (it == events_.end()) return cudaErrorInvalidResourceHandle;
    const auto st = streams_.find(it->second.stream);
    if (it->second.stream < 0 || st == streams_.end()) return cudaSuccess;  // never recorded, or its stream is gone
    return st->second.done > it->second.index ? cudaSuccess : cudaErrorNotReady;
  }
  cudaError_t sync_event(cudaEvent_t e) {
    auto it = events_.find(eid(e));
    if (it == events_.end()) return cudaErrorInvalidResourceHandle;
    if (it->second.stream >= 0) complete(it->second.stream, it->second.index + 1);
    return cudaSuccess;
  }
  cudaError_t sync_stream(cudaStream_t s) {
    const int id = sid(s);
    if (streams_.count(id) == 0) return cudaErrorInvalidResourceHandle;
    complete(id, streams_[id].ops.size());
    return cudaSuccess;
  }
  cudaError_t copy(void* dst, const void* src, std::size_t n, cudaStream_t s, bool host_sync) {
    const int id = sid(s);
    if (streams_.count(id) == 0) return cudaErrorInvalidResourceHandle;
    op o;
    o.what = "copy";
    o.dst = reinterpret_cast<std::uintptr_t>(dst);
    o.src = reinterpret_cast<std::uintptr_t>(src);
    o.n = n;
    o.touches = {{dst, n}, {src, n}};
    const bool host_src = is_host(o.src), host_dst = is_host(o.dst);
    if (host_src && !pinned(o.src, n)) {  // the driver stages pageable memory at the call
      ++pageable_copies_;
      o.staged.assign(static_cast<const std::byte*>(src), static_cast<const std::byte*>(src) + n);
    }
    const std::size_t at = enqueue(id, std::move(o));
    if (host_sync && (host_src || host_dst)) complete(id, at + 1);  // device-to-device: no host wait
    return cudaSuccess;
  }

  CUresult reserve(CUdeviceptr* p, std::size_t size, std::size_t alignment) {
    if (alignment != 0 && (alignment & (alignment - 1)) != 0) return CUDA_ERROR_INVALID_VALUE;
    if (size == 0 || size % granularity_ != 0) return CUDA_ERROR_INVALID_VALUE;
    const std::uintptr_t align = alignment == 0 ? granularity_ : alignment;
    next_va_ = (next_va_ + align - 1) / align * align;
    *p = next_va_;
    reservations_[next_va_] = size;
    next_va_ += size + granularity_;  // a gap: an overrun of one reservation is not the next one
    return CUDA_SUCCESS;
  }
  CUresult free_va(CUdeviceptr p, std::size_t size) {
    auto it = reservations_.find(p);
    if (it == reservations_.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
    for (const auto& [va, mp] : mappings_)
      if (va >= p && va < p + size) return CUDA_ERROR_INVALID_VALUE;  // still mapped
    reservations_.erase(it);
    return CUDA_SUCCESS;
  }
  CUresult create(CUmemGenericAllocationHandle* h, std::size_t size) {
    if (size == 0 || size % granularity_ != 0) return CUDA_ERROR_INVALID_VALUE;
    *h = next_handle_++;
    physical_[*h] = std::vector<std::byte>(size);
    return CUDA_SUCCESS;
  }
  CUresult release(CUmemGenericAllocationHandle h) { return physical_.erase(h) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }
  CUresult map(CUdeviceptr p, std::size_t size, std::size_t offset, CUmemGenericAllocationHandle h) {
    const auto ph = physical_.find(h);
    if (ph == physical_.end() || offset + size > ph->second.size() || p % granularity_ != 0 || size % granularity_ != 0)
      return CUDA_ERROR_INVALID_VALUE;
    if (!reserved(p, size)) return CUDA_ERROR_INVALID_VALUE;
    for (const auto& [va, mp] : mappings_)
      if (va < p + size && p < va + mp.size) return CUDA_ERROR_ALREADY_MAPPED;
    mappings_[p] = mapping{h, offset, size, false};
    return CUDA_SUCCESS;
  }
  CUresult set_access(CUdeviceptr p, std::size_t size) {
    auto it = mappings_.find(p);
    if (it == mappings_.end() || it->second.size != size) return CUDA_ERROR_INVALID_VALUE;
    it->second.accessible = true;
    return CUDA_SUCCESS;
  }
  CUresult unmap(CUdeviceptr p, std::size_t size) {
    auto it = mappings_.find(p);
    if (it == mappings_.end() || it->second.size != size) return CUDA_ERROR_NOT_MAPPED;
    // cuMemUnmap does not wait for device work: anything queued that still uses the range
    // would fault on a GPU.
    for (const auto& [id, s] : streams_)
      for (std::size_t i = s.done; i < s.ops.size(); ++i)
        for (const auto& [tp, tn] : s.ops[i].touches)
          if (overlaps(reinterpret_cast<std::uintptr_t>(tp), tn, p, size))
            violations_.push_back("cuMemUnmap of [" + hex(p) + ", +" + std::to_string(size) + ") while a queued " +
                                  s.ops[i].what + " on stream " + std::to_string(id) + " still uses it");
    mappings_.erase(it);
    return CUDA_SUCCESS;
  }
  [[nodiscard]] std::size_t granularity() const { return granularity_; }

 private:
  struct op {
    std::string what;
    std::vector<std::pair<int, std::size_t>> deps;  // (stream, index) that must have run
    std::vector<std::pair<const void*, std::size_t>> touches;
    std::uintptr_t dst = 0, src = 0;
    std::size_t n = 0;
    std::vector<std::byte> staged;
    std::function<void(const std::function<std::byte*(const void*)>&)> kernel;
  };
  struct stream {
    bool blocking = true;
    int device = 0;
    std::vector<op> ops;
    std::size_t done = 0;
  };
  struct event {
    int device = 0;
    bool timing = true;
    int stream = -1;
    std::size_t index = 0;
  };
  struct mapping {
    CUmemGenericAllocationHandle handle;
    std::size_t offset, size;
    bool accessible;
  };
  struct allocation {
    std::unique_ptr<std::byte[]> mem;
    std::size_t n = 0;
  };

  gpu() { streams_[0].blocking = true; }  // the legacy default stream

  static int sid(cudaStream_t s) { return static_cast<int>(reinterpret_cast<std::uintptr_t>(s)); }
  static int eid(cudaEvent_t e) { return static_cast<int>(reinterpret_cast<std::uintptr_t>(e)); }
  static bool overlaps(std::uintptr_t a, std::size_t an, std::uintptr_t b, std::size_t bn) {
    return a < b + bn && b < a + an;
  }
  static std::string hex(std::uintptr_t v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
    return buf;
  }
  [[nodiscard]] bool in_vmm(std::uintptr_t p) const {
    auto it = reservations_.upper_bound(p);
    if (it == reservations_.begin()) return false;
    --it;
    return p < it->first + it->second;
  }
  [[nodiscard]] bool reserved(std::uintptr_t p, std::size_t n) const {
    auto it = reservations_.upper_bound(p);
    if (it == reservations_.begin()) return false;
    --it;
    return p + n <= it->first + it->second;
  }
  [[nodiscard]] bool is_device_alloc(std::uintptr_t p) const {
    for (const auto& [base, a] : device_allocs_)
      if (p >= reinterpret_cast<std::uintptr_t>(base) && p < reinterpret_cast<std::uintptr_t>(base) + a.n) return true;
    return false;
  }
  [[nodiscard]] bool is_host(std::uintptr_t p) const { return !in_vmm(p) && !is_device_alloc(p); }
  [[nodiscard]] bool pinned(std::uintptr_t p, std::size_t n) const {
    auto it = pinned_.upper_bound(p);
    if (it == pinned_.begin()) return false;
    --it;
    return p + n <= it->first + it->second;
  }
  // Host bytes behind a device address, or null (and a violation) for an unmapped VMM range.
  std::byte* translate(std::uintptr_t p, std::size_t n, const std::string& who) {
    if (!in_vmm(p)) return reinterpret_cast<std::byte*>(p);
    auto it = mappings_.upper_bound(p);
    if (it != mappings_.begin()) {
      --it;
      if (p >= it->first && p + n <= it->first + it->second.size && it->second.accessible)
        return physical_[it->second.handle].data() + it->second.offset + (p - it->first);
    }
    violations_.push_back(who + " accessed [" + hex(p) + ", +" + std::to_string(n) + "), which is not mapped");
    return nullptr;
  }

  std::size_t enqueue(int id, op o) {
    // The legacy stream and blocking streams are ordered with each other.
    stream& s = streams_[id];
    if (id == 0) {
      for (const auto& [oid, os] : streams_)
        if (oid != 0 && os.blocking && !os.ops.empty()) o.deps.push_back({oid, os.ops.size() - 1});
    } else if (s.blocking && !streams_[0].ops.empty()) {
      o.deps.push_back({0, streams_[0].ops.size() - 1});
    }
    s.ops.push_back(std::move(o));
    return s.ops.size() - 1;
  }
  // Runs stream `id` up to (excluding) op `end`, dependencies first.
  void complete(int id, std::size_t end) {
    auto found = streams_.find(id);
    if (found == streams_.end()) return;
    while (streams_[id].done < end) {
      const std::size_t i = streams_[id].done;
      const auto deps = streams_[id].ops[i].deps;
      for (const auto& [ds, di] : deps) complete(ds, di + 1);
      execute(streams_[id].ops[i], id);
      ++streams_[id].done;
    }
  }
  void execute(op& o, int id) {
    const std::string who = o.what + " on stream " + std::to_string(id);
    if (o.what == "copy") {
      std::byte* d = translate(o.dst, o.n, who);
      const std::byte* src = o.staged.empty() ? translate(o.src, o.n, who) : o.staged.data();
      if (d != nullptr && src != nullptr) std::memmove(d, src, o.n);
    } else if (o.what == "kernel") {
      bool ok = true;
      for (const auto& [p, n] : o.touches) ok = translate(reinterpret_cast<std::uintptr_t>(p), n, who) != nullptr && ok;
      if (ok)
        o.kernel([this, who](const void* p) { return translate(reinterpret_cast<std::uintptr_t>(p), 1, who); });
    }
  }

  int devices_ = 1, current_ = 0;
  std::size_t granularity_ = std::size_t{2} << 20;
  std::map<int, stream> streams_;
  std::map<int, event> events_;
  int next_stream_ = 1, next_event_ = 1;
  std::map<void*, allocation> device_allocs_, host_allocs_;
  std::map<std::uintptr_t, std::size_t> pinned_;
  std::map<CUdeviceptr, std::size_t> reservations_;
  std::map<CUdeviceptr, mapping> mappings_;
  std::map<CUmemGenericAllocationHandle, std::vector<std::byte>> physical_;
  CUdeviceptr next_va_ = 0x7a0000000000ull;
  CUmemGenericAllocationHandle next_handle_ = 1;
  std::vector<std::string> violations_;
  std::map<std::string, int> calls_;
  std::map<std::string, std::pair<int, int>> failures_;
  int pageable_copies_ = 0;
};

}  // namespace fake_cuda

// ---- the API --------------------------------------------------------------------------------
#define FAKE_CUDA_ENTER(name)                                   \
  auto& fg = ::fake_cuda::gpu::get();                           \
  std::lock_guard fake_lock(fg.mutex());                        \
  if (const int injected = fg.call(name); injected != 0) return static_cast<decltype(cudaSuccess)>(injected)
#define FAKE_CU_ENTER(name)                                     \
  auto& fg = ::fake_cuda::gpu::get();                           \
  std::lock_guard fake_lock(fg.mutex());                        \
  if (const int injected = fg.call(name); injected != 0) return static_cast<CUresult>(injected)

inline const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    default: return "cudaErrorUnknown";
  }
}
inline const char* cudaGetErrorString(cudaError_t e) { return cudaGetErrorName(e); }
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline cudaError_t cudaGetDevice(int* d) {
  FAKE_CUDA_ENTER("cudaGetDevice");
  *d = fg.current_device();
  return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int d) {
  FAKE_CUDA_ENTER("cudaSetDevice");
  return fg.set_device(d);
}
inline cudaError_t cudaMalloc(void** p, std::size_t n) {
  FAKE_CUDA_ENTER("cudaMalloc");
  *p = fg.device_alloc(n, false);
  return cudaSuccess;
}
inline cudaError_t cudaFree(void* p) {
  FAKE_CUDA_ENTER("cudaFree");
  return fg.device_free(p, false);
}
inline cudaError_t cudaHostAlloc(void** p, std::size_t n, unsigned int) {
  FAKE_CUDA_ENTER("cudaHostAlloc");
  *p = fg.device_alloc(n, true);
  return cudaSuccess;
}
inline cudaError_t cudaFreeHost(void* p) {
  FAKE_CUDA_ENTER("cudaFreeHost");
  return fg.device_free(p, true);
}
inline cudaError_t cudaHostRegister(void* p, std::size_t n, unsigned int) {
  FAKE_CUDA_ENTER("cudaHostRegister");
  fg.register_host(p, n, true);
  return cudaSuccess;
}
inline cudaError_t cudaHostUnregister(void* p) {
  FAKE_CUDA_ENTER("cudaHostUnregister");
  fg.register_host(p, 0, false);
  return cudaSuccess;
}
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  FAKE_CUDA_ENTER("cudaStreamCreateWithFlags");
  *s = fg.create_stream(flags);
  return cudaSuccess;
}
inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
  FAKE_CUDA_ENTER("cudaStreamDestroy");
  return fg.destroy_stream(s);
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  FAKE_CUDA_ENTER("cudaStreamSynchronize");
  return fg.sync_stream(s);
}
inline cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int = 0) {
  FAKE_CUDA_ENTER("cudaStreamWaitEvent");
  return fg.wait_event(s, e);
}
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) {
  FAKE_CUDA_ENTER("cudaEventCreateWithFlags");
  *e = fg.create_event(flags);
  return cudaSuccess;
}
inline cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }
inline cudaError_t cudaEventDestroy(cudaEvent_t e) {
  FAKE_CUDA_ENTER("cudaEventDestroy");
  return fg.destroy_event(e);
}
inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = nullptr) {
  FAKE_CUDA_ENTER("cudaEventRecord");
  return fg.record(e, s);
}
inline cudaError_t cudaEventQuery(cudaEvent_t e) {
  FAKE_CUDA_ENTER("cudaEventQuery");
  return fg.query(e);
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  FAKE_CUDA_ENTER("cudaEventSynchronize");
  return fg.sync_event(e);
}
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) {
  FAKE_CUDA_ENTER("cudaEventElapsedTime");
  *ms = 1.0f;
  return cudaSuccess;
}
inline cudaError_t cudaDeviceSynchronize() {
  FAKE_CUDA_ENTER("cudaDeviceSynchronize");
  fg.run_all();
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t n, cudaMemcpyKind, cudaStream_t s = nullptr) {
  FAKE_CUDA_ENTER("cudaMemcpyAsync");
  return fg.copy(dst, src, n, s, false);
}
inline cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t n, cudaMemcpyKind) {
  FAKE_CUDA_ENTER("cudaMemcpy");
  return fg.copy(dst, src, n, nullptr, true);
}

inline CUresult cuGetErrorName(CUresult e, const char** s) {
  *s = e == CUDA_SUCCESS ? "CUDA_SUCCESS" : e == CUDA_ERROR_INVALID_VALUE ? "CUDA_ERROR_INVALID_VALUE"
       : e == CUDA_ERROR_OUT_OF_MEMORY ? "CUDA_ERROR_OUT_OF_MEMORY" : e == CUDA_ERROR_NOT_MAPPED ? "CUDA_ERROR_NOT_MAPPED"
       : e == CUDA_ERROR_ALREADY_MAPPED ? "CUDA_ERROR_ALREADY_MAPPED" : "CUDA_ERROR_UNKNOWN";
  return CUDA_SUCCESS;
}
inline CUresult cuGetErrorString(CUresult e, const char** s) { return cuGetErrorName(e, s); }
inline CUresult cuMemGetAllocationGranularity(std::size_t* g, const CUmemAllocationProp*, CUmemAllocationGranularity_flags) {
  FAKE_CU_ENTER("cuMemGetAllocationGranularity");
  *g = fg.granularity();
  return CUDA_SUCCESS;
}
inline CUresult cuMemCreate(CUmemGenericAllocationHandle* h, std::size_t size, const CUmemAllocationProp*, unsigned long long) {
  FAKE_CU_ENTER("cuMemCreate");
  return fg.create(h, size);
}
inline CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
  FAKE_CU_ENTER("cuMemRelease");
  return fg.release(h);
}
inline CUresult cuMemAddressReserve(CUdeviceptr* p, std::size_t size, std::size_t alignment, CUdeviceptr, unsigned long long) {
  FAKE_CU_ENTER("cuMemAddressReserve");
  return fg.reserve(p, size, alignment);
}
inline CUresult cuMemAddressFree(CUdeviceptr p, std::size_t size) {
  FAKE_CU_ENTER("cuMemAddressFree");
  return fg.free_va(p, size);
}
inline CUresult cuMemMap(CUdeviceptr p, std::size_t size, std::size_t offset, CUmemGenericAllocationHandle h,
                         unsigned long long) {
  FAKE_CU_ENTER("cuMemMap");
  return fg.map(p, size, offset, h);
}
inline CUresult cuMemUnmap(CUdeviceptr p, std::size_t size) {
  FAKE_CU_ENTER("cuMemUnmap");
  return fg.unmap(p, size);
}
inline CUresult cuMemSetAccess(CUdeviceptr p, std::size_t size, const CUmemAccessDesc*, std::size_t) {
  FAKE_CU_ENTER("cuMemSetAccess");
  return fg.set_access(p, size);
}

/// The driver entry-point table: the fake functions above, by name.
inline cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned int, unsigned long long,
                                                    cudaDriverEntryPointQueryResult* result) {
  static const std::map<std::string, void*> table{
      {"cuGetErrorName", reinterpret_cast<void*>(&cuGetErrorName)},
      {"cuGetErrorString", reinterpret_cast<void*>(&cuGetErrorString)},
      {"cuMemGetAllocationGranularity", reinterpret_cast<void*>(&cuMemGetAllocationGranularity)},
      {"cuMemCreate", reinterpret_cast<void*>(&cuMemCreate)},
      {"cuMemRelease", reinterpret_cast<void*>(&cuMemRelease)},
      {"cuMemAddressReserve", reinterpret_cast<void*>(&cuMemAddressReserve)},
      {"cuMemAddressFree", reinterpret_cast<void*>(&cuMemAddressFree)},
      {"cuMemMap", reinterpret_cast<void*>(&cuMemMap)},
      {"cuMemUnmap", reinterpret_cast<void*>(&cuMemUnmap)},
      {"cuMemSetAccess", reinterpret_cast<void*>(&cuMemSetAccess)},
  };
  const auto it = table.find(symbol);
  *fn = it == table.end() ? nullptr : it->second;
  *result = it == table.end() ? cudaDriverEntryPointSymbolNotFound : cudaDriverEntryPointSuccess;
  return cudaSuccess;
}
