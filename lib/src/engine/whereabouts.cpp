#include "engine/whereabouts.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <utility>

#include "base/text.hpp"  // comma_list, printable, rounded_seconds, seconds_text
#include "engine/segment.hpp"
#include "engine/segment_file.hpp"  // status_of, joined_and
#include "waiting/poll_backoff.hpp"

namespace lockstep::detail {
namespace {

// Ranks by where they are, in the order first seen.
using Places = std::vector<std::pair<std::string, std::vector<int>>>;

void add_place(Places& places, const std::string& where, int rank) {
  auto place = std::find_if(places.begin(), places.end(),
                            [&](const auto& known) { return known.first == where; });
  if (place == places.end()) {
    places.emplace_back(where, std::vector<int>{});
    place = places.end() - 1;
  }
  place->second.push_back(rank);
}

// "process 0 waits in X; processes 1, 2 wait in Y" (`one` " waits in ", `many` " wait in ",
// `between` "; ").
std::string places_text(Places& places, const char* one, const char* many, const char* between) {
  std::string text;
  for (auto& [where, ranks] : places) {
    std::sort(ranks.begin(), ranks.end());
    text += (text.empty() ? "" : between) +
            std::string(ranks.size() == 1 ? "process " : "processes ") + comma_list(ranks) +
            (ranks.size() == 1 ? one : many) + where;
  }
  return text;
}

// Whether `call` met its episode at a place it recorded: a try's call came after it, and an
// unrecorded place may be any (never taken as different).
bool met_at_a_place(const CallView& call) {
  return call.end != CallEnd::tried && call.site != 0;
}

}  // namespace

std::string site_text(const CallView& call, bool full) {
  if (call.site == 0) {
    return "an unrecorded place";
  }
  std::string file = call.file;
  if (!full) {
    if (const auto slash = file.rfind('/'); slash != std::string::npos) {
      file.erase(0, slash + 1);
    }
  }
  // Escaped: a file's or function's name is any bytes, and a message must not carry a control
  // character to a terminal.
  std::string text = printable(file) + ":" + std::to_string(call.line);
  if (full && !call.function.empty()) {
    text += " in " + printable(call.function);
  }
  return text;
}

std::string call_place(const CallView& call) {
  return std::string(call_kind_name(call.kind)) + " at " + site_text(call);
}

std::string call_text(const CallView& call) {
  std::string text = call_place(call);
  if (call.episode != kNoEpisode) {
    text += " (episode " + std::to_string(call.episode) + ")";
  }
  return text;
}

std::string absent_text(const std::optional<CallView>& call, std::int64_t now, bool gone) {
  if (!call) {
    return gone ? "had made no lockstep call since it joined"
                : "has made no lockstep call since it joined";
  }
  const std::string what = call_text(*call);
  if (call->ended == 0) {
    return (gone ? "was in " : "is in ") + what + " since " + span_text(call->began, now);
  }
  std::string text = gone ? "had last been in " + what + ", which " : "is not in a lockstep call: ";
  const std::string ago = span_text(call->ended, now) + " ago";
  switch (call->end) {
    case CallEnd::passed:
      return text + (gone ? "returned " : "it returned from " + what + " ") + ago;
    case CallEnd::timed_out:
      return text + (gone ? "" : "its " + what + " ") + "timed out " + ago;
    case CallEnd::interrupted:
      return text + (gone ? "" : "its " + what + " ") + "was interrupted " + ago;
    case CallEnd::tried:
      return text + (gone ? "" : "its " + what + " ") + "gave up a quick try " + ago;
    case CallEnd::failed:
      break;
  }
  return text + (gone ? "" : "its " + what + " ") + "failed " + ago;
}

std::string flight_text(const std::string& who, const std::vector<CallView>& calls,
                        std::int64_t now) {
  std::string text = who + ", its last " + std::to_string(calls.size()) +
                     (calls.size() == 1 ? " call:" : " calls, oldest first:");
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const CallView& call = calls[i];
    text += (i == 0 ? " " : "; ") + call_text(call) + ", began " + span_text(call.began, now) +
            " ago, " +
            (call.ended == 0 ? std::string("not ended")
                             : std::string(call_end_name(call.end)) + " after " +
                                   span_text(call.began, call.ended));
  }
  return text;
}

std::string other_nodes_text(const std::vector<int>& nodes, const std::map<int, std::string>& told,
                             std::chrono::milliseconds waited) {
  std::string text;
  for (const int node : nodes) {
    const auto answer = told.find(node);
    text += "; on node " + std::to_string(node) +
            (answer != told.end()
                 ? ", " + printable(answer->second)
                 : ", where its processes are is not known (not told within " +
                       seconds_text(std::chrono::duration<double>(waited).count()) + " s)");
  }
  return text;
}

