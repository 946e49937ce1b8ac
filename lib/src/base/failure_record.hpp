// Failure records: why a job cannot go on, in a form that crosses processes and machines, and
// their translation to and from the public exceptions (internal).
//
// Below both the node engine (lib/src/shm, which keeps a record in the node segment for the
// node's processes) and the cross-node backends (which send one to the other leaders).
#pragma once

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

namespace lockstep::detail {

enum class FailureKind : std::uint32_t { timeout = 1, peer_lost = 2, config = 3, error = 4 };

struct Failure {
  FailureKind kind = FailureKind::error;
  int rank = -1;             // the process lost, for peer_lost
  std::vector<int> missing;  // the processes that had not arrived, for timeout
  std::string message;
};

// Throws the lockstep::Error that `failure` describes, its message prefixed by `context`.
[[noreturn]] void throw_failure(const Failure& failure, const std::string& context = "");
// The failure that a lockstep::Error thrown by a backend or the node engine describes; its
// message without the leading "<what>: " that names the call (whoever rethrows names its own),
// and from its reason on where it was itself a failure passed on ("...: the job cannot go on: ").
Failure failure_of(const std::exception& error, const char* what);

}  // namespace lockstep::detail
