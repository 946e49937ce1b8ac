// What a job leaves on a machine, for the launcher: its node segments, cleared when no process
// of theirs runs, and who has joined one (internal). The launcher's only way into the engine's
// room (lib/src/meson.build's arrows): it never sees the segment's layout or its calls.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace lockstep::detail {

// Removes node `node_index`'s segment of the job `job_id` launched as `launch` (the launch id in
// hexadecimal, as LOCKSTEP_LAUNCH_ID) if none of its processes runs (a job killed before it could
// leave). Returns true when it removed it.
bool remove_abandoned_job(const std::string& job_id, int node_index, const std::string& launch);
// The ranks that have joined that segment (a hint, for the launcher's start-up message); empty
// when the segment does not exist (yet).
std::optional<std::vector<int>> joined_job_ranks(const std::string& job_id, int node_index,
                                                 const std::string& launch);
// Removes this user's abandoned segments (see sweep_abandoned_segments in engine/segment.hpp);
// returns their paths.
std::vector<std::string> remove_abandoned_jobs(bool other_versions);

}  // namespace lockstep::detail
