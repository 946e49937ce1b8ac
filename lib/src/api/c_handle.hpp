// The C API's handle and its helpers (internal), shared by the files that implement lockstep.h.
#pragma once

#include <chrono>
#include <exception>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/lockstep.h"
#include "lockstep/state.hpp"

struct lockstep_state {
  explicit lockstep_state(lockstep::SourceLocation where) : state(where) {}
  lockstep_state(const lockstep_state&) = delete;
  lockstep_state& operator=(const lockstep_state&) = delete;
  ~lockstep_state() {
    while (!blocks.empty()) {  // innermost first, as the C++ guards would end
      blocks.pop_back();
    }
  }
  lockstep::State state;
  std::string source = state.environment_source();  // for lockstep_environment_source
  // The open first blocks (between *main_process_first_begin and _end), innermost last.
  struct OpenBlock {
    lockstep::FirstGuard guard;
    bool local;
    std::string begun;  // where its _begin was called ("nest.c:12"), for a mismatched _end
  };
  std::vector<OpenBlock> blocks;
};

namespace lockstep::detail::capi {

// A C caller's site (its strings are read during the call only).
inline SourceLocation site_of(const char* file, int line, const char* function) noexcept {
  return {file, line > 0 ? static_cast<unsigned>(line) : 0U, function};
}

// Keeps `message` as this thread's lockstep_last_error and returns `status`.
lockstep_status fail(lockstep_status status, const char* message) noexcept;
// This thread's last message (fail's).
const char* last_error_text() noexcept;

// Runs `body`, turning what it throws into a status and a message (no exception crosses into C).
template <class Body>
lockstep_status guarded(Body&& body) noexcept {
  try {
    body();
    return LOCKSTEP_OK;
  } catch (const lockstep::TimeoutError& error) {
    return fail(LOCKSTEP_TIMEOUT, error.what());
  } catch (const lockstep::PeerLostError& error) {
    return fail(LOCKSTEP_PEER_LOST, error.what());
  } catch (const lockstep::InterruptedError& error) {
    return fail(LOCKSTEP_INTERRUPTED, error.what());
  } catch (const lockstep::ConfigError& error) {
    return fail(LOCKSTEP_CONFIG_ERROR, error.what());
  } catch (const lockstep::SystemError& error) {
    return fail(LOCKSTEP_SYSTEM_ERROR, error.what());
  } catch (const std::bad_alloc&) {
    return fail(LOCKSTEP_SYSTEM_ERROR, "lockstep: out of memory");
  } catch (const std::exception& error) {
    return fail(LOCKSTEP_ERROR, error.what());
  } catch (...) {
    return fail(LOCKSTEP_ERROR, "lockstep: unknown error");
  }
}

}  // namespace lockstep::detail::capi
