// lockstep-run --status's reading of the node segments (status.hpp).
#include "engine/status.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "base/proc.hpp"
#include "base/unique_fd.hpp"
#include "engine/call_log.hpp"
#include "engine/segment.hpp"  // user_segments
#include "engine/segment_file.hpp"
#include "job/job_config.hpp"  // kMaxLocalProcesses

namespace lockstep::detail {
namespace {

ProcessStatus process_status(const Slot& slot, std::span<const CallLog> logs, int index,
                             bool same_namespace, std::int64_t now) {
  ProcessStatus out;
  const SlotStatus status = status_of(slot);
  out.rank = slot.rank.load(std::memory_order_relaxed);  // after the status (acquire)
  out.pid = slot.pid.load(std::memory_order_relaxed);
  if (const auto call = latest_call(logs, index)) {
    out.call = call_kind_name(call->kind);
    out.file = call->file;
    out.function = call->function;
    out.line = static_cast<int>(call->line);
    out.episode = call->episode == kNoEpisode ? -1 : static_cast<std::int64_t>(call->episode);
    out.seconds = static_cast<double>(now - (call->ended == 0 ? call->began : call->ended)) / 1e9;
    out.seconds = std::max(out.seconds, 0.0);
    out.ended = call->ended == 0 ? "" : call_end_name(call->end);
    out.state = call->ended == 0 ? "waiting" : "running";
  } else {
    out.state = "running";
  }
  if (status == SlotStatus::empty) {
    out.state = "joining";
  } else if (status == SlotStatus::left) {
    out.state = "left";
  } else if (!same_namespace) {
    out.state = "unknown";
  } else if (joined_and(slot, Liveness::dead)) {
    out.state = status_of(slot) == SlotStatus::left ? "left" : "dead";
  }
  return out;
}

// The episodes the machine's processes completed: the arrival counter's, which counts each
// process's arrival (and across machines the leader's release); a machine's only process meets
// the other machines without it, and its log says instead.
std::uint64_t episodes_passed(const SegmentHeader& header, std::uint32_t num_slots,
                              const CallLog* logs) {
  if (num_slots > 1) {
    const bool across = header.world_size > num_slots;  // a release per episode too
    return header.episode.arrivals.load(std::memory_order_relaxed) / (num_slots + (across ? 1 : 0));
  }
  const auto call = latest_call({logs, 1}, 0);
  if (!call || call->episode == kNoEpisode) {
    return 0;
  }
  // A call that ended well completed its episode; one that lasts or gave up did not.
  return call->episode + (call->ended != 0 && call->end == CallEnd::passed ? 1 : 0);
}

// One segment, read through a read-only mapping; nullopt: not a lockstep segment of this user.
std::optional<JobStatus> read_job(const std::string& name, std::int64_t now) {
  JobStatus job;
  job.path = "/dev/shm/" + name;
  // O_NONBLOCK: a FIFO put where a segment should be must not hang the reader.
  UniqueFd owned(::open(job.path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
  if (!owned) {
    return std::nullopt;
  }
  const int fd = owned.get();
  struct stat st {};
  Prefix prefix;
  const bool ours = ::fstat(fd, &st) == 0 && made_by_us(st);
  const Peek peeked = ours ? peek(fd, static_cast<std::size_t>(st.st_size), prefix) : Peek::torn;
  if (!ours) {
    return std::nullopt;
  }
  if (peeked != Peek::ours) {
    job.note = peeked == Peek::other_version
                   ? "laid out by another lockstep version (layout " +
                         std::to_string(prefix.layout_version) + "): its processes are not read"
                   : "being laid out, or left torn by a process that died laying it out";
    return job;
  }
  if (prefix.num_slots == 0 || prefix.num_slots > static_cast<std::uint32_t>(kMaxLocalProcesses)) {
    job.note = "malformed: its header says " + std::to_string(prefix.num_slots) +
               " processes (a segment holds 1 to " + std::to_string(kMaxLocalProcesses) + ")";
    return job;
  }
  const std::size_t size = segment_size(prefix.num_slots);
  void* base = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  owned.reset();  // the mapping stays (errno stays mmap's)
  if (base == MAP_FAILED) {
    job.note = "could not be mapped: " + error_text(errno);
    return job;
  }
  const auto& header = *static_cast<const SegmentHeader*>(base);
  job.identity.assign(header.identity,
                      std::min<std::size_t>(header.identity_length, sizeof header.identity));
  job.world_size = static_cast<int>(header.world_size);
  const std::uint32_t num_slots = prefix.num_slots;  // what was mapped, whatever the header says
  job.num_slots = static_cast<int>(num_slots);
  const bool same_namespace = header.pid_namespace == pid_namespace();
  const auto* slots = reinterpret_cast<const Slot*>(&header + 1);
  const auto* logs = reinterpret_cast<const CallLog*>(static_cast<const unsigned char*>(base) +
                                                      call_log_offset(num_slots));
  for (std::uint32_t slot = 0; slot < num_slots; ++slot) {
    job.processes.push_back(process_status(slots[slot], {logs, num_slots}, static_cast<int>(slot),
                                           same_namespace, now));
  }
  job.episode = episodes_passed(header, num_slots, logs);
  ::munmap(base, size);
  std::sort(job.processes.begin(), job.processes.end(),
            [](const ProcessStatus& a, const ProcessStatus& b) { return a.rank < b.rank; });
  return job;
}

}  // namespace

std::vector<JobStatus> job_statuses() {
  std::vector<std::string> names = user_segments();
  std::sort(names.begin(), names.end());
  const std::int64_t now = coarse_clock_ns();
  std::vector<JobStatus> jobs;
  for (const auto& name : names) {
    if (auto job = read_job(name, now)) {
      jobs.push_back(std::move(*job));
    }
  }
  return jobs;
}

}  // namespace lockstep::detail
