// The fake CUDA driver's events (tests/fake_cuda/fake_cuda.cpp): words in a memfd per process;
// an interprocess handle names the process, the descriptor and the event, and is opened through
// /proc/<pid>/fd.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "fake_cuda.hpp"

namespace lockstep::fake_cuda {
namespace {

constexpr std::uint32_t kHandleMagic = 0x6c6b7370;  // "lksp"
constexpr std::size_t kEventsPerProcess = 4096;

// What an interprocess event handle holds.
struct EventHandle {
  std::uint32_t magic;
  std::int32_t pid;
  std::int32_t fd;
  std::uint32_t index;
};
static_assert(sizeof(EventHandle) <= sizeof(CUipcEventHandle));

}  // namespace

CUresult event_create(CUevent* event, unsigned int /*flags*/) {
  Driver& d = driver();
  std::lock_guard lock(d.mutex);
  if (d.events == nullptr) {
    d.events_fd = ::memfd_create("fake-cuda-events", MFD_CLOEXEC);
    const std::size_t bytes = kEventsPerProcess * sizeof(EventWords);
    if (d.events_fd < 0 || ::ftruncate(d.events_fd, static_cast<off_t>(bytes)) != 0) {
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    void* map = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, d.events_fd, 0);
    if (map == MAP_FAILED) {
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    d.events = static_cast<EventWords*>(map);
  }
  if (d.events_used == kEventsPerProcess) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  // NOLINTNEXTLINE(cppcoreguidelines-owning-memory): events live to the process's end
  *event = new CUevent_st{&d.events[d.events_used++]};
  d.made_events.push_back(*event);
  return CUDA_SUCCESS;
}

CUresult event_record(CUevent event, CUstream stream) {
  const std::uint64_t record = event->words->recorded.fetch_add(1) + 1;
  EventWords* words = event->words;
  return enqueue(stream, [words, record] {
    std::uint64_t seen = words->completed.load();
    while (seen < record && !words->completed.compare_exchange_weak(seen, record)) {
    }
    return true;
  });
}

CUresult event_synchronize(CUevent event) {
  if (CUresult refused = check_unsafe(); refused != CUDA_SUCCESS) {
    return refused;
  }
  const std::uint64_t record = event->words->recorded.load();
  while (event->words->completed.load() < record) {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return CUDA_SUCCESS;
}

CUresult stream_wait_event(CUstream stream, CUevent event, unsigned int /*flags*/) {
  const std::uint64_t record = event->words->recorded.load();
  EventWords* words = event->words;
  return enqueue(stream, [words, record] { return words->completed.load() >= record; });
}

CUresult ipc_get_event_handle(CUipcEventHandle* handle, CUevent event) {
  Driver& d = driver();
  std::lock_guard lock(d.mutex);
  EventHandle mine{kHandleMagic, ::getpid(), d.events_fd,
                   static_cast<std::uint32_t>(event->words - d.events)};
  std::memset(handle, 0, sizeof *handle);
  std::memcpy(handle, &mine, sizeof mine);
  return CUDA_SUCCESS;
}

CUresult ipc_open_event_handle(CUevent* event, CUipcEventHandle handle) {
  EventHandle theirs{};
  std::memcpy(&theirs, &handle, sizeof theirs);
  if (theirs.magic != kHandleMagic || theirs.index >= kEventsPerProcess) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Driver& d = driver();
  std::lock_guard lock(d.mutex);
  EventWords*& words = d.opened[{theirs.pid, theirs.fd}];
  if (words == nullptr) {
    const std::string path =
        "/proc/" + std::to_string(theirs.pid) + "/fd/" + std::to_string(theirs.fd);
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    void* map = ::mmap(nullptr, kEventsPerProcess * sizeof(EventWords), PROT_READ | PROT_WRITE,
                       MAP_SHARED, fd, 0);
    ::close(fd);
    if (map == MAP_FAILED) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    words = static_cast<EventWords*>(map);
  }
  // NOLINTNEXTLINE(cppcoreguidelines-owning-memory): events live to the process's end
  *event = new CUevent_st{&words[theirs.index]};
  d.made_events.push_back(*event);
  return CUDA_SUCCESS;
}

}  // namespace lockstep::fake_cuda
