// The UCX backend: the leaders' dissemination barrier, node 0's broadcast, the allgather of any
// size, over UCP active messages (the class: ucx_backend.hpp; joining: ucx_join.cpp; what the
// leaders know of each other, their losses and the job's abort: ucx_members.cpp; the
// exchanges, broadcast, allgather and share: ucx_exchange.cpp).
#include <poll.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <utility>

#include "base/proc.hpp"
#include "base/text.hpp"
#include "lockstep/error.hpp"
#include "ucx/ucx_backend.hpp"

namespace lockstep::detail::ucx {
namespace {

using namespace std::chrono_literals;

constexpr unsigned kAmId = 0x4c;     // every lockstep message travels as this active message
constexpr unsigned kChunkId = 0x4d;  // but the chunks of an allgather's parts, as this one
// A chunk this small goes eagerly, as the barrier's messages do (UCX would take a slower path).
constexpr std::size_t kEagerChunk = 8192;
// How long a leader waiting in a barrier sleeps on the worker's event fd before it progresses the
// worker again. UCX 1.13's event fd sometimes misses a message on loopback TCP (four simulated
// nodes, all asleep on their fds, each holding a message the next needed: 100 ms stalls, several
// per second, when this was kSleepSlice); the slice bounds what such a miss costs, at about 500
// wake-ups a second (~0.3% of a core) while a leader waits long.
constexpr auto kEventSlice = 2ms;
// How long a waiting leader naps while a send of its is in flight (see wait_until).
constexpr auto kSendNap = 50us;
// How long the worker must have had nothing to do before it is destroyed.
constexpr auto kQuiet = 20ms;
// Messages kept from other nodes before node 0's welcome names the job's token.
constexpr std::size_t kMaxEarly = 4096;

// What the wire decodes is what the interface promises to carry (Bootstrap's limits).
static_assert(wire::kMaxBlob == Bootstrap::kMaxBlob);

}  // namespace

void check(ucs_status_t status, const std::string& what) {
  if (status != UCS_OK) {
    throw Error("lockstep: UCX backend: " + what + ": " + ucx_api().status_string(status));
  }
}

UcxBackend::UcxBackend(const LeaderConfig& config)
    : config_(config), me_(config.job.node_index), num_nodes_(config.job.num_nodes) {
  while ((1 << rounds_) < num_nodes_) {
    ++rounds_;
  }
  members_.assign(static_cast<std::size_t>(num_nodes_), nullptr);
  start_ucx();
  try {
    if (me_ == 0) {
      serve();
    } else {
      connect();
    }
    connect_mesh();
    progress();
    watch_new_paths();
    // What other leaders sent before this one knew the job's token.
    for (const auto& bytes : std::exchange(early_, {})) {
      try {
        handle_member(wire::decode(bytes));
      } catch (const wire::WireError&) {
        // malformed or foreign: dropped
      }
    }
  } catch (...) {
    shutdown();
    throw;
  }
}

UcxBackend::~UcxBackend() {
  shutdown();
}

void UcxBackend::start_ucx() {
  ucp_config_t* ucx_config = nullptr;
  check(ucx_api().config_read(nullptr, nullptr, &ucx_config),
        "reading UCX's configuration (UCX_*)");
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  ucs_status_t status =
      ucx_api().init_version(UCP_API_MAJOR, UCP_API_MINOR, &params, ucx_config, &context_);
  ucx_api().config_release(ucx_config);
  check(status, "ucp_init");

  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  // One thread at a time, not always the same one (Leaders: the GPU relay's meets).
  worker_params.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  check(ucx_api().worker_create(context_, &worker_params, &worker_), "ucp_worker_create");
  check(ucx_api().worker_get_efd(worker_, &event_fd_), "ucp_worker_get_efd");

  ucp_am_handler_param_t handler{};
  handler.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                       UCP_AM_HANDLER_PARAM_FIELD_ARG;
  handler.id = kAmId;
  handler.cb = &UcxBackend::on_message;
  handler.arg = this;
  check(ucx_api().worker_set_am_recv_handler(worker_, &handler), "ucp_worker_set_am_recv_handler");
  handler.field_mask |= UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
  handler.id = kChunkId;
  handler.cb = &UcxBackend::on_chunk;
  handler.flags = UCP_AM_FLAG_WHOLE_MSG;
  check(ucx_api().worker_set_am_recv_handler(worker_, &handler), "ucp_worker_set_am_recv_handler");

  ucp_worker_attr_t attr{};
  attr.field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS;
  check(ucx_api().worker_query(worker_, &attr), "ucp_worker_query");
  const auto* begin = reinterpret_cast<const std::byte*>(attr.address);
  address_.assign(begin, begin + attr.address_length);
  ucx_api().worker_release_address(worker_, attr.address);
}

void UcxBackend::close_endpoints() noexcept {
  std::vector<void*> closing;
  for (auto& endpoint : endpoints_) {
    if (endpoint->ep == nullptr) {
      continue;
    }
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = endpoint->error != UCS_OK ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    void* request = ucx_api().ep_close_nbx(endpoint->ep, &param);
    endpoint->ep = nullptr;
    if (request != nullptr && !UCS_PTR_IS_ERR(request)) {
      closing.push_back(request);
    }
  }
  const auto until = Clock::now() + kCloseBound;
  while (!closing.empty() && Clock::now() < until) {
    ucx_api().worker_progress(worker_);
    std::erase_if(closing, [](void* request) {
      if (ucx_api().request_check_status(request) == UCS_INPROGRESS) {
        return false;
      }
      ucx_api().request_free(request);
      return true;
    });
  }
  // Let UCX finish what it has under way (connection set-up messages in particular) until it
  // has been quiet for a moment: UCX 1.13 asserts (and aborts the process) when it destroys a
  // worker whose endpoints still hold a pending wire-up reply (seen in backend_test under load).
  auto quiet_since = Clock::now();
  while (Clock::now() < until && Clock::now() - quiet_since < kQuiet) {
    if (ucx_api().worker_progress(worker_) != 0) {
      quiet_since = Clock::now();
    }
  }
  // Whatever is still in flight is handed back to UCX, which releases it with the worker.
  for (void* request : closing) {
    ucx_api().request_free(request);
  }
}

void UcxBackend::shutdown() noexcept {
  desk_.reset();  // before its links close
  for (UniqueFd& link : links_) {
    link.reset();
  }
  if (worker_ == nullptr) {
    if (context_ != nullptr) {
      ucx_api().cleanup(context_);
      context_ = nullptr;
    }
    return;
  }
  close_endpoints();
  for (const Sending& entry : sending_) {
    ucx_api().request_free(entry.request);
  }
  for (const Receiving& entry : receiving_) {
    ucx_api().request_free(entry.request);
  }
  ucx_api().worker_destroy(worker_);
  worker_ = nullptr;
  sending_.clear();  // what they sent from and received into, once UCX has let go of it
  receiving_.clear();
  part_inbox_.reset();
  ucx_api().cleanup(context_);
  context_ = nullptr;
}

ucs_status_t UcxBackend::on_message(void* arg, const void* /*header*/,
                                    std::size_t /*header_length*/, void* data, std::size_t length,
                                    const ucp_am_recv_param_t* param) {
  auto* self = static_cast<UcxBackend*>(arg);
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) {
    return UCS_OK;  // larger than any lockstep message: not ours (the data is never fetched)
  }
  const auto* begin = static_cast<const std::byte*>(data);
  if (!self->joined_) {
    // Another leader's message can come before this one has read node 0's welcome, which names
    // the token to check it by: it is kept until then (bounded).
    try {
      if (self->early_.size() < kMaxEarly) {
        self->early_.emplace_back(begin, begin + length);
      }
    } catch (...) {
      // (out of memory) nothing may cross into UCX
    }
    return UCS_OK;
  }
  // The barrier's hot path: a member's message is handled here, without a copy or a queue
  // (handle_member makes no UCX call).
  try {
    self->handle_member(wire::decode({begin, length}));
  } catch (const wire::WireError&) {
    // malformed or foreign: dropped
  } catch (...) {
    // (out of memory) nothing may cross into UCX
  }
  return UCS_OK;
}

