// What lockstep-run --status shows (internal): this user's jobs on this machine and where each
// of their processes is, read from their node segments without joining, locking or writing them.
// The launcher's second way into the engine's room (lib/src/meson.build's arrows): plain data.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::detail {

struct ProcessStatus {
  int rank = -1;
  pid_t pid = 0;
  // "waiting" (in a call that meets the others), "running" (in its own code), "left", "dead",
  // "joining" (its slot not claimed yet), or "unknown" (a pid of another pid namespace).
  std::string state;
  // The call it is in (waiting) or made last (running, left, dead); empty if none.
  std::string call;      // "wait_for_everyone", ...
  std::string file;      // as recorded (empty: an unrecorded place)
  std::string function;  //
  int line = 0;
  std::int64_t episode = -1;  // -1: none (a join)
  double seconds = 0;         // waiting: since it began; else since it returned
  std::string ended;          // how the last call ended: "returned", "timed out", ...
};

struct JobStatus {
  std::string path;  // /dev/shm/...
  std::string identity;
  int world_size = 0;
  int num_slots = 0;          // the processes on this machine
  std::uint64_t episode = 0;  // the episodes the machine's processes completed
  std::string note;           // why the processes are not shown ("another lockstep version")
  std::vector<ProcessStatus> processes;
};

// This user's lockstep jobs on this machine (at most 256 segments looked at), each read as it is
// this moment (a process may move on while it is read: every field is the process's own).
std::vector<JobStatus> job_statuses();

}  // namespace lockstep::detail
