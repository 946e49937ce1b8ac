// The base room on its own (lib/src/base): text, /proc and errno, failure records.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <string>
#include <thread>
#include <vector>

#include "base/failure_record.hpp"
#include "base/proc.hpp"
#include "base/text.hpp"
#include "lockstep/error.hpp"

namespace lockstep::detail {
namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(Text, ParseIntegerTakesWholeDecimalIntsOnly) {
  EXPECT_EQ(parse_integer("0"), 0);
  EXPECT_EQ(parse_integer("-3"), -3);
  EXPECT_EQ(parse_integer("2147483647"), 2147483647);
  EXPECT_EQ(parse_integer("-2147483648"), -2147483648LL);
  for (const char* bad : {"", "-", "+1", " 1", "1 ", "1.0", "0x10", "2147483648", "-2147483649",
                          "99999999999999999999", "1\n"}) {
    EXPECT_FALSE(parse_integer(bad)) << '"' << bad << '"';
  }
}

TEST(Text, CommaLists) {
  EXPECT_EQ(comma_list(std::vector<int>{}), "");
  EXPECT_EQ(comma_list(std::vector<int>{3, 5, 7}), "3, 5, 7");
  EXPECT_EQ(comma_list(std::vector<std::string>{"ucx", "nccl"}), "ucx, nccl");
}

// A child that has exited but is not reaped yet is a zombie: dead to lockstep.
TEST(Proc, LivenessTellsTheLivingFromZombiesReapedAndReusedPids) {
  const auto mine = process_start_time(::getpid());
  ASSERT_TRUE(mine);
  EXPECT_EQ(process_liveness(::getpid(), *mine), Liveness::alive);
  EXPECT_EQ(process_liveness(::getpid(), *mine + 1), Liveness::dead);  // another process's time

  pid_t child = ::fork();
  if (child == 0) {
    ::_exit(0);
  }
  ASSERT_GT(child, 0);
  const auto started = process_start_time(child);
  ASSERT_TRUE(started);
  // Until it has exited it may still be alive; then a zombie, which counts as dead.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (process_liveness(child, *started) == Liveness::alive &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(process_liveness(child, *started), Liveness::dead);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_FALSE(process_start_time(child));
  EXPECT_EQ(process_liveness(child, *started), Liveness::dead);
}

// A process of another machine, as its mark names it: alive or dead where it ran on this boot in
// this pid namespace, unknown anywhere else (another host, container, or an unknown mark).
TEST(Proc, AProcessMarkTellsFateOnlyBesideThisProcess) {
  const ProcessMark mine = this_process_mark();
  EXPECT_NE(mine.boot, (std::array<std::uint64_t, 2>{}));
  EXPECT_EQ(mine.pid, static_cast<std::uint32_t>(::getpid()));
  EXPECT_EQ(fate_of(mine, std::chrono::milliseconds(0)), Fate::alive);

  pid_t child = ::fork();
  if (child == 0) {
    ::pause();
    ::_exit(0);
  }
  ASSERT_GT(child, 0);
  ProcessMark theirs = mine;
  theirs.pid = static_cast<std::uint32_t>(child);
  theirs.start_time = process_start_time(child).value_or(0);
  EXPECT_EQ(fate_of(theirs, std::chrono::milliseconds(0)), Fate::alive);
  ::kill(child, SIGKILL);
  // A zombie is dead; the grace covers the moment between the kill and the exit.
  EXPECT_EQ(fate_of(theirs, std::chrono::seconds(10)), Fate::dead);
  ::waitpid(child, nullptr, 0);
  EXPECT_EQ(fate_of(theirs, std::chrono::milliseconds(0)), Fate::dead);

  ProcessMark elsewhere = mine;
  elsewhere.boot[1] ^= 1;  // another host, or this one booted again
  EXPECT_EQ(fate_of(elsewhere, std::chrono::milliseconds(0)), Fate::unknown);
  ProcessMark contained = theirs;
  contained.pid_namespace ^= 1;  // the pid means another process there
  EXPECT_EQ(fate_of(contained, std::chrono::milliseconds(0)), Fate::unknown);
  EXPECT_EQ(fate_of(ProcessMark{}, std::chrono::milliseconds(0)), Fate::unknown);
}

TEST(Proc, FindsWhoHoldsALockAndWhoMapsAFile) {
  char path[] = "/tmp/lockstep-base-test-XXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, 4096), 0);
  struct stat info {};
  ASSERT_EQ(::fstat(fd, &info), 0);
  EXPECT_FALSE(flock_holder(info.st_ino));
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  EXPECT_EQ(flock_holder(info.st_ino), ::getpid());
  ASSERT_EQ(::flock(fd, LOCK_UN), 0);

  EXPECT_FALSE(process_mapping(path, info.st_ino));  // this process does not count
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t child = ::fork();
  if (child == 0) {
    void* map = ::mmap(nullptr, 4096, PROT_READ, MAP_SHARED, fd, 0);
    char byte = map == MAP_FAILED ? 'n' : 'y';
    if (::write(ready[1], &byte, 1) == 1) {
      ::pause();  // mapped until killed
    }
    ::_exit(0);
  }
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  EXPECT_EQ(byte, 'y');
  EXPECT_EQ(process_mapping(path, info.st_ino), child);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  EXPECT_FALSE(process_mapping(path, info.st_ino));
  ::close(ready[0]);
  ::close(ready[1]);
  ::close(fd);
  ::unlink(path);
}

TEST(Proc, NamesUsersErrorsAndRandomBytes) {
  EXPECT_EQ(user_of(0), "uid 0 (root)");
  EXPECT_EQ(user_of(3999999), "uid 3999999");  // no such user: the number alone
  EXPECT_TRUE(contains(error_text(ENOENT), "No such file")) << error_text(ENOENT);
  EXPECT_NE(pid_namespace(), 0U);
  std::array<std::byte, 32> first{};
  std::array<std::byte, 32> second{};
  fill_random(first, "test");
  fill_random(second, "test");
  EXPECT_NE(first, second);
  errno = EACCES;
  try {
    throw_errno("opening the thing", "open");
  } catch (const SystemError& error) {
    EXPECT_EQ(error.error_number(), EACCES);
    EXPECT_TRUE(contains(error.what(), "opening the thing")) << error.what();
    EXPECT_TRUE(contains(error.what(), "open")) << error.what();
    EXPECT_TRUE(contains(error.what(), error_text(EACCES))) << error.what();
  }
}

// A failure crosses processes as a record and comes back as the exception it was, its message
// without the call's name, prefixed by the rethrower's context.
TEST(FailureRecord, EachKindRoundTrips) {
  const Failure timeout = failure_of(TimeoutError("wait: timed out", {2, 3}), "wait");
  EXPECT_EQ(timeout.kind, FailureKind::timeout);
  EXPECT_EQ(timeout.missing, (std::vector<int>{2, 3}));
  EXPECT_EQ(timeout.message, "timed out");
  try {
    throw_failure(timeout, "barrier: ");
  } catch (const TimeoutError& error) {
    EXPECT_EQ(std::string(error.what()), "barrier: timed out");
    EXPECT_EQ(error.missing(), (std::vector<int>{2, 3}));
  }
  const Failure lost = failure_of(PeerLostError("process 4 died", 4), "wait");
  EXPECT_EQ(lost.kind, FailureKind::peer_lost);
  EXPECT_EQ(lost.rank, 4);
  EXPECT_EQ(lost.message, "process 4 died");  // no "wait: " to take off
  try {
    throw_failure(lost);
  } catch (const PeerLostError& error) {
    EXPECT_EQ(error.process_index(), 4);
  }
  const Failure config = failure_of(ConfigError("bad"), "x");
  EXPECT_EQ(config.kind, FailureKind::config);
  EXPECT_THROW(throw_failure(config), ConfigError);
  const Failure other = failure_of(SystemError("disk", EIO), "x");
  EXPECT_EQ(other.kind, FailureKind::error);
  try {
    throw_failure(other);
  } catch (const TimeoutError&) {
    ADD_FAILURE() << "a plain error came back as a timeout";
  } catch (const PeerLostError&) {
    ADD_FAILURE() << "a plain error came back as a lost peer";
  } catch (const ConfigError&) {
    ADD_FAILURE() << "a plain error came back as a configuration error";
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()), "disk");
  }
}