void UcxBackend::on_error(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* endpoint = static_cast<Endpoint*>(arg);
  if (endpoint->error == UCS_OK) {
    endpoint->error = status;
  }
}

Endpoint& UcxBackend::add_endpoint(ucp_ep_params_t params, int node) {
  auto endpoint = std::make_unique<Endpoint>();
  endpoint->node = node;
  params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;  // a dead peer is an error, never a hang
  params.err_handler.cb = &UcxBackend::on_error;
  params.err_handler.arg = endpoint.get();
  ucs_status_t status = ucx_api().ep_create(worker_, &params, &endpoint->ep);
  if (status != UCS_OK) {
    endpoint->ep = nullptr;
    endpoint->error = status;
  }
  endpoints_.push_back(std::move(endpoint));
  return *endpoints_.back();
}

ucs_status_t UcxBackend::on_chunk(void* arg, const void* header, std::size_t header_length,
                                  void* data, std::size_t length,
                                  const ucp_am_recv_param_t* param) {
  auto* self = static_cast<UcxBackend*>(arg);
  if (!self->part_inbox_ || header_length == 0) {
    return UCS_OK;  // before the join (no leader sends then), or not a chunk: dropped
  }
  try {
    const wire::Message message =
        wire::decode({static_cast<const std::byte*>(header), header_length});
    const auto* head = std::get_if<wire::Chunk>(&message);
    if (head == nullptr) {
      return UCS_OK;
    }
    const ChunkPlace place = self->part_inbox_->place(*head, length);
    if (place.verdict == ChunkPlace::Verdict::refuse) {
      if (!self->aborted_) {  // no chunk of it is received: the job's failure
        self->aborted_ = Failure{FailureKind::error, -1, {}, place.why};
      }
      return UCS_OK;
    }
    if (place.verdict == ChunkPlace::Verdict::drop) {
      return UCS_OK;
    }
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) == 0) {
      if (length != 0) {
        std::memcpy(place.at, data, length);
      }
      self->part_inbox_->received(*head, true);
      return UCS_OK;
    }
    self->receiving_.reserve(self->receiving_.size() + 1);  // no throw once UCX has the buffer
    ucp_request_param_t receive{};
    void* request = ucx_api().am_recv_data_nbx(self->worker_, data, place.at, length, &receive);
    if (request == nullptr || UCS_PTR_IS_ERR(request)) {
      self->part_inbox_->received(*head, request == nullptr);
    } else {
      self->receiving_.push_back(Receiving{request, *head});
    }
  } catch (const wire::WireError&) {
    // malformed or foreign: dropped
  } catch (...) {
    // (out of memory) nothing may cross into UCX
  }
  return UCS_OK;
}

