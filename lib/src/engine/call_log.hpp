// Each process's record of its calls in the node segment (internal): where it waits now and what
// it called last, for the messages of a wait that lasts or fails and for lockstep-run --status.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/proc.hpp"  // ReadOnlyImages
#include "engine/layout.hpp"
#include "lockstep/source_location.hpp"

namespace lockstep::detail {

// What a call is: which public call, and which side of it.
enum class CallKind : std::uint8_t {
  unknown = 0,
  wait = 1,                 // wait_for_everyone (the timed form and the try too)
  first_wait = 2,           // main_process_first, waiting for the main process
  first_release = 3,        // main_process_first, the main process releasing the others
  local_first_wait = 4,     // local_main_process_first, the same two sides
  local_first_release = 5,  //
  broadcast = 6,
  stream = 7,  // wait_for_everyone(stream)
  join = 8,    // joining the job (State's constructor)
  gather = 9,  // gather_object
};
// How a call ended (CallEntry::ended tells whether it has).
// `tried`: a try (try_wait_for_everyone) that found the others not all there and withdrew.
enum class CallEnd : std::uint8_t {
  passed = 0,
  timed_out = 1,
  interrupted = 2,
  tried = 3,
  failed = 4
};

// "wait_for_everyone", "main_process_first (waiting)", ...: a kind as a user knows it.
const char* call_kind_name(CallKind kind) noexcept;
// "returned", "timed out", "interrupted", "gave up its quick try", "failed".
const char* call_end_name(CallEnd end) noexcept;

// CallEntry::call: the site's index (1-based; 0: unknown) in the low byte, the kind, the end.
inline constexpr std::uint32_t call_word(CallKind kind, std::uint32_t site,
                                         CallEnd end = CallEnd::passed) noexcept {
  return site | (static_cast<std::uint32_t>(kind) << 8) | (static_cast<std::uint32_t>(end) << 16);
}
inline constexpr CallKind call_kind(std::uint32_t word) noexcept {
  return static_cast<CallKind>((word >> 8) & 0xff);
}

// A call to record: its word (call_word), or what and where it is, whose word CallRecorder makes
// when asked (the barrier asks after its arrival, so that a site's look-up delays no peer).
class CallAt {
 public:
  // NOLINTNEXTLINE(google-explicit-constructor): a word is a call made already
  constexpr CallAt(std::uint32_t word = call_word(CallKind::unknown, 0)) noexcept : word_(word) {}
  constexpr CallAt(CallKind kind, const SourceLocation& site) noexcept
      : word_(call_word(kind, 0)), site_(&site) {}

 private:
  friend class CallRecorder;
  std::uint32_t word_;                    // the word, or the kind's with no site
  const SourceLocation* site_ = nullptr;  // null: word_ is the word
};

// The steady clock as of the last scheduler tick (CLOCK_MONOTONIC_COARSE, ~6 ns a read here
// against ~26 for the precise one), in ns: what the log's times are.
[[nodiscard]] std::int64_t coarse_clock_ns() noexcept;
// An entry's time that no clock read gave: the call completed its episode as it arrived, so
// its time is the episode's end, which the node's other processes of that episode recorded
// (they waited for it). The readers below put that time in its place.
inline constexpr std::int64_t kEpisodeEnd = 1;

// This process's writer of its own log. One thread at a time (the barrier's BusyGuard).
class CallRecorder {
 public:
  explicit CallRecorder(CallLog& log) noexcept : log_(log) {}

  // The word of a call of `kind` at `site`, writing the site's text into the log the first
  // time (after kMaxSites sites, later ones are unknown). Sites are known by their text: the
  // strings are read during the call only. Pointers to read-only memory of a loaded image
  // (string literals, __func__, std::source_location's), whose text cannot change, are taken
  // by address once their text is known.
  [[nodiscard]] std::uint32_t word(CallKind kind, const SourceLocation& site) noexcept {
    // Inline for the common case, a fixed site asked for again (a loop's wait).
    if (site.file_name() == last_.file && site.line() == last_.line &&
        site.function_name() == last_.function && last_.fixed) [[likely]] {
      return call_word(kind, last_.index);
    }
    return word_anew(kind, site);
  }
  [[nodiscard]] std::uint32_t word(const CallAt& call) noexcept {
    return call.site_ == nullptr ? call.word_ : word(call_kind(call.word_), *call.site_);
  }
  // A call begins: the entry is written whole (see CallEntry) with the coarse clock's time, or,
  // for a call whose arrival completed its episode on the node (`completed`), kEpisodeEnd: the
  // completer reads no clock on its way to its next arrival, which its peers wait for.
  void begin(std::uint32_t word, std::uint64_t episode, bool completed = false) noexcept;
  // A call that meets nobody (flags mode's stream barrier: no episode) begins: it takes the
  // latest entry's place if that was one too, so that a run of them keeps one entry and the
  // ring keeps the calls that met (the check of an episode looks for each process's there).
  void begin_unmet(std::uint32_t word) noexcept;
  // The call returned: `now` read anew, or, for a call that did not wait past its quick spins,
  // its beginning (the coarse clock could not tell them apart; kEpisodeEnd for a completer).
  void end(bool read_clock) noexcept;
  // The call gave up or failed (if it has not ended yet).
  void end_as(CallEnd how) noexcept;

