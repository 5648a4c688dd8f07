#pragma once
// What the planning service does, without the transport (service/planner_server.h serves it over
// gRPC; tests call it directly). Thread-safe: the server's workers call it concurrently.
//
// Note [Planning service]
// A Plan call names its graph and profile by bytes or by hash. The core stores both (Note
// [Planner store]), computes the plan key, and answers from the store when the key is there:
// from memory, the answer decoded and verified once (Note [Answers from memory]).
// Otherwise it plans; a second call with the same key arriving while the first plans waits for
// that plan instead of planning again (in-flight calls are shared by key). Each answer carries
// the partition log lines captured while it was planned (Note [Captured log lines]), so a job
// asking the service prints what a local plan would have printed. Neighbours queues plans for
// other device counts on one background thread; WhatIf plans every point of a sweep and reports
// each point's prediction or why it does not fit, without storing them.
//
// Note [Call deadlines]
// planGraph cannot be interrupted, so a call never plans on its own thread: a plan is made on a
// thread of the core (one per plan being made, at most maxConcurrentPlans of them for calls), and
// the call waits for it, asking its CallerCheck and the service's limit (maxPlanSeconds, from the
// call's start) every few milliseconds. When the caller's deadline passes or it goes away, or the
// limit is reached, the call stops waiting and fails (DeadlineExceeded, CallCancelled) while the
// plan goes on: when it is made it is stored, so the next identical call is answered from the
// store, and an identical call arriving meanwhile waits for it (still planned once). A new plan
// beyond maxConcurrentPlans waits for a slot, asking its caller and the limit as above: a burst of
// jobs is answered, one slot after another, while a caller that leaves before its plan started
// leaves nothing behind, so callers that left occupy at most maxConcurrentPlans threads
// (Neighbours' background plans, one at a time, are not counted). A WhatIf
// sweep is not stored: the calling thread watches the caller and the limit while the sweep's
// threads plan, and when either ends the wait no thread takes another point; the call returns
// when the points being planned at that moment are done (one planGraph each at most). Only the
// calling thread asks the CallerCheck. The core's destructor waits for the plans being made, so
// everything a plan thread touches (the core, its store, the test hook) outlives it.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/proto/planner_service.pb.h"
#include "service/known_files.h"
#include "service/plan_call.h"
#include "service/plan_store.h"
#include "service/stored_copies.h"

namespace autostage::service {

// Why a call stopped being waited for (Note [Call deadlines]).
class DeadlineExceeded : public Error {  // the caller's deadline, or the service's limit
  using Error::Error;
};
class CallCancelled : public Error {  // the caller went away
  using Error::Error;
};

enum class CallerState { kWaiting, kDeadlinePassed, kCancelled };
// Asked (from the call's threads) while a call is answered; empty: the caller always waits.
using CallerCheck = std::function<CallerState()>;

struct PlanningOptions {
  std::string storeDirectory;   // empty: in memory only
  int64_t storeMaxBytes = 0;    // Note [Store eviction]; 0: no limit
  int maxConcurrentPlans = 0;   // plans made at once for calls; 0: the machine's cores
  double maxPlanSeconds = 300;  // a Plan or WhatIf call fails with DeadlineExceeded after this
  // Note [Answers from memory]: at most this many bytes each of decoded answers, profile keys
  // and call files kept in memory; 0: none (every stored answer is read and verified again).
  int64_t memoryBytes = int64_t{256} << 20;
  // Print each plan's partition log as it is made, as well as keeping it in the answer: the
  // local planner (Note [One planner] in planner.h). A service keeps it only.
  bool echoLog = false;
  void validate() const;
};

class PlanningCore {
 public:
  explicit PlanningCore(PlanningOptions options);
  explicit PlanningCore(std::string storeDirectory)
      : PlanningCore(PlanningOptions{std::move(storeDirectory)}) {}
  ~PlanningCore();  // waits for the plans being made, drops the queued background ones

  // Throws FormatError (bad files or unknown hashes), ConfigError (options), PlanError, and
  // (Note [Call deadlines]) DeadlineExceeded or CallCancelled.
  proto::PlanAnswer plan(const proto::PlanCall& call, const CallerCheck& caller = {});
  proto::WhatIfAnswer whatIf(const proto::WhatIfCall& call, const CallerCheck& caller = {});
  proto::NeighboursAnswer neighbours(const proto::NeighboursCall& call);
  proto::StatusAnswer status() const;

