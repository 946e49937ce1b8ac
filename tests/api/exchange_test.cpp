// Gathers and broadcasts of any size, on one machine: 1 MiB and 64 MiB per process at N = 4,
// content checked byte for byte; a process killed in the middle of an exchange; a /dev/shm that
// takes no more bytes; the gather's regions at every number of processes a machine allows.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <lockstep/lockstep.hpp>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/segment_file.hpp"  // shm_path
#include "engine/spill.hpp"
#include "membership/exchange_regions.hpp"
#include "pattern.hpp"
#include "ranks.hpp"

namespace {

using lockstep::testing::failures;
using lockstep::testing::Job;
using lockstep::testing::pattern;
using lockstep::testing::run_ranks;
using lockstep::testing::shared_array;

constexpr std::size_t kMiB = std::size_t{1} << 20;

TEST(Exchanges, OneAndSixtyFourMebibytesPerProcessArriveWhole) {
  constexpr int kProcesses = 4;
  Job job = Job::of(kProcesses);
  job.limit = std::chrono::seconds(120);
  auto ends = run_ranks(job, [](int rank) {
    lockstep::State state;
    for (const std::size_t size : {kMiB, 64 * kMiB}) {
      const auto all = state.gather_object(
          pattern(size + static_cast<std::size_t>(rank), static_cast<std::uint64_t>(rank) + size));
      RANK_CHECK(all.size() == static_cast<std::size_t>(kProcesses));
      for (int of = 0; of < kProcesses; ++of) {
        RANK_CHECK(
            all[static_cast<std::size_t>(of)] ==
            pattern(size + static_cast<std::size_t>(of), static_cast<std::uint64_t>(of) + size));
      }
      const std::string text = pattern(size, size * 3);
      RANK_CHECK(state.broadcast(rank == 0 ? text : std::string("not this")) == text);
    }
    state.wait_for_everyone();
    RANK_CHECK(
        lockstep::testing::spill_files().empty());  // every spill removed as its exchange ended
    state.wait_for_everyone();
  });
  EXPECT_EQ(failures(ends), "");
}

// The exchanges into the caller's memory (State::gather_object_into, broadcast_into, what the C
// API's buffers use): each process's bytes land once, in process order, in the room given for
// their sizes; a room that throws fails this process's call only, after every process has read.
TEST(Exchanges, IntoTheCallersMemoryTheBytesLandInProcessOrder) {
  constexpr int kProcesses = 3;
  auto ends = run_ranks(Job::of(kProcesses), [](int rank) {
    lockstep::State state;
    for (const std::size_t size : {std::size_t{0}, std::size_t{100}, 2 * kMiB}) {
      const auto mine = pattern(size * static_cast<std::size_t>(rank), size + 1);
      std::vector<std::byte> room;
      std::vector<std::size_t> sizes;
      state.gather_object_into(std::as_bytes(std::span(mine.data(), mine.size())),
                               [&](std::span<const std::size_t> each) {
                                 sizes.assign(each.begin(), each.end());
                                 std::size_t total = 0;
                                 for (const std::size_t one : each) {
                                   total += one;
                                 }
                                 room.resize(total);
                                 return room.data();
                               });
      std::string expected;
      for (int of = 0; of < kProcesses; ++of) {
        RANK_CHECK(sizes.at(static_cast<std::size_t>(of)) == size * static_cast<std::size_t>(of));
        expected += pattern(size * static_cast<std::size_t>(of), size + 1);
      }
      RANK_CHECK(std::string(reinterpret_cast<const char*>(room.data()), room.size()) == expected);
      const std::string text = rank == 0 ? pattern(size, size * 5) : "not this";
      std::string got;
      state.broadcast_into(std::as_bytes(std::span(text.data(), text.size())),
                           [&](std::size_t bytes) {
                             got.resize(bytes);
                             return reinterpret_cast<std::byte*>(got.data());
                           });
      RANK_CHECK(got == pattern(size, size * 5));
    }
    bool threw = false;
    try {
      state.gather_object_into(std::as_bytes(std::span("x", 1)),
                               [&](std::span<const std::size_t> /*each*/) -> std::byte* {
                                 if (rank == 1) {
                                   throw std::runtime_error("no room");
                                 }
                                 static std::byte spare[8];
                                 return spare;
                               });
    } catch (const std::runtime_error& error) {
      threw = std::string(error.what()) == "no room";
    }
    RANK_CHECK(threw == (rank == 1));
    state.wait_for_everyone();  // the job goes on in step
  });
  EXPECT_EQ(failures(ends), "");
}

// The exchanges read in place (State::gather_object_in_place, broadcast_in_place, what Python's
// gather_object and broadcast_object use): `each` has every process's bytes once, wherever they
// lie (inline, copied from a writer's memory, in a writer's windows: spilled_in_place, through
// the three of each writer and as they grow), also
// beside a process that gathers into copies; an `each` that throws fails this process's call only,
// after every process has read; no spill is left.
TEST(Exchanges, ReadInPlaceEachProcessHasItsBytesOnceWhereverTheyLie) {
  constexpr int kProcesses = 3;
  auto ends = run_ranks(Job::of(kProcesses), [](int rank) {
    lockstep::State state;
    // Windows in turn, grown (2 MiB + 3), and bytes past the largest window (5 MiB: a spill).
    for (const std::size_t size :
         {std::size_t{0}, std::size_t{100}, std::size_t{100000}, std::size_t{300000}, 2 * kMiB + 3,
          std::size_t{300000}, 5 * kMiB, kMiB + 1, 2 * kMiB + 3}) {
      const auto of_rank = [size](int of) {
        return pattern(size + static_cast<std::size_t>(of), size + static_cast<std::uint64_t>(of));
      };
      const std::string mine = of_rank(rank);
      const auto bytes = std::as_bytes(std::span(mine.data(), mine.size()));
      std::vector<std::string> got(kProcesses);
      std::vector<int> calls(kProcesses, 0);
      if (rank == 1) {  // a process that gathers into copies, in the same exchange
        const auto all = state.gather_object(bytes);
        for (int of = 0; of < kProcesses; ++of) {
          got[static_cast<std::size_t>(of)].assign(
              reinterpret_cast<const char*>(all[static_cast<std::size_t>(of)].data()),
              all[static_cast<std::size_t>(of)].size());
          calls[static_cast<std::size_t>(of)] = 1;
        }
      } else {
        state.gather_object_in_place(bytes, [&](int of, std::span<const std::byte> theirs) {
          RANK_CHECK(of >= 0 && of < kProcesses);
          got[static_cast<std::size_t>(of)].assign(reinterpret_cast<const char*>(theirs.data()),
                                                   theirs.size());
          ++calls[static_cast<std::size_t>(of)];
        });
      }
      for (int of = 0; of < kProcesses; ++of) {
        RANK_CHECK(calls[static_cast<std::size_t>(of)] == 1);
        RANK_CHECK(got[static_cast<std::size_t>(of)] == of_rank(of));
      }
      const std::string text = rank == 0 ? pattern(size, size * 5) : "not this";
      int broadcasts = 0;
      std::string received;
      state.broadcast_in_place(std::as_bytes(std::span(text.data(), text.size())),
                               [&](std::span<const std::byte> theirs) {
                                 ++broadcasts;
                                 received.assign(reinterpret_cast<const char*>(theirs.data()),
                                                 theirs.size());
                               });
      RANK_CHECK(broadcasts == 1 && received == pattern(size, size * 5));
    }
    bool threw = false;
    const std::string large = pattern(kMiB, 3);
    try {
      state.gather_object_in_place(std::as_bytes(std::span(large.data(), large.size())),
                                   [&](int /*of*/, std::span<const std::byte> /*theirs*/) {
                                     if (rank == 2) {
                                       throw std::runtime_error("cannot decode");
                                     }
                                   });
    } catch (const std::runtime_error& error) {
      threw = std::string(error.what()) == "cannot decode";
    }
    RANK_CHECK(threw == (rank == 2));
    state.wait_for_everyone();  // the job goes on in step
    // What stays between gathers: the windows of the processes that read in place, no spill
    // (processes 0 and 2 used all theirs, process 1 one, in the last gather).
    for (const std::string& name : lockstep::testing::spill_files()) {
      RANK_CHECK(name.find('w', name.rfind("-x")) != std::string::npos);
    }
    RANK_CHECK(lockstep::testing::spill_files().size() ==
               static_cast<std::size_t>(2 * lockstep::detail::kWindows + 1));
    state.wait_for_everyone();
  });
  EXPECT_EQ(failures(ends), "");
  EXPECT_EQ(lockstep::testing::spill_files(), std::vector<std::string>{}) << "windows left";
}

// A forked child whose copy of the process's State goes (at its exit) leaves the parent's windows
// where they are (the others still map them by name), and the parent's next gathers pass; the
// parent's windows go when it leaves the job.
TEST(Exchanges, AForkedChildLeavesItsParentsWindows) {
  constexpr int kProcesses = 2;
  auto ends = run_ranks(Job::of(kProcesses), [](int rank) {
    auto state = std::make_unique<lockstep::State>();
    const std::string mine = pattern(kMiB, static_cast<std::uint64_t>(rank));
    const auto bytes = std::as_bytes(std::span(mine.data(), mine.size()));
    const auto gather = [&] {
      int whole = 0;
      state->gather_object_in_place(bytes, [&](int of, std::span<const std::byte> theirs) {
        const std::string got(reinterpret_cast<const char*>(theirs.data()), theirs.size());
        whole += got == pattern(kMiB, static_cast<std::uint64_t>(of)) ? 1 : 0;
      });
      return whole;
    };
    RANK_CHECK(gather() == kProcesses);
    const std::string window = "-x" + std::to_string(rank) + "w0";
    const auto has_window = [&] {
      const auto names = lockstep::testing::spill_files();
      return std::any_of(names.begin(), names.end(),
                         [&](const std::string& name) { return name.ends_with(window); });
    };
    RANK_CHECK(has_window());
    const pid_t child = ::fork();
    if (child == 0) {
      std::exit(0);  // NOLINT(concurrency-mt-unsafe): the copy's Context goes with the statics
    }
    int status = 0;
    RANK_CHECK(child > 0 && ::waitpid(child, &status, 0) == child && WIFEXITED(status));
    RANK_CHECK(has_window());
    for (int round = 0; round < 4; ++round) {
      RANK_CHECK(gather() == kProcesses);
    }
    state->wait_for_everyone();
    state->leave();
    RANK_CHECK(!has_window());
  });
  EXPECT_EQ(failures(ends), "");
}

// A process killed with its bytes given, before it arrived (a gather's: in its memory, which the
// others then cannot read; a broadcast's: in its spill): every other process gets PeerLostError
// naming it, and once they have exited nothing of the job is left in /dev/shm.
TEST(Exchanges, AProcessKilledMidExchangeLeavesNothingBehind) {
  constexpr int kProcesses = 4;
  constexpr int kVictim = 2;
  // A gather read in place: the victim's bytes are in its spill.
  for (const char* const kind : {"gather", "broadcast", "gather in place"}) {
    const bool gather = std::string(kind) != "broadcast";
    Job job = Job::of(kProcesses);
    // The broadcast's writer is the main process: the victim there is process 0.
    const int victim = gather ? kVictim : 0;
    job.env["LOCKSTEP_FAULT_POINT"] = "exchange.written@" + std::to_string(victim);
    auto* lost = shared_array<int>(kProcesses);
    auto ends = run_ranks(job, [&](int rank) {
      lockstep::State state;
      state.wait_for_everyone();
      try {
        if (std::string(kind) == "gather in place") {
          const std::string mine = pattern(4 * kMiB, static_cast<std::uint64_t>(rank));
          state.gather_object_in_place(std::as_bytes(std::span(mine.data(), mine.size())),
                                       [](int /*of*/, std::span<const std::byte> /*bytes*/) {});
        } else if (gather) {
          (void)state.gather_object(pattern(4 * kMiB, static_cast<std::uint64_t>(rank)));
        } else {
          (void)state.broadcast(pattern(rank == 0 ? 4 * kMiB : 0, 7));
        }
      } catch (const lockstep::PeerLostError& error) {
        lost[rank] = error.process_index() == victim ? 1 : 2;
      }
    });
    EXPECT_EQ(failures(ends, victim), "") << kind;
    for (int rank = 0; rank < kProcesses; ++rank) {
      if (rank != victim) {
        EXPECT_EQ(lost[rank], 1) << "process " << rank << ", " << kind;
      }
    }
    EXPECT_EQ(lockstep::testing::spill_files(), std::vector<std::string>{}) << "spills left";
  }
}

// A process that cannot read another's memory (process_vm_readv refused: a Yama ptrace scope, a
// seccomp filter; LOCKSTEP_FAULT_POINT's exchange.no-memory-read here): the gather goes on
// through spills, in two more episodes on every process, and every process has every byte.
TEST(Exchanges, AGatherGoesOnThroughSpillsWhereMemoryCannotBeRead) {
  constexpr int kProcesses = 4;
  for (const int reader : {0, 3}) {
    Job job = Job::of(kProcesses);
    job.env["LOCKSTEP_FAULT_POINT"] = "exchange.no-memory-read@" + std::to_string(reader);
    auto ends = run_ranks(job, [](int rank) {
      lockstep::State state;
      for (int round = 0; round < 3; ++round) {
        const auto seed = [round](int of) {
          return static_cast<std::uint64_t>(of) * 10 + static_cast<std::uint64_t>(round);
        };
        const auto all =
            state.gather_object(pattern(kMiB + 7 * static_cast<std::size_t>(rank), seed(rank)));
        for (int of = 0; of < kProcesses; ++of) {
          RANK_CHECK(all[static_cast<std::size_t>(of)] ==
                     pattern(kMiB + 7 * static_cast<std::size_t>(of), seed(of)));
        }
      }
      state.wait_for_everyone();
      RANK_CHECK(lockstep::testing::spill_files().empty());
      state.wait_for_everyone();
    });
    EXPECT_EQ(failures(ends), "") << "process " << reader << " could not read";
  }
}

// A /dev/shm that takes none of a process's bytes (LOCKSTEP_FAULT_POINT's spill.full): an Error
// on every process naming that process and why, and the job goes on.
TEST(Exchanges, ASpillThatDevShmRefusesIsAnErrorOnEveryProcess) {
  constexpr int kProcesses = 3;
  for (const bool gather : {true, false}) {
    Job job = Job::of(kProcesses);
    const int refused = gather ? 1 : 0;
    // A gather's bytes go through a spill where another process cannot read them in place.
    job.env["LOCKSTEP_FAULT_POINT"] =
        "spill.full@" + std::to_string(refused) + (gather ? ",exchange.no-memory-read@0" : "");
    auto ends = run_ranks(job, [&](int rank) {
      lockstep::State state;
      try {
        if (gather) {
          (void)state.gather_object(pattern(100000, static_cast<std::uint64_t>(rank)));
        } else {
          (void)state.broadcast(pattern(rank == 0 ? 100000 : 0, 7));
        }
        RANK_CHECK(false);
      } catch (const lockstep::Error& error) {
        const std::string text = error.what();
        RANK_CHECK(text.find("No space left on device") != std::string::npos);
        RANK_CHECK(!gather || text.find("process 1 could not give its bytes") != std::string::npos);
      }
      // The job goes on: the next exchanges of that size pass.
      const auto all = state.gather_object(pattern(100000, static_cast<std::uint64_t>(rank)));
      for (int of = 0; of < kProcesses; ++of) {
        RANK_CHECK(all[static_cast<std::size_t>(of)] ==
                   pattern(100000, static_cast<std::uint64_t>(of)));
      }
      RANK_CHECK(state.broadcast(rank == 0 ? pattern(100000, 9) : "") == pattern(100000, 9));
    });
    EXPECT_EQ(failures(ends), "") << (gather ? "gather" : "broadcast");
  }
}

// A process reading in place whose spill /dev/shm refuses (LOCKSTEP_FAULT_POINT's spill.full):
// its bytes stay in its memory, where the others read them, and the gather passes.
TEST(Exchanges, AReaderInPlaceWhoseSpillIsRefusedKeepsItsBytesInMemory) {
  constexpr int kProcesses = 3;
  Job job = Job::of(kProcesses);
  job.env["LOCKSTEP_FAULT_POINT"] = "spill.full@1";
  auto ends = run_ranks(job, [](int rank) {
    lockstep::State state;
    const std::string mine = pattern(kMiB, static_cast<std::uint64_t>(rank));
    std::vector<int> whole(kProcesses, 0);
    state.gather_object_in_place(std::as_bytes(std::span(mine.data(), mine.size())),
                                 [&](int of, std::span<const std::byte> theirs) {
                                   const std::string got(
                                       reinterpret_cast<const char*>(theirs.data()), theirs.size());
                                   if (got == pattern(kMiB, static_cast<std::uint64_t>(of))) {
                                     ++whole[static_cast<std::size_t>(of)];
                                   }
                                 });
    for (int of = 0; of < kProcesses; ++of) {
      RANK_CHECK(whole[static_cast<std::size_t>(of)] == 1);
    }
  });
  EXPECT_EQ(failures(ends), "");
}

// What another process finds at a spill's or a window's name in /dev/shm where lockstep's file
// should be: a FIFO (never blocking the reader), a link, a file others may read, one of the wrong
// size: an Error naming the path, never a mapping. A writer replaces whatever is at its own names.
TEST(Spills, AFifoALinkOrAnOpenFileAtTheNameIsRefused) {
  using lockstep::detail::shm_path;
  const std::string segment = "lockstep-u" + std::to_string(::geteuid()) + "-spilltest" +
                              std::to_string(::getpid()) + "-n0";
  const std::string spill = lockstep::detail::spill_name(segment, 0);
  const std::string window = lockstep::detail::window_name(segment, 1, 0);
  const auto refused = [&](const char* what) {
    std::string why;
    try {
      const lockstep::detail::SpillView view(spill, kMiB, "test");
    } catch (const lockstep::Error& error) {
      why = error.what();
    }
    EXPECT_NE(why.find(shm_path(spill)), std::string::npos) << what << ": " << why;
    why.clear();
    try {
      lockstep::detail::WindowViews views;
      (void)views.view(segment, 1, 0, kMiB, 10, "test");
    } catch (const lockstep::Error& error) {
      why = error.what();
    }
    EXPECT_NE(why.find(shm_path(window)), std::string::npos) << what << ": " << why;
    (void)::unlink(shm_path(spill).c_str());
    (void)::unlink(shm_path(window).c_str());
  };
  for (const std::string& name : {spill, window}) {
    ASSERT_EQ(::mkfifo(shm_path(name).c_str(), 0600), 0);
  }
  refused("a FIFO");
  for (const std::string& name : {spill, window}) {
    ASSERT_EQ(::symlink("/etc/passwd", shm_path(name).c_str()), 0);
  }
  refused("a link");
  for (const std::string& name : {spill, window}) {
    const int fd = ::open(shm_path(name).c_str(), O_CREAT | O_WRONLY, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(kMiB)), 0);
    ASSERT_EQ(::fchmod(fd, 0644), 0);
    ::close(fd);
  }
  refused("a file others may read");
  for (const std::string& name : {spill, window}) {
    const int fd = ::open(shm_path(name).c_str(), O_CREAT | O_WRONLY, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(kMiB / 2)), 0);
    ::close(fd);
  }
  refused("a file too small");
  // The writer's own name: a FIFO there is replaced, and its bytes are read back.
  ASSERT_EQ(::mkfifo(shm_path(window).c_str(), 0600), 0);
  {
    lockstep::detail::Windows windows(segment, 1);
    const std::string mine = pattern(1000, 5);
    const auto placed = windows.put(std::as_bytes(std::span(mine.data(), mine.size())), "test");
    lockstep::detail::WindowViews views;
    const auto got = views.view(segment, 1, placed.window, placed.capacity, mine.size(), "test");
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(got.data()), got.size()), mine);
  }
  struct stat st {};
  EXPECT_NE(::lstat(shm_path(window).c_str(), &st), 0) << "the window is removed with its writer";
}

