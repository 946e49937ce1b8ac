#include "text.hpp"

namespace lockstep::detail {

std::string comma_list(const std::vector<int>& numbers) {
  std::string out;
  for (int number : numbers) {
    out += (out.empty() ? "" : ", ") + std::to_string(number);
  }
  return out;
}

std::string comma_list(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& word : words) {
    out += (out.empty() ? "" : ", ") + word;
  }
  return out;
}

}  // namespace lockstep::detail