  // Counts a finished request (answered or failed) for status().
  void countRequest(bool failed);
  // Requests being answered now, for status().
  void enter() { ++inFlight_; }
  void leave() { --inFlight_; }
  const PlanStore& store() const { return store_; }
  int64_t plansMade() const { return plansMade_; }
  const PlanningOptions& options() const { return options_; }
  // Tests: called on the planning thread before every planGraph (a plan, each WhatIf point), so
  // a test can hold planning on a latch. Set before any call.
  void setPlanHookForTesting(std::function<void()> hook) { planHook_ = std::move(hook); }

 private:
  struct Resolved;  // a call's decoded files and its plan key
  struct Settings;  // a call's cluster and planner options, decoded
  struct InFlight;  // a plan being made: its answer to come and who waits for it
  Resolved resolve(const proto::PlanCall& call);
  // counted: a call's plan (limited by maxConcurrentPlans), not a background one.
  proto::PlanAnswer planResolved(Resolved r, int64_t batchSize, const CallerCheck& caller,
                                 std::chrono::steady_clock::time_point limit, bool counted);
  // Starts a plan thread for r (under mutex_, with a slot free when counted).
  std::shared_ptr<InFlight> startPlanLocked(Resolved r, int64_t batchSize, bool counted);
  // On a plan thread: plans, stores, frees the slot, then answers the waiting calls.
  void makePlan(const std::shared_ptr<InFlight>& state, Resolved& r, int64_t batchSize,
                bool counted);
  void planPoint(const Resolved& base, proto::WhatIfPoint* point);  // one point of a WhatIf
  // Note [Answers from memory]: the stored answer, from memory when its entry is unchanged.
  std::optional<proto::PlanAnswer> fromStore(const std::string& planKey);
  // The profile hash stored under a profile key's hash, as fromStore.
  std::optional<std::string> profileOfKey(const std::string& keyHash);
  // Throws when the caller left or the limit passed; what: the call, for the message.
  void checkCaller(const CallerCheck& caller, std::chrono::steady_clock::time_point limit,
                   const std::string& what, const std::string& after) const;
  // The call's cluster and options, decoded once per distinct set (calls of a job repeat them).
  std::shared_ptr<const Settings> settingsOf(const proto::PlanCall& call);
  // The graph hash of a profile decoded before (profile hash -> its graph hash).
  std::optional<std::string> graphOfProfile(const std::string& profileHash) const;
  void rememberGraphOfProfile(const std::string& profileHash, const std::string& graphHash);
  void backgroundLoop();

  const PlanningOptions options_;
  const int maxConcurrentPlans_;
  PlanStore store_;
  // Note [Answers from memory]
  KnownFiles knownFiles_;
  StoredCopies<proto::PlanAnswer> answers_;  // by plan key
  StoredCopies<std::string> profileKeys_;    // by the profile key's hash
  mutable std::shared_mutex memoMutex_;
  std::map<std::string, std::string> graphOfProfile_;                // graphOfProfile()
  std::map<std::string, std::shared_ptr<const Settings>> settings_;  // settingsOf()
  std::function<void()> planHook_;
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  std::atomic<int64_t> requests_{0}, failed_{0}, planCalls_{0}, storeHits_{0}, plansMade_{0},
      inFlight_{0};
  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<InFlight>> planning_;  // by plan key
  // Note [Call deadlines]: the plan threads (joined when finished or at destruction).
  std::map<uint64_t, std::thread> planThreads_;
  std::vector<uint64_t> finishedPlanThreads_;
  uint64_t nextPlanThread_ = 0;
  int countedPlans_ = 0;  // plans being made for calls (not background ones)
  int waitingForSlot_ = 0;  // calls whose new plan waits for countedPlans_ to drop
  std::condition_variable slotFreed_;
  std::condition_variable backgroundWake_;
  std::deque<proto::PlanCall> backgroundQueue_;
  bool stopping_ = false;
  std::thread background_;
};

}  // namespace autostage::service
