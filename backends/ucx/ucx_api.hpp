// UCX's entry points, opened at run time (internal).
//
// liblockstep does not link UCX: loading libucp also loads libucm, whose memory hooks then patch
// malloc, mmap and madvise in every process that links lockstep, single-node ones included (and
// clash with sanitizers). libucp.so.0 is opened only when a multi-node job makes a UCX backend.
#pragma once

#include <ucp/api/ucp.h>

namespace lockstep::detail {

struct UcxApi {
  decltype(&::ucp_config_read) config_read;
  decltype(&::ucp_config_release) config_release;
  decltype(&::ucp_init_version) init_version;
  decltype(&::ucp_cleanup) cleanup;
  decltype(&::ucp_worker_create) worker_create;
  decltype(&::ucp_worker_destroy) worker_destroy;
  decltype(&::ucp_worker_get_efd) worker_get_efd;
  decltype(&::ucp_worker_set_am_recv_handler) worker_set_am_recv_handler;
  decltype(&::ucp_worker_query) worker_query;
  decltype(&::ucp_worker_release_address) worker_release_address;
  decltype(&::ucp_worker_progress) worker_progress;
  decltype(&::ucp_worker_arm) worker_arm;
  decltype(&::ucp_ep_create) ep_create;
  decltype(&::ucp_ep_close_nbx) ep_close_nbx;
  decltype(&::ucp_request_check_status) request_check_status;
  decltype(&::ucp_request_free) request_free;
  decltype(&::ucp_am_send_nbx) am_send_nbx;
  decltype(&::ucp_am_recv_data_nbx) am_recv_data_nbx;
  decltype(&::ucs_status_string) status_string;
};

// Opens libucp.so.0 (or LOCKSTEP_UCX_LIBRARY) once. ConfigError when it cannot.
const UcxApi& ucx_api();

}  // namespace lockstep::detail