std::string span_text(std::int64_t from, std::int64_t to) {
  return rounded_seconds(static_cast<double>(std::max<std::int64_t>(to - from, 0)) / 1e9) + " s";
}

bool one_call(const std::vector<CallKind>& kinds) {
  // A first block's two sides, global or local, meet each other at any depth of nesting: the
  // first process's release of an inner block meets the others' wait at an outer one (every
  // process runs each body in turn, as Accelerate's blocks, which are plain barriers, do).
  const auto side_of = [](CallKind kind) {
    switch (kind) {
      case CallKind::first_release:
      case CallKind::local_first_wait:
      case CallKind::local_first_release:
        return CallKind::first_wait;
      default:
        return kind;
    }
  };
  CallKind seen = CallKind::unknown;
  for (const CallKind kind : kinds) {
    if (kind == CallKind::unknown) {
      continue;
    }
    if (seen != CallKind::unknown && side_of(kind) != seen) {
      return false;
    }
    seen = side_of(kind);
  }
  return true;
}

int Whereabouts::rank_of(int slot) const noexcept {
  return segment_.slot(slot).rank.load(std::memory_order_relaxed);  // set before joining
}

std::string Whereabouts::met_there(int slot, const std::optional<CallView>& call) const {
  if (!call || call->site != 0 || call->episode == kNoEpisode) {
    return {};
  }
  Places places;
  for (int other = 0; other < segment_.num_slots(); ++other) {
    if (other == slot) {
      continue;
    }
    for (const CallView& theirs : recent_calls(segment_.call_logs(), other)) {
      if (theirs.episode == call->episode && met_at_a_place(theirs)) {
        add_place(places, call_place(theirs), rank_of(other));
      }
    }
  }
  return places.empty() ? std::string()
                        : "; in episode " + std::to_string(call->episode) + ", " +
                              places_text(places, " was in ", " were in ", ", ");
}

std::string Whereabouts::absent_line(int slot, const std::optional<CallView>& call,
                                     std::int64_t now, bool gone) const {
  return "process " + std::to_string(rank_of(slot)) + " " + absent_text(call, now, gone) +
         met_there(slot, call);
}

std::string Whereabouts::around(std::uint64_t episode, const std::vector<int>& late,
                                int lost) const {
  const std::int64_t now = coarse_clock_ns();
  std::string text;
  for (const int slot : late) {
    text += "; " + absent_line(slot, latest_call(segment_.call_logs(), slot), now, false);
  }
  if (lost >= 0) {
    text += "; " + absent_line(lost, latest_call(segment_.call_logs(), lost), now, true);
  }
  // The others that are in this episode's call, grouped by what and where.
  Places groups;
  for (int slot = 0; slot < segment_.num_slots(); ++slot) {
    if (slot == lost || std::find(late.begin(), late.end(), slot) != late.end()) {
      continue;
    }
    const auto call = latest_call(segment_.call_logs(), slot);
    if (!call || call->episode != episode) {
      continue;  // not in this episode's call (or it wrote a later one meanwhile)
    }
    add_place(groups, call_text(*call), rank_of(slot));
  }
  if (!groups.empty()) {
    text += "; " + places_text(groups, " waits in ", " wait in ", "; ");
  }
  return text + met_apart_before(episode);
}

std::string Whereabouts::lost(std::uint64_t episode, const LostPeer& peer,
                              std::uint64_t waiting) const {
  // "while 0 processes waited" said nothing (a call that finds the loss before it arrives: a
  // stream barrier's, a later one).
  return segment_.describe(peer.slot) + " " + describe(peer.how) +
         (waiting == 0 ? std::string()
                       : " while " + std::to_string(waiting) + " process" +
                             (waiting == 1 ? "" : "es") + " waited") +
         around(episode, {}, peer.slot);
}

