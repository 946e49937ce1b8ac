// The stream-ordered barrier: State::wait_for_everyone(cudaStream_t) (internal).
#pragma once

#include <string>

#include <functional>
#include <memory>

#include "env.hpp"
#include "shm/segment.hpp"

struct CUstream_st;  // CUDA's stream (cudaStream_t is CUstream_st*)

namespace lockstep::detail {

// Orders GPU work across the node's processes without making the host wait for the GPU.
//
// Each process creates kGpuRing interprocess events on its current device and publishes their
// handles in its GpuSlot of the node segment; the first call (collective, like every call) also
// opens every peer's. A call records this process's next event on the stream, meets the others
// on the host barrier (`meet`), then makes the stream wait on every peer's event of the same
// episode. A peer can be at most one episode ahead of this process's waits (it cannot pass the
// next host barrier without this process), so with a ring of 4 an event is never re-recorded
// before every peer has enqueued its wait on the earlier record (which cudaStreamWaitEvent
// captures when called).
//
// With LOCKSTEP_GPU_BARRIER=memops (one node only), no host rendezvous at all: each process owns
// a 64-bit flag in device memory, which its peers map through CUDA IPC; a call enqueues a write
// of the episode number to its own flag (after the stream's earlier work) and a wait on every
// peer's flag reaching it (cuStreamWriteValue64 / cuStreamWaitValue64, reached through
// cudaGetDriverEntryPointByVersion). Not the default: nothing on the host watches a memops
// barrier, so a peer that dies leaves the survivors' streams waiting for ever, where the events
// barrier turns it into PeerLostError.
//
// Across nodes the other nodes' events cannot be waited on: there each process first waits for
// its own stream's work (cudaEventSynchronize), then meets the job on the host. Ordering holds;
// only the node's own processes are stream-ordered without the host waiting.
class StreamBarrier {
 public:
  StreamBarrier() = default;
  virtual ~StreamBarrier() = default;
  StreamBarrier(const StreamBarrier&) = delete;
  StreamBarrier& operator=(const StreamBarrier&) = delete;

  // `meet` runs the host barrier (all nodes); `what` names the call in errors.
  virtual void wait(CUstream_st* stream, const std::function<void()>& meet, const char* what) = 0;
};

// The barrier for this process (`segment` null in a job of one). Throws ConfigError when this
// build has no CUDA support.
std::unique_ptr<StreamBarrier> make_stream_barrier(NodeSegment* segment, const JobConfig& config);

// The device a local process should use: its local index modulo the devices CUDA shows it
// (CUDA_VISIBLE_DEVICES applies); -1 when there is none, or this build has no CUDA support.
int visible_device(int local_index) noexcept;
// How many CUDA devices this process sees (CUDA_VISIBLE_DEVICES applies); 0 with `why` saying
// why when none (no driver, no device, a build without CUDA).
int visible_device_count(std::string& why);
// The PCI bus id of visible device `device` ("0000:3b:00.0", lower case, as sysfs names it);
// empty with `why` when it cannot be told.
std::string device_pci_bus_id(int device, std::string& why);

}  // namespace lockstep::detail
