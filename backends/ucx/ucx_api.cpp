#include "ucx/ucx_api.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>

#include "base/dynamic_library.hpp"
#include "lockstep/error.hpp"

namespace lockstep::detail {
namespace {

void bind(void* library, const char* name, auto& function) {
  bind_symbol(library, name, function, "the UCX library (1.12 or later is needed)");
}

UcxApi load() {
  const char* chosen = std::getenv("LOCKSTEP_UCX_LIBRARY");  // NOLINT(concurrency-mt-unsafe)
  const char* path = chosen != nullptr ? chosen : "libucp.so.0";
  void* library = ::dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  if (library == nullptr) {
    throw ConfigError(
        std::string("lockstep: a multi-node job needs UCX, which cannot be loaded (") +
        ::dlerror() +  // NOLINT(concurrency-mt-unsafe)
        "): install libucx0, or set LOCKSTEP_UCX_LIBRARY to libucp.so's path");
  }
  UcxApi api{};
  bind(library, "ucp_config_read", api.config_read);
  bind(library, "ucp_config_release", api.config_release);
  bind(library, "ucp_init_version", api.init_version);
  bind(library, "ucp_cleanup", api.cleanup);
  bind(library, "ucp_worker_create", api.worker_create);
  bind(library, "ucp_worker_destroy", api.worker_destroy);
  bind(library, "ucp_worker_get_efd", api.worker_get_efd);
  bind(library, "ucp_worker_set_am_recv_handler", api.worker_set_am_recv_handler);
  bind(library, "ucp_worker_query", api.worker_query);
  bind(library, "ucp_worker_release_address", api.worker_release_address);
  bind(library, "ucp_worker_progress", api.worker_progress);
  bind(library, "ucp_worker_arm", api.worker_arm);
  bind(library, "ucp_ep_create", api.ep_create);
  bind(library, "ucp_ep_close_nbx", api.ep_close_nbx);
  bind(library, "ucp_request_check_status", api.request_check_status);
  bind(library, "ucp_request_free", api.request_free);
  bind(library, "ucp_am_send_nbx", api.am_send_nbx);
  bind(library, "ucp_am_recv_data_nbx", api.am_recv_data_nbx);
  bind(library, "ucs_status_string", api.status_string);  // libucs, which libucp loads
  return api;
}

}  // namespace

const UcxApi& ucx_api() {
  static std::mutex mutex;
  static std::optional<UcxApi> api;
  std::lock_guard lock(mutex);
  if (!api) {
    api = load();  // a failure throws and is tried again next time
  }
  return *api;
}

}  // namespace lockstep::detail
