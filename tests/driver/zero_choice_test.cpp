// Note [Choosing ZeRO-1 for a module] (driver/plan_sources.h): one decision for both APIs.
#include <string>

#include "catch_torch.h"  // last: glog's CHECK must not replace Catch2's (NOTES-libtorch.md)

#include "core/config.h"
#include "core/error.h"
#include "core/log.h"
#include "driver/plan_sources.h"

namespace autostage::driver {
namespace {

TEST_CASE("one ZeRO-1 decision: kept, planned without and said why, or refused by name",
          "[driver]") {
  const std::string problem = "the optimizer keeps state across elements; use Adam or zero=0";
  core::Config config;
  config.set("zero", "auto", "test");
  CHECK_FALSE(plansWithoutZero(config, true, ""));  // nothing stops it: the planner chooses
  {
    core::LogCapture capture(/*echo=*/false);
    CHECK(plansWithoutZero(config, true, problem));
    REQUIRE(capture.lines().size() == 1);
    // Why, without what to do (the text after ';').
    CHECK(capture.lines()[0].find("zero=auto plans without ZeRO-1: the optimizer keeps state "
                                  "across elements") != std::string::npos);
    CHECK(capture.lines()[0].find("use Adam") == std::string::npos);
  }
  CHECK(plansWithoutZero(config, false, ""));  // no trainable parameters: nothing to shard

  config.set("zero", "1", "test");
  CHECK_FALSE(plansWithoutZero(config, true, ""));
  CHECK_THROWS_AS(plansWithoutZero(config, true, problem), UnsupportedError);
  CHECK_THROWS_WITH(plansWithoutZero(config, true, problem), Catch::Contains(problem));
  {
    core::LogCapture capture(/*echo=*/false);
    CHECK(plansWithoutZero(config, false, problem));  // nothing to shard, whatever the optimizer
    REQUIRE(capture.lines().size() == 1);
    CHECK(capture.lines()[0].find("nothing to shard") != std::string::npos);
  }

  config.set("zero", "0", "test");
  CHECK_FALSE(plansWithoutZero(config, true, problem));  // asked for none: nothing to decide
  CHECK_FALSE(plansWithoutZero(config, false, ""));
}

}  // namespace
}  // namespace autostage::driver
