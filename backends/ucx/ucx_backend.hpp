// The UCX backend's leader (internal to backends/ucx): ucx_backend.cpp runs the barrier, the
// broadcast, the gather and the failure reports; ucx_join.cpp joins the other leaders (node 0's
// rendezvous, the others' connection to it, then the mesh of UCP endpoints).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/function_ref.hpp"
#include "base/unique_fd.hpp"
#include "membership/backend.hpp"
#include "ucx/part_inbox.hpp"
#include "ucx/paths.hpp"
#include "ucx/places.hpp"
#include "ucx/rendezvous.hpp"
#include "ucx/ucx_api.hpp"
#include "ucx/wire.hpp"

namespace lockstep::detail::ucx {

using namespace std::chrono_literals;

// How long a waiting leader sleeps on the worker's event fd before it looks at the clock again.
constexpr auto kSleepSlice = 100ms;
// How long closing the endpoints may take (flushing what was sent) before the worker goes.
constexpr auto kCloseBound = 1s;
constexpr int kMaxRounds = 16;  // ceil(log2(wire::kMaxNodes))

// One UCP endpoint and what UCX's error callback said about it.
struct Endpoint {
  int node = -1;  // the leader of this node
  ucp_ep_h ep = nullptr;
  ucs_status_t error = UCS_OK;
};

// A barrier message waiting for its round.
struct RoundSlot {
  bool present = false;
  std::uint64_t episode = 0;
  std::vector<std::uint64_t> known;
};

// A leader's link to the others: the backend's barrier, and (for a backend such as NCCL's) the
// bootstrap's broadcast and failure reports, over one UCP worker.
// Why node 0 (whose job is `job`) refuses an authenticated node's `hello`, given the nodes that
// have joined so far; empty when the node may join. (A function of its inputs alone, so that the
// join's fuzzer reaches it: fuzz/fuzz_join.cpp.)
std::string hello_refusal(const wire::Hello& hello, const JobConfig& job,
                          const std::vector<NodeInfo>& joined);

class UcxBackend final : public Backend, public Bootstrap {
 public:
  explicit UcxBackend(const LeaderConfig& config);
  ~UcxBackend() override;
  UcxBackend(const UcxBackend&) = delete;
  UcxBackend& operator=(const UcxBackend&) = delete;

  [[nodiscard]] const char* name() const noexcept override { return "ucx"; }
  [[nodiscard]] const std::vector<NodeInfo>& nodes() const noexcept override { return nodes_; }
  void barrier(std::optional<Clock::time_point> deadline, const char* what) override;
  std::vector<std::byte> broadcast(std::span<const std::byte> blob,
                                   std::optional<Clock::time_point> deadline,
                                   const char* what) override;
  // Each chunk of `part` goes to every other leader as one active message of its own id, its
  // head the message's header and its bytes the data, which UCX sends by its rendezvous
  // protocol where they are large (straight into the receiver's buffer, part_inbox.hpp).
  std::vector<std::vector<std::byte>> allgather(std::span<const std::byte> part,
                                                std::optional<Clock::time_point> deadline,
                                                const char* what) override;
  std::vector<std::byte> share(std::span<const std::byte> data,
                               std::optional<Clock::time_point> deadline,
                               const char* what) override;
  void abort(const Failure& failure) noexcept override;
  void check_aborted(const char* what) override {
    if (aborted_) {
      fail(*aborted_, what);
    }
  }
  void poll(const char* what) override {
    progress();
    check_members(what);
  }
  // The places desk's question (places.hpp: node 0 asks the nodes, another node asks node 0).
  [[nodiscard]] std::optional<NodePlaces> places(const std::vector<int>& nodes) const override;

 private:
  static ucs_status_t on_message(void* arg, const void* header, std::size_t header_length,
                                 void* data, std::size_t length, const ucp_am_recv_param_t* param);
  // A chunk of another leader's part (allgather), delivered or started (rendezvous) into the
  // place part_inbox_ names for it.
  static ucs_status_t on_chunk(void* arg, const void* header, std::size_t header_length, void* data,
                               std::size_t length, const ucp_am_recv_param_t* param);
  static void on_error(void* arg, ucp_ep_h ep, ucs_status_t status);

