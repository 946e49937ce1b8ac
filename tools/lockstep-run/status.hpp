// lockstep-run --status: this user's jobs on this machine, and where each process is.
#pragma once

namespace lockstep::run {

// Prints the jobs (as text, or with `json` one JSON document) on stdout; returns the exit status.
int show_status(bool json);

}  // namespace lockstep::run
