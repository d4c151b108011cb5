// python/src/runtime.cpp: the runtime from Python. Model specs and presets, the cost model,
// and `PrefixCache`: a prefix cache of one of hcbench's policies (caches.hpp) whose KV pages
// and SSM checkpoints live in a host asymmetric pool (or, store="bytes", that only counts
// bytes), driven through the request lifecycle (prefix/lifecycle.hpp; docs/runtime.md). Pool memory reaches Python without a copy: the KV
// pages as one (pages, page_bytes) uint8 array over the pool's arena that block tables index,
// checkpoints as one uint8 array per recurrent layer's block (docs/python.md).
//
// Every argument is checked before the library is called, so a wrong type, dtype or shape
// raises TypeError / InvalidArgument and leaves the cache as it was; the library's own
// refusals (a stale ticket, no room) arrive as its `expected` errors and leave it unchanged
// too (docs/runtime.md, "The error contract").
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <hybridcache/hybridcache.hpp>
#include <hybridcache/prefix/lifecycle.hpp>
#include <hybridcache/tiered/tier.hpp>

#include "caches.hpp"
#include "errors.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace hybridcache::python {

// ---- argument checks ---------------------------------------------------------------------
static std::string type_of(nb::handle h) { return nb::borrow<nb::str>(nb::type_name(h.type())).c_str(); }

/// A 1-D sequence of integers in [lo, hi] from a list/tuple of ints or a 1-D integer array of
/// any integer dtype (never a float array: a truncated token id would be a silent bug).
std::vector<std::int64_t> int_sequence(nb::handle h, const char* what, std::int64_t lo, std::int64_t hi) {
  std::vector<std::int64_t> out;
  auto take = [&](std::int64_t v, std::size_t i) {
    if (v < lo || v > hi)
      throw hybridcache::invalid_argument(std::string(what) + "[" + std::to_string(i) + "] = " + std::to_string(v) +
                                          ": expected a value in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    out.push_back(v);
  };
  if (PyList_Check(h.ptr()) || PyTuple_Check(h.ptr())) {
    const nb::sequence seq = nb::borrow<nb::sequence>(h);
    const std::size_t n = nb::len(seq);
    out.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      nb::handle item = seq[i];
      if (!PyLong_Check(item.ptr()) || PyBool_Check(item.ptr()))
        throw nb::type_error((std::string(what) + "[" + std::to_string(i) + "]: expected an int, got " + type_of(item)).c_str());
      int overflow = 0;
      const long long v = PyLong_AsLongLongAndOverflow(item.ptr(), &overflow);
      if (overflow != 0) throw hybridcache::invalid_argument(std::string(what) + "[" + std::to_string(i) + "]: out of int64 range");
      take(v, i);
    }
    return out;
  }
  nb::ndarray<nb::ro, nb::device::cpu> a;
  if (!nb::try_cast(h, a, false))
    throw nb::type_error((std::string(what) + ": expected a 1-D integer array or a list of ints, got " + type_of(h)).c_str());
  if (a.ndim() != 1)
    throw hybridcache::invalid_argument(std::string(what) + ": expected a 1-D array, got " + std::to_string(a.ndim()) + " dimensions");
  const auto code = static_cast<nb::dlpack::dtype_code>(a.dtype().code);
  const unsigned bits = a.dtype().bits;
  if ((code != nb::dlpack::dtype_code::Int && code != nb::dlpack::dtype_code::UInt) || a.dtype().lanes != 1 ||
      (bits != 8 && bits != 16 && bits != 32 && bits != 64))
    throw nb::type_error((std::string(what) + ": expected an integer dtype, got a " +
                          (code == nb::dlpack::dtype_code::Float ? "float" : code == nb::dlpack::dtype_code::Bool ? "bool" : "non-integer") +
                          std::to_string(bits) + " array").c_str());
  const auto* base = static_cast<const std::byte*>(a.data());
  const std::int64_t stride = a.stride(0) * static_cast<std::int64_t>(bits / 8);
  out.reserve(a.shape(0));
  for (std::size_t i = 0; i < a.shape(0); ++i) {
    const std::byte* p = base + static_cast<std::int64_t>(i) * stride;
    std::int64_t v = 0;
    const bool is_signed = code == nb::dlpack::dtype_code::Int;
    switch (bits) {
      case 8: v = is_signed ? std::int64_t{*reinterpret_cast<const std::int8_t*>(p)} : std::int64_t{*reinterpret_cast<const std::uint8_t*>(p)}; break;
      case 16: v = is_signed ? std::int64_t{*reinterpret_cast<const std::int16_t*>(p)} : std::int64_t{*reinterpret_cast<const std::uint16_t*>(p)}; break;
      case 32: v = is_signed ? std::int64_t{*reinterpret_cast<const std::int32_t*>(p)} : std::int64_t{*reinterpret_cast<const std::uint32_t*>(p)}; break;
      default: {
        if (is_signed) {
          v = *reinterpret_cast<const std::int64_t*>(p);
        } else {
          const std::uint64_t u = *reinterpret_cast<const std::uint64_t*>(p);
          if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
            throw hybridcache::invalid_argument(std::string(what) + "[" + std::to_string(i) + "]: out of int64 range");
          v = static_cast<std::int64_t>(u);
        }
      }
    }
    take(v, i);
  }
  return out;
}

