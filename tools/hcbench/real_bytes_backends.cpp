// Storage backends of `hcbench replay --real-bytes`: see real_bytes_backends.hpp.
#include "real_bytes_backends.hpp"

#include <unistd.h>

#include <filesystem>
#include <limits>
#include <string>
#include <system_error>

#include <hybridcache/core/error.hpp>
#include <hybridcache/tiered/disk_backend.hpp>
#if HCBENCH_HAS_REDIS
#include <hybridcache/tiered/redis/redis_backend.hpp>
#endif

#include "cli_support.hpp"

namespace hcbench {

namespace hc = hybridcache;
namespace tr = hybridcache::tiered;

struct real_bytes_backends::impl {
  std::vector<std::unique_ptr<tr::disk_backend<>>> disks;
#if HCBENCH_HAS_REDIS
  std::vector<std::unique_ptr<tr::redis_backend<>>> redis;
#endif
  std::vector<std::string> dirs;
  std::vector<hc::tiered::storage_tier_io> io;

  // Closes the backends, then removes their directories (each DIR/hcbench-real-PID is ours).
  // Also when the constructor fails part way (a later tier's backend): the ones made go.
  ~impl() {
    io.clear();
    disks.clear();
#if HCBENCH_HAS_REDIS
    redis.clear();
#endif
    for (const auto& d : dirs) {
      std::error_code ec;
      std::filesystem::remove_all(d, ec);
    }
  }
};

real_bytes_backends::real_bytes_backends(const std::vector<tr::tier_config>& tiers) : impl_(std::make_unique<impl>()) {
  double memory = 0.0;
  for (const auto& t : tiers)
    if (!tr::is_storage(t.kind)) memory += static_cast<double>(t.capacity_bytes);
  const double ram = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGE_SIZE));
  if (ram > 0 && memory > ram / 2)
    throw hc::invalid_argument("--real-bytes: the memory tiers (hbm, host, cxl) take " +
                               std::to_string(static_cast<long long>(memory)) + " B of real arenas, more than half of "
                               "this machine's " + std::to_string(static_cast<long long>(ram)) +
                               " B; scale the tiers down (and the trace with --limit)");
  const std::string tag = "hcbench-real-" + std::to_string(::getpid());
  for (std::size_t i = 0; i < tiers.size(); ++i) {
    const auto& t = tiers[i];
    if (!tr::is_storage(t.kind)) continue;
    const std::int64_t cap =
        t.capacity_bytes > std::numeric_limits<std::int64_t>::max() / 2 ? t.capacity_bytes : 2 * t.capacity_bytes;
    const std::string who = "--real-bytes: tier " + std::to_string(i) + " (" + std::string(to_string(t.kind)) + "@" +
                            t.location + ")";
    if (t.kind == tr::tier_kind::disk) {
      const std::string dir = (std::filesystem::path(t.location) / tag).string();
      impl_->dirs.push_back(dir);  // before the backend: one that fails may have made it
      try {
        impl_->disks.push_back(std::make_unique<tr::disk_backend<>>(tr::disk_backend_config{.directory = dir, .capacity_bytes = cap}));
      } catch (const std::exception& e) {
        throw hc::error(who + ": " + strip_library_prefix(e.what()));
      }
      impl_->io.push_back(hc::tiered::storage_io_of(*impl_->disks.back()));
      continue;
    }
#if HCBENCH_HAS_REDIS
    const tr::redis_host_port ep = tr::parse_redis_endpoint(t.location, who);
    tr::redis_backend_config c;
    c.server.endpoints = {{ep.host, ep.port}};
    c.key_prefix = tag + ":";
    c.capacity_bytes = cap;
    try {
      impl_->redis.push_back(std::make_unique<tr::redis_backend<>>(c));
    } catch (const std::exception& e) {
      throw hc::error(who + ": " + strip_library_prefix(e.what()));
    }
    impl_->io.push_back(hc::tiered::storage_io_of(*impl_->redis.back()));
#else
    throw hc::error(who + ": this hcbench was built without hiredis; a redis tier cannot move real bytes");
#endif
  }
}

real_bytes_backends::~real_bytes_backends() = default;

std::vector<hc::tiered::storage_tier_io> real_bytes_backends::io() const { return impl_->io; }

}  // namespace hcbench
