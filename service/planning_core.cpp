// The planning core (service/planning_core.h): plans made on threads of their own and waited
// for within the caller's deadline (Note [Call deadlines]), answers kept in the store and served
// from memory (Note [Answers from memory]). Call resolution: call_resolution.cpp; sweeps:
// sweeps.cpp.
#include "service/planning_core.h"

#include <algorithm>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/ir/graph.h"
#include "core/log.h"
#include "core/proto/cluster_file.h"
#include "core/proto/file_format.h"
#include "core/proto/file_format_inl.h"
#include "core/proto/graph_file.h"
#include "core/proto/profile_file.h"
#include "service/plan_call.h"
#include "service/planning_core_internal.h"

namespace autostage::service {
namespace {
// Stored answers are framed files (core/proto/file_format.h): a torn or altered entry fails its
// hash check and is planned again instead of being served.
const char* const kAnswerKind = "plan-answer";
constexpr uint32_t kAnswerVersion = 1;
}  // namespace

void PlanningOptions::validate() const {
  AUTOSTAGE_CHECK_AS(ConfigError, storeMaxBytes >= 0,
                     "the store's size limit must be >= 0 (0: no limit), got ", storeMaxBytes,
                     " bytes");
  AUTOSTAGE_CHECK_AS(ConfigError, maxConcurrentPlans >= 0,
                     "plans made at once must be >= 0 (0: one per core), got ", maxConcurrentPlans);
  AUTOSTAGE_CHECK_AS(ConfigError, maxPlanSeconds > 0, "--max-plan-s must be > 0 seconds, got ",
                     maxPlanSeconds);
  AUTOSTAGE_CHECK_AS(ConfigError, memoryBytes >= 0,
                     "the bytes kept in memory must be >= 0 (0: none), got ", memoryBytes);
}

PlanningCore::PlanningCore(PlanningOptions options)
    : options_((options.validate(), std::move(options))),
      maxConcurrentPlans_(options_.maxConcurrentPlans > 0
                              ? options_.maxConcurrentPlans
                              : std::max(1, static_cast<int>(std::thread::hardware_concurrency()))),
      store_(options_.storeDirectory, options_.storeMaxBytes),
      knownFiles_(options_.memoryBytes),
      answers_(options_.memoryBytes),
      profileKeys_(options_.memoryBytes),
      background_([this] { backgroundLoop(); }) {}

PlanningCore::~PlanningCore() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    backgroundQueue_.clear();
  }
  backgroundWake_.notify_all();
  background_.join();
  // Note [Call deadlines]: plans whose callers left are finished (and stored) before the store
  // and the core go away.
  std::map<uint64_t, std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    threads.swap(planThreads_);
    if (!planning_.empty())
      core::logger("Service")->info("waiting for {} plan(s) still being made; they are stored",
                                    planning_.size());
  }
  for (auto& [id, thread] : threads) thread.join();
}

proto::PlanAnswer PlanningCore::plan(const proto::PlanCall& call, const CallerCheck& caller) {
  const auto limit = std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                         std::chrono::duration<double>(options_.maxPlanSeconds));
  ++planCalls_;
  return planResolved(resolve(call), call.batch_size(), caller, limit, /*counted=*/true);
}

std::optional<proto::PlanAnswer> PlanningCore::fromStore(const std::string& planKey) {
  const std::string origin = "stored plan " + planKey;
  try {
    auto answer = answers_.read(store_, "plans", planKey, [&](const std::string& bytes) {
      auto decoded = std::make_shared<proto::PlanAnswer>(core::parsePayload<proto::PlanAnswer>(
          core::decodeFramed(bytes, kAnswerKind, kAnswerVersion, origin), origin));
      decoded->set_from_store(true);
      return std::shared_ptr<const proto::PlanAnswer>(std::move(decoded));
    });
    if (!answer) return std::nullopt;
    return *answer;
  } catch (const FormatError& e) {
    core::logger("Service")->warn("{}: removed from the store, planning again", e.what());
    store_.discard("plans", planKey);
    answers_.erase(planKey);
    return std::nullopt;
  }
}

void PlanningCore::checkCaller(const CallerCheck& caller,
                               std::chrono::steady_clock::time_point limit, const std::string& what,
                               const std::string& after) const {
  const CallerState state = caller ? caller() : CallerState::kWaiting;
  if (state == CallerState::kDeadlinePassed)
    throw DeadlineExceeded(what + ": the caller's deadline passed; " + after);
  if (state == CallerState::kCancelled) throw CallCancelled(what + ": the caller left; " + after);
  if (std::chrono::steady_clock::now() >= limit) {
    std::ostringstream seconds;
    seconds << options_.maxPlanSeconds;
    throw DeadlineExceeded(what + " took longer than the service's limit of " + seconds.str() +
                           " s per call (its --max-plan-s); " + after);
  }
}

