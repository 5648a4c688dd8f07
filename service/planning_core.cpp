#include "service/planning_core.h"

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

namespace autostage::service {
namespace {
// Stored answers are framed files (core/proto/file_format.h): a torn or altered entry fails its
// hash check and is planned again instead of being served.
const char* const kAnswerKind = "plan-answer";
constexpr uint32_t kAnswerVersion = 1;
}  // namespace

// A call's files, decoded only when a plan is made (Note [Planning service]: an answer from the
// store needs the hashes only, and decoding a large graph costs more than the rest of the call).
struct PlanningCore::Resolved {
  std::string graphBytes, profileBytes;  // set when not decoded yet
  std::optional<core::Graph> graph;
  std::optional<core::GraphProfile> profile;
  core::ClusterSpec cluster;
  decomposer::PlanOptions options;
  std::string graphHash, profileHash, planKey;

  void decode() {
    if (!graph) graph = core::decodeGraph(graphBytes, "graph " + graphHash);
    if (!profile) profile = core::decodeProfile(profileBytes, "profile " + profileHash);
  }
};

PlanningCore::PlanningCore(std::string storeDirectory)
    : store_(std::move(storeDirectory)), background_([this] { backgroundLoop(); }) {}

PlanningCore::~PlanningCore() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    backgroundQueue_.clear();
  }
  backgroundWake_.notify_all();
  background_.join();
}

std::optional<std::string> PlanningCore::remembered(const std::string& bytesKey) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = hashOfBytes_.find(bytesKey);
  return found == hashOfBytes_.end() ? std::nullopt : std::optional<std::string>(found->second);
}

void PlanningCore::remember(const std::string& bytesKey, const std::string& hash) {
  std::lock_guard<std::mutex> lock(mutex_);
  hashOfBytes_[bytesKey] = hash;
}

PlanningCore::Resolved PlanningCore::resolve(const proto::PlanCall& call) {
  Resolved r;
  AUTOSTAGE_CHECK_AS(ConfigError, call.batch_size() >= 1,
                     "planning call: batch_size must be at "
                     "least 1 (the global batch), got ",
                     call.batch_size());
  if (!call.graph().empty()) {
    const std::string bytesKey = "graph bytes " + core::fnv1aHex(call.graph());
    if (auto known = remembered(bytesKey)) {  // these exact bytes were decoded before
      r.graphHash = *known;
      r.graphBytes = call.graph();
    } else {
      r.graph = core::decodeGraph(call.graph(), "the call's graph");
      r.graphHash = r.graph->hash();
      if (!store_.get("graphs", r.graphHash)) store_.put("graphs", r.graphHash, call.graph());
      remember(bytesKey, r.graphHash);
    }
  } else {
    AUTOSTAGE_CHECK_AS(FormatError, !call.graph_hash().empty(),
                       "planning call without a graph: "
                       "send the graph file's bytes, or graph_hash of one the service stored");
    auto bytes = store_.get("graphs", call.graph_hash());
    AUTOSTAGE_CHECK_AS(FormatError, bytes.has_value(), "graph ", call.graph_hash(),
                       " is not in "
                       "the service's store: send the graph file's bytes");
    r.graphBytes = std::move(*bytes);
    r.graphHash = call.graph_hash();
  }
  if (!call.profile().empty()) {
    const std::string bytesKey = "profile bytes " + core::fnv1aHex(call.profile());
    if (auto known = remembered(bytesKey)) {
      r.profileHash = *known;
      r.profileBytes = call.profile();
    } else {
      r.profile = core::decodeProfile(call.profile(), "the call's profile");
      std::string canonical = core::encodeProfile(*r.profile);  // the writer's version aside
      r.profileHash = core::fnv1aHex(canonical);
      if (!store_.get("profiles", r.profileHash)) store_.put("profiles", r.profileHash, canonical);
      remember(bytesKey, r.profileHash);
      remember("graph of profile " + r.profileHash, r.profile->graphHash);
    }
    if (!call.profile_key().empty())
      store_.put("profile-keys", core::fnv1aHex(call.profile_key()), r.profileHash);
  } else {
    std::string hash = call.profile_hash();
    if (hash.empty() && !call.profile_key().empty()) {
      auto known = store_.get("profile-keys", core::fnv1aHex(call.profile_key()));
      if (!known) throw NotStored("the service has no profile for this profile_key yet: send one");
      hash = *known;
    }
    AUTOSTAGE_CHECK_AS(FormatError, !hash.empty(),
                       "planning call without a profile: send the "
                       "profile file's bytes, its profile_hash or a profile_key");
    auto bytes = store_.get("profiles", hash);
    AUTOSTAGE_CHECK_AS(FormatError, bytes.has_value(), "profile ", hash,
                       " is not in the "
                       "service's store: send the profile file's bytes");
    r.profileBytes = std::move(*bytes);
    r.profileHash = hash;
  }
  auto profileGraph = remembered("graph of profile " + r.profileHash);
  if (!profileGraph) {  // a stored profile not decoded since the service started
    r.profile = core::decodeProfile(r.profileBytes, "stored profile " + r.profileHash);
    profileGraph = r.profile->graphHash;
    remember("graph of profile " + r.profileHash, *profileGraph);
  }
  AUTOSTAGE_CHECK_AS(FormatError, profileGraph->empty() || *profileGraph == r.graphHash,
                     "the profile is of graph ", *profileGraph, ", not of the call's graph ",
                     r.graphHash, ": profile the graph you send");
  r.cluster = core::decodeClusterSpec(call.cluster(), "the call's cluster");
  r.options = optionsOf(call);
  std::ostringstream key;
  key << r.graphHash << '\n'
      << r.profileHash << '\n'
      << core::fnv1aHex(core::encodeClusterSpec(r.cluster)) << '\n'
      << call.batch_size() << '\n'
      << r.options.toString();
  r.planKey = core::fnv1aHex(key.str());
  return r;
}

