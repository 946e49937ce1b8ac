// lockstep.h's first blocks: lockstep_main_process_first_begin, _end and the local forms.
// The plain names are this file's functions, not the header's macros (which call the _at forms).
#define LOCKSTEP_NO_SITE_MACROS
#include <string>

#include "api/c_handle.hpp"

using lockstep::SourceLocation;
using lockstep::detail::capi::fail;
using lockstep::detail::capi::guarded;
using lockstep::detail::capi::site_of;

namespace {

// "nest.c:12", or "an unrecorded place" (a call without its _at form's site).
std::string site_words(const SourceLocation& site) {
  if (site.file_name() == nullptr) {
    return "an unrecorded place";
  }
  return std::string(site.file_name()) + ":" + std::to_string(site.line());
}

// The first process (the main one, or each node's main one) runs the block between begin and end
// first: the others wait in begin until it has called end. The C++ guard holds the rule (which
// process waits where, and that the first one enters only an intact job).
lockstep_status first_begin(lockstep_state* state, bool local, const char* what,
                            const SourceLocation& site) {
  if (state == nullptr) {
    return fail(LOCKSTEP_INVALID_ARGUMENT, (std::string(what) + ": state is null").c_str());
  }
  return guarded([&] {
    lockstep::FirstGuard guard =
        local ? state->state.local_main_process_first(site) : state->state.main_process_first(site);
    state->blocks.push_back({std::move(guard), local, site_words(site)});
  });
}

const char* block_name(bool local) {
  return local ? "local_main_process_first" : "main_process_first";
}

lockstep_status first_end(lockstep_state* state, bool local, const char* what,
                          const SourceLocation& site) {
  if (state == nullptr || state->blocks.empty()) {
    return fail(LOCKSTEP_INVALID_ARGUMENT,
                (std::string(what) + ": no open block on this handle (no _begin without its _end)")
                    .c_str());
  }
  lockstep_state::OpenBlock& innermost = state->blocks.back();
  if (innermost.local != local) {
    return fail(
        LOCKSTEP_INVALID_ARGUMENT,
        (std::string(what) + " at " + site_words(site) + ": the innermost open block is a " +
         block_name(innermost.local) + " block, begun at " + innermost.begun +
         "; end it first (blocks " + "end in the reverse order of their _begin)")
            .c_str());
  }
  const lockstep_status status = guarded([&] { innermost.guard.end(site); });
  if (status != LOCKSTEP_INTERRUPTED) {
    state->blocks.pop_back();  // interrupted: the others are still held; _end may be called again
  }
  return status;
}

}  // namespace

extern "C" {

lockstep_status lockstep_main_process_first_begin(lockstep_state* state) {
  return lockstep_main_process_first_begin_at(state, nullptr, 0, nullptr);
}

lockstep_status lockstep_main_process_first_begin_at(lockstep_state* state, const char* file,
                                                     int line, const char* function) {
  return first_begin(state, false, "lockstep_main_process_first_begin",
                     site_of(file, line, function));
}

lockstep_status lockstep_main_process_first_end(lockstep_state* state) {
  return lockstep_main_process_first_end_at(state, nullptr, 0, nullptr);
}

lockstep_status lockstep_main_process_first_end_at(lockstep_state* state, const char* file,
                                                   int line, const char* function) {
  return first_end(state, false, "lockstep_main_process_first_end", site_of(file, line, function));
}

lockstep_status lockstep_local_main_process_first_begin(lockstep_state* state) {
  return lockstep_local_main_process_first_begin_at(state, nullptr, 0, nullptr);
}

lockstep_status lockstep_local_main_process_first_begin_at(lockstep_state* state, const char* file,
                                                           int line, const char* function) {
  return first_begin(state, true, "lockstep_local_main_process_first_begin",
                     site_of(file, line, function));
}

lockstep_status lockstep_local_main_process_first_end(lockstep_state* state) {
  return lockstep_local_main_process_first_end_at(state, nullptr, 0, nullptr);
}

lockstep_status lockstep_local_main_process_first_end_at(lockstep_state* state, const char* file,
                                                         int line, const char* function) {
  return first_end(state, true, "lockstep_local_main_process_first_end",
                   site_of(file, line, function));
}

}  // extern "C"
