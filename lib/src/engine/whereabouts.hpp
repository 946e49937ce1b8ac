#pragma once

// Where each process of a node is, read from the call logs its slots keep (call_log.hpp): the one
// reader of those logs for what is said of them, and the one writer of that text. The barrier's
// messages (a timeout, a lost peer, a stall, a check that failed), the flight record and the
// answer to another machine's question (the places desk) all come here; lockstep-run --status
// still reads the logs' latest calls itself (engine/status.cpp), as fields, not text. Reads
// only: any thread, any time, as --status reads a segment of another process.

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "engine/call_log.hpp"

namespace lockstep::detail {

class NodeSegment;
struct LostPeer;

// "train.py:88" (the file's last component; `full`: its path as recorded, and " in main"), or
// "an unrecorded place" (a call made through an interface that gave none, or a Python wait that
// passed within its quick try).
[[nodiscard]] std::string site_text(const CallView& call, bool full = false);
// "wait_for_everyone at train.py:88".
[[nodiscard]] std::string call_place(const CallView& call);
// "wait_for_everyone at train.py:88 (episode 41)".
[[nodiscard]] std::string call_text(const CallView& call);
// Where a process that is not waiting in this episode is, from its latest call `call` (none:
// nullopt), as of `now`: "is not in a lockstep call: it returned from wait_for_everyone at
// train.py:88 (episode 41) 2.1 s ago", "is in joining the job at an unknown place since 3.0 s".
// `gone`: the process died or left (its last call, in the past tense).
[[nodiscard]] std::string absent_text(const std::optional<CallView>& call, std::int64_t now,
                                      bool gone);
// A process's flight record, one line: "process 1 (pid 4121), its last 3 calls, oldest first:
// joining the job at train.py:4, returned 9.1 s ago; ...".
[[nodiscard]] std::string flight_text(const std::string& who, const std::vector<CallView>& calls,
                                      std::int64_t now);
// Where other machines' processes are, after a message about them: "; on node 1, process 3 is
// not in a lockstep call: ..." for each of `nodes`, from what its leader told (`told`, by node,
// as that machine wrote it: escaped here), or "; on node 2, where its processes are is not known
// (not told within 1.0 s)" (`waited`: how long the question waited).
[[nodiscard]] std::string other_nodes_text(const std::vector<int>& nodes,
                                           const std::map<int, std::string>& told,
                                           std::chrono::milliseconds waited);
// "0.3 s", "12 s": how long from `from` to `to` (coarse ns).
[[nodiscard]] std::string span_text(std::int64_t from, std::int64_t to);

// Whether calls of `kinds` may meet in one episode: one call, or the sides of first blocks at any
// depth of nesting. An unknown kind (the engine's own callers) meets any.
[[nodiscard]] bool one_call(const std::vector<CallKind>& kinds);

// The node's processes as one segment's call logs tell them.
class Whereabouts {
 public:
  explicit Whereabouts(const NodeSegment& segment) : segment_(segment) {}

  // Where the node's processes are, for a message about `episode`: "; process 1 is not in a
  // lockstep call: ...; processes 0, 2 wait in wait_for_everyone at train.py:88 (episode 41)",
  // then the latest earlier episode met at different places (met_apart_before). `late`: the slots
  // that have not arrived (named first); `lost`: a slot that is gone (its last call).
  [[nodiscard]] std::string around(std::uint64_t episode, const std::vector<int>& late,
                                   int lost = -1) const;
  // "process 3 (pid 4121) died while 2 processes waited; ...": `peer` lost during `episode`,
  // while `waiting` processes waited, and where the others are (around).
  [[nodiscard]] std::string lost(std::uint64_t episode, const LostPeer& peer,
                                 std::uint64_t waiting) const;
  // Where each process of the node is now, for another machine's messages: "process 3 is not in
  // a lockstep call: it returned from wait_for_everyone at train.py:12 (episode 4) 2.0 s ago;
  // process 2 waits in wait_for_everyone at train.py:15 (episode 5)".
  [[nodiscard]] std::string now() const;
  // Every process's flight record (its last calls), a line each.
  [[nodiscard]] std::vector<std::string> flight_record() const;
  // Whether the processes' calls of `episode` (each wrote its own just after its arrival, or a
  // plain wait that ended at once just after its wait: waited for 0.1 s at most) met apart: nullopt
  // if they are one call (and with `strict`, at one place per kind), else whether they are one call
  // at different places. Reads the calls' words only.
  [[nodiscard]] std::optional<bool> met_apart_in(std::uint64_t episode, bool strict) const;
  // "episode 7 met from different calls: process 0 in ..., process 1 in ... (why)": the message
  // of a check of `episode` that failed (`same_call`: one call at different places).
  [[nodiscard]] std::string met_apart(std::uint64_t episode, bool same_call) const;
  // "; episode 40 met at different places: process 0 in wait_for_everyone at train.py:12,
  // process 1 in wait_for_everyone at train.py:20": the latest episode before `episode`, among
  // those the logs keep, whose processes came from different sites (empty if none).
  [[nodiscard]] std::string met_apart_before(std::uint64_t episode) const;

 private:
  [[nodiscard]] int rank_of(int slot) const noexcept;
  // "process 3 is not in a lockstep call: ..." for `slot`, whose latest call is `call` (`gone`:
  // it died or left), with where the others met its last episode when its own place is
  // unrecorded.
  [[nodiscard]] std::string absent_line(int slot, const std::optional<CallView>& call,
                                        std::int64_t now, bool gone) const;
  // "; in episode 0, process 0 was in wait_for_everyone at train.py:88": where the others met
  // `slot`'s last episode, when its own place is unrecorded (a Python wait that passed in its
  // quick try), naming the other side of a wait that some processes skip.
  [[nodiscard]] std::string met_there(int slot, const std::optional<CallView>& call) const;

  const NodeSegment& segment_;
};

}  // namespace lockstep::detail
