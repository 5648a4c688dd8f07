// Note [Captured log lines]: a LogCapture keeps what its own thread logs, formatted as printed.
#include <thread>

#include "core/log.h"

#include <catch2/catch.hpp>

namespace autostage::core {
namespace {

TEST_CASE("a LogCapture keeps its thread's lines, not another thread's", "[core]") {
  std::vector<std::string> outer;
  {
    LogCapture capture(/*echo=*/false);
    logger("DPStaging")->info("graph={} repl={}", "STAGE_0_3", 2);
    logger("Decomposer")->debug("below the level: not kept");
    std::thread([] { logger("Decomposer")->info("another thread's line"); }).join();
    {
      LogCapture inner(false);
      logger("Module")->warn("inner");
      REQUIRE(inner.lines().size() == 1);
      CHECK(inner.lines()[0] == "[Module] [warning] inner");
    }
    logger("Decomposer")->info("after the inner one");
    outer = capture.lines();
  }
  REQUIRE(outer.size() == 2);
  CHECK(outer[0] == "[DPStaging] [info] graph=STAGE_0_3 repl=2");
  CHECK(outer[1] == "[Decomposer] [info] after the inner one");
}

}  // namespace
}  // namespace autostage::core
