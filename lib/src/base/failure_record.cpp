#include "base/failure_record.hpp"

#include <string>
#include <string_view>

#include "lockstep/error.hpp"

namespace lockstep::detail {
namespace {

constexpr std::string_view kCannotGoOn = "the job cannot go on: ";

// `message` from its reason on: a failure passed on again ("gather_object: the job cannot go
// on: process 3 died", recorded and thrown by the next call) keeps its reason, once.
std::string_view reason_of(std::string_view message) {
  const auto at = message.rfind(kCannotGoOn);
  return at == std::string_view::npos ? message : message.substr(at + kCannotGoOn.size());
}

}  // namespace

void throw_failure(const Failure& failure, const std::string& context) {
  std::string message = context;
  message += context.ends_with(kCannotGoOn) ? reason_of(failure.message) : failure.message;
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
  failure.message = std::string(reason_of(failure.message));
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