namespace {

std::vector<token_id> tokens(nb::handle h, const char* what) {
  // The common case, a 1-D contiguous int32 array (NumPy token ids): one pass that checks the
  // range, then one copy, instead of int_sequence's per-element dtype switch into int64s.
  nb::ndarray<nb::ro, const std::int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> a;
  if (!PyList_Check(h.ptr()) && !PyTuple_Check(h.ptr()) && nb::try_cast(h, a, false)) {
    const std::int32_t* p = a.data();
    const std::size_t n = a.shape(0);
    for (std::size_t i = 0; i < n; ++i)
      if (p[i] < 0)
        throw hybridcache::invalid_argument(std::string(what) + "[" + std::to_string(i) + "] = " + std::to_string(p[i]) +
                                            ": expected a value in [0, " +
                                            std::to_string(std::numeric_limits<token_id>::max()) + "]");
    return std::vector<token_id>(p, p + n);
  }
  const auto v = int_sequence(h, what, 0, std::numeric_limits<token_id>::max());
  return {v.begin(), v.end()};
}

std::int64_t non_negative(std::int64_t v, const char* what) {
  if (v < 0) throw hybridcache::invalid_argument(std::string(what) + " must be >= 0, got " + std::to_string(v));
  return v;
}

/// A cache salt from Python: None (the shared namespace) or an integer in [0, 2^64) (an int
/// or anything with __index__, e.g. a NumPy integer; never a bool or a float).
cache_salt salt_of(nb::handle h) {
  if (h.is_none()) return std::nullopt;
  if (PyBool_Check(h.ptr()) || !PyIndex_Check(h.ptr()))
    throw nb::type_error(("salt: expected None or an int, got " + type_of(h)).c_str());
  const nb::object i = nb::steal(PyNumber_Index(h.ptr()));
  if (!i.is_valid()) {
    PyErr_Clear();
    throw nb::type_error(("salt: expected None or an int, got " + type_of(h)).c_str());
  }
  const unsigned long long v = PyLong_AsUnsignedLongLong(i.ptr());
  if (v == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    PyErr_Clear();
    throw hybridcache::invalid_argument("salt " + std::string(nb::str(i).c_str()) + ": expected an int in [0, 2**64)");
  }
  return static_cast<std::uint64_t>(v);
}

// ---- the cache ------------------------------------------------------------------------------
/// The Python object: a cache of the chosen policy and store (caches.hpp) with its lifecycle.
// The memory lock. The calls that may move or free pool memory (begin, grow, finish, abort,
// clear: an asymmetric pool moves live pages when it rebalances or compacts) take it
// exclusively; `memory_read_lock()` takes it shared, so arrays resolved inside its `with` block
// stay where they are until the block ends, whatever other threads call. It is the binding's
// own (the lifecycle's memory lock, taken inside those calls, is then never contended), so
// that no thread waits for it while holding the GIL: each first tries the lock and, only
// when that fails, waits with the GIL released (a reader in its block needs the GIL to leave
// it). Which caches this thread holds a read lock of (and how deeply): a call that would wait
// for this thread's own read lock raises instead of deadlocking.
thread_local std::vector<std::pair<const void*, int>> reads_held_by_this_thread;

int reads_held_here(const void* cache) {
  for (const auto& [c, n] : reads_held_by_this_thread)
    if (c == cache) return n;
  return 0;
}

class prefix_cache_py {
 public:
  explicit prefix_cache_py(std::unique_ptr<cache_base> c) : c_(std::move(c)) {}
  cache_base& operator*() { return *c_; }
  cache_base* operator->() { return c_.get(); }

  /// The memory lock, exclusively, for `call` (one of the calls that may move or free memory).
  /// Uncontended: one try_lock. Else it waits with the GIL released.
  [[nodiscard]] std::unique_lock<std::shared_mutex> exclusive(const char* call) {
    if (reads_held_here(this) > 0)
      throw hybridcache::invalid_argument(std::string(call) +
                                          ": this thread holds the cache's memory_read_lock(); leave its with block "
                                          "first (the call may move pages, so it would wait for that lock forever)");
    std::unique_lock<std::shared_mutex> lock(memory_, std::try_to_lock);
    if (!lock.owns_lock()) {
      nb::gil_scoped_release release;
      lock.lock();
    }
    return lock;
  }
  /// Shared, for memory_read_lock()'s `with` block (re-entered by this thread: counted only).
  void lock_shared() {
    for (auto& [c, n] : reads_held_by_this_thread)
      if (c == this) {
        ++n;
        return;
      }
    if (!memory_.try_lock_shared()) {
      nb::gil_scoped_release release;
      memory_.lock_shared();
    }
    reads_held_by_this_thread.emplace_back(this, 1);
  }
  void unlock_shared() {
    auto& held = reads_held_by_this_thread;
    for (auto it = held.begin(); it != held.end(); ++it)
      if (it->first == this) {
        if (--it->second == 0) {
          held.erase(it);
          memory_.unlock_shared();
        }
        return;
      }
  }

