#include "status.hpp"

#include <cstdio>
#include <string>

#include "base/text.hpp"  // json_string, printable, rounded_seconds
#include "engine/status.hpp"

namespace lockstep::run {
namespace {

using lockstep::detail::JobStatus;
using lockstep::detail::json_string;
using lockstep::detail::printable;
using lockstep::detail::ProcessStatus;

std::string seconds_text(double seconds) {
  return lockstep::detail::rounded_seconds(seconds) + " s";
}

std::string place(const ProcessStatus& process) {
  if (process.file.empty()) {
    return "an unrecorded place";
  }
  std::string text = printable(process.file) + ":" + std::to_string(process.line);
  if (!process.function.empty()) {
    text += " in " + printable(process.function);
  }
  return text;
}

std::string call_text(const ProcessStatus& process) {
  std::string text = process.call + " at " + place(process);
  if (process.episode >= 0) {
    text += " (episode " + std::to_string(process.episode) + ")";
  }
  return text;
}

// "waiting 3.2 s in wait_for_everyone at train.py:88 in main (episode 12)", ...
std::string state_text(const ProcessStatus& process) {
  if (process.state == "waiting") {
    return "waiting " + seconds_text(process.seconds) + " in " + call_text(process);
  }
  std::string text = process.state;
  if (process.state == "unknown") {
    text += " (its pid is another pid namespace's)";
  }
  if (process.call.empty()) {
    return text + (process.state == "running" ? ": no lockstep call yet" : "");
  }
  if (process.ended.empty()) {
    return text + ", in " + call_text(process) + " since " + seconds_text(process.seconds);
  }
  return text + ", its last call " + call_text(process) + " " + process.ended + " " +
         seconds_text(process.seconds) + " ago";
}

void print_json(const std::vector<JobStatus>& jobs) {
  std::string out = "{\"jobs\": [";
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    const JobStatus& job = jobs[j];
    out += std::string(j == 0 ? "" : ", ") + "{\"segment\": " + json_string(job.path) +
           ", \"identity\": " + json_string(job.identity) +
           ", \"world_size\": " + std::to_string(job.world_size) +
           ", \"processes_here\": " + std::to_string(job.num_slots) +
           ", \"episode\": " + std::to_string(job.episode) +
           ", \"note\": " + json_string(job.note) + ", \"processes\": [";
    for (std::size_t p = 0; p < job.processes.size(); ++p) {
      const ProcessStatus& process = job.processes[p];
      char seconds[32];
      (void)std::snprintf(seconds, sizeof seconds, "%.3f", process.seconds);
      out += std::string(p == 0 ? "" : ", ") + "{\"rank\": " + std::to_string(process.rank) +
             ", \"pid\": " + std::to_string(process.pid) +
             ", \"state\": " + json_string(process.state) +
             ", \"call\": " + json_string(process.call) +
             ", \"file\": " + json_string(process.file) +
             ", \"line\": " + std::to_string(process.line) +
             ", \"function\": " + json_string(process.function) +
             ", \"episode\": " + std::to_string(process.episode) + ", \"seconds\": " + seconds +
             ", \"ended\": " + json_string(process.ended) + "}";
    }
    out += "]}";
  }
  out += "]}\n";
  (void)std::fputs(out.c_str(), stdout);
}

}  // namespace

int show_status(bool json) {
  const auto jobs = lockstep::detail::job_statuses();
  if (json) {
    print_json(jobs);
    return 0;
  }
  if (jobs.empty()) {
    (void)std::printf("lockstep-run: no lockstep job of this user runs on this machine\n");
    return 0;
  }
  for (const JobStatus& job : jobs) {
    (void)std::printf("%s\n", printable(job.path).c_str());
    if (!job.note.empty()) {
      (void)std::printf("  %s\n", job.note.c_str());
      continue;
    }
    (void)std::printf("  job %s: %d of its %d processes on this machine, %llu episodes passed\n",
                      printable(job.identity).c_str(), job.num_slots, job.world_size,
                      static_cast<unsigned long long>(job.episode));
    for (const ProcessStatus& process : job.processes) {
      (void)std::printf("  process %d (pid %d): %s\n", process.rank, static_cast<int>(process.pid),
                        state_text(process).c_str());
    }
  }
  return 0;
}

}  // namespace lockstep::run
