// The job's secret: what the nodes of a multi-node job prove to each other when they join
// (backends/ucx/auth.hpp), never sent (internal; the job environment's room).
#pragma once

#include <string>

#include "job/job_config.hpp"

namespace lockstep::detail {

inline constexpr std::size_t kMinSecret = 16;  // bytes: 128 bits

struct JobSecret {
  std::string bytes;
  std::string source;  // "LOCKSTEP_SECRET", "LOCKSTEP_SECRET_FILE=/path", "/root/.config/..."
};

// The secret, from the first of: LOCKSTEP_SECRET (at least 16 bytes); LOCKSTEP_SECRET_FILE (a
// regular file owned by this user, readable by nobody else, at least 16 bytes, a final newline
// dropped); this user's key file, $XDG_CONFIG_HOME/lockstep/secret or ~/.config/lockstep/secret,
// created on first use (32 random bytes, hex, 0600, its folder 0700), as a cluster shares an ssh
// key through a shared home. Every path is opened with O_NOFOLLOW | O_NONBLOCK and checked with
// fstat. ConfigError naming the source and what is wrong with it.
JobSecret load_job_secret(const EnvLookup& env);

// Where load_job_secret would take the secret from, without creating anything (--dry-run).
std::string describe_secret_source(const EnvLookup& env);

}  // namespace lockstep::detail