std::optional<bool> Whereabouts::met_apart_in(std::uint64_t episode, bool strict) const {
  // The call words first (no text, no allocation: LOCKSTEP_CHECK=strict runs this on every
  // episode); the places' text is read only for the message of a mismatch.
  struct Met {
    int slot;
    std::uint32_t word;
  };
  std::vector<Met> met;
  met.reserve(static_cast<std::size_t>(segment_.num_slots()));
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
  for (int slot = 0; slot < segment_.num_slots(); ++slot) {
    // Each process writes its call just after its arrival (a plain wait that ended at once, just
    // after its wait): a moment's wait at most, unless it is descheduled or died there (then it
    // is left out of the check).
    for (PollBackoff backoff;; backoff.pause()) {
      if (const auto word = episode_call(segment_.call_log(slot), episode)) {
        met.push_back(Met{slot, *word});
        break;
      }
      if (std::chrono::steady_clock::now() > give_up) {
        break;
      }
    }
  }
  std::vector<CallKind> kinds;
  kinds.reserve(met.size());
  for (const Met& one : met) {
    kinds.push_back(call_kind(one.word));
  }
  if (!one_call(kinds)) {
    return false;
  }
  if (strict) {
    for (const Met& one : met) {  // one place per kind (a guard's two sides may differ)
      for (const Met& other : met) {
        if (call_kind(one.word) == call_kind(other.word) &&
            !same_place(segment_.call_log(one.slot), one.word & 0xff, segment_.call_log(other.slot),
                        other.word & 0xff)) {
          return true;
        }
      }
    }
  }
  return std::nullopt;
}

std::string Whereabouts::met_apart(std::uint64_t episode, bool same_call) const {
  Places places;
  for (int slot = 0; slot < segment_.num_slots(); ++slot) {
    std::optional<CallView> found;
    for (CallView& call : recent_calls(segment_.call_logs(), slot)) {
      if (call.episode == episode && call.end != CallEnd::tried) {
        found = std::move(call);
      }
    }
    if (found) {
      add_place(places, call_place(*found), rank_of(slot));
    }
  }
  return "episode " + std::to_string(episode) + " met " +
         (same_call ? "at different places" : "from different calls") + ": " +
         places_text(places, " in ", " in ", ", ") +
         (same_call ? " (LOCKSTEP_CHECK=strict: every process must wait at the same place)"
                    : " (a wait that some processes skip, or a main_process_first block that "
                      "raised on the main process?)");
}

std::string Whereabouts::met_apart_before(std::uint64_t episode) const {
  // Each process's calls of the last episodes it kept: episode -> (rank, what and where).
  std::map<std::uint64_t, std::map<int, std::string>> met;
  for (int slot = 0; slot < segment_.num_slots(); ++slot) {
    const int rank = segment_.slot(slot).rank.load(std::memory_order_relaxed);
    for (const CallView& call : recent_calls(segment_.call_logs(), slot)) {
      if (call.episode < episode && met_at_a_place(call)) {
        met[call.episode][rank] = call_place(call);
      }
    }
  }
  // Latest first (clang 14's ranges with libstdc++ 12 cannot reverse a map's view).
  // NOLINTNEXTLINE(modernize-loop-convert)
  for (auto latest = met.rbegin(); latest != met.rend(); ++latest) {
    Places places;
    for (const auto& [rank, where] : latest->second) {
      add_place(places, where, rank);
    }
    if (places.size() >= 2) {  // the latest only
      return "; episode " + std::to_string(latest->first) +
             " met at different places: " + places_text(places, " in ", " in ", ", ");
    }
  }
  return {};
}

std::vector<std::string> Whereabouts::flight_record() const {
  const std::int64_t now = coarse_clock_ns();
  std::vector<std::string> lines;
  lines.reserve(static_cast<std::size_t>(segment_.num_slots()));
  for (int slot = 0; slot < segment_.num_slots(); ++slot) {
    lines.push_back(flight_text("flight record of " + segment_.describe(slot),
                                recent_calls(segment_.call_logs(), slot), now));
  }
  return lines;
}

std::string Whereabouts::now() const {
  const std::int64_t clock = coarse_clock_ns();
  std::vector<std::pair<int, std::string>> absent;  // by rank
  Places waiting;
  for (int slot = 0; slot < segment_.num_slots(); ++slot) {
    const Slot& peer = segment_.slot(slot);
    const int rank = peer.rank.load(std::memory_order_relaxed);  // set before joining
    const auto call = latest_call(segment_.call_logs(), slot);
    const bool gone = status_of(peer) == SlotStatus::left || joined_and(peer, Liveness::dead);
    if (call && call->ended == 0 && !gone) {
      add_place(waiting, call_text(*call), rank);
    } else {
      absent.emplace_back(rank, absent_line(slot, call, clock, gone));
    }
  }
  std::sort(absent.begin(), absent.end());
  std::string text;
  for (const auto& [rank, line] : absent) {
    text += (text.empty() ? "" : "; ") + line;
  }
  if (!waiting.empty()) {
    text += text.empty() ? "" : "; ";  // in two steps: see comma_list (base/text.cpp)
    text += places_text(waiting, " waits in ", " wait in ", "; ");
  }
  return text;
}

}  // namespace lockstep::detail
