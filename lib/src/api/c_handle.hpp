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

#include "engine/call_log.hpp"
#include "lockstep/lockstep.h"
#include "lockstep/state.hpp"
#include "membership/context.hpp"

namespace lockstep::detail {

// State's calls at a C caller's site (State's private _at forms), and the handle they work on.
class CApi {
 public:
  static State create(const CallSite& site) { return State(site); }
  static void wait(State& state, std::optional<std::chrono::milliseconds> timeout,
                   const CallSite& site) {
    state.wait_at(timeout, site);
  }
  static bool try_wait(State& state, const CallSite& site) { return state.try_wait_at(site); }
  // The bytes copied once, from the segment or a spill straight into the C caller's buffer.
  static void broadcast(State& state, std::span<const std::byte> data,
                        FunctionRef<void(std::span<const std::byte>)> put, const CallSite& site) {
    state.context_->broadcast_into(data, put, "broadcast", site);
  }
  static void gather(State& state, std::span<const std::byte> data, const Context::GatherSink& sink,
                     const CallSite& site) {
    state.context_->gather_into(data, sink, "gather_object", site);
  }
  static bool check_trigger(State& state, const CallSite& site) {
    return state.check_trigger_at(site);
  }
  static void wait_stream(State& state, void* stream,
                          std::optional<std::chrono::milliseconds> timeout, const CallSite& site) {
    state.wait_stream_at(static_cast<CUstream_st*>(stream), timeout, site);
  }
  static FirstGuard first(State& state, bool local, const CallSite& site) {
    return state.first_at(local, site);
  }
  // Ends the block at the _end call's site (C++'s guard releases where it was made).
  static void end(FirstGuard& guard, const CallSite& site) {
    guard.file_ = site.file;
    guard.function_ = site.function;
    guard.line_ = site.line;
    guard.end();
  }
};

}  // namespace lockstep::detail

struct lockstep_state {
  explicit lockstep_state(const lockstep::detail::CallSite& site)
      : state(lockstep::detail::CApi::create(site)) {}
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
    lockstep::detail::CallSite begun;
  };
  std::vector<OpenBlock> blocks;
};

namespace lockstep::detail::capi {

inline CallSite site_of(const char* file, int line, const char* function) noexcept {
  return {file, function, line > 0 ? static_cast<std::uint32_t>(line) : 0};
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