void UcxBackend::take_token(std::uint64_t token) {
  token_ = token;
  part_inbox_.emplace(me_, num_nodes_, token_, kMaxAhead, PartInbox::physical_memory());
}

void UcxBackend::send(ucp_ep_h ep, const wire::Message& message, bool reply) {
  if (ep == nullptr) {
    return;  // a failed endpoint: its error is reported by check_members()
  }
  std::vector<std::byte> bytes = wire::encode(message);
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_AM_SEND_FLAG_EAGER | (reply ? UCP_AM_SEND_FLAG_REPLY : 0);
  void* request = ucx_api().am_send_nbx(ep, kAmId, nullptr, 0, bytes.data(), bytes.size(), &param);
  if (request == nullptr || UCS_PTR_IS_ERR(request)) {
    return;  // sent at once, or failed: a failed endpoint also reports through on_error
  }
  sending_.push_back(Sending{request, std::move(bytes), nullptr});  // kept until the send completes
}

void UcxBackend::send_chunk(ucp_ep_h ep, const wire::Chunk& head,
                            const std::shared_ptr<const std::vector<std::byte>>& part) {
  if (ep == nullptr) {
    return;  // a failed endpoint: its error is reported by check_members()
  }
  std::vector<std::byte> bytes = wire::encode(head);
  ucp_request_param_t param{};
  if (head.length <= kEagerChunk) {  // else UCX chooses: rendezvous for the large ones
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_AM_SEND_FLAG_EAGER;
  }
  void* request = ucx_api().am_send_nbx(ep, kChunkId, bytes.data(), bytes.size(),
                                        part->data() + head.offset, head.length, &param);
  if (request == nullptr || UCS_PTR_IS_ERR(request)) {
    return;  // sent at once, or failed: a failed endpoint also reports through on_error
  }
  sending_.push_back(Sending{request, std::move(bytes), part});
}

