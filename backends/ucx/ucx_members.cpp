// What the UCX backend's leaders know of each other (the class: ucx_backend.hpp): whether each
// is still there (its link to node 0, its UCX connection; a death told apart from a lost
// connection where the two ran on one host), which nodes a wait still waits for and where
// their processes are (the places desk), the job's abort, sent to every leader, and what a
// member sends once joined (arrivals, aborts, node 0's broadcasts), taken or dropped.
#include <chrono>
#include <string>
#include <vector>

#include "base/proc.hpp"
#include "base/text.hpp"
#include "lockstep/error.hpp"
#include "ucx/ucx_backend.hpp"
#include "waiting/poll_backoff.hpp"

namespace lockstep::detail::ucx {
namespace {

using namespace std::chrono_literals;

// How long abort() keeps progressing so that its messages leave.
constexpr auto kAbortFlush = 200ms;
// How often a waiting leader asks the kernel about its links (a poll(2) each).
constexpr auto kLinkLook = 20ms;
// How long a leader whose connection to another ended waits for that process to be gone (see
// check_members), and then for the word it may have sent as it gave up: its abort left before
// it exited, and reaches the others directly or through node 0 (where the two cannot talk) in
// a few milliseconds; a killed process sends none, and costs its peers this wait.
constexpr auto kExitGrace = 100ms;
constexpr auto kLastWord = kAbortFlush / 2;

}  // namespace

std::string ranks_text(const std::vector<int>& ranks) {
  return (ranks.size() == 1 ? "process " : "processes ") + comma_list(ranks);
}

void UcxBackend::watch_new_paths() {
  paths_checked_ = Clock::now();
  watch_paths(tcp_sockets_under(event_fd_), paths_, config_.job.link_timeout);
}

void UcxBackend::check_links(const char* what) {
  const auto now = Clock::now();
  if (links_.empty() || now - links_checked_ < kLinkLook) {
    return;
  }
  links_checked_ = now;
  if (now - paths_checked_ >= rendezvous::kLinkProbe) {
    watch_new_paths();  // connections UCX made since (a peer's, accepted)
  }
  for (int node = 0; node < num_nodes_; ++node) {
    UniqueFd& link = links_[static_cast<std::size_t>(node)];
    int error = 0;
    const auto state =
        !link ? rendezvous::LinkState::fine : rendezvous::look_at_link(link.get(), &error);
    if (state == rendezvous::LinkState::fine) {
      continue;
    }
    desk_.reset();  // before its link closes
    link.reset();
    open_desk();  // node 0's, on the links left
    if (state == rendezvous::LinkState::ended) {
      continue;  // closed in order: its process exited (UCX reports a death as it happens)
    }
    const int leader = nodes_[static_cast<std::size_t>(node)].ranks.front();
    const Failure failure{
        FailureKind::peer_lost,
        leader,
        {},
        "node " + std::to_string(node) + "'s main process (process " + std::to_string(leader) +
            ") is unreachable: its machine has not answered for " +
            seconds_text(std::chrono::duration<double>(config_.job.link_timeout).count()) +
            " s (LOCKSTEP_LINK_TIMEOUT; " + error_text(error) + ")"};
    abort(failure);
    fail(failure, what);
  }
}

void UcxBackend::check_members(const char* what) {
  check_aborted(what);
  check_cancelled(what);
  // The links first: a node that the network cut off from every other sees its link to node 0
  // and its UCX connections fail alike (the same bound, paths.hpp), and says so naming node 0,
  // the job's hub, rather than whichever connection UCX reported first.
  check_links(what);
  for (int node = 0; node < num_nodes_; ++node) {
    const Endpoint* member = members_[static_cast<std::size_t>(node)];
    if (member != nullptr && member->error != UCS_OK) {
      // Its process ended, or the network between the two machines no longer carries their
      // connection (the kernel gave up on it: paths.hpp). The others are told: a machine that
      // still reaches this one but not that one (a partition) must not wait for either.
      const int leader = nodes_[static_cast<std::size_t>(node)].ranks.front();
      // UCX sees the connection end as the kernel closes a dying process's sockets, a moment
      // before the process is gone.
      const Fate fate = fate_of(marks_[static_cast<std::size_t>(node)], kExitGrace);
      if (fate == Fate::dead) {
        await_last_word(what);  // a leader that gave up said why before it exited
      }
      const Failure failure{FailureKind::peer_lost,
                            leader,
                            {},
                            lost_leader_text(node, ucx_api().status_string(member->error), fate)};
      abort(failure);
      fail(failure, what);
    }
  }
}

void UcxBackend::await_last_word(const char* what) {
  const auto until = Clock::now() + kLastWord;
  for (PollBackoff backoff(PollBackoff::Plan{0, 1ms, 1ms, 0ms}); Clock::now() < until;
       backoff.pause()) {
    progress();
    check_aborted(what);
  }
}

std::string UcxBackend::lost_leader_text(int node, const std::string& why, Fate fate) const {
  const std::string whom = "node " + std::to_string(node) + "'s main process (process " +
                           std::to_string(nodes_[static_cast<std::size_t>(node)].ranks.front()) +
                           ")";
  const ProcessMark& mark = marks_[static_cast<std::size_t>(node)];
  const std::string pid = "pid " + std::to_string(mark.pid) + ", on this host";
  if (fate == Fate::dead) {
    return whom + " died (" + pid + ")";
  }
  return whom + " is gone or unreachable from node " + std::to_string(me_) +
         ": their connection failed (" + why + ")" +
         (fate == Fate::alive ? "; it still runs (" + pid + ")" : "");
}

void UcxBackend::fail(const Failure& failure, const char* what) {
  throw_failure(failure, std::string(what) + ": ");
}

std::vector<int> UcxBackend::ranks_of_nodes(const std::vector<int>& nodes) const {
  std::vector<int> ranks;
  for (int node : nodes) {
    const auto& list = nodes_[static_cast<std::size_t>(node)].ranks;
    ranks.insert(ranks.end(), list.begin(), list.end());
  }
  return ranks;
}

std::vector<int> UcxBackend::unheard_nodes(std::uint64_t episode,
                                           const std::vector<std::uint64_t>& known) const {
  std::vector<std::uint64_t> heard = known;
  for (const RoundSlot& other : inbox_[episode & 1]) {
    if (other.present && other.episode == episode) {
      for (std::size_t w = 0; w < heard.size(); ++w) {
        heard[w] |= other.known[w];
      }
    }
  }
  std::vector<int> nodes;
  for (int node = 0; node < num_nodes_; ++node) {
    if ((heard[static_cast<std::size_t>(node) / 64] & (1ULL << (node % 64))) == 0) {
      nodes.push_back(node);
    }
  }
  return nodes;
}

std::vector<int> UcxBackend::nodes_of(const std::vector<std::int32_t>& ranks, int except) const {
  std::vector<int> nodes;
  for (const NodeInfo& info : nodes_) {
    const bool has = std::any_of(info.ranks.begin(), info.ranks.end(), [&](int rank) {
      return std::find(ranks.begin(), ranks.end(), rank) != ranks.end();
    });
    if (has && info.node != me_ && info.node != except) {
      nodes.push_back(info.node);
    }
  }
  return nodes;
}

void UcxBackend::open_desk() {
  // Questions and answers come on the links from now on (nothing else does after the join). A
  // node other than 0 that lost its link to node 0 has nobody to ask or answer.
  if (config_.places && (me_ == 0 || (!links_.empty() && links_[0]))) {
    desk_ = std::make_unique<PlacesDesk>(me_, link_fds(), config_.places);
  }
}

std::vector<int> UcxBackend::link_fds() const {
  std::vector<int> fds;
  for (const UniqueFd& link : links_) {
    fds.push_back(link.get());
  }
  return fds;
}

std::optional<NodePlaces> UcxBackend::places(const std::vector<int>& nodes) const {
  if (!desk_) {
    return std::nullopt;
  }
  return NodePlaces{desk_->ask(nodes), desk_->answer_wait()};
}

std::string UcxBackend::nodes_text(const std::vector<int>& nodes) const {
  return std::string(nodes.size() == 1 ? "node " : "nodes ") + comma_list(nodes) + " (" +
         ranks_text(ranks_of_nodes(nodes)) + ")";
}

void UcxBackend::abort(const Failure& failure) noexcept {
  try {
    wire::Abort message{token_,
                        static_cast<std::uint32_t>(me_),
                        static_cast<std::uint32_t>(failure.kind),
                        failure.rank,
                        {failure.missing.begin(), failure.missing.end()},
                        failure.message};
    if (message.message.size() > wire::kMaxText) {
      message.message.resize(wire::kMaxText);
    }
    for (Endpoint* member : members_) {
      if (member != nullptr && member->error == UCS_OK) {
        send(member->ep, message);
      }
    }
    const auto until = Clock::now() + kAbortFlush;
    while (!sending_.empty() && Clock::now() < until) {
      progress();
    }
  } catch (...) {
    // Best effort: the other nodes still notice when this leader's process ends.
  }
}

bool UcxBackend::from_member(std::uint64_t token, std::uint32_t from) const noexcept {
  return token == token_ && from < static_cast<std::uint32_t>(num_nodes_) &&
         from != static_cast<std::uint32_t>(me_);
}

void UcxBackend::handle_arrive(const wire::Arrive& arrive) {
  if (!from_member(arrive.token, arrive.from)) {
    return;
  }
  const std::uint32_t expected_from = static_cast<std::uint32_t>(
      (me_ - (1 << std::min<std::uint32_t>(arrive.round, 30)) % num_nodes_ + num_nodes_) %
      num_nodes_);
  const bool in_step = arrive.episode == episode_ || arrive.episode == episode_ + 1;
  RoundSlot* slot = arrive.round < static_cast<std::uint32_t>(rounds_)
                        ? &inbox_[arrive.episode & 1][arrive.round]
                        : nullptr;
  if (slot == nullptr || arrive.from != expected_from || !in_step || slot->present ||
      arrive.known.size() != (static_cast<std::size_t>(num_nodes_) + 63) / 64) {
    if (!aborted_) {
      aborted_ = Failure{
          FailureKind::error,
          -1,
          {},
          "node " + std::to_string(arrive.from) + " sent a barrier message out of step (episode " +
              std::to_string(arrive.episode) + ", round " + std::to_string(arrive.round) +
              "; node " + std::to_string(me_) + " is at episode " + std::to_string(episode_) +
              "): do all processes call wait_for_everyone() equally often?"};
    }
    return;
  }
  slot->present = true;
  slot->episode = arrive.episode;
  slot->known = arrive.known;
}

void UcxBackend::handle_abort(const wire::Abort& abort) {
  if (!from_member(abort.token, abort.from) || aborted_) {
    return;
  }
  Failure failure;
  failure.kind = abort.kind >= 1 && abort.kind <= 4 ? static_cast<FailureKind>(abort.kind)
                                                    : FailureKind::error;
  failure.rank = abort.rank;
  failure.missing.assign(abort.missing.begin(), abort.missing.end());
  // Escaped: another machine's text reaches this machine's terminals and logs.
  failure.message = "node " + std::to_string(abort.from) + " gave up: " + printable(abort.message);
  aborted_ = std::move(failure);
  if (me_ == 0) {
    relay_ = abort;  // sent on by progress(), outside UCX's callback
  }
}

void UcxBackend::handle_blob(const wire::Blob& blob) {
  if (!from_member(blob.token, blob.from) || blob.from != 0 || blob.sequence < blob_sequence_ ||
      blobs_.count(blob.sequence) != 0) {
    return;  // foreign, old or repeated: dropped
  }
  if (blob.sequence >= blob_sequence_ + kMaxAhead) {
    // Node 0 went further ahead than this leader keeps (Bootstrap::kMaxAhead): the blob
    // cannot be kept, and dropping it would leave this leader waiting for it for ever.
    if (!aborted_) {
      aborted_ = Failure{FailureKind::error,
                         -1,
                         {},
                         "node 0 sent broadcast " + std::to_string(blob.sequence) + " while node " +
                             std::to_string(me_) + " had taken " + std::to_string(blob_sequence_) +
                             ": a leader keeps at most " + std::to_string(kMaxAhead) +
                             " broadcasts that it has not asked for (Bootstrap::kMaxAhead)"};
    }
    return;
  }
  blobs_[blob.sequence] = blob.data;
}

void UcxBackend::handle_member(const wire::Message& message) {
  // A message from another leader of this job is taken; another job's, or a forged one, is
  // dropped. A hello, welcome or refusal from a member after joining is dropped, as is a
  // chunk's head that comes as a message (chunks have an id of their own: on_chunk).
  if (const auto* arrive = std::get_if<wire::Arrive>(&message)) {
    handle_arrive(*arrive);
  } else if (const auto* abort = std::get_if<wire::Abort>(&message)) {
    handle_abort(*abort);
  } else if (const auto* blob = std::get_if<wire::Blob>(&message)) {
    handle_blob(*blob);
  }
}

}  // namespace lockstep::detail::ucx
