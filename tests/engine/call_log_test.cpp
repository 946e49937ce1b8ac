// A process's call log knows its sites by their text (lib/src/engine/call_log.hpp): the strings
// of a site are read during the call only, so a buffer reused for another site's text names that
// site, and two buffers with one text are one site; string literals, in read-only memory, are
// known by their address.
#include "engine/call_log.hpp"

#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <thread>

#include "base/proc.hpp"

namespace lockstep::detail {
namespace {

// The file and function the log names for its latest call.
std::string latest_place(const CallLog& log) {
  const auto call = latest_call({&log, 1}, 0);
  return call ? call->file + ":" + std::to_string(call->line) + " " + call->function : "none";
}

TEST(CallLog, ABufferReusedForAnotherSitesTextNamesThatSite) {
  auto log = std::make_unique<CallLog>();
  CallRecorder recorder(*log);
  std::array<char, 32> file{};
  std::array<char, 32> function{};
  std::strcpy(file.data(), "first.c");
  std::strcpy(function.data(), "one");
  const SourceLocation site(file.data(), 7, function.data());
  recorder.begin(recorder.word(CallKind::wait, site), 0);
  recorder.end(false);
  EXPECT_EQ(latest_place(*log), "first.c:7 one");
  // The same addresses and line, another text: another site.
  std::strcpy(file.data(), "second.c");
  std::strcpy(function.data(), "two");
  const std::uint32_t word = recorder.word(CallKind::wait, site);
  recorder.begin(word, 1);
  recorder.end(false);
  EXPECT_EQ(latest_place(*log), "second.c:7 two");
  EXPECT_EQ(word & 0xff, 2U);
  // The first text again, from other memory: the first site.
  const std::string again_file = "first.c";
  const std::string again_function = "one";
  EXPECT_EQ(
      recorder.word(CallKind::wait, SourceLocation(again_file.c_str(), 7, again_function.c_str())) &
          0xff,
      1U);
  EXPECT_EQ(log->sites.load(), 2U);
}

TEST(CallLog, LiteralsAreKnownByAddressAndTheirTextIsWrittenOnce) {
  auto log = std::make_unique<CallLog>();
  CallRecorder recorder(*log);
  const SourceLocation here = SourceLocation::current();
  const std::uint32_t first = recorder.word(CallKind::wait, here);
  const SourceLocation there = SourceLocation::current();
  EXPECT_NE(recorder.word(CallKind::wait, there) & 0xff, first & 0xff);
  EXPECT_EQ(recorder.word(CallKind::wait, here), first);
  EXPECT_EQ(log->sites.load(), 2U);
}

// The barrier takes a call as a word made already or as a kind and a site, whose word it asks
// for after its arrival: both give the word the site has, and a site is counted once.
TEST(CallLog, ACallAtASiteHasTheSitesWord) {
  auto log = std::make_unique<CallLog>();
  CallRecorder recorder(*log);
  const SourceLocation here = SourceLocation::current();
  const std::uint32_t word = recorder.word(CallKind::first_wait, here);
  EXPECT_EQ(recorder.word(CallAt(CallKind::first_wait, here)), word);
  EXPECT_EQ(recorder.word(CallAt(word)), word);
  EXPECT_EQ(recorder.word(CallAt()), call_word(CallKind::unknown, 0));
  EXPECT_EQ(recorder.word(CallAt(CallKind::gather, SourceLocation())),
            call_word(CallKind::gather, 0));
  EXPECT_EQ(call_kind(recorder.word(CallAt(CallKind::gather, here))), CallKind::gather);
  EXPECT_EQ(log->sites.load(), 1U);
}

// The process whose arrival completes an episode reads no clock: its call's time is the
// episode's end, which the node's other processes recorded (the latest of their times for it).
// Nothing a reader gets carries the marker.
TEST(CallLog, ACompletersTimeIsItsEpisodesEnd) {
  auto logs = std::make_unique<std::array<CallLog, 3>>();
  std::array<CallRecorder, 3> recorders{CallRecorder((*logs)[0]), CallRecorder((*logs)[1]),
                                        CallRecorder((*logs)[2])};
  const std::span<const CallLog> node(*logs);
  const std::uint32_t wait = call_word(CallKind::wait, 0);
  recorders[0].begin(wait, 7);  // arrives first, and sleeps until the episode's end
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  recorders[1].begin(wait, 7);  // arrives later, and passes in its quick spins
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  recorders[2].begin(wait, 7, true);  // completes the episode
  recorders[1].end(false);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  recorders[0].end(true);  // woken
  recorders[2].end(false);
  const auto first = latest_call(node, 0);
  const auto second = latest_call(node, 1);
  const auto completer = latest_call(node, 2);
  ASSERT_TRUE(first && second && completer);
  EXPECT_GT(first->ended, second->began);
  EXPECT_EQ(completer->began, first->ended);
  EXPECT_EQ(completer->ended, first->ended);
  // Its flight record says the same.
  const auto recent = recent_calls(node, 2);
  ASSERT_EQ(recent.size(), 1U);
  EXPECT_EQ(recent[0].began, first->ended);

  // The completer's next call, whose episode no other log holds any more (rewritten since):
  // its time is its next call's beginning, or, for the latest, now.
  const std::int64_t before = coarse_clock_ns();
  recorders[2].begin(wait, 8, true);
  recorders[2].end(false);
  recorders[2].begin(call_word(CallKind::join, 0), kNoEpisode);
  const auto calls = recent_calls(node, 2);
  ASSERT_EQ(calls.size(), 3U);
  EXPECT_EQ(calls[1].began, calls[2].began);
  EXPECT_GE(calls[1].began, before);
  recorders[2].begin(wait, 9, true);
  const auto latest = latest_call(node, 2);
  ASSERT_TRUE(latest);
  EXPECT_EQ(latest->ended, 0);  // it lasts
  EXPECT_GE(latest->began, before);
  for (const CallView& call : recent_calls(node, 2)) {
    EXPECT_NE(call.began, kEpisodeEnd);
    EXPECT_NE(call.ended, kEpisodeEnd);
  }
}

TEST(CallLog, OnlyReadOnlyMemoryOfALoadedImageIsTakenAsFixed) {
  static char writable[] = "writable.c";  // NOLINT: the test needs writable static memory
  const std::string heap = "heap.c";
  const std::array<char, 8> stack{'s', '.', 'c', '\0'};
  EXPECT_TRUE(in_read_only_image("literal.c"));
  EXPECT_TRUE(in_read_only_image(__func__));
  EXPECT_FALSE(in_read_only_image(writable));
  EXPECT_FALSE(in_read_only_image(heap.c_str()));
  EXPECT_FALSE(in_read_only_image(stack.data()));
  EXPECT_FALSE(in_read_only_image(nullptr));
  // Kept between lookups (the segments read once), with the same answers each time.
  ReadOnlyImages images;
  for (int round = 0; round < 2; ++round) {
    EXPECT_TRUE(images.contains("literal.c"));
    EXPECT_TRUE(images.contains(__func__));
    EXPECT_FALSE(images.contains(writable));
    EXPECT_FALSE(images.contains(heap.c_str()));
    EXPECT_FALSE(images.contains(stack.data()));
    EXPECT_FALSE(images.contains(nullptr));
  }
}

}  // namespace
}  // namespace lockstep::detail