void UcxBackend::progress() {
  while (ucx_api().worker_progress(worker_) != 0) {
  }
  if (relay_) {
    // Node 0 passes another leader's abort on to every other leader: a leader that cannot
    // reach the one that gave up (a partition) learns it so.
    wire::Abort abort = *std::exchange(relay_, std::nullopt);
    if (abort.kind == static_cast<std::uint32_t>(FailureKind::timeout)) {
      // A leader timed out on machines that node 0 can ask: where their processes are goes with
      // the error, to this node's processes and the others'.
      const std::string places = places_text(nodes_of(abort.missing, static_cast<int>(abort.from)));
      abort.message += places;
      abort.message.resize(std::min(abort.message.size(), wire::kMaxText));
      if (aborted_) {
        aborted_->message += places;
      }
    }
    for (Endpoint* member : members_) {
      if (member != nullptr && member->error == UCS_OK &&
          member->node != static_cast<int>(abort.from)) {
        send(member->ep, abort);
      }
    }
  }
  std::erase_if(sending_, [](const Sending& entry) {
    if (ucx_api().request_check_status(entry.request) == UCS_INPROGRESS) {
      return false;
    }
    ucx_api().request_free(entry.request);
    return true;
  });
  std::erase_if(receiving_, [this](const Receiving& entry) {
    const ucs_status_t status = ucx_api().request_check_status(entry.request);
    if (status == UCS_INPROGRESS) {
      return false;
    }
    ucx_api().request_free(entry.request);
    part_inbox_->received(entry.head, status == UCS_OK);
    return true;
  });
}

void UcxBackend::wait_until(FunctionRef<bool()> done, std::optional<Clock::time_point> deadline,
                            const char* what, FunctionRef<void()> on_deadline,
                            FunctionRef<std::string()> whom) {
  // The backend as a place to wait: polling progresses the worker (and throws the job's failure
  // if a leader is gone); blocking sleeps on the worker's event fd. A message from another node
  // takes microseconds: the Waiter yields between polls (idle machine) and then sleeps.
  // Out of line, each call: see WaitSite (waiting/waiter.hpp).
  struct Site : WaitSite {
    UcxBackend& backend;
    FunctionRef<bool()>& ready;
    const char* what;
    [[gnu::noinline]] bool done() {
      backend.progress();
      // Another node gave up on the job: no episode completes here after that, even when the
      // message that would complete it came in with the abort (or before it, unread).
      backend.check_aborted(what);
      if (ready()) {
        return true;
      }
      backend.check_members(what);
      return false;
    }
    [[gnu::noinline]] void block(std::chrono::nanoseconds limit) {
      if (!backend.sending_.empty() || !backend.receiving_.empty()) {
        // A send in flight completes only as this worker progresses, and UCX does not say
        // that its event fd fires for that: rather than risk holding the message (and every
        // node waiting for it) for a slice, nap briefly and progress again.
        std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(limit, kSendNap));
        return;
      }
      if (ucx_api().worker_arm(backend.worker_) != UCS_OK) {
        return;  // events are pending: progress them
      }
      const auto slice = std::clamp(std::chrono::ceil<std::chrono::milliseconds>(limit),
                                    std::chrono::milliseconds(0), kEventSlice);
      pollfd fd{backend.event_fd_, POLLIN, 0};
      (void)::poll(&fd, 1, static_cast<int>(slice.count()));
    }
    [[gnu::noinline]] void stalled(std::chrono::nanoseconds waited) noexcept {
      try {
        say_stalled(backend.config_.job.rank, what, waited, whom());
      } catch (...) {
        // Out of memory for a diagnostic: the wait goes on without it.
      }
    }
    FunctionRef<std::string()>& whom;
  } site{{}, *this, done, what, whom};
  switch (config_.waiter->wait(site, deadline, kSleepSlice)) {
    case Waiter::End::done:
      return;
    case Waiter::End::timed_out:
      on_deadline();
      return;
    case Waiter::End::interrupted:
      throw InterruptedError(std::string(what) + ": interrupted by a signal");
  }
}

