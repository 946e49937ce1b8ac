// Symbol visibility for the public API, and the language check every C++ header makes (through
// this one): lockstep's C++ API needs C++20. From C, or C++ of any standard, use lockstep.h.
#pragma once

#if !defined(__cplusplus) || __cplusplus < 202002L
#error "lockstep's C++ headers need C++20: compile with -std=c++20 (CMake: target_link_libraries with lockstep::lockstep, or target_compile_features(app PRIVATE cxx_std_20); Meson: default_options: ['cpp_std=c++20']). From C or older C++, include <lockstep/lockstep.h>."
#endif

#if defined(LOCKSTEP_BUILDING) || defined(LOCKSTEP_STATIC)
#define LOCKSTEP_API __attribute__((visibility("default")))
#else
#define LOCKSTEP_API
#endif