  /// The pool's memory, or InvalidArgument naming `what` for a bytes-only cache.
  cache_base& memory(const char* what) {
    if (!c_->has_memory())
      throw hybridcache::invalid_argument(std::string(what) +
                                          ": this PrefixCache has store='bytes' (it counts bytes and holds no memory)");
    return *c_;
  }

 private:
  std::unique_ptr<cache_base> c_;
  std::shared_mutex memory_;
};

/// `PrefixCache.memory_read_lock()`'s object: a context manager over the memory lock, shared.
/// Entered and left by one thread; keeps its cache alive.
struct memory_read_lock_py {
  nb::object owner;
  std::thread::id holder{};
  bool held = false;

  explicit memory_read_lock_py(nb::object cache) : owner(std::move(cache)) {}
  memory_read_lock_py(memory_read_lock_py&&) = default;
  memory_read_lock_py& operator=(memory_read_lock_py&&) = delete;
  prefix_cache_py& cache() { return nb::cast<prefix_cache_py&>(owner); }
  ~memory_read_lock_py() {  // dropped inside its block by the thread that holds it: let go
    if (held && holder == std::this_thread::get_id()) cache().unlock_shared();
  }
};

/// A request in flight. Generation-checked by the library: after finish/abort (or clear) every
/// call with it raises HandleError.
struct ticket_py {
  prefix::request_ticket ticket;
  nb::object owner;  // the PrefixCache it came from (kept alive while the ticket lives)
  std::int64_t prompt_tokens = 0;
};

prefix_cache_py& cache_of(nb::handle self) { return nb::cast<prefix_cache_py&>(self); }

prefix::request_ticket own_ticket(nb::handle self, const ticket_py& t) {
  // Another cache's ticket: the library would say foreign_handle; say which object instead.
  if (!t.owner.is(self)) throw library_error(error_info{errc::foreign_handle, false, "the ticket belongs to another PrefixCache", 0});
  return t.ticket;
}

using u8_array = nb::ndarray<nb::numpy, std::uint8_t, nb::ndim<1>>;

/// A checkpoint's blocks (one per recurrent layer) as uint8 arrays over the pool's memory.
nb::list checkpoint_arrays(nb::handle self, cache_base& c, const std::vector<std::byte*>& blocks) {
  nb::list out;
  for (std::byte* p : blocks)
    out.append(u8_array(reinterpret_cast<std::uint8_t*>(p), {static_cast<std::size_t>(c.block_bytes())}, self));
  return out;
}

// A storage tier below the host tier from its two keyword arguments, where (a directory, an
// endpoint) and size: both or neither, a non-empty where, a size > 0, a host tier above it.
// Returns whether the tier was given.
static bool storage_tier_arguments(const char* where_name, const std::optional<std::string>& where, const char* bytes_name,
                            const std::optional<std::int64_t>& bytes, std::int64_t host_tier_bytes) {
  if (where.has_value() != bytes.has_value())
    throw hybridcache::invalid_argument(std::string(where_name) + " and " + bytes_name + " go together (the tier needs both)");
  if (!where) return false;
  if (where->empty()) throw hybridcache::invalid_argument(std::string(where_name) + ": empty");
  if (*bytes <= 0) throw hybridcache::invalid_argument(std::string(bytes_name) + " must be > 0, got " + std::to_string(*bytes));
  if (host_tier_bytes == 0)
    throw hybridcache::invalid_argument(std::string(where_name) + ": a storage tier goes below the host tier: give host_tier_bytes > 0 too");
  return true;
}

/// PrefixCache's arguments, checked before anything is built. Pool-only arguments given
/// with store="bytes", or alpha with a policy other than marconi, are refused.
std::unique_ptr<cache_base> make_prefix_cache(const cost_model& model, std::int64_t capacity_bytes,
                                              std::optional<std::int64_t> tokens_per_page,
                                              std::optional<std::int64_t> granularity_bytes, std::optional<double> ssm_fraction,
                                              std::optional<bool> compaction, std::optional<std::int64_t> host_tier_bytes,
                                              const std::string& policy, nb::handle alpha, const std::string& store,
                                              std::optional<std::string> disk_tier_dir, std::optional<std::int64_t> disk_tier_bytes,
                                              std::optional<std::string> redis_tier, std::optional<std::int64_t> redis_tier_bytes) {
  cache_options o;
  if (capacity_bytes <= 0) throw hybridcache::invalid_argument("capacity_bytes must be > 0, got " + std::to_string(capacity_bytes));
  o.capacity_bytes = capacity_bytes;
  if (std::find(policy_names().begin(), policy_names().end(), policy) == policy_names().end())
    throw hybridcache::invalid_argument("policy '" + policy + "': expected sglang+, marconi, gdsf, lru or vllm+");
  o.policy = policy;
  if (!alpha.is_none() && !(PyUnicode_Check(alpha.ptr()) && nb::cast<std::string>(alpha) == "auto")) {
    if (PyBool_Check(alpha.ptr()) || !(PyLong_Check(alpha.ptr()) || PyFloat_Check(alpha.ptr())))
      throw nb::type_error(("alpha: expected a number, 'auto' or None, got " + type_of(alpha)).c_str());
    const double a = PyFloat_AsDouble(alpha.ptr());
    if (PyErr_Occurred()) {
      PyErr_Clear();
      throw hybridcache::invalid_argument("alpha: out of range");
    }
    if (!(a >= 0) || !std::isfinite(a))
      throw hybridcache::invalid_argument("alpha must be a number >= 0, got " + std::string(nb::str(alpha).c_str()));
    o.alpha = a;
  }
  if (!alpha.is_none() && policy != "marconi")
    throw hybridcache::invalid_argument("alpha applies to policy='marconi' only (policy '" + policy + "' has no FLOP weight)");
  if (store != "pool" && store != "bytes")
    throw hybridcache::invalid_argument("store '" + store + "': expected pool (real bytes) or bytes (counting only)");
  o.store = store;
  if (store == "bytes") {
    std::string given;
    for (const auto& [name, set] : {std::pair{"tokens_per_page", tokens_per_page.has_value()},
                                    std::pair{"granularity_bytes", granularity_bytes.has_value()},
                                    std::pair{"ssm_fraction", ssm_fraction.has_value()},
                                    std::pair{"compaction", compaction.has_value()},
                                    std::pair{"host_tier_bytes", host_tier_bytes.has_value()},
                                    std::pair{"disk_tier_dir", disk_tier_dir.has_value()},
                                    std::pair{"disk_tier_bytes", disk_tier_bytes.has_value()},
                                    std::pair{"redis_tier", redis_tier.has_value()},
                                    std::pair{"redis_tier_bytes", redis_tier_bytes.has_value()}})
      if (set) given += std::string(given.empty() ? "" : ", ") + name;
    if (!given.empty())
      throw hybridcache::invalid_argument(given + ": not with store='bytes' (they configure the pool; a bytes store has none)");
    if (model.ssm_checkpoint_bytes() > capacity_bytes)
      throw hybridcache::invalid_argument("capacity_bytes " + std::to_string(capacity_bytes) + " is smaller than one checkpoint (" +
                                          std::to_string(model.ssm_checkpoint_bytes()) + " B)");
    return make_bytes_cache(model, o);
  }
  o.tokens_per_page = tokens_per_page.value_or(16);
  if (o.tokens_per_page <= 0) throw hybridcache::invalid_argument("tokens_per_page must be > 0, got " + std::to_string(o.tokens_per_page));
  o.granularity_bytes = non_negative(granularity_bytes.value_or(0), "granularity_bytes");
  o.ssm_fraction = ssm_fraction.value_or(0.5);
  o.compaction = compaction.value_or(false);
  o.host_tier_bytes = non_negative(host_tier_bytes.value_or(0), "host_tier_bytes");
  if (storage_tier_arguments("disk_tier_dir", disk_tier_dir, "disk_tier_bytes", disk_tier_bytes, o.host_tier_bytes)) {
    o.disk_tier_dir = *disk_tier_dir;
    o.disk_tier_bytes = *disk_tier_bytes;
  }
  if (storage_tier_arguments("redis_tier", redis_tier, "redis_tier_bytes", redis_tier_bytes, o.host_tier_bytes)) {
    (void)tiered::parse_redis_endpoint(*redis_tier, "redis_tier");
    o.redis_tier = *redis_tier;
    o.redis_tier_bytes = *redis_tier_bytes;
  }
  return make_pool_cache(model, o);
}

}  // namespace

