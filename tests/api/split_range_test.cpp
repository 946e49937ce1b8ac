// lockstep::split_range, the rule behind split_between_processes (C++, C and Python share it).
#include <gtest/gtest.h>

#include <cstddef>
#include <limits>
#include <lockstep/lockstep.hpp>

namespace {

// split_range: every size 0..3n for n = 1..8: contiguous, in order, the first size % n one more,
// padding up to the longest share; indices outside the job refused.
TEST(SplitRange, EverySizeAndProcessCount) {
  for (int n = 1; n <= 8; ++n) {
    for (std::size_t size = 0; size <= 3 * static_cast<std::size_t>(n); ++size) {
      std::size_t next = 0;
      const std::size_t longest = (size + static_cast<std::size_t>(n) - 1) / n;
      for (int i = 0; i < n; ++i) {
        const lockstep::Share share = lockstep::split_range(size, n, i);
        EXPECT_EQ(share.begin, next) << "n=" << n << " size=" << size << " i=" << i;
        const std::size_t want = size / n + (static_cast<std::size_t>(i) < size % n ? 1 : 0);
        EXPECT_EQ(share.size(), want) << "n=" << n << " size=" << size << " i=" << i;
        EXPECT_EQ(share.size() + share.padding, size == 0 ? 0 : longest);
        next = share.end;
      }
      EXPECT_EQ(next, size);
    }
  }
  EXPECT_THROW((void)lockstep::split_range(5, 0, 0), lockstep::ConfigError);
  EXPECT_THROW((void)lockstep::split_range(5, 3, 3), lockstep::ConfigError);
  EXPECT_THROW((void)lockstep::split_range(5, 3, -1), lockstep::ConfigError);
}

// Near 2^64 the longest share is still ceil(size / n): its padding never wraps.
TEST(SplitRange, TheLargestSizes) {
  const std::size_t size = std::numeric_limits<std::size_t>::max();
  for (int n : {2, 3, 7}) {
    const auto un = static_cast<std::size_t>(n);
    const std::size_t longest = size / un + (size % un != 0 ? 1 : 0);
    std::size_t next = 0;
    for (int i = 0; i < n; ++i) {
      const lockstep::Share share = lockstep::split_range(size, n, i);
      EXPECT_EQ(share.begin, next);
      EXPECT_EQ(share.size() + share.padding, longest) << "n=" << n << " i=" << i;
      next = share.end;
    }
    EXPECT_EQ(next, size);
  }
}

}  // namespace