 private:
  struct Known {
    const char* file;
    const char* function;
    std::uint32_t line;
    std::uint32_t index;
    bool fixed;  // `file` and `function` point to read-only memory: their text cannot change
  };
  // A site's text, as first asked for (the log keeps it cut to its room).
  struct Text {
    std::string file;
    std::string function;
    std::uint32_t line;
    std::uint32_t index;
  };
  // word's other cases: an unknown site, another site than the last, one not fixed.
  std::uint32_t word_anew(CallKind kind, const SourceLocation& site) noexcept;
  // The site's index (0: unknown), by address for a fixed site seen before, else by text.
  Known lookup(const SourceLocation& site) noexcept;
  std::uint32_t intern(const SourceLocation& site) noexcept;
  // Writes entry `number` whole, as a call that begins now (began_: the clock's, or
  // kEpisodeEnd for a completer), and opens it.
  void write(std::uint64_t number, std::uint32_t word, std::uint64_t episode,
             bool completed = false) noexcept;

  CallLog& log_;
  std::uint64_t calls_ = 0;   // this process's count of log_.calls
  std::int64_t began_ = 0;    // the current call's
  bool open_ = false;         // the current call has not ended
  bool unmet_ = false;        // the latest entry is begin_unmet's
  Known last_{};              // the last site asked for, the common case
  std::vector<Known> known_;  // fixed sites by address
  std::vector<Text> texts_;   // every site's text
  ReadOnlyImages images_;     // what `fixed` asks
};

// The recorder's per-call writes are inline: every call makes them (out of line, a call around
// which the barrier's live values were spilled, they cost the idle barrier at N = 2 a few percent
// more). The completer reads no clock: its work after its arrival delays its next arrival, for
// which its peers wait when it is the last again. Against a build that records nothing, at N = 2
// on separate cores (tools/bench-ab, finely alternated, 2 vCPUs): 8% with the completer's clock
// read (~6 ns), 5% without it, 2.4% with word's common case inline too.
inline void CallRecorder::write(std::uint64_t number, std::uint32_t word, std::uint64_t episode,
                                bool completed) noexcept {
  CallEntry& entry = log_.ring[number % kCallRing];
  // A seqlock's writer (see CallEntry): relaxed stores between the odd mark and the even one;
  // the release fence keeps them after the odd mark for a reader that reads them.
  entry.sequence.store(2 * number + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  began_ = completed ? kEpisodeEnd : coarse_clock_ns();
  entry.episode.store(episode, std::memory_order_relaxed);
  entry.call.store(word, std::memory_order_relaxed);
  entry.began.store(began_, std::memory_order_relaxed);
  entry.ended.store(0, std::memory_order_relaxed);
  entry.sequence.store(2 * number + 2, std::memory_order_release);
  open_ = true;
}

inline void CallRecorder::begin(std::uint32_t word, std::uint64_t episode,
                                bool completed) noexcept {
  write(calls_, word, episode, completed);
  calls_ += 1;
  log_.calls.store(calls_, std::memory_order_release);  // release: the entry is whole
  unmet_ = false;
}

inline void CallRecorder::end(bool read_clock) noexcept {
  // Relaxed: one word, read under the entry's sequence (a reader sees the call ended or not).
  log_.ring[(calls_ - 1) % kCallRing].ended.store(read_clock ? coarse_clock_ns() : began_,
                                                  std::memory_order_relaxed);
  open_ = false;
}

// One call as any process reads it from a log.
struct CallView {
  std::uint64_t number = 0;  // the owner's count of calls before it
  CallKind kind = CallKind::unknown;
  CallEnd end = CallEnd::passed;
  std::uint64_t episode = kNoEpisode;
  std::int64_t began = 0;
  std::int64_t ended = 0;  // 0: the call lasts
  std::uint32_t site = 0;  // 0: unknown
  std::uint32_t line = 0;
  std::string file;
  std::string function;
};

// The latest call in the log of `node`'s process `slot`, if there is one and it reads whole (a
// few tries while the owner rewrites it). `node`: every log of the node, where a completer's
// time is (kEpisodeEnd).
[[nodiscard]] std::optional<CallView> latest_call(std::span<const CallLog> node, int slot);
// The last kCallRing calls at most of the same log, oldest first, each read whole.
[[nodiscard]] std::vector<CallView> recent_calls(std::span<const CallLog> node, int slot);
// The word (call_word) of `log`'s call in `episode`, other than a try that withdrew, if the log
// still holds it whole: what a check of an episode compares first. Reads no site's text.
[[nodiscard]] std::optional<std::uint32_t> episode_call(const CallLog& log, std::uint64_t episode);
// Whether site `a` of `log_a` and site `b` of `log_b` (1-based indices, as in a call word) are
// one place: the same line of the same file. An unknown site (0, or not yet counted) is one
// place with any.
[[nodiscard]] bool same_place(const CallLog& log_a, std::uint32_t a, const CallLog& log_b,
                              std::uint32_t b) noexcept;
}  // namespace lockstep::detail
