// python/src/caches_bytes.cpp: PrefixCache's policies over the byte-counting store
// (store="bytes": hcbench's replay store, one budget for KV and checkpoints, no memory), so
// a Python-driven run makes the decisions `hcbench replay --drive lifecycle` makes.
#include "cache_impl.hpp"

namespace hybridcache::python {

std::unique_ptr<cache_base> make_bytes_cache(const cost_model& model, const cache_options& o) {
  return make_cache<bytes_store_t>(model, o);
}

}  // namespace hybridcache::python
