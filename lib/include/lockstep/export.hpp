// Symbol visibility for the public API, and the language check every C++ header makes (through
// this one): lockstep's C++ API needs C++20. From C, or C++ of any standard, use lockstep.h.
#pragma once

// Below C++20: compile with -std=c++20 (CMake: link lockstep::lockstep, which requires
// cxx_std_20; Meson: default_options: ['cpp_std=c++20']), or include lockstep.h instead.
#if !defined(__cplusplus) || __cplusplus < 202002L
#error "lockstep's C++ headers need C++20 (-std=c++20); from C or older C++, use lockstep.h"
#endif

#if defined(LOCKSTEP_BUILDING) || defined(LOCKSTEP_STATIC)
#define LOCKSTEP_API __attribute__((visibility("default")))
#else
#define LOCKSTEP_API
#endif