proto::PlanAnswer PlanningCore::plan(const proto::PlanCall& call) {
  ++planCalls_;
  return planResolved(resolve(call), call.batch_size());
}

proto::PlanAnswer PlanningCore::planResolved(Resolved r, int64_t batchSize) {
  auto fromStore = [&]() -> std::optional<proto::PlanAnswer> {
    auto stored = store_.get("plans", r.planKey);
    if (!stored) return std::nullopt;
    try {
      proto::PlanAnswer answer = core::parsePayload<proto::PlanAnswer>(
          core::decodeFramed(*stored, kAnswerKind, kAnswerVersion, "stored plan " + r.planKey),
          "stored plan " + r.planKey);
      answer.set_from_store(true);
      return answer;
    } catch (const FormatError& e) {
      core::logger("Service")->warn("{}: planning again", e.what());
      return std::nullopt;
    }
  };
  std::shared_future<proto::PlanAnswer> result;
  std::promise<proto::PlanAnswer> promise;
  bool mine = false;
  {
    // Under the lock, so that a plan finished (stored, and no longer in planning_) between a
    // first look at the store and here is found, not planned again.
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto answer = fromStore()) {
      ++storeHits_;
      return *answer;
    }
    auto found = planning_.find(r.planKey);
    if (found != planning_.end()) {
      result = found->second;
    } else {
      result = promise.get_future().share();
      planning_.emplace(r.planKey, result);
      mine = true;
    }
  }
  if (!mine) {  // Note [Planning service]: the same plan is being made; wait for it
    proto::PlanAnswer answer = result.get();
    ++storeHits_;
    answer.set_from_store(true);
    return answer;
  }
  try {
    r.decode();
    proto::PlanAnswer answer = answerPlan(*r.graph, *r.profile, r.cluster, batchSize, r.options);
    answer.set_graph_hash(r.graphHash);
    answer.set_profile_hash(r.profileHash);
    answer.set_plan_key(r.planKey);
    store_.put("plans", r.planKey,
               core::encodeFramed(kAnswerKind, kAnswerVersion, answer.SerializeAsString()));
    ++plansMade_;
    promise.set_value(answer);
  } catch (...) {
    promise.set_exception(std::current_exception());
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    planning_.erase(r.planKey);
  }
  return result.get();  // rethrows the planning error
}