void bind_runtime(nb::module_& m) {
  // ---- model specs, presets, the cost model -------------------------------------------------
  nb::class_<model_spec>(m, "ModelSpec", "Shapes, dtypes and layer order of a (hybrid) model (model/model_spec.hpp).")
      .def(nb::init<>())
      .def_static("preset", [](const std::string& name) { return presets::preset(name); }, "name"_a,
                  "A preset by name (see preset_names()); InvalidArgument naming the known ones otherwise.")
      .def_rw("name", &model_spec::name)
      .def_rw("source", &model_spec::source)
      .def_prop_rw(
          "layers",
          [](const model_spec& s) {
            std::string p;
            for (const layer_kind k : s.layers) p += k == layer_kind::attention ? 'A' : k == layer_kind::recurrent ? 'R' : 'M';
            return p;
          },
          [](model_spec& s, const std::string& p) { s.layers = layer_pattern(p); },
          "The layer order as a string: A attention, R recurrent, M MLP (\"RARA\").")
      .def_prop_rw(
          "recurrent", [](const model_spec& s) { return std::string(to_string(s.recurrent)); },
          [](model_spec& s, const std::string& name) {
            for (const auto f : {recurrent_family::none, recurrent_family::mamba1, recurrent_family::mamba2,
                                 recurrent_family::linear_attention, recurrent_family::gated_deltanet})
              if (to_string(f) == name) {
                s.recurrent = f;
                return;
              }
            throw hybridcache::invalid_argument("recurrent '" + name +
                                                "': expected none, mamba1, mamba2, linear_attention or gated_deltanet");
          },
          "The recurrent mixer: none, mamba1, mamba2, linear_attention, gated_deltanet.")
      .def_rw("d_model", &model_spec::d_model)
      .def_rw("attention_heads", &model_spec::attention_heads)
      .def_rw("kv_heads", &model_spec::kv_heads)
      .def_rw("head_dim", &model_spec::head_dim)
      .def_rw("ssm_d_inner", &model_spec::ssm_d_inner)
      .def_rw("ssm_state_rows", &model_spec::ssm_state_rows)
      .def_rw("d_state", &model_spec::d_state)
      .def_rw("conv_kernel", &model_spec::conv_kernel)
      .def_rw("conv_channels", &model_spec::conv_channels)
      .def_rw("gdn_key_heads", &model_spec::gdn_key_heads)
      .def_rw("gdn_value_heads", &model_spec::gdn_value_heads)
      .def_rw("gdn_key_dim", &model_spec::gdn_key_dim)
      .def_rw("gdn_value_dim", &model_spec::gdn_value_dim)
      .def_rw("kv_dtype_bytes", &model_spec::kv_dtype_bytes)
      .def_rw("state_dtype_bytes", &model_spec::state_dtype_bytes)
      .def_rw("conv_dtype_bytes", &model_spec::conv_dtype_bytes)
      .def_rw("activation_dtype_bytes", &model_spec::activation_dtype_bytes)
      .def_rw("scan_chunk", &model_spec::scan_chunk);

  m.def("preset_names", [] {
    std::vector<std::string> out;
    for (const auto n : presets::preset_names()) out.emplace_back(n);
    return out;
  });

  nb::class_<cost_model>(m, "CostModel", "Exact byte and FLOP costs of a model (model/cost_model.hpp).")
      .def(nb::init<model_spec>(), "spec"_a, "Checks the spec (InvalidArgument naming a bad field).")
      .def("__init__", [](cost_model* self, const std::string& preset) { new (self) cost_model(presets::preset(preset)); },
           "preset"_a, "The cost model of a preset by name.")
      .def_prop_ro("spec", &cost_model::spec)
      .def_prop_ro("attention_layers", &cost_model::attention_layers)
      .def_prop_ro("recurrent_layers", &cost_model::recurrent_layers)
      .def_prop_ro("kv_bytes_per_token", &cost_model::kv_bytes_per_token)
      .def_prop_ro("kv_bytes_per_token_per_layer", &cost_model::kv_bytes_per_token_per_layer)
      .def_prop_ro("ssm_checkpoint_bytes", &cost_model::ssm_checkpoint_bytes)
      .def_prop_ro("ssm_checkpoint_bytes_per_layer", &cost_model::ssm_checkpoint_bytes_per_layer)
      .def("kv_bytes", [](const cost_model& c, std::int64_t t) { return c.kv_bytes(non_negative(t, "tokens")); }, "tokens"_a)
      .def("prefill_flops", [](const cost_model& c, std::int64_t t) { return c.prefill_flops(non_negative(t, "tokens")); }, "tokens"_a)
      .def("saved_flops",
           [](const cost_model& c, std::int64_t p, std::int64_t l) {
             non_negative(p, "reused");
             if (l < p) throw hybridcache::invalid_argument("saved_flops: tokens must be >= reused");
             return c.saved_flops(p, l);
           },
           "reused"_a, "tokens"_a, "FLOPs a hit of `reused` tokens saves on a `tokens`-token prefill.")
      .def("kv_page_bytes", [](const cost_model& c, std::int64_t t) { return memory::kv_page_bytes(c, t); }, "tokens_per_page"_a = 16,
           "One KV page: `tokens_per_page` tokens of one attention layer (the pool's KV unit).")
      .def("checkpoint_block_bytes", [](const cost_model& c) { return memory::checkpoint_block_bytes(c); },
           "One recurrent layer's checkpoint: SSM + conv state (the pool's state unit).");

  // ---- the prefix cache over a pool, with the request lifecycle -----------------------------
  nb::class_<ticket_py>(m, "Ticket", "A request in flight (begin's result); ended by finish or abort.")
      .def_prop_ro("prompt_tokens", [](const ticket_py& t) { return t.prompt_tokens; })
      .def("__repr__", [](const ticket_py& t) {
        return "<hybridcache.Ticket of a " + std::to_string(t.prompt_tokens) + "-token prompt>";
      });

  nb::class_<memory_read_lock_py>(m, "MemoryReadLock",
                                  "PrefixCache.memory_read_lock()'s context manager: while its with block runs, no "
                                  "call moves or frees the pool's memory (begin, grow, finish, abort and clear of "
                                  "other threads wait for the block to end).")
      .def("__enter__",
           [](nb::handle self) {
             auto& l = nb::cast<memory_read_lock_py&>(self);
             if (l.held) throw hybridcache::invalid_argument("memory_read_lock: already entered (one with block per lock object)");
             l.cache().lock_shared();
             l.held = true;
             l.holder = std::this_thread::get_id();
             return nb::borrow(self);
           })
      .def(
          "__exit__",
          [](memory_read_lock_py& l, nb::handle, nb::handle, nb::handle) {
            if (!l.held) throw hybridcache::invalid_argument("memory_read_lock: not entered");
            if (l.holder != std::this_thread::get_id())
              throw hybridcache::invalid_argument("memory_read_lock: left by another thread than the one that entered it");
            l.held = false;
            l.cache().unlock_shared();
            return false;
          },
          "exc_type"_a.none(), "exc"_a.none(), "traceback"_a.none())
      .def_prop_ro("held", [](const memory_read_lock_py& l) { return l.held; });

  nb::class_<prefix_cache_py>(
      m, "PrefixCache",
      "A prefix cache with the request lifecycle (docs/runtime.md, docs/python.md): hcbench's policies "
      "(sglang+, marconi, gdsf, lru, vllm+) over a host asymmetric pool holding the KV pages and SSM "
      "checkpoints (store='pool'), or over a store that only counts bytes (store='bytes').")
      .def(
          "__init__",
          [](prefix_cache_py* self, const cost_model& model, std::int64_t capacity_bytes, std::optional<std::int64_t> tokens_per_page,
             std::optional<std::int64_t> granularity_bytes, std::optional<double> ssm_fraction, std::optional<bool> compaction,
             std::optional<std::int64_t> host_tier_bytes, const std::string& policy, nb::handle alpha, const std::string& store,
             std::optional<std::string> disk_tier_dir, std::optional<std::int64_t> disk_tier_bytes,
             std::optional<std::string> redis_tier, std::optional<std::int64_t> redis_tier_bytes) {
            new (self) prefix_cache_py(make_prefix_cache(model, capacity_bytes, tokens_per_page, granularity_bytes, ssm_fraction,
                                                         compaction, host_tier_bytes, policy, alpha, store, disk_tier_dir,
                                                         disk_tier_bytes, redis_tier, redis_tier_bytes));
          },
          "model"_a, "capacity_bytes"_a, "tokens_per_page"_a = nb::none(), "granularity_bytes"_a = nb::none(),
          "ssm_fraction"_a = nb::none(), "compaction"_a = nb::none(), "host_tier_bytes"_a = nb::none(), nb::kw_only(),
          "policy"_a = "sglang+", "alpha"_a = nb::none(), "store"_a = "pool", "disk_tier_dir"_a = nb::none(),
          "disk_tier_bytes"_a = nb::none(), "redis_tier"_a = nb::none(), "redis_tier_bytes"_a = nb::none(),
          "A cache of `capacity_bytes`. policy: hcbench's names: 'sglang+' (judicious admission + LRU, the "
          "default), 'marconi' (+ FLOP-aware eviction with `alpha`; alpha None or 'auto': the adaptive "
          "selector), 'gdsf', 'lru' (only the last token's state), 'vllm+' (a checkpoint every 32 tokens). "
          "store='pool': a pool of chunks of `granularity_bytes` (None: the pool's default; a multiple of the KV "
          "page) split between KV pages of `tokens_per_page` tokens (16) and checkpoint blocks (`ssm_fraction` "
          "0.5, `compaction` False); `host_tier_bytes` > 0 adds a host tier (half KV pages, half checkpoint "
          "blocks) that what the cache evicts is demoted to and a later begin loads back "
          "(state()['loaded_at']); `disk_tier_dir` + `disk_tier_bytes` put a disk tier (a directory this cache "
          "owns) below the host tier: its victims move down there and a begin brings them back; `redis_tier` "
          "('HOST:PORT' of a redis-server) + `redis_tier_bytes` a Redis tier below it (below the disk tier when both "
          "are given; values keyed by a random per-cache salt). store='bytes': one byte budget for KV and checkpoints and no memory, "
          "hcbench's replay store; the pool's arguments are refused with it.")
      .def_prop_ro("model", [](prefix_cache_py& c) { return c->model(); })
      .def_prop_ro("policy", [](prefix_cache_py& c) { return c->options().policy; }, "The policy's hcbench name.")
      .def_prop_ro("store", [](prefix_cache_py& c) { return c->options().store; }, "'pool' or 'bytes'.")
      .def_prop_ro("capacity_bytes", [](prefix_cache_py& c) { return c->options().capacity_bytes; })
      .def_prop_ro("alpha", [](prefix_cache_py& c) { return c->alpha(); },
                   "The FLOP weight eviction runs with now (marconi; the followed rule's under the selector), None for "
                   "a rule without one.")
      .def_prop_ro(
          "followed",
          [](prefix_cache_py& c) -> std::optional<std::string> {
            std::string f = c->followed();
            if (f.empty()) return std::nullopt;
            return f;
          },
          "marconi without alpha: the rule the adaptive selector follows now, as hcbench's selector_followed "
          "('sglang+', 'marconi:0.5', 'gdsf'); None for the other policies.")
      .def_prop_ro("tokens_per_page", [](prefix_cache_py& c) { return c.memory("tokens_per_page").options().tokens_per_page; })
      .def_prop_ro("page_bytes", [](prefix_cache_py& c) { return c.memory("page_bytes").page_bytes(); },
                   "Bytes of one KV page: tokens_per_page tokens of one attention layer.")
      .def_prop_ro("block_bytes", [](prefix_cache_py& c) { return c.memory("block_bytes").block_bytes(); },
                   "Bytes of one recurrent layer's checkpoint block.")
      .def_prop_ro(
          "kv_pages",
          [](nb::handle self) {
            auto& c = cache_of(self).memory("kv_pages");
            const std::size_t pages = c.arena_bytes() / static_cast<std::uint64_t>(c.page_bytes());
            return nb::ndarray<nb::numpy, std::uint8_t, nb::ndim<2>>(reinterpret_cast<std::uint8_t*>(c.arena_base()),
                                                                     {pages, static_cast<std::size_t>(c.page_bytes())}, self);
          },
          "The pool's memory as (pages, page_bytes) uint8, no copy: block_table's numbers index its rows. Read and "
          "write only the pages of your own tickets.")
      .def_prop_ro(
          "host_memory",
          [](nb::handle self) {
            const std::span<std::byte> h = cache_of(self).memory("host_memory").host_memory();
            return nb::ndarray<nb::numpy, nb::ro, std::uint8_t, nb::ndim<1>>(reinterpret_cast<std::uint8_t*>(h.data()),
                                                                             {h.size()}, self);
          },
          "The host tier's memory as read-only uint8, no copy (empty without a host tier): the KV pages and SSM "
          "blocks of the entries the pool demoted, in pages of gcd(page_bytes, block_bytes) bytes. Read-only: every "
          "entry is CRC-checked when loaded, so a write would only get it dropped. For inspection, or to register "
          "the memory with a copy engine.")
      .def(
          "begin",
          [](nb::handle self, nb::handle prompt, std::int64_t output_tokens, nb::handle extra_checkpoints, nb::handle salt) {
            auto& c = cache_of(self);
            const std::vector<token_id> p = tokens(prompt, "prompt");
            std::vector<std::int64_t> extra;
            if (!extra_checkpoints.is_none())
              extra = int_sequence(extra_checkpoints, "extra_checkpoints", std::numeric_limits<std::int64_t>::min(),
                                   std::numeric_limits<std::int64_t>::max());
            const prefix::begin_options o{.output_tokens = output_tokens, .extra_checkpoints = extra, .salt = salt_of(salt)};
            const auto lock = c.exclusive("begin");
            const prefix::request_ticket t = c->begin(p, o);
            return ticket_py{t, nb::borrow(self), static_cast<std::int64_t>(p.size())};
          },
          "prompt"_a, "output_tokens"_a = 0, "extra_checkpoints"_a = nb::none(), "salt"_a = nb::none(),
          "Matches and pins the prompt's cached prefix, plans the checkpoints prefill must capture and reserves KV "
          "for the prompt plus `output_tokens` and one slot per checkpoint. `salt` (an int in [0, 2**64), e.g. a "
          "tenant's): the request matches and inserts only in that namespace; None: the shared one. All or nothing: "
          "OutOfCapacity leaves the cache unchanged.")
      .def(
          "peek",
          [](nb::handle self, nb::handle prompt, nb::handle salt) {
            const std::vector<token_id> p = tokens(prompt, "prompt");
            const cache_salt s = salt_of(salt);
            return cache_of(self)->peek(p, s);
          },
          "prompt"_a, "salt"_a = nb::none(),
          "The tokens a begin of `prompt` in `salt`'s namespace would reuse, changing nothing (no pin, no recency, no "
          "counters): for a scheduler that orders requests by their reuse.")
      .def(
          "state",
          [](nb::handle self, const ticket_py& t) {
            const request_view s = cache_of(self)->state(own_ticket(self, t));
            nb::dict d;
            d["prompt_tokens"] = s.prompt_tokens;
            d["reusable_tokens"] = s.reusable_tokens;
            d["prefill_start"] = s.prefill_start;
            d["kv_from"] = s.kv_from;
            d["reserved_tokens"] = s.reserved_tokens;
            d["loaded_at"] = s.loaded_at;
            d["salt"] = s.salt;
            d["sites"] = s.sites;
            d["slots"] = s.slots;
            return d;
          },
          "ticket"_a,
          "What the runtime reads of a request: reusable_tokens, prefill_start, kv_from (write KV from here), "
          "reserved_tokens, loaded_at (> 0: the host tier's hit was loaded into the reservation up to it; "
          "prefill_start is then loaded_at), salt, sites (the positions to capture), slots (their positions; 0 = "
          "the end slot).")
      .def(
          "block_table",
          [](nb::handle self, const ticket_py& t, std::int64_t layer) {
            auto& c = cache_of(self).memory("block_table");
            auto* out = new std::vector<std::int64_t>();
            nb::capsule owner(out, [](void* p) noexcept { delete static_cast<std::vector<std::int64_t>*>(p); });
            *out = c.block_table(own_ticket(self, t), layer);
            return nb::ndarray<nb::numpy, std::int64_t, nb::ndim<1>>(out->data(), {out->size()}, owner);
          },
          "ticket"_a, "layer"_a,
          "Attention layer `layer`'s block table as int64 page numbers into kv_pages: row table[p // tokens_per_page] "
          "holds token p. The cached prefix's pages, then the reservation's.")
      .def(
          "resume_checkpoint",
          [](nb::handle self, const ticket_py& t) -> nb::object {
            auto& c = cache_of(self).memory("resume_checkpoint");
            bool found = false;
            const auto blocks = c.resume_checkpoint(own_ticket(self, t), found);
            if (!found) return nb::none();
            return checkpoint_arrays(self, c, blocks);
          },
          "ticket"_a,
          "The state prefill resumes from: one uint8 array per recurrent layer over the pool's block (no copy), or "
          "None on a miss.")
      .def(
          "checkpoint_slot",
          [](nb::handle self, const ticket_py& t, std::int64_t i) {
            auto& c = cache_of(self).memory("checkpoint_slot");
            return checkpoint_arrays(self, c, c.checkpoint_slot(own_ticket(self, t), i));
          },
          "ticket"_a, "index"_a,
          "Reserved slot `index` (state(ticket)['slots'][index] is its position; sites first, then the end slot): "
          "one uint8 array per recurrent layer to write the captured state into.")
      .def(
          "grow",
          [](nb::handle self, const ticket_py& t, std::int64_t tokens) {
            auto& c = cache_of(self);
            const prefix::request_ticket ticket = own_ticket(self, t);
            const auto lock = c.exclusive("grow");
            c->grow(ticket, tokens);
          },
          "ticket"_a, "tokens"_a, "Reserves KV for `tokens` more tokens; fetch the block tables again after it.")
      .def(
          "finish",
          [](nb::handle self, const ticket_py& t, nb::handle sequence, nb::handle captured) {
            auto& c = cache_of(self);
            const prefix::request_ticket ticket = own_ticket(self, t);
            const std::vector<token_id> seq = tokens(sequence, "sequence");
            const std::vector<std::int64_t> cap = int_sequence(captured, "captured", 0, std::numeric_limits<std::int64_t>::max());
            const auto lock = c.exclusive("finish");
            const prefix::finish_result r = c->finish(ticket, seq, cap);
            nb::dict d;
            d["checkpoints_kept"] = r.checkpoints_kept;
            d["checkpoints_returned"] = r.checkpoints_returned;
            d["tokens_returned"] = r.tokens_returned;
            return d;
          },
          "ticket"_a, "sequence"_a, "captured"_a,
          "Inserts `sequence` (prompt + output) keeping checkpoints exactly at `captured` (planned sites or "
          "len(sequence)). A refused finish leaves the request in flight.")
      .def(
          "abort",
          [](nb::handle self, const ticket_py& t) {
            auto& c = cache_of(self);
            const prefix::request_ticket ticket = own_ticket(self, t);
            const auto lock = c.exclusive("abort");
            c->abort(ticket);
          },
          "ticket"_a,
          "Ends a request without inserting: the reservation goes back, the pin is released.")
      .def(
          "clear",
          [](prefix_cache_py& c) {
            const auto lock = c.exclusive("clear");
            c->clear();
          },
           "Ends every request in flight (their tickets raise HandleError) and empties the cache.")
      .def(
          "memory_read_lock", [](nb::handle self) { return memory_read_lock_py{nb::borrow(self)}; },
          "A context manager: inside `with cache.memory_read_lock():` no call moves or frees the pool's memory "
          "(begin, grow, finish, abort and clear of other threads wait for the block to end; the same thread's "
          "raise InvalidArgument), so the block tables, checkpoint arrays and kv_pages rows resolved inside it "
          "stay valid until it ends. Needed when several threads share the cache, or with compaction=True. "
          "state, block_table, resume_checkpoint, checkpoint_slot and peek may be called inside it.")
      .def_prop_ro("in_flight", [](prefix_cache_py& c) { return c->in_flight(); })
      .def_prop_ro("tokens_cached", [](prefix_cache_py& c) { return c->tokens_cached(); })
      .def_prop_ro("checkpoints_cached", [](prefix_cache_py& c) { return c->checkpoints_cached(); })
      .def_prop_ro("used_bytes", [](prefix_cache_py& c) { return c->used_bytes(); },
                   "Bytes the store holds: cached KV and checkpoints and the reservations of requests in flight.")
      .def_prop_ro(
          "counters",
          [](prefix_cache_py& c) {
            nb::dict d;
            for (const auto& [name, value] : c->counters()) d[name.c_str()] = value;
            return d;
          },
          "The cache's counters; with store='pool' also the pool's occupancy and the host tier's (host_*: all 0 "
          "without one).");

  m.def(
      "_bench_begin_finish",
      [](prefix_cache_py& c, const nb::list& prompts, std::int64_t rounds) {
        std::vector<std::vector<token_id>> ps;
        for (nb::handle p : prompts) ps.push_back(tokens(p, "prompts[i]"));
        const auto lock = c.exclusive("_bench_begin_finish");
        nb::gil_scoped_release release;
        return c->bench_begin_finish(ps, rounds);
      },
      "cache"_a, "prompts"_a, "rounds"_a, "bench/python_costs.py: seconds of the begin + finish loop run in C++.");
}

}  // namespace hybridcache::python
