// python/src/runtime.cpp: the runtime from Python. Model specs and presets, the cost model,
// and `PrefixCache`: a Marconi prefix cache (judicious admission, LRU eviction) whose KV pages
// and SSM checkpoints live in a host asymmetric pool, driven through the request lifecycle
// (prefix/lifecycle.hpp; docs/runtime.md). Pool memory reaches Python without a copy: the KV
// pages as one (pages, page_bytes) uint8 array over the pool's arena that block tables index,
// checkpoints as one uint8 array per recurrent layer's block (docs/python.md).
//
// Every argument is checked before the library is called, so a wrong type, dtype or shape
// raises TypeError / InvalidArgument and leaves the cache as it was; the library's own
// refusals (a stale ticket, no room) arrive as its `expected` errors and leave it unchanged
// too (docs/runtime.md, "The error contract").
#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <hybridcache/hybridcache.hpp>
#include <hybridcache/prefix/lifecycle.hpp>

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

using pool_t = memory::host_asymmetric_pool<memory::threshold_rebalancer>;
using store_t = stores::pool_state_store<pool_t>;
// mutex_lock: Python threads may share one cache (the calls hold the GIL, but a future
// GIL-free build or a C++ caller on another thread must not race the bookkeeping).
using cache_t = prefix::prefix_cache<cost_model, prefix::judicious_admission, prefix::lru_scorer, store_t, prefix::mutex_lock>;
using lifecycle_t = prefix::request_lifecycle<cache_t>;

std::vector<token_id> tokens(nb::handle h, const char* what) {
  const auto v = int_sequence(h, what, 0, std::numeric_limits<token_id>::max());
  return {v.begin(), v.end()};
}

std::int64_t non_negative(std::int64_t v, const char* what) {
  if (v < 0) throw hybridcache::invalid_argument(std::string(what) + " must be >= 0, got " + std::to_string(v));
  return v;
}

// ---- the cache ------------------------------------------------------------------------------
struct cache_config {
  std::int64_t capacity_bytes;
  std::int64_t tokens_per_page;
  std::int64_t granularity_bytes;
  double ssm_fraction;
  bool compaction;
  std::int64_t host_tier_bytes;  // 0: no host tier; else half KV pages, half checkpoint blocks
};

/// The pool, the cache and the lifecycle in one object, destroyed in that reverse order (the
/// lifecycle ends what is in flight, the cache gives every page back, then the pool goes).
class prefix_cache_py {
 public:
  prefix_cache_py(const cost_model& model, const cache_config& c)
      : model_(model),
        pool_(pool_config(model, c)),
        cache_(model_, store_t(pool_, model_, {.tokens_per_page = c.tokens_per_page, .host_tier = host_tier(model, c)}),
               prefix::lru_scorer{}),
        requests_(cache_) {
    page_bytes_ = pool_.stats(pool_kind::kv).unit_bytes;
    block_bytes_ = pool_.stats(pool_kind::ssm).unit_bytes;
    // Block tables are page numbers in `kv_pages`, the arena cut into pages: that needs every
    // chunk to hold whole pages.
    if (pool_.arena().chunk_bytes() % static_cast<std::uint64_t>(page_bytes_) != 0)
      throw hybridcache::invalid_argument("PrefixCache: granularity_bytes " + std::to_string(pool_.arena().chunk_bytes()) +
                                          " is not a multiple of the KV page (" + std::to_string(page_bytes_) +
                                          " B): block tables index the arena in pages");
  }

