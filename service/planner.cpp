// The planners of Note [One planner]; see planner.h.
#include "service/planner.h"

#include <utility>

#include "core/error.h"
#include "core/log.h"
#include "service/planner_client.h"
#include "service/planning_core.h"

namespace autostage::service {
namespace {

// Replays a partition log line captured where the plan was made ("[DPStaging] [info] ...")
// through the named logger, so a caller prints what planning in its own process would have, at
// its own log levels.
void replayLogLine(const std::string& line) {
  const size_t nameEnd = line.find("] [");
  const size_t levelEnd = nameEnd == std::string::npos ? nameEnd : line.find("] ", nameEnd + 3);
  if (line.empty() || line[0] != '[' || levelEnd == std::string::npos) {
    core::logger("Service")->info("{}", line);
    return;
  }
  auto level = spdlog::level::from_str(line.substr(nameEnd + 3, levelEnd - nameEnd - 3));
  core::logger(line.substr(1, nameEnd - 1))->log(level, "{}", line.substr(levelEnd + 2));
}

void replayLog(const proto::PlanAnswer& answer) {
  for (const std::string& line : answer.log()) replayLogLine(line);
}

bool byProfileKeyOnly(const proto::PlanCall& call) {
  return call.profile().empty() && call.profile_hash().empty();
}

class LocalPlanner : public Planner {
 public:
  explicit LocalPlanner(const std::string& storeDirectory)
      : directory_(storeDirectory), core_(optionsFor(storeDirectory)) {}

  proto::PlanAnswer plan(const proto::PlanCall& call) override {
    proto::PlanAnswer answer = core_.plan(call);
    auto log = core::logger("DPStaging");
    if (answer.from_store()) {
      replayLog(answer);  // printed when it was planned, by another process or call
      log->info("Plan {} from {} (plan_cache_dir): skipping planning", answer.plan_key(),
                where());
    } else if (!directory_.empty()) {
      log->info("Plan {} saved in {} (plan_cache_dir)", answer.plan_key(), where());
    }
    return answer;
  }

  std::string where() const override {
    return directory_.empty() ? "this process" : "the plan store at " + directory_;
  }

 private:
  static PlanningOptions optionsFor(const std::string& directory) {
    PlanningOptions options;
    options.storeDirectory = directory;
    options.maxConcurrentPlans = 1;
    options.maxPlanSeconds = 1e7;  // a caller in this process waits for its plan, however long
    options.echoLog = true;        // the partition log and its progress as the plan is made
    return options;
  }

  std::string directory_;
  PlanningCore core_;
};

class RemotePlanner : public Planner {
 public:
  RemotePlanner(std::string address, double timeoutSeconds)
      : address_(std::move(address)), timeoutSeconds_(timeoutSeconds), client_(address_) {}

  proto::PlanAnswer plan(const proto::PlanCall& call) override {
    auto log = core::logger("Module");
    log->info("Asking {}{} ...", where(),
              byProfileKeyOnly(call) ? " for a plan with this model's stored profile" : "");
    proto::PlanAnswer answer = client_.plan(call, timeoutSeconds_);
    replayLog(answer);
    log->info("Plan {} from {} ({})", answer.plan_key(), where(),
              answer.from_store() ? "from its store" : "planned for this job");
    return answer;
  }

  std::string where() const override { return "the planning service at " + address_; }

 private:
  std::string address_;
  double timeoutSeconds_;
  PlannerClient client_;
};

class FallbackPlanner : public Planner {
 public:
  FallbackPlanner(std::unique_ptr<Planner> remote, std::unique_ptr<Planner> local)
      : remote_(std::move(remote)), local_(std::move(local)) {}

  proto::PlanAnswer plan(const proto::PlanCall& call) override {
    if (!remoteFailed_) {
      try {
        return remote_->plan(call);
      } catch (const PlanError&) {
        throw;  // the answer: nothing fits, wherever it is planned
      } catch (const NotStored&) {
        throw;  // the caller profiles and asks again with the profile
      } catch (const Error& e) {
        core::logger("Module")->warn("{}; planning locally ({}) from now on", e.what(),
                                     local_->where());
        remoteFailed_ = true;
      }
    }
    return local_->plan(call);
  }

  std::string where() const override { return (remoteFailed_ ? local_ : remote_)->where(); }

 private:
  std::unique_ptr<Planner> remote_, local_;
  bool remoteFailed_ = false;
};

}  // namespace

std::unique_ptr<Planner> makeLocalPlanner(const std::string& storeDirectory) {
  return std::make_unique<LocalPlanner>(storeDirectory);
}

std::unique_ptr<Planner> makeRemotePlanner(const std::string& address, double timeoutSeconds) {
  return std::make_unique<RemotePlanner>(address, timeoutSeconds);
}

std::unique_ptr<Planner> makeFallbackPlanner(std::unique_ptr<Planner> remote,
                                             std::unique_ptr<Planner> local) {
  return std::make_unique<FallbackPlanner>(std::move(remote), std::move(local));
}

std::unique_ptr<Planner> makePlanner(const core::Config& config) {
  std::unique_ptr<Planner> local = makeLocalPlanner(config.getString("plan_cache_dir"));
  const std::string address = config.getString("planner_address");
  if (address.empty()) return local;
  return makeFallbackPlanner(makeRemotePlanner(address, config.getFloat("planner_timeout_s")),
                             std::move(local));
}

}  // namespace autostage::service
