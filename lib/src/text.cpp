#include "text.hpp"

namespace lockstep::detail {

std::string comma_list(const std::vector<int>& numbers) {
  std::string out;
  for (int number : numbers) {
    out += (out.empty() ? "" : ", ") + std::to_string(number);
  }
  return out;
}

}  // namespace lockstep::detail
