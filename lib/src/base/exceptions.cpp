// The public exceptions (lockstep/error.hpp): below every layer, so that the node engine builds
// without the rest of the library (tests/engine/node_test.cpp).
#include "lockstep/error.hpp"

#include <string>
#include <utility>
#include <vector>

namespace lockstep {

Error::~Error() = default;
ConfigError::~ConfigError() = default;

TimeoutError::TimeoutError(const std::string& what, std::vector<int> missing)
    : Error(what), missing_(std::move(missing)) {}
TimeoutError::~TimeoutError() = default;

InterruptedError::~InterruptedError() = default;

PeerLostError::PeerLostError(const std::string& what, int process_index)
    : Error(what), process_index_(process_index) {}
PeerLostError::~PeerLostError() = default;

SystemError::SystemError(const std::string& what, int error_number)
    : Error(what), errno_(error_number) {}
SystemError::~SystemError() = default;

}  // namespace lockstep
