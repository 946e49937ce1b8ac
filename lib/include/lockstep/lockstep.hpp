// lockstep: Accelerate's execution control for multi-process C++ programs.
#pragma once

#include "lockstep/error.hpp"
#include "lockstep/state.hpp"
#include "lockstep/version.hpp"