// A gather's regions of the node segment's area at every number of processes a machine allows
// (1 to 4,096), without starting them: each region holds an entry's head and lies within the area,
// or the machine's gathers are refused naming its process count. (Above 2,048 the regions were
// 8 bytes, and an entry's 16-byte head, or a failure's reason, was written past its region and,
// from the last process, past the area.)
TEST(ExchangeRegions, StayWithinTheAreaAtEveryProcessCount) {
  using lockstep::detail::gather_refusal;
  using lockstep::detail::kEntryHead;
  using lockstep::detail::kMaxBroadcast;
  using lockstep::detail::region_size;
  for (int processes = 1; processes <= 4096; ++processes) {
    const std::string why = gather_refusal(processes);
    if (why.empty()) {
      ASSERT_GE(region_size(processes), kEntryHead) << processes;
      ASSERT_LE(region_size(processes) * static_cast<std::size_t>(processes), kMaxBroadcast)
          << processes;
      ASSERT_EQ(region_size(processes) % 8, 0U) << processes;
    } else {
      ASSERT_GT(processes, 2048);
    }
  }
  EXPECT_EQ(region_size(1365), 24U);
  EXPECT_EQ(region_size(1366), 16U);
  EXPECT_EQ(region_size(2048), 16U);
  EXPECT_EQ(gather_refusal(2048), "");
  EXPECT_EQ(gather_refusal(2049),
            "this machine has 2049 processes of the job, and a gather takes at most 2048 on a "
            "machine (each needs its place in the node segment's area)");
  EXPECT_NE(gather_refusal(4096).find("has 4096 processes"), std::string::npos);
  EXPECT_NE(gather_refusal(0), "");
}

}  // namespace