// Text from recorded call sites is any bytes: what lockstep writes of it is valid UTF-8, with
// control characters escaped, for a terminal (printable) and for a strict JSON parser.
TEST(Text, AnyBytesBecomeValidUtf8WithControlsEscaped) {
  EXPECT_EQ(printable("/home/jos\xc3\xa9/\xe5\xae\x9f\xe9\xa8\x93.py"),
            "/home/jos\xc3\xa9/\xe5\xae\x9f\xe9\xa8\x93.py");  // as it is
  EXPECT_EQ(printable("a\x1b[31mb\nc\x7f"), "a\\x1b[31mb\\x0ac\\x7f");
  EXPECT_EQ(printable("c1\xc2\x85!"), "c1\\u0085!");  // NEL, a C1 control
  EXPECT_EQ(printable("\xa9\xe5\xae"), "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");  // cut, stray
  // Overlong, a surrogate, past U+10FFFF, overlong again: each byte one U+FFFD.
  for (const std::string bad : {"\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe0\x80\x80"}) {
    const std::string out = printable(bad);
    EXPECT_EQ(out.size(), 3 * bad.size()) << "each invalid byte is one U+FFFD";
  }
  EXPECT_EQ(json_string("q\"b\\\x01\xc2\x9f\xff\xe6\xbc\xa2"),
            "\"q\\\"b\\\\\\u0001\\u009f\xef\xbf\xbd\xe6\xbc\xa2\"");
  // Cuts between characters: a head drops the lead of a character the limit cuts, a tail the
  // rest of one whose lead it cuts off.
  const std::string cjk = "\xe6\xbc\xa2\xe6\xbc\xa2";  // two 3-byte letters
  EXPECT_EQ(utf8_head(cjk, 4), 3U);
  EXPECT_EQ(utf8_head(cjk, 3), 3U);
  EXPECT_EQ(utf8_head(cjk, 2), 0U);
  EXPECT_EQ(utf8_head(cjk, 9), 6U);
  EXPECT_EQ(utf8_tail(cjk, 4), 3U);  // the last letter, from byte 3
  EXPECT_EQ(utf8_tail(cjk, 3), 3U);
  EXPECT_EQ(utf8_tail(cjk, 2), 6U);  // nothing whole
  EXPECT_EQ(utf8_tail(cjk, 9), 0U);
}

