// The base room on its own (lib/src/base): text, /proc and errno, failure records, descriptors
// and service threads.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstddef>
#include <string>
#include <thread>
#include <vector>

#include "base/bytes.hpp"
#include "base/failure_record.hpp"
#include "base/proc.hpp"
#include "base/service_thread.hpp"
#include "base/text.hpp"
#include "base/unique_fd.hpp"
#include "hex.hpp"
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

// The byte kit: little-endian whatever the machine, lengths before sized bytes, every read
// checked against what is left and every count against its limit.
TEST(Bytes, WritesPinnedBytesAndReadsThemBackWithinBounds) {
  ByteWriter w;
  w.u8(0xab);
  w.u16(0x0102);
  w.u32(0x03040506);
  w.i32(-2);
  w.u64(0x0708090a0b0c0d0eULL);
  w.text("hi");
  const std::vector<std::byte> bytes = w.take();
  EXPECT_EQ(lockstep::testing::hex(bytes),
            "ab"
            "0201"
            "06050403"
            "feffffff"
            "0e0d0c0b0a090807"
            "02000000"
            "6869");

  ByteReader r(bytes);
  EXPECT_EQ(r.u8(), 0xab);
  EXPECT_EQ(r.u16(), 0x0102);
  EXPECT_EQ(r.u32(), 0x03040506U);
  EXPECT_EQ(r.i32(), -2);
  EXPECT_EQ(r.u64(), 0x0708090a0b0c0d0eULL);
  EXPECT_EQ(r.text(2, "text"), "hi");
  r.finish();
  EXPECT_THROW((void)r.u8(), BytesError);  // nothing left

  ByteReader limited(bytes);
  (void)limited.raw(19, "the numbers");
  EXPECT_THROW((void)limited.text(1, "text"), BytesError);  // 2 bytes: over the limit of 1
  const std::span<const std::byte> all(bytes);
  ByteReader short_text(all.first(bytes.size() - 1));
  (void)short_text.raw(19, "the numbers");
  EXPECT_THROW((void)short_text.text(16, "text"), BytesError);  // 2 claimed, 1 left
  EXPECT_THROW((void)ByteReader(bytes).raw(bytes.size() + 1, "all"), BytesError);
  ByteReader unfinished(bytes);
  (void)unfinished.u8();
  EXPECT_THROW(unfinished.finish(), BytesError);

  ByteWriter more(std::vector<std::byte>{std::byte{1}});
  more.u8(2);
  EXPECT_EQ(lockstep::testing::hex(more.take()), "0102");
}

bool is_open(int fd) {
  return ::fcntl(fd, F_GETFD) != -1;
}

// One owner: closed when it goes or takes another, moved not copied, given up by release();
// errno survives the close (a caller reports the call that failed, not the close).
TEST(UniqueFd, OwnsOneDescriptor) {
  int raw = -1;
  {
    UniqueFd fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    ASSERT_TRUE(fd);
    raw = fd.get();
    UniqueFd moved = std::move(fd);
    EXPECT_FALSE(fd);  // NOLINT(bugprone-use-after-move): the point of the test
    EXPECT_EQ(moved.get(), raw);
    EXPECT_TRUE(is_open(raw));
  }
  EXPECT_FALSE(is_open(raw));

  UniqueFd fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  raw = fd.get();
  errno = ENOSPC;
  fd.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  EXPECT_EQ(errno, ENOSPC);
  EXPECT_FALSE(is_open(raw) && raw != fd.get());
  const int given = fd.release();
  EXPECT_FALSE(fd);
  EXPECT_TRUE(is_open(given));
  UniqueFd again(given);
  again = UniqueFd();
  EXPECT_FALSE(is_open(given));
  EXPECT_FALSE(UniqueFd(-5));  // a failed call's result: none
}

// A service thread is named, takes no signal, wakes on wake() and ends on stop(); a forked
// child's stop() leaves the parent's thread running.
TEST(ServiceThread, NamedSignalFreeWokenStoppedAndForkSafe) {
  ServiceThread thread;
  std::atomic<int> wakes{0};
  std::atomic<bool> signals_blocked{false};
  std::atomic<bool> ended{false};
  char name[16] = {};
  thread.start(
      "lockstep-test",
      [&] {
        sigset_t mask;
        pthread_sigmask(SIG_SETMASK, nullptr, &mask);
        signals_blocked = sigismember(&mask, SIGINT) == 1 && sigismember(&mask, SIGTERM) == 1;
        while (!thread.stopping()) {
          pollfd entry{thread.wake_fd(), POLLIN, 0};
          if (::poll(&entry, 1, 10000) > 0) {
            thread.drain();
            (void)pthread_getname_np(pthread_self(), name,
                                     sizeof name);  // named before start returned
            ++wakes;
          }
        }
        ended = true;
      },
      "test");
  ASSERT_TRUE(thread.running());
  const auto wait_for = [](auto done) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!done() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return done();
  };
  thread.wake();
  ASSERT_TRUE(wait_for([&] { return wakes.load() >= 1; }));
  EXPECT_STREQ(name, "lockstep-test");
  EXPECT_TRUE(signals_blocked);

  const pid_t child = ::fork();
  if (child == 0) {
    thread.stop();  // the parent's thread: forgotten here, never stopped
    ::_exit(thread.running() ? 1 : 0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const int before = wakes.load();
  thread.wake();
  EXPECT_TRUE(wait_for([&] { return wakes.load() > before; })) << "the child stopped it";
  EXPECT_FALSE(ended);

  thread.stop();
  EXPECT_TRUE(ended);
  EXPECT_FALSE(thread.running());
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
