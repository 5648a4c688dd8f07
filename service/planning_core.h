#pragma once
// What the planning service does, without the transport (service/planner_server.h serves it over
// gRPC; tests call it directly). Thread-safe: the server's workers call it concurrently.
//
// Note [Planning service]
// A Plan call names its graph and profile by bytes or by hash. The core stores both (Note
// [Planner store]), computes the plan key, and answers from the store when the key is there.
// Otherwise it plans; a second call with the same key arriving while the first plans waits for
// that plan instead of planning again (in-flight calls are shared by key). Each answer carries
// the partition log lines captured while it was planned (Note [Captured log lines]), so a job
// asking the service prints what a local plan would have printed. Neighbours queues plans for
// other device counts on one background thread; WhatIf plans every point of a sweep and reports
// each point's prediction or why it does not fit, without storing them.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "core/proto/planner_service.pb.h"
#include "service/plan_call.h"
#include "service/plan_store.h"

namespace autostage::service {

class PlanningCore {
 public:
  explicit PlanningCore(std::string storeDirectory);
  ~PlanningCore();  // finishes the background plan being made, drops the queued ones

  // Throws FormatError (bad files or unknown hashes), ConfigError (options), PlanError.
  proto::PlanAnswer plan(const proto::PlanCall& call);
  proto::WhatIfAnswer whatIf(const proto::WhatIfCall& call);
  proto::NeighboursAnswer neighbours(const proto::NeighboursCall& call);
  proto::StatusAnswer status() const;

  // Counts a finished request (answered or failed) for status().
  void countRequest(bool failed);
  // Requests being answered now, for status().
  void enter() { ++inFlight_; }
  void leave() { --inFlight_; }
  const PlanStore& store() const { return store_; }
  int64_t plansMade() const { return plansMade_; }

 private:
  struct Resolved;  // a call's decoded files and its plan key
  Resolved resolve(const proto::PlanCall& call);
  proto::PlanAnswer planResolved(Resolved r, int64_t batchSize);
  // Hashes of file bytes decoded before ("graph bytes <fnv>" -> graph hash, "profile bytes
  // <fnv>" -> profile hash, "graph of profile <hash>" -> its graph hash).
  std::optional<std::string> remembered(const std::string& bytesKey);
  void remember(const std::string& bytesKey, const std::string& hash);
  void backgroundLoop();

  PlanStore store_;
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  std::atomic<int64_t> requests_{0}, failed_{0}, planCalls_{0}, storeHits_{0}, plansMade_{0},
      inFlight_{0};
  mutable std::mutex mutex_;
  std::map<std::string, std::shared_future<proto::PlanAnswer>> planning_;  // by plan key
  std::map<std::string, std::string> hashOfBytes_;                         // remembered()
  std::condition_variable backgroundWake_;
  std::deque<proto::PlanCall> backgroundQueue_;
  bool stopping_ = false;
  std::thread background_;
};

}  // namespace autostage::service
