// What leaders share, as one interface (lib/src/membership/backend.hpp): where other machines'
// processes are comes back from LeaderLinks::places as what each leader told, and is written as
// text in one place (places_text, the whereabouts room's other_nodes_text), whichever links ask.
#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "membership/backend.hpp"

namespace lockstep::detail {
namespace {

// Links of three nodes that answer with `told`, or cannot ask at all.
class FakeLinks final : public LeaderLinks {
 public:
  explicit FakeLinks(std::optional<NodePlaces> answers) : answers_(std::move(answers)) {}
  [[nodiscard]] const std::vector<NodeInfo>& nodes() const noexcept override { return nodes_; }
  std::vector<std::vector<std::byte>> allgather(std::span<const std::byte> /*part*/,
                                                std::optional<Clock::time_point> /*deadline*/,
                                                const char* /*what*/) override {
    return {};
  }
  std::vector<std::byte> share(std::span<const std::byte> /*data*/,
                               std::optional<Clock::time_point> /*deadline*/,
                               const char* /*what*/) override {
    return {};
  }
  void abort(const Failure& /*failure*/) noexcept override {}
  [[nodiscard]] std::optional<NodePlaces> places(const std::vector<int>& nodes) const override {
    asked = nodes;
    return answers_;
  }
  mutable std::vector<int> asked;

 private:
  std::vector<NodeInfo> nodes_{{0, {0, 1}}, {1, {2, 3}}, {2, {4, 5}}};
  std::optional<NodePlaces> answers_;
};

TEST(LeaderLinks, PlacesAreTextInOnePlaceEscapedAndAMissingAnswerSaysHowLongItWasAwaited) {
  FakeLinks links(NodePlaces{{{1, "process 2 is not in a lockstep call\n\x1b[2J"}},
                             std::chrono::milliseconds(1500)});
  EXPECT_EQ(places_text(links, {1, 2}),
            "; on node 1, process 2 is not in a lockstep call\\x0a\\x1b[2J"
            "; on node 2, where its processes are is not known (not told within 1.5 s)");
  EXPECT_EQ(links.asked, (std::vector<int>{1, 2}));
}

TEST(LeaderLinks, LinksThatCannotAskAddNothingAndNoNodesAsksNobody) {
  FakeLinks cannot(std::nullopt);
  EXPECT_EQ(places_text(cannot, {1, 2}), "");
  FakeLinks can(NodePlaces{{{1, "x"}}, std::chrono::milliseconds(1000)});
  EXPECT_EQ(places_text(can, {}), "");
  EXPECT_TRUE(can.asked.empty());
}

TEST(LeaderLinks, NodesButOneAreTheOthersInOrder) {
  FakeLinks links(std::nullopt);
  EXPECT_EQ(nodes_but(links, 1), (std::vector<int>{0, 2}));
  EXPECT_EQ(nodes_but(links, 0), (std::vector<int>{1, 2}));
}

}  // namespace
}  // namespace lockstep::detail