void UcxBackend::barrier(std::optional<Clock::time_point> deadline, const char* what) {
  if (aborted_) {
    fail(*aborted_, what);
  }
  const std::uint64_t episode = episode_;
  std::vector<std::uint64_t> known((static_cast<std::size_t>(num_nodes_) + 63) / 64, 0);
  known[static_cast<std::size_t>(me_) / 64] |= 1ULL << (me_ % 64);
  for (int round = 0; round < rounds_; ++round) {
    const int to = (me_ + (1 << round)) % num_nodes_;
    send(members_[static_cast<std::size_t>(to)]->ep,
         wire::Arrive{token_, static_cast<std::uint32_t>(me_), episode,
                      static_cast<std::uint32_t>(round), known});
    RoundSlot& slot = inbox_[episode & 1][static_cast<std::size_t>(round)];
    wait_until(
        [&] { return slot.present; }, deadline, what,
        [&] {
          const std::vector<int> missing_nodes = unheard_nodes(episode, known);
          const std::string message =
              "timed out waiting for " + nodes_text(missing_nodes) + places_text(missing_nodes);
          // A leader that timed out as this one did may have said so while this one asked where
          // the late machines' processes are (node 0 then answers no more once its process
          // ends): the job's failure is the one declared first.
          progress();
          if (aborted_) {
            fail(*aborted_, what);
          }
          Failure failure{FailureKind::timeout, -1, ranks_of_nodes(missing_nodes), message};
          abort(failure);  // the episode cannot be taken back: the others must not wait for ever
          fail(failure, what);
        },
        [&] {
          const std::vector<int> unheard = unheard_nodes(episode, known);
          return nodes_text(unheard) + " on the other machines" + places_text(unheard);
        });
    for (std::size_t w = 0; w < known.size(); ++w) {
      known[w] |= slot.known[w];
    }
    slot = RoundSlot{};
  }
  ++episode_;
  flush(deadline, what);
}

void UcxBackend::flush(std::optional<Clock::time_point> deadline, const char* what) {
  if (sending_.empty()) {
    return;  // the usual case: an eager send leaves at once
  }
  // A send queued behind a connection that UCX is still setting up (the job's first episodes)
  // leaves only as this worker progresses: returning now would hold it, and the leader that
  // waits for it, until this leader's next call.
  wait_until([&] { return sending_.empty(); }, deadline, what,
             [&] {
               const Failure failure{FailureKind::timeout,
                                     -1,
                                     {},
                                     "timed out while its message to the other machines was "
                                     "still being sent"};
               abort(failure);
               fail(failure, what);
             },
             [] { return std::string("its message to the other machines to leave"); });
}

}  // namespace lockstep::detail::ucx

namespace lockstep::detail {
namespace {

using ucx::UcxBackend;

std::unique_ptr<Backend> make_ucx(const LeaderConfig& config,
                                  std::unique_ptr<Bootstrap> /*unused*/) {
  return std::make_unique<UcxBackend>(config);
}

std::unique_ptr<Bootstrap> make_ucx_bootstrap(const LeaderConfig& config) {
  return std::make_unique<UcxBackend>(config);
}

}  // namespace

// Node 0's leader listens on config.job.master_addr:rendezvous_port (lockstep's own rendezvous,
// rendezvous.hpp), the others connect to it, retrying until `config.deadline`, and present the
// job's identity; node 0 answers with every leader's UCX worker address and a random job token,
// and each leader then connects to every other directly.
extern constinit const BackendType ucx_backend_type{"ucx", &make_ucx, &make_ucx_bootstrap, false};

}  // namespace lockstep::detail