  static memory::asymmetric_pool_config pool_config(const cost_model& model, const cache_config& c) {
    non_negative(c.granularity_bytes, "granularity_bytes");
    if (c.capacity_bytes <= 0) throw hybridcache::invalid_argument("capacity_bytes must be > 0, got " + std::to_string(c.capacity_bytes));
    if (c.tokens_per_page <= 0) throw hybridcache::invalid_argument("tokens_per_page must be > 0, got " + std::to_string(c.tokens_per_page));
    memory::asymmetric_pool_config p;
    p.capacity_bytes = c.capacity_bytes;
    p.kv_page_bytes = memory::kv_page_bytes(model, c.tokens_per_page);
    p.ssm_block_bytes = memory::checkpoint_block_bytes(model);
    if (c.granularity_bytes > 0) p.granularity_bytes = c.granularity_bytes;
    p.ssm_fraction = c.ssm_fraction;
    p.compaction = c.compaction;
    return p;
  }

  /// The host tier's slots: half of `host_tier_bytes` in KV pages, half in checkpoint blocks
  /// (the tiny runtime's split). The store refuses a tier too small for one checkpoint.
  static stores::host_tier_config host_tier(const cost_model& model, const cache_config& c) {
    non_negative(c.host_tier_bytes, "host_tier_bytes");
    if (c.host_tier_bytes == 0) return {};
    const std::int64_t page = memory::kv_page_bytes(model, c.tokens_per_page), block = memory::checkpoint_block_bytes(model);
    const stores::host_tier_config h{.kv_pages = c.host_tier_bytes / 2 / page, .checkpoint_blocks = c.host_tier_bytes / 2 / block};
    // A size that makes no tier is refused, never silently taken as "no host tier".
    if (h.kv_pages == 0 || h.checkpoint_blocks < model.recurrent_layers())
      throw hybridcache::invalid_argument("host_tier_bytes " + std::to_string(c.host_tier_bytes) +
                                          " holds no KV page or no checkpoint: half of it must hold a " +
                                          std::to_string(page) + "-byte page and half " +
                                          std::to_string(model.recurrent_layers()) + " blocks of " + std::to_string(block) + " bytes");
    return h;
  }

  pool_t& pool() { return pool_; }
  cache_t& cache() { return cache_; }
  lifecycle_t& requests() { return requests_; }
  const cost_model& model() const { return model_; }
  std::int64_t page_bytes() const { return page_bytes_; }
  std::int64_t block_bytes() const { return block_bytes_; }
  std::byte* arena_base() { return pool_.arena().chunk_pointer(0); }
  std::uint64_t arena_bytes() { return pool_.arena().reserved_bytes(); }

  /// The page number of a KV handle in `kv_pages`.
  std::int64_t page_index(packed_handle h) {
    const std::byte* p = check(pool_.resolve(h));
    return static_cast<std::int64_t>((p - arena_base()) / page_bytes_);
  }

 private:
  cost_model model_;
  pool_t pool_;
  cache_t cache_;
  lifecycle_t requests_;
  std::int64_t page_bytes_ = 0, block_bytes_ = 0;
};

/// A request in flight. Generation-checked by the library: after finish/abort (or clear) every
/// call with it raises HandleError.
struct ticket_py {
  prefix::request_ticket ticket;
  nb::object owner;  // the PrefixCache it came from (kept alive while the ticket lives)
  std::int64_t prompt_tokens = 0;
};

prefix_cache_py& cache_of(nb::handle self) { return nb::cast<prefix_cache_py&>(self); }

const ticket_py& own_ticket(nb::handle self, const ticket_py& t) {
  // Another cache's ticket: the library would say foreign_handle; say which object instead.
  if (!t.owner.is(self)) throw library_error(error_info{errc::foreign_handle, false, "the ticket belongs to another PrefixCache", 0});
  return t;
}

const lifecycle_t::request_state& state_of(prefix_cache_py& c, const ticket_py& t) {
  return *check(c.requests().state(t.ticket));
}

using u8_array = nb::ndarray<nb::numpy, std::uint8_t, nb::ndim<1>>;

/// A checkpoint's blocks (one per recurrent layer) as uint8 arrays over the pool's memory.
nb::list checkpoint_arrays(nb::handle self, prefix_cache_py& c, const store_t::checkpoint_handle& h) {
  nb::list out;
  for (const packed_handle b : h.blocks) {
    std::byte* p = check(c.pool().resolve(b));
    out.append(u8_array(reinterpret_cast<std::uint8_t*>(p), {static_cast<std::size_t>(c.block_bytes())}, self));
  }
  return out;
}