// Note [Call deadlines]: a plan is made on a plan thread; the call waits for it while its caller
// does and the limit allows.
proto::PlanAnswer PlanningCore::planResolved(Resolved r, int64_t batchSize,
                                             const CallerCheck& caller,
                                             std::chrono::steady_clock::time_point limit,
                                             bool counted) {
  std::shared_ptr<InFlight> state;
  bool mine = false;
  const std::string planKey = r.planKey;
  // The store is thread-safe: answers from it do not wait for the core's lock.
  if (auto answer = fromStore(planKey)) {
    ++storeHits_;
    return std::move(*answer);
  }
  {
    // Again under the lock, so that a plan finished (stored, and no longer in planning_) since
    // the first look is found, not planned again. A new plan beyond the slots waits for one while
    // its caller waits (Note [Call deadlines]); meanwhile the same plan may be started by another
    // call or even finished, so every look starts from the store.
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      if (auto answer = fromStore(planKey)) {
        ++storeHits_;
        return std::move(*answer);
      }
      auto found = planning_.find(planKey);
      if (found != planning_.end()) {
        state = found->second;  // Note [Planning service]: the same plan is being made
        ++state->waiters;
        break;
      }
      if (!counted || countedPlans_ < maxConcurrentPlans_) {
        state = startPlanLocked(std::move(r), batchSize, counted);
        mine = true;
        break;
      }
      ++waitingForSlot_;
      slotFreed_.wait_for(lock, kCallerPoll);
      --waitingForSlot_;
      lock.unlock();
      checkCaller(caller, limit, "plan " + planKey,
                  "it waited for one of the service's --workers and was not started");
      lock.lock();
    }
  }
  struct Leave {  // a waiter less, however the wait ends
    InFlight& state;
    ~Leave() { --state.waiters; }
  } leave{*state};
  while (state->result.wait_for(kCallerPoll) != std::future_status::ready)
    checkCaller(caller, limit, "plan " + planKey,
                "it goes on and is stored when made, so asking again then is answered from "
                "the store");
  proto::PlanAnswer answer = state->result.get();  // rethrows the planning error
  if (!mine) {
    ++storeHits_;
    answer.set_from_store(true);
    answer.set_joined_in_flight(true);
  }
  return answer;
}

std::shared_ptr<PlanningCore::InFlight> PlanningCore::startPlanLocked(Resolved r, int64_t batchSize,
                                                                      bool counted) {
  AUTOSTAGE_INTERNAL_ASSERT(!counted || countedPlans_ < maxConcurrentPlans_,
                            "a plan started beyond the service's --workers (", countedPlans_,
                            " being made)");
  for (uint64_t id : finishedPlanThreads_) {  // threads done since the last plan
    planThreads_.at(id).join();
    planThreads_.erase(id);
  }
  finishedPlanThreads_.clear();
  r.keepFiles();  // the plan thread outlives the call
  auto state = std::make_shared<InFlight>();
  state->waiters = 1;  // the caller, before the thread starts
  const std::string planKey = r.planKey;
  const uint64_t id = nextPlanThread_++;
  planThreads_.emplace(
      id, std::thread([this, state, id, counted, batchSize, r = std::move(r)]() mutable {
        makePlan(state, r, batchSize, counted);
        std::lock_guard<std::mutex> lock(mutex_);
        finishedPlanThreads_.push_back(id);
      }));  // a thread that cannot start throws here, before anything waits for it
  planning_.emplace(planKey, state);
  countedPlans_ += counted ? 1 : 0;
  return state;
}

void PlanningCore::makePlan(const std::shared_ptr<InFlight>& state, Resolved& r, int64_t batchSize,
                            bool counted) {
  std::optional<proto::PlanAnswer> answer;
  std::exception_ptr error;
  try {
    if (planHook_) planHook_();
    r.decode(store_);
    answer = answerPlan(*r.graph, *r.profile, r.cluster, batchSize, r.options, options_.echoLog);
    answer->set_graph_hash(r.graphHash);
    answer->set_profile_hash(r.profileHash);
    answer->set_plan_key(r.planKey);
  } catch (const std::exception& e) {
    error = std::current_exception();
    if (state->waiters == 0)
      core::logger("Service")->info("plan {} not made, after its caller(s) left: {}", r.planKey,
                                    e.what());
  }
  {
    // The slot is free before anyone can see the answer (in the store or from the future), so
    // that a caller's next plan is not refused as busy because of this one.
    std::lock_guard<std::mutex> lock(mutex_);
    countedPlans_ -= counted ? 1 : 0;
  }
  if (counted) slotFreed_.notify_all();
  if (answer) {
    const std::string framed =
        core::encodeFramed(kAnswerKind, kAnswerVersion, answer->SerializeAsString());
    if (auto version = store_.put("plans", r.planKey, framed)) {  // Note [Answers from memory]
      auto stored = std::make_shared<proto::PlanAnswer>(*answer);
      stored->set_from_store(true);
      answers_.put(r.planKey, *version, std::move(stored), static_cast<int64_t>(framed.size()));
    }
    ++plansMade_;
    if (state->waiters == 0)
      core::logger("Service")->info("plan {} made after its caller(s) left: stored", r.planKey);
  }
  {
    // Stored first, then no longer in planning_: a call looking meanwhile finds one or the other.
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = planning_.find(r.planKey);
    if (found != planning_.end() && found->second == state) planning_.erase(found);
  }
  if (answer)
    state->promise.set_value(std::move(*answer));
  else
    state->promise.set_exception(error);
}


void PlanningCore::countRequest(bool failed) {
  ++requests_;
  if (failed) ++failed_;
}

proto::StatusAnswer PlanningCore::status() const {
  proto::StatusAnswer s;
  s.set_uptime_seconds(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count());
  s.set_requests(requests_);
  s.set_failed(failed_);
  s.set_plans_made(plansMade_);
  s.set_store_hits(storeHits_);
  s.set_in_flight(inFlight_);
  s.set_store_entries(store_.entries());
  s.set_store_bytes(store_.bytes());
  s.set_hit_rate(planCalls_ > 0 ? static_cast<double>(storeHits_) / planCalls_ : 0.0);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    s.set_background_queued(static_cast<int64_t>(backgroundQueue_.size()));
    s.set_waiting_for_worker(waitingForSlot_);
  }
  s.set_store_dir(store_.directory());
  s.set_store_evictions(store_.evictions());
  s.set_store_max_bytes(store_.maxBytes());
  return s;
}


}  // namespace autostage::service
