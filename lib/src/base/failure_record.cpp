#include "base/failure_record.hpp"

#include "lockstep/error.hpp"

namespace lockstep::detail {

void throw_failure(const Failure& failure, const std::string& context) {
  std::string message = context + failure.message;
  switch (failure.kind) {
    case FailureKind::timeout:
      throw TimeoutError(message, failure.missing);
    case FailureKind::peer_lost:
      throw PeerLostError(message, failure.rank);
    case FailureKind::config:
      throw ConfigError(message);
    case FailureKind::error:
      break;
  }
  throw Error(message);
}

Failure failure_of(const std::exception& error, const char* what) {
  Failure failure;
  failure.message = error.what();
  const std::string prefix = std::string(what) + ": ";
  if (failure.message.starts_with(prefix)) {
    failure.message.erase(0, prefix.size());
  }
  if (const auto* timeout = dynamic_cast<const TimeoutError*>(&error)) {
    failure.kind = FailureKind::timeout;
    failure.missing = timeout->missing();
  } else if (const auto* lost = dynamic_cast<const PeerLostError*>(&error)) {
    failure.kind = FailureKind::peer_lost;
    failure.rank = lost->process_index();
  } else if (dynamic_cast<const ConfigError*>(&error) != nullptr) {
    failure.kind = FailureKind::config;
  }
  return failure;
}

}  // namespace lockstep::detail