/// The C++ side of bench/python_costs.py: the same loop as its Python caller's. Round r
/// begins each prompt with one output token reserved and finishes it as prompt + [r] with
/// the end state captured (a new sequence every round: a whole-prompt hit could capture
/// nothing). Seconds for `rounds` passes over `prompts`, timed here without Python.
double bench_begin_finish(prefix_cache_py& c, const std::vector<std::vector<token_id>>& prompts, std::int64_t rounds) {
  std::vector<std::int64_t> captured(1);
  std::vector<token_id> sequence;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::int64_t r = 0; r < rounds; ++r)
    for (const auto& p : prompts) {
      const prefix::request_ticket t = check(c.requests().begin(p, {.output_tokens = 1}));
      sequence.assign(p.begin(), p.end());
      sequence.push_back(static_cast<token_id>(r));
      captured[0] = static_cast<std::int64_t>(sequence.size());
      (void)check(c.requests().finish(t, sequence, captured));
    }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
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

  nb::class_<prefix_cache_py>(
      m, "PrefixCache",
      "A Marconi prefix cache (judicious admission, LRU) whose KV pages and SSM checkpoints live in a host "
      "asymmetric pool, with the request lifecycle (docs/runtime.md, docs/python.md).")
      .def(
          "__init__",
          [](prefix_cache_py* self, const cost_model& model, std::int64_t capacity_bytes, std::int64_t tokens_per_page,
             std::int64_t granularity_bytes, double ssm_fraction, bool compaction, std::int64_t host_tier_bytes) {
            new (self) prefix_cache_py(model, {capacity_bytes, tokens_per_page, granularity_bytes, ssm_fraction, compaction,
                                               host_tier_bytes});
          },
          "model"_a, "capacity_bytes"_a, "tokens_per_page"_a = 16, "granularity_bytes"_a = 0, "ssm_fraction"_a = 0.5,
          "compaction"_a = false, "host_tier_bytes"_a = 0,
          "A pool of `capacity_bytes` (chunks of `granularity_bytes`, 0: the pool's default, a multiple of the KV "
          "page) split between KV pages of `tokens_per_page` tokens and checkpoint blocks. `host_tier_bytes` > 0 "
          "adds a host tier (half KV pages, half checkpoint blocks): what the cache evicts is demoted there, and a "
          "later begin whose prompt continues into it loads it back into its reservation (state()['loaded_at']).")
      .def_prop_ro("model", [](prefix_cache_py& c) { return c.model(); })
      .def_prop_ro("tokens_per_page", [](prefix_cache_py& c) { return c.cache().store().tokens_per_page(); })
      .def_prop_ro("page_bytes", &prefix_cache_py::page_bytes, "Bytes of one KV page: tokens_per_page tokens of one attention layer.")
      .def_prop_ro("block_bytes", &prefix_cache_py::block_bytes, "Bytes of one recurrent layer's checkpoint block.")
      .def_prop_ro(
          "kv_pages",
          [](nb::handle self) {
            auto& c = cache_of(self);
            const std::size_t pages = c.arena_bytes() / static_cast<std::uint64_t>(c.page_bytes());
            return nb::ndarray<nb::numpy, std::uint8_t, nb::ndim<2>>(reinterpret_cast<std::uint8_t*>(c.arena_base()),
                                                                     {pages, static_cast<std::size_t>(c.page_bytes())}, self);
          },
          "The pool's memory as (pages, page_bytes) uint8, no copy: block_table's numbers index its rows. Read and "
          "write only the pages of your own tickets.")
      .def(
          "begin",
          [](nb::handle self, nb::handle prompt, std::int64_t output_tokens, nb::handle extra_checkpoints) {
            auto& c = cache_of(self);
            const std::vector<token_id> p = tokens(prompt, "prompt");
            std::vector<std::int64_t> extra;
            if (!extra_checkpoints.is_none())
              extra = int_sequence(extra_checkpoints, "extra_checkpoints", std::numeric_limits<std::int64_t>::min(),
                                   std::numeric_limits<std::int64_t>::max());
            const prefix::begin_options o{.output_tokens = output_tokens, .extra_checkpoints = extra};
            const prefix::request_ticket t = check(c.requests().begin(p, o));
            return ticket_py{t, nb::borrow(self), static_cast<std::int64_t>(p.size())};
          },
          "prompt"_a, "output_tokens"_a = 0, "extra_checkpoints"_a = nb::none(),
          "Matches and pins the prompt's cached prefix, plans the checkpoints prefill must capture and reserves KV "
          "for the prompt plus `output_tokens` and one slot per checkpoint. All or nothing: OutOfCapacity leaves the "
          "cache unchanged.")
      .def(
          "state",
          [](nb::handle self, const ticket_py& t) {
            auto& c = cache_of(self);
            const auto& s = state_of(c, own_ticket(self, t));
            nb::dict d;
            d["prompt_tokens"] = s.prompt_tokens;
            d["reusable_tokens"] = s.match.reusable_tokens;
            d["prefill_start"] = s.plan.prefill_start;
            d["kv_from"] = s.kv_from;
            d["reserved_tokens"] = s.reserved_tokens;
            d["loaded_at"] = s.loaded_at;
            std::vector<std::int64_t> sites;
            for (const auto& site : s.plan.sites) sites.push_back(site.position);
            d["sites"] = sites;
            std::vector<std::int64_t> slots;
            for (const auto& slot : s.checkpoints) slots.push_back(slot.position);
            d["slots"] = slots;
            return d;
          },
          "ticket"_a,
          "What the runtime reads of a request: reusable_tokens, prefill_start, kv_from (write KV from here), "
          "reserved_tokens, loaded_at (> 0: the host tier's hit was loaded into the reservation up to it; "
          "prefill_start is then loaded_at), sites (the positions to capture), slots (their positions; 0 = the "
          "end slot).")
      .def(
          "block_table",
          [](nb::handle self, const ticket_py& t, std::int64_t layer) {
            auto& c = cache_of(self);
            own_ticket(self, t);
            std::vector<packed_handle> table;
            check(c.requests().block_table(t.ticket, layer, table));
            auto* out = new std::vector<std::int64_t>(table.size());
            nb::capsule owner(out, [](void* p) noexcept { delete static_cast<std::vector<std::int64_t>*>(p); });
            for (std::size_t b = 0; b < table.size(); ++b) (*out)[b] = c.page_index(table[b]);
            return nb::ndarray<nb::numpy, std::int64_t, nb::ndim<1>>(out->data(), {out->size()}, owner);
          },
          "ticket"_a, "layer"_a,
          "Attention layer `layer`'s block table as int64 page numbers into kv_pages: row table[p // tokens_per_page] "
          "holds token p. The cached prefix's pages, then the reservation's.")
      .def(
          "resume_checkpoint",
          [](nb::handle self, const ticket_py& t) -> nb::object {
            auto& c = cache_of(self);
            own_ticket(self, t);
            const auto* h = check(c.requests().resume_checkpoint(t.ticket));
            if (h == nullptr) return nb::none();
            return checkpoint_arrays(self, c, *h);
          },
          "ticket"_a,
          "The state prefill resumes from: one uint8 array per recurrent layer over the pool's block (no copy), or "
          "None on a miss.")
      .def(
          "checkpoint_slot",
          [](nb::handle self, const ticket_py& t, std::int64_t i) {
            auto& c = cache_of(self);
            const auto& s = state_of(c, own_ticket(self, t));
            if (i < 0 || i >= static_cast<std::int64_t>(s.checkpoints.size()))
              throw hybridcache::invalid_argument("checkpoint_slot: index must lie in [0, " + std::to_string(s.checkpoints.size()) +
                                                  "), got " + std::to_string(i));
            return checkpoint_arrays(self, c, s.checkpoints[static_cast<std::size_t>(i)].handle);
          },
          "ticket"_a, "index"_a,
          "Reserved slot `index` (state(ticket)['slots'][index] is its position; sites first, then the end slot): "
          "one uint8 array per recurrent layer to write the captured state into.")
      .def(
          "grow",
          [](nb::handle self, const ticket_py& t, std::int64_t tokens) {
            check(cache_of(self).requests().grow(own_ticket(self, t).ticket, tokens));
          },
          "ticket"_a, "tokens"_a, "Reserves KV for `tokens` more tokens; fetch the block tables again after it.")
      .def(
          "finish",
          [](nb::handle self, const ticket_py& t, nb::handle sequence, nb::handle captured) {
            auto& c = cache_of(self);
            own_ticket(self, t);
            const std::vector<token_id> seq = tokens(sequence, "sequence");
            const std::vector<std::int64_t> cap =
                int_sequence(captured, "captured", 0, std::numeric_limits<std::int64_t>::max());
            const prefix::finish_result r = check(c.requests().finish(t.ticket, seq, cap));
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
          "abort", [](nb::handle self, const ticket_py& t) { check(cache_of(self).requests().abort(own_ticket(self, t).ticket)); },
          "ticket"_a, "Ends a request without inserting: the reservation goes back, the pin is released.")
      .def("clear", [](prefix_cache_py& c) { c.requests().clear(); },
           "Ends every request in flight (their tickets raise HandleError) and empties the cache.")
      .def_prop_ro("in_flight", [](prefix_cache_py& c) { return c.requests().in_flight(); })
      .def_prop_ro("tokens_cached", [](prefix_cache_py& c) { return c.cache().tokens_cached(); })
      .def_prop_ro("checkpoints_cached", [](prefix_cache_py& c) { return c.cache().checkpoints_cached(); })
      .def_prop_ro(
          "counters",
          [](prefix_cache_py& c) {
            const auto& k = c.cache().counters();
            nb::dict d;
            d["matches"] = k.matches;
            d["hits"] = k.hits;
            d["tokens_matched"] = k.tokens_matched;
            d["tokens_skipped"] = k.tokens_skipped;
            d["commits"] = k.commits;
            d["checkpoints_admitted"] = k.checkpoints_admitted;
            d["checkpoints_evicted"] = k.checkpoints_evicted;
            d["evictions"] = k.evictions;
            d["pool_rebalances"] = c.pool().counters().rebalances;
            d["kv_pages_used"] = c.pool().stats(pool_kind::kv).used_units;
            d["blocks_used"] = c.pool().stats(pool_kind::ssm).used_units;
            const auto& h = c.cache().store().host_counters();
            d["host_demotions"] = h.demotions;
            d["host_demotions_dropped"] = h.demotions_dropped;
            d["host_evictions"] = h.host_evictions;
            d["host_loads"] = h.loads;
            d["host_tokens_loaded"] = h.tokens_loaded;
            d["host_corrupt_dropped"] = h.corrupt_dropped;
            d["host_entries"] = c.cache().store().host_entries();
            return d;
          },
          "The cache's counters, the pool's occupancy and the host tier's (host_*: all 0 without one).");

  m.def(
      "_bench_begin_finish",
      [](prefix_cache_py& c, const nb::list& prompts, std::int64_t rounds) {
        std::vector<std::vector<token_id>> ps;
        for (nb::handle p : prompts) ps.push_back(tokens(p, "prompts[i]"));
        nb::gil_scoped_release release;
        return bench_begin_finish(c, ps, rounds);
      },
      "cache"_a, "prompts"_a, "rounds"_a, "bench/python_costs.py: seconds of the begin + finish loop run in C++.");
}

}  // namespace hybridcache::python