// A failure passed on again (a leader's gather failed; the next wait throws it, and a process
// of another machine records it) reads "the job cannot go on" once, before its reason.
TEST(FailureRecord, AFailurePassedOnSaysTheJobCannotGoOnOnce) {
  const Failure once = failure_of(
      PeerLostError("gather_object: the job cannot go on: process 3 died", 3), "wait_for_everyone");
  EXPECT_EQ(once.message, "process 3 died");
  EXPECT_EQ(once.rank, 3);
  try {
    throw_failure(once, "wait_for_everyone: the job cannot go on: ");
  } catch (const PeerLostError& error) {
    EXPECT_EQ(std::string(error.what()), "wait_for_everyone: the job cannot go on: process 3 died");
  }
  // A record written before (its message still says it) is read the same way.
  Failure old = once;
  old.message = "the job cannot go on: the job cannot go on: process 3 died";
  try {
    throw_failure(old, "barrier: the job cannot go on: ");
  } catch (const PeerLostError& error) {
    EXPECT_EQ(std::string(error.what()), "barrier: the job cannot go on: process 3 died");
  }
  // Another context keeps the message whole.
  try {
    throw_failure(old, "barrier: ");
  } catch (const PeerLostError& error) {
    EXPECT_EQ(std::string(error.what()),
              "barrier: the job cannot go on: the job cannot go on: process 3 died");
  }
}

}  // namespace
}  // namespace lockstep::detail