  void start_ucx();
  // Closes every endpoint (flushing what was sent, for a bounded time) and releases UCX.
  void shutdown() noexcept;
  // Closes every endpoint, waiting a bounded time for the closes and for UCX to go quiet.
  void close_endpoints() noexcept;
  void serve();
  void connect();
  void connect_mesh();
  Endpoint& add_endpoint(ucp_ep_params_t params, int node);
  void send(ucp_ep_h ep, const wire::Message& message, bool reply = false);
  // Sends the chunk `head` names of `part` (kept alive until the send completes).
  void send_chunk(ucp_ep_h ep, const wire::Chunk& head,
                  const std::shared_ptr<const std::vector<std::byte>>& part);
  // The job's token, once known: messages are checked by it from then on.
  void take_token(std::uint64_t token);
  // Runs UCX until nothing more happens, then handles what arrived.
  void progress();
  // Waits (as wait_until) until this leader's sends in flight have left.
  void flush(std::optional<Clock::time_point> deadline, const char* what);
  // Node 0's rendezvous: a hello taken or refused (why: hello_refusal), a joined node's
  // connection lost before the welcome, and the join timeout's message.
  rendezvous::Verdict take_hello(int id, std::span<const std::byte> bytes, const std::string& from);
  void forget_joiner(int id);
  // A joining node: checks node 0's table of nodes (welcome_) before trusting it, and keeps it.
  void check_welcome();
  // The join's last step (ucx_join.cpp, kTookWelcome): node 0 waits until every node took its
  // welcome, then tells them to wire up; a node says it took it and waits for that word.
  void await_welcome_taken();
  void await_wire_up();
  // Node 0: node `node` did not take the welcome (its link closed, with errno `error` or 0, or it
  // timed out): tells the other nodes which, and throws.
  [[noreturn]] void give_up_join(int node, bool timed_out, int error);
  [[noreturn]] void throw_serve_timeout(const std::vector<std::string>& dropped) const;
  void handle_member(const wire::Message& message);
  // Whether a message's token and sender make it another leader's of this job.
  [[nodiscard]] bool from_member(std::uint64_t token, std::uint32_t from) const noexcept;
  void handle_arrive(const wire::Arrive& arrive);
  void handle_abort(const wire::Abort& abort);
  void handle_blob(const wire::Blob& blob);
  // allgather (every leader gives) and share (node 0's leader alone): sends this leader's part
  // if it gives, then waits for the parts it takes and returns them all (by node index; this
  // node's empty).
  std::vector<std::vector<std::byte>> exchange(std::span<const std::byte> part, bool share,
                                               std::optional<Clock::time_point> deadline,
                                               const char* what);
  // Polls, then sleeps on the worker's event fd, as the process's Waiter decides, until done();
  // throws the job's failure, or calls on_deadline() when `deadline` passes. whom() says what
  // it still waits for, in the stall line of a wait that lasts (LOCKSTEP_STALL_WARNING).
  // (FunctionRefs: one wait's machine code for every caller, base/function_ref.hpp.)
  void wait_until(FunctionRef<bool()> done, std::optional<Clock::time_point> deadline,
                  const char* what, FunctionRef<void()> on_deadline,
                  FunctionRef<std::string()> whom);
  // The nodes this leader has not heard of in `episode`'s barrier, directly or through the
  // others, given what it knew (`known`, a bit per node) before the round it waits in.
  [[nodiscard]] std::vector<int> unheard_nodes(std::uint64_t episode,
                                               const std::vector<std::uint64_t>& known) const;
  // "node 1 (processes 2, 3)", "nodes 1, 3 (processes 2, 3, 6, 7)".
  [[nodiscard]] std::string nodes_text(const std::vector<int>& nodes) const;
  // "; on node 1, process 3 is not in a lockstep call: ...; process 2 waits in ...", as
  // `nodes`' answers say (membership's places_text).
  [[nodiscard]] std::string places_text(const std::vector<int>& nodes) const {
    return detail::places_text(*this, nodes);
  }
  void open_desk();                                 // desk_ on the links there are, once joined
  [[nodiscard]] std::vector<int> link_fds() const;  // links_' descriptors (-1: none)
  // The nodes, other than this one and `except`, of any of `ranks`, ascending.
  [[nodiscard]] std::vector<int> nodes_of(const std::vector<std::int32_t>& ranks, int except) const;
  // Throws (and keeps) the job's failure, if a leader aborted or disconnected (or its link says
  // the network no longer reaches it: check_links).
  void check_members(const char* what);
  // At most every kLinkLook: a broken link (rendezvous.hpp) is a lost leader; node 0 tells the
  // leaders it still reaches, which cannot see the break themselves.
  void check_links(const char* what);
  // Gives UCX's TCP connections that are new since the last look the links' watch (paths.hpp).
  void watch_new_paths();
  // "node 1's main process (process 2) died (pid 1234, on this host)" where it ran beside this
  // one and is gone (`fate`: fate_of its mark); else "... is gone or unreachable from node 0:
  // their connection failed (`why`)", with its pid where it still runs beside this one.
  [[nodiscard]] std::string lost_leader_text(int node, const std::string& why, Fate fate) const;
  // A leader whose process is gone may have given up first, and its abort (relayed by node 0
  // where this one cannot hear it) says why: for a moment, throws that abort if it comes.
  void await_last_word(const char* what);
  [[noreturn]] void fail(const Failure& failure, const char* what);
  [[nodiscard]] std::vector<int> ranks_of_nodes(const std::vector<int>& nodes) const;

