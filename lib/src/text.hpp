// Small helpers for messages (internal).
#pragma once

#include <string>
#include <vector>

namespace lockstep::detail {

// "3, 5, 7": numbers for a message.
std::string comma_list(const std::vector<int>& numbers);
// "ucx, nccl": words for a message.
std::string comma_list(const std::vector<std::string>& words);

}  // namespace lockstep::detail
