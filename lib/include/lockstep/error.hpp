// The exceptions that lockstep's public API throws.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "lockstep/export.hpp"

namespace lockstep {

// Base of every exception lockstep throws. The message is one line that says what failed, where
// and why.
class LOCKSTEP_API Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
  ~Error() override;
};

// A wait did not complete in time. `missing()` lists the process indices that had not arrived.
class LOCKSTEP_API TimeoutError : public Error {
 public:
  TimeoutError(const std::string& what, std::vector<int> missing);
  ~TimeoutError() override;
  [[nodiscard]] const std::vector<int>& missing() const noexcept { return missing_; }

 private:
  std::vector<int> missing_;
};

// A peer process died or left the job while this process needed it. `process_index()` names it.
class LOCKSTEP_API PeerLostError : public Error {
 public:
  PeerLostError(const std::string& what, int process_index);
  ~PeerLostError() override;
  [[nodiscard]] int process_index() const noexcept { return process_index_; }

 private:
  int process_index_;
};

// The environment, a flag or an argument describes an impossible job (malformed or inconsistent
// variables, a segment owned by someone else, a second job with the same identity).
class LOCKSTEP_API ConfigError : public Error {
 public:
  using Error::Error;
  ~ConfigError() override;
};

// A wait gave up because a signal arrived while an interrupt descriptor was set
// (lockstep_set_interrupt_fd, which the Python package sets around each wait so that Ctrl-C
// raises KeyboardInterrupt). On one machine the process's arrival is withdrawn, as after a
// timeout, so the same call may be made again; a node's main process interrupted while it waits
// for the other machines ends the job (the others get PeerLostError naming it).
class LOCKSTEP_API InterruptedError : public Error {
 public:
  using Error::Error;
  ~InterruptedError() override;
};

// A system call failed in a way the caller cannot fix by changing its input.
class LOCKSTEP_API SystemError : public Error {
 public:
  SystemError(const std::string& what, int error_number);
  ~SystemError() override;
  [[nodiscard]] int error_number() const noexcept { return errno_; }

 private:
  int errno_;
};

}  // namespace lockstep
