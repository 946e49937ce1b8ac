// What a job leaves on a machine (leftovers.hpp), through the node segment's own calls.
#include "engine/leftovers.hpp"

#include <string>

#include "engine/segment.hpp"
#include "job/launch_env.hpp"  // job_identity

namespace lockstep::detail {

namespace {
std::string job_segment(const std::string& job_id, int node_index, const std::string& launch) {
  return segment_name(job_identity(job_id), node_index, std::stoull(launch, nullptr, 16));
}
}  // namespace

bool remove_abandoned_job(const std::string& job_id, int node_index, const std::string& launch) {
  return remove_abandoned_segment(job_segment(job_id, node_index, launch));
}

std::optional<std::vector<int>> joined_job_ranks(const std::string& job_id, int node_index,
                                                 const std::string& launch) {
  return joined_ranks(job_segment(job_id, node_index, launch));
}

std::vector<std::string> remove_abandoned_jobs(bool other_versions) {
  std::vector<std::string> paths;
  for (const auto& name : sweep_abandoned_segments(other_versions)) {
    paths.push_back("/dev/shm/" + name);
  }
  return paths;
}

}  // namespace lockstep::detail