  LeaderConfig config_;
  int me_ = 0;
  int num_nodes_ = 0;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int event_fd_ = -1;
  std::vector<std::byte> address_;  // this worker's address
  std::uint64_t token_ = 0;
  bool joined_ = false;

  std::vector<std::unique_ptr<Endpoint>> endpoints_;  // owns every endpoint
  std::vector<Endpoint*> members_;                    // by node index (nullptr: this node)
  // A send in flight, with what it sends from (an encoded message; a chunk's head and part).
  struct Sending {
    void* request = nullptr;
    std::vector<std::byte> bytes;
    std::shared_ptr<const std::vector<std::byte>> part;
  };
  std::vector<Sending> sending_;
  // A chunk that UCX receives by rendezvous into part_inbox_'s place for it.
  struct Receiving {
    void* request = nullptr;
    wire::Chunk head;
  };
  std::vector<Receiving> receiving_;

  // Joining.
  std::vector<NodeInfo> nodes_;
  std::vector<std::vector<std::byte>> addresses_;  // by node index
  std::vector<ProcessMark> marks_;                 // by node index: its main process
  std::vector<int> joiners_;             // node 0: rendezvous connection by node (-1: none)
  std::map<int, std::string> refusals_;  // node 0: why a node's last connection was refused
  std::optional<std::string>
      shape_refusal_;  // node 0: a node of this job that disagrees on its shape
  std::optional<wire::Welcome> welcome_;
  // By node index: node 0 has one to each node, the others to node 0.
  std::vector<UniqueFd> links_;
  Clock::time_point links_checked_{};
  std::unique_ptr<PlacesDesk> desk_;  // answers and asks on links_ (places.hpp)
  std::vector<PathSocket> paths_;     // UCX's TCP connections that have the links' watch
  Clock::time_point paths_checked_{};
  std::vector<std::vector<std::byte>> early_;  // member messages before the welcome

  // The barrier and broadcasts.
  std::uint64_t episode_ = 0;
  int rounds_ = 0;
  std::array<std::array<RoundSlot, kMaxRounds>, 2> inbox_{};
  std::uint64_t blob_sequence_ = 0;
  std::map<std::uint64_t, std::vector<std::byte>> blobs_;
  std::optional<PartInbox> part_inbox_;  // once the token is known
  std::optional<Failure> aborted_;       // an abort received from another leader
  std::optional<wire::Abort> relay_;     // node 0: an abort to pass on to the other leaders
};

// Throws Error naming `what` unless `status` is UCS_OK.
void check(ucs_status_t status, const std::string& what);

// "process 3", "processes 2, 3".
std::string ranks_text(const std::vector<int>& ranks);

}  // namespace lockstep::detail::ucx
