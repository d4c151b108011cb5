// python/src/caches_pool.cpp: PrefixCache's policies over the pool store (real bytes; the
// block tables, checkpoints and kv_pages arrays). cache_impl.hpp says what each policy is.
#include "cache_impl.hpp"

namespace hybridcache::python {

std::unique_ptr<cache_base> make_pool_cache(const cost_model& model, const cache_options& o) {
  return make_cache<pool_store_t>(model, o);
}

}  // namespace hybridcache::python
