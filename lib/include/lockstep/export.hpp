// Symbol visibility for the public API.
#pragma once

#if defined(LOCKSTEP_BUILDING) || defined(LOCKSTEP_STATIC)
#define LOCKSTEP_API __attribute__((visibility("default")))
#else
#define LOCKSTEP_API
#endif