proto::WhatIfAnswer PlanningCore::whatIf(const proto::WhatIfCall& call) {
  Resolved base = resolve(call.base());
  base.decode();
  auto orBase = [](auto list, auto value) {
    using T = decltype(value);
    std::vector<T> values(list.begin(), list.end());
    if (values.empty()) values.push_back(value);
    return values;
  };
  const auto devices = orBase(call.devices(), base.cluster.devices);
  const auto memories = orBase(call.device_memory_gib(),
                               static_cast<double>(base.cluster.memoryPerDevice) / (1 << 30));
  const auto batches = orBase(call.batch_sizes(), call.base().batch_size());
  const auto schedules = orBase(call.schedules(), base.options.schedule);
  AUTOSTAGE_CHECK_AS(
      ConfigError, devices.size() * memories.size() * batches.size() * schedules.size() <= 4096,
      "a what-if sweep of ", devices.size() * memories.size() * batches.size() * schedules.size(),
      " points is too large: at most 4096 per call");
  proto::WhatIfAnswer answer;
  for (int32_t n : devices)
    for (double gib : memories)
      for (int64_t batch : batches)
        for (const std::string& schedule : schedules) {
          proto::WhatIfPoint* point = answer.add_points();
          point->set_devices(n);
          point->set_device_memory_gib(gib);
          point->set_batch_size(batch);
          point->set_schedule_option(schedule);
        }
  // The points are independent plans: plan them on the machine's cores, each thread taking the
  // next unplanned point.
  std::atomic<int> next{0};
  auto work = [&] {
    for (int i = next++; i < answer.points_size(); i = next++) {
      proto::WhatIfPoint* point = answer.mutable_points(i);
      try {
        core::ClusterSpec cluster = base.cluster;
        cluster.devices = point->devices();
        cluster.devicesPerNode = std::min(std::max(1, cluster.devicesPerNode), point->devices());
        cluster.memoryPerDevice =
            static_cast<int64_t>(core::gibToBytes(point->device_memory_gib()));
        cluster.validate();
        decomposer::PlanOptions options = base.options;
        options.schedule = point->schedule_option();
        options.validate();
        proto::PlanAnswer plan =
            answerPlan(*base.graph, *base.profile, cluster, point->batch_size(), options);
        point->set_feasible(true);
        point->set_iteration_seconds(plan.iteration_seconds());
        point->set_peak_bytes(plan.peak_bytes());
        point->set_stages(plan.stages());
        point->set_micro_batches(plan.micro_batches());
        point->set_schedule(plan.schedule());
        point->set_replicas(replicasOf(plan.deployment()));
      } catch (const Error& e) {
        point->set_feasible(false);
        point->set_error(e.what());
      }
    }
  };
  const int threads =
      std::min<int>(answer.points_size(), std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  return answer;
}

proto::NeighboursAnswer PlanningCore::neighbours(const proto::NeighboursCall& call) {
  Resolved base = resolve(call.base());  // checks the call before anything is queued
  AUTOSTAGE_CHECK_AS(ConfigError, call.spread() >= 1 && call.spread() <= 64,
                     "neighbours: spread "
                     "must be in [1, 64] device counts, got ",
                     call.spread());
  proto::NeighboursAnswer answer;
  std::lock_guard<std::mutex> lock(mutex_);
  for (int n = base.cluster.devices - call.spread(); n <= base.cluster.devices + call.spread();
       ++n) {
    if (n < 1 || n == base.cluster.devices) continue;
    proto::PlanCall other = call.base();
    // Stored by hash now: the queue holds no copies of the files.
    other.clear_graph();
    other.set_graph_hash(base.graphHash);
    other.clear_profile();
    other.set_profile_hash(base.profileHash);
    core::ClusterSpec cluster = base.cluster;
    cluster.devices = n;
    cluster.devicesPerNode = std::min(cluster.devicesPerNode, n);
    other.set_cluster(core::encodeClusterSpec(cluster));
    backgroundQueue_.push_back(std::move(other));
    answer.add_queued(n);
  }
  backgroundWake_.notify_all();
  return answer;
}

void PlanningCore::backgroundLoop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    backgroundWake_.wait(lock, [&] { return stopping_ || !backgroundQueue_.empty(); });
    if (stopping_) return;
    proto::PlanCall call = std::move(backgroundQueue_.front());
    backgroundQueue_.pop_front();
    lock.unlock();
    try {
      planResolved(resolve(call), call.batch_size());  // not a client's call: not counted
    } catch (const std::exception& e) {  // a neighbour that does not fit is not an error
      core::logger("Service")->info("background plan not made: {}", e.what());
    }
    lock.lock();
  }
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
  }
  s.set_store_dir(store_.directory());
  return s;
}

}  // namespace autostage::service
