#include "core/deployment.h"

#include <catch2/catch.hpp>

using namespace autostage::core;

namespace {

// 2 stages on 4 ranks over hosts a (ranks 0, 2) and b (ranks 1, 3): stage 0 on ranks 0, 1 (both
// hosts), stage 1 on ranks 3, 2 (listed out of order).
Deployment twoHosts() {
  Deployment d;
  d.worldSize = 4;
  d.rankHosts = {"a", "b", "a", "b"};
  StageDeployment first, second;
  first.name = "STAGE_0_3";
  first.ranks = {0, 1};
  second.id = 1;
  second.name = "STAGE_4_7";
  second.ranks = {3, 2};
  d.stages = {first, second};
  return d;
}

}  // namespace

TEST_CASE("hosts of ranks: grouped in order of first appearance, as the partition log says",
          "[core]") {
  const Deployment d = twoHosts();
  const std::vector<HostRanks> all = ranksByHost(d.rankHosts);
  REQUIRE(all.size() == 2);
  REQUIRE(all[0].host == "a");
  REQUIRE(all[0].ranks == std::vector<int>{0, 2});
  REQUIRE(all[1].host == "b");
  REQUIRE(all[1].ranks == std::vector<int>{1, 3});
  REQUIRE(hostsText(d.rankHosts) == "a (ranks 0,2), b (ranks 1,3)");
  REQUIRE(hostsText(d.rankHosts, {3, 2}) == "b (ranks 3), a (ranks 2)");
  REQUIRE(stageHostsText(d) == "STAGE_0_3 on a (ranks 0), b (ranks 1); "
                               "STAGE_4_7 on b (ranks 3), a (ranks 2)");
}

TEST_CASE("a deployment without hosts (one host, older files) has no host text", "[core]") {
  Deployment d = twoHosts();
  d.rankHosts.clear();
  REQUIRE(stageHostsText(d) == "");
  REQUIRE(hostsText({}) == "");
  REQUIRE(ranksByHost({}).empty());
}
