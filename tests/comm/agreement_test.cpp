// Collective error agreement over 4 in-process ranks: a failure on some ranks becomes the same
// error, of the lowest failing rank's class, on every rank.
#include "catch_torch.h"

#include <string>
#include <vector>

#include "comm/agreement.h"
#include "comm/thread_backend.h"
#include "core/error.h"

using namespace autostage;
using namespace autostage::comm;

namespace {

// what() of every rank's error; "" for a rank that returned normally.
std::vector<std::string> messages(const std::vector<std::exception_ptr>& errors) {
  std::vector<std::string> out;
  for (const auto& error : errors) {
    if (!error) {
      out.emplace_back();
      continue;
    }
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      out.emplace_back(e.what());
    }
  }
  return out;
}

}  // namespace

TEST_CASE("agreement: every rank succeeds, nobody throws", "[comm]") {
  auto errors = runThreadRanks(4, [](ThreadBackend& backend) {
    runAgreed(backend, "step", [] {});
    auto payloads = agreeAndGather(backend, "step", {}, "p" + std::to_string(backend.rank()));
    AUTOSTAGE_CHECK(payloads == std::vector<std::string>({"p0", "p1", "p2", "p3"}),
                    "payloads out of rank order");
  });
  for (const auto& m : messages(errors)) CHECK(m.empty());
}

TEST_CASE("agreement: one rank's error reaches every rank with its class", "[comm]") {
  auto errors = runThreadRanks(4, [](ThreadBackend& backend) {
    runAgreed(backend, "loading the file", [&] {
      if (backend.rank() == 2) throw FormatError("file is truncated");
    });
  });
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r);
    REQUIRE(errors[r]);
    CHECK_THROWS_AS(std::rethrow_exception(errors[r]), FormatError);
    CHECK(messages(errors)[r] == "loading the file failed on rank 2: file is truncated");
  }
}

TEST_CASE("agreement: equal messages merge, distinct ones are listed, lowest class wins",
          "[comm]") {
  auto errors = runThreadRanks(4, [](ThreadBackend& backend) {
    StepStatus status;
    if (backend.rank() == 1 || backend.rank() == 3) status = {"UnsupportedError", "bad input"};
    if (backend.rank() == 2) status = {"ConfigError", "bad option"};
    agreeOnStatus(backend, "checking", status);
  });
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r);
    REQUIRE(errors[r]);
    CHECK_THROWS_AS(std::rethrow_exception(errors[r]), UnsupportedError);
    CHECK(messages(errors)[r] ==
          "checking failed on ranks 1,3: bad input; on rank 2: bad option");
  }
}

TEST_CASE("agreement: payloads may contain newlines and statuses of any class", "[comm]") {
  auto errors = runThreadRanks(2, [](ThreadBackend& backend) {
    StepStatus status;
    if (backend.rank() == 0) status = {"SomethingElse", "line 1\nline 2"};
    agreeAndGather(backend, "s", status, "x\ny");
  });
  for (int r = 0; r < 2; ++r) {
    REQUIRE(errors[r]);
    CHECK_THROWS_AS(std::rethrow_exception(errors[r]), Error);
    CHECK(messages(errors)[r] == "s failed on rank 0: line 1\nline 2");
  }
}

TEST_CASE("agreement: a non-autostage exception is reported as Error with its text", "[comm]") {
  auto errors = runThreadRanks(2, [](ThreadBackend& backend) {
    runAgreed(backend, "tracing", [&] {
      if (backend.rank() == 1) throw std::out_of_range("index 7");
    });
  });
  for (int r = 0; r < 2; ++r) {
    REQUIRE(errors[r]);
    CHECK(messages(errors)[r] == "tracing failed on rank 1: index 7");
  }
  CHECK(lastAgreedError() == "tracing failed on rank 1: index 7");
}

TEST_CASE("agreement: one rank works alone without communicating", "[comm]") {
  auto errors = runThreadRanks(1, [](ThreadBackend& backend) {
    runAgreed(backend, "alone", [] { throw PlanError("nothing fits"); });
  });
  REQUIRE(errors[0]);
  CHECK_THROWS_AS(std::rethrow_exception(errors[0]), PlanError);
  CHECK(messages(errors)[0] == "alone failed on rank 0: nothing fits");
}
