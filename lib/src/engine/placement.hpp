// Engine: where the node's processes run, and where one of them moves to even them out
// (internal; NodeBarrier::spread acts on it).
#pragma once

#include <bitset>
#include <cstdint>
#include <span>

#include "base/proc.hpp"  // kMaxCpus

namespace lockstep::detail {

// The CPU that a process on `here` moves to, given how many of the node's processes were last
// seen on each CPU (`on`, indexed by CPU number, this process counted on `here`) and the CPUs it
// may run on (`usable`): the usable CPU with the fewest (the lowest number of those), where that
// is at least two fewer than `here` holds, so that the move evens them out rather than trading
// places; -1 otherwise.
int emptier_cpu(std::span<const std::uint16_t> on, int here,
                const std::bitset<kMaxCpus>& usable) noexcept;

}  // namespace lockstep::detail
