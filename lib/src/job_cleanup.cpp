// The launcher's clean-up entry points (job.hpp), over the node segment's.
#include "job.hpp"
#include "shm/segment.hpp"

namespace lockstep::detail {

bool remove_abandoned_job(const std::string& job_id, int node_index) {
  return remove_abandoned_segment(segment_name(job_identity(job_id), node_index));
}

std::vector<std::string> remove_abandoned_jobs(bool other_versions) {
  std::vector<std::string> paths;
  for (const auto& name : sweep_abandoned_segments(other_versions)) {
    paths.push_back("/dev/shm/" + name);
  }
  return paths;
}

}  // namespace lockstep::detail
