// The program lockstep-run starts: whether it can run, and what it is where that is cheap to
// tell: an MPI program (which under lockstep-run would be N MPI jobs of one process each).
#pragma once

#include <optional>
#include <string>

namespace lockstep::run {

// Whether `program` can be executed as execvp would find it; the reason when not.
std::optional<std::string> cannot_execute(const std::string& program);

// The MPI library `program` (found as execvp finds it) is linked with, from its ELF dynamic
// section ("libmpi.so.40"); empty when it is not an ELF executable linked with one, or cannot
// be read.
std::optional<std::string> linked_mpi(const std::string& program);

}  // namespace lockstep::run
