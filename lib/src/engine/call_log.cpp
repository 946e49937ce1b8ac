#include "engine/call_log.hpp"

#include <algorithm>
#include <cstring>
#include <ctime>
#include <new>
#include <string_view>

#include "base/proc.hpp"  // ReadOnlyImages
#include "base/text.hpp"  // printable, rounded_seconds, utf8_head, utf8_tail

namespace lockstep::detail {

const char* call_kind_name(CallKind kind) noexcept {
  switch (kind) {
    case CallKind::unknown:
      break;
    case CallKind::wait:
      return "wait_for_everyone";
    case CallKind::first_wait:
      return "main_process_first (waiting for the main process)";
    case CallKind::first_release:
      return "main_process_first (releasing the others)";
    case CallKind::local_first_wait:
      return "local_main_process_first (waiting for the local main process)";
    case CallKind::local_first_release:
      return "local_main_process_first (releasing the others)";
    case CallKind::broadcast:
      return "broadcast";
    case CallKind::stream:
      return "wait_for_everyone(stream)";
    case CallKind::join:
      return "joining the job";
    case CallKind::gather:
      return "gather_object";
  }
  return "a lockstep call";
}

const char* call_end_name(CallEnd end) noexcept {
  switch (end) {
    case CallEnd::passed:
      return "returned";
    case CallEnd::timed_out:
      return "timed out";
    case CallEnd::interrupted:
      return "interrupted";
    case CallEnd::tried:
      return "gave up its quick try";
    case CallEnd::failed:
      break;
  }
  return "failed";
}

std::int64_t coarse_clock_ns() noexcept {
  timespec now{};
  (void)::clock_gettime(CLOCK_MONOTONIC_COARSE, &now);
  return static_cast<std::int64_t>(now.tv_sec) * 1'000'000'000 + now.tv_nsec;
}

std::uint32_t CallRecorder::intern(const SourceLocation& site) noexcept {
  // Relaxed: only this process writes the count.
  const std::uint32_t count = log_.sites.load(std::memory_order_relaxed);
  if (count >= kMaxSites) {
    return 0;  // named "an unknown place" from here on
  }
  SiteText& text = log_.site[count];
  text.line = site.line();
  // The file keeps its end (the name), the function its beginning, each cut between characters
  // (UTF-8); each ends in '\0'.
  const std::string_view file = site.file_name();
  const std::size_t file_from = utf8_tail(file, kSiteText * 3 / 4);
  const std::size_t file_kept = file.size() - file_from;
  std::memcpy(text.text, file.data() + file_from, file_kept);
  text.text[file_kept] = '\0';
  const std::string_view function = site.function_name() != nullptr ? site.function_name() : "";
  const std::size_t function_kept = utf8_head(function, sizeof text.text - file_kept - 2);
  std::memcpy(text.text + file_kept + 1, function.data(), function_kept);
  text.text[file_kept + 1 + function_kept] = '\0';
  // Release: a reader that counts the site (acquire) reads its text whole.
  log_.sites.store(count + 1, std::memory_order_release);
  try {
    texts_.push_back(Text{std::string(file), std::string(function), site.line(), count + 1});
  } catch (const std::bad_alloc&) {  // the site is written; this process would write it again
  }
  return count + 1;
}

CallRecorder::Known CallRecorder::lookup(const SourceLocation& site) noexcept {
  const char* file = site.file_name();
  const char* function = site.function_name();
  for (const Known& known : known_) {
    if (known.file == file && known.function == function && known.line == site.line()) {
      return known;  // fixed: the text it had
    }
  }
  Known found{file, function, site.line(), 0,
              images_.contains(file) && (function == nullptr || images_.contains(function))};
  const std::string_view function_text = function != nullptr ? function : "";
  const auto same = std::find_if(texts_.begin(), texts_.end(), [&](const Text& text) {
    return text.line == site.line() && text.file == file && text.function == function_text;
  });
  found.index = same != texts_.end() ? same->index : intern(site);
  if (found.fixed && known_.size() < std::size_t{4} * kMaxSites) {
    try {
      known_.push_back(found);
    } catch (const std::bad_alloc&) {  // looked up by its text again next time
    }
  }
  return found;
}

std::uint32_t CallRecorder::word_anew(CallKind kind, const SourceLocation& site) noexcept {
  if (site.file_name() == nullptr) {
    return call_word(kind, 0);
  }
  last_ = lookup(site);
  return call_word(kind, last_.index);
}

void CallRecorder::begin_unmet(std::uint32_t word) noexcept {
  if (!unmet_ || open_ || calls_ == 0) {
    begin(word, kNoEpisode);
    unmet_ = true;
    return;
  }
  // The latest entry again (a reader sees the old call or this one, whole).
  write(calls_ - 1, word, kNoEpisode);
}

void CallRecorder::end_as(CallEnd how) noexcept {
  if (!open_) {
    return;
  }
  const std::uint64_t number = calls_ - 1;
  CallEntry& entry = log_.ring[number % kCallRing];
  entry.sequence.store(2 * number + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  const std::uint32_t word = entry.call.load(std::memory_order_relaxed);
  entry.call.store((word & 0xffff) | (static_cast<std::uint32_t>(how) << 16),
                   std::memory_order_relaxed);
  entry.ended.store(coarse_clock_ns(), std::memory_order_relaxed);
  entry.sequence.store(2 * number + 2, std::memory_order_release);
  open_ = false;
}

namespace {

// Call `number` of `log`, if its entry holds it whole now.
std::optional<CallView> read_call(const CallLog& log, std::uint64_t number) {
  const CallEntry& entry = log.ring[number % kCallRing];
  for (int attempt = 0; attempt < 4; ++attempt) {
    // A seqlock's reader: acquire on the first read, an acquire fence before the second.
    const std::uint64_t before = entry.sequence.load(std::memory_order_acquire);
    CallView view;
    view.number = number;
    view.episode = entry.episode.load(std::memory_order_relaxed);
    const std::uint32_t word = entry.call.load(std::memory_order_relaxed);
    view.began = entry.began.load(std::memory_order_relaxed);
    view.ended = entry.ended.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    const std::uint64_t after = entry.sequence.load(std::memory_order_relaxed);
    if (before != after || (before & 1) != 0) {
      continue;  // the owner writes it now
    }
    if (before != 2 * number + 2) {
      return std::nullopt;  // another call's entry (a later one overwrote it)
    }
    view.kind = call_kind(word);
    view.end = static_cast<CallEnd>((word >> 16) & 0xff);
    view.site = word & 0xff;
    // Acquire: the text of a counted site is whole (CallRecorder::intern).
    if (view.site != 0 && view.site <= log.sites.load(std::memory_order_acquire) &&
        view.site <= kMaxSites) {
      const SiteText& text = log.site[view.site - 1];
      view.line = text.line;
      view.file.assign(text.text, strnlen(text.text, sizeof text.text));
      if (view.file.size() + 1 < sizeof text.text) {
        const char* function = text.text + view.file.size() + 1;
        view.function.assign(function, strnlen(function, sizeof text.text - view.file.size() - 1));
      }
    } else {
      view.site = 0;
    }
    return view;
  }
  return std::nullopt;
}

// The time a process of the node other than `slot` recorded for `episode` (the latest: its
// episode's end, when it stopped waiting, or its arrival where it ended in its quick spins), or
// 0 if none holds it now.
std::int64_t episode_end(std::span<const CallLog> node, int slot, std::uint64_t episode) {
  std::int64_t latest = 0;
  for (std::size_t other = 0; other < node.size(); ++other) {
    if (static_cast<int>(other) == slot) {
      continue;
    }
    const CallLog& log = node[other];
    const std::uint64_t calls = log.calls.load(std::memory_order_acquire);  // as latest_call
    const std::uint64_t first = calls > kCallRing ? calls - kCallRing : 0;
    for (std::uint64_t number = calls; number-- > first;) {  // the latest first
      const auto call = read_call(log, number);
      if (call && (call->episode == kNoEpisode || call->episode > episode)) {
        continue;  // a call that met nobody (a join, a stream's), or a later episode's
      }
      if (call && call->episode == episode) {
        latest = std::max({latest, call->began > kEpisodeEnd ? call->began : 0,
                           call->ended > kEpisodeEnd ? call->ended : 0});
      }
      break;  // its call of the episode, an earlier one's, or an entry rewritten now
    }
  }
  return latest;
}

// A completer's times (kEpisodeEnd) from the node's other processes; failing that (their entries
// of the episode rewritten since), from this process's next call's beginning, or now.
void put_episode_end(std::span<const CallLog> node, int slot, std::span<CallView> calls) {
  for (std::size_t i = 0; i < calls.size(); ++i) {
    CallView& call = calls[i];
    if (call.began != kEpisodeEnd) {
      continue;
    }
    std::int64_t when = call.episode != kNoEpisode ? episode_end(node, slot, call.episode) : 0;
    for (std::size_t next = i + 1; when == 0 && next < calls.size(); ++next) {
      when = calls[next].began > kEpisodeEnd ? calls[next].began : 0;
    }
    when = when != 0 ? when : coarse_clock_ns();
    call.began = when;
    call.ended = call.ended == kEpisodeEnd ? when : call.ended;
  }
}

}  // namespace

std::optional<CallView> latest_call(std::span<const CallLog> node, int slot) {
  const CallLog& log = node[static_cast<std::size_t>(slot)];
  for (int attempt = 0; attempt < 4; ++attempt) {
    // Acquire: the entry the count names is whole (CallRecorder::begin).
    const std::uint64_t calls = log.calls.load(std::memory_order_acquire);
    if (calls == 0) {
      return std::nullopt;
    }
    if (auto call = read_call(log, calls - 1)) {
      put_episode_end(node, slot, std::span(&*call, 1));
      return call;
    }
  }
  return std::nullopt;
}

std::optional<std::uint32_t> episode_call(const CallLog& log, std::uint64_t episode) {
  const std::uint64_t calls = log.calls.load(std::memory_order_acquire);  // as latest_call
  const std::uint64_t first = calls > kCallRing ? calls - kCallRing : 0;
  for (std::uint64_t number = calls; number-- > first;) {  // the latest first
    const CallEntry& entry = log.ring[number % kCallRing];
    for (int attempt = 0; attempt < 4; ++attempt) {
      // A seqlock's reader, as read_call's.
      const std::uint64_t before = entry.sequence.load(std::memory_order_acquire);
      const std::uint64_t its_episode = entry.episode.load(std::memory_order_relaxed);
      const std::uint32_t word = entry.call.load(std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (entry.sequence.load(std::memory_order_relaxed) != before || (before & 1) != 0) {
        continue;  // the owner writes it now
      }
      if (before == 2 * number + 2 && its_episode == episode &&
          static_cast<CallEnd>((word >> 16) & 0xff) != CallEnd::tried) {
        return word;
      }
      break;  // another episode's call, or overwritten by a later one
    }
  }
  return std::nullopt;
}

bool same_place(const CallLog& log_a, std::uint32_t a, const CallLog& log_b,
                std::uint32_t b) noexcept {
  // Acquire: the text of a counted site is whole (CallRecorder::intern).
  if (a == 0 || b == 0 || a > kMaxSites || b > kMaxSites ||
      a > log_a.sites.load(std::memory_order_acquire) ||
      b > log_b.sites.load(std::memory_order_acquire)) {
    return true;
  }
  const SiteText& one = log_a.site[a - 1];
  const SiteText& other = log_b.site[b - 1];
  // The file is the text's first string (then the function's).
  return one.line == other.line && strncmp(one.text, other.text, sizeof one.text) == 0;
}

std::vector<CallView> recent_calls(std::span<const CallLog> node, int slot) {
  const CallLog& log = node[static_cast<std::size_t>(slot)];
  std::vector<CallView> out;
  const std::uint64_t calls = log.calls.load(std::memory_order_acquire);  // as latest_call
  const std::uint64_t first = calls > kCallRing ? calls - kCallRing : 0;
  for (std::uint64_t number = first; number < calls; ++number) {
    if (auto call = read_call(log, number)) {
      out.push_back(std::move(*call));
    }
  }
  put_episode_end(node, slot, out);
  return out;
}

}  // namespace lockstep::detail
