// lockstep::SourceLocation: where a call that meets the other processes was made.
#pragma once

#if __has_include(<source_location>)
#include <source_location>
#endif

namespace lockstep {

// Where a call was made: the caller's file, line and function, as lockstep::State's calls record
// them (see State). Filled in by their defaulted argument, as C++20's std::source_location (which
// clang 14 with libstdc++ 12, Debian 12's pair, does not have); a wrapper passes its own
// caller's on, as one or the other, or any strings: they are read during the call only (lockstep
// keeps its own copy of each place, known by its text).
class SourceLocation {
 public:
  // An unknown place ("an unrecorded place" in messages).
  constexpr SourceLocation() noexcept = default;
  static constexpr SourceLocation current(const char* file = __builtin_FILE(),
                                          unsigned line = __builtin_LINE(),
                                          const char* function = __builtin_FUNCTION()) noexcept {
    return {file, line, function};
  }
  constexpr SourceLocation(const char* file, unsigned line, const char* function) noexcept
      : file_(file), function_(function), line_(line) {}
#if defined(__cpp_lib_source_location)
  // NOLINTNEXTLINE(google-explicit-constructor): std's and ours stand for each other
  constexpr SourceLocation(const std::source_location& where) noexcept
      : file_(where.file_name()), function_(where.function_name()), line_(where.line()) {}
#endif
  [[nodiscard]] constexpr const char* file_name() const noexcept {
    return file_;
  }
  [[nodiscard]] constexpr const char* function_name() const noexcept {
    return function_;
  }
  [[nodiscard]] constexpr unsigned line() const noexcept {
    return line_;
  }

 private:
  const char* file_ = nullptr;
  const char* function_ = nullptr;
  unsigned line_ = 0;
};

}  // namespace lockstep
