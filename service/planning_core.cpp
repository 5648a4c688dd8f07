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
  std::string graphBytes, profileBytes;  // set when not decoded yet; empty: read from the store
  std::optional<core::Graph> graph;
  std::optional<core::GraphProfile> profile;
  core::ClusterSpec cluster;
  decomposer::PlanOptions options;
  std::string graphHash, profileHash, planKey;
  // The call whose files were known (KnownFiles) and not copied: an answer from the store needs
  // none of them. Valid until the call returns, so copied (keepFiles) before a plan thread or a
  // decode needs them.
  const proto::PlanCall* call = nullptr;

  void keepFiles() {
    if (!call) return;
    if (!graph && graphBytes.empty()) graphBytes = call->graph();
    if (!profile && profileBytes.empty()) profileBytes = call->profile();
    call = nullptr;
  }
  void decode(PlanStore& store) {
    keepFiles();
    if (!graph) {
      if (graphBytes.empty()) graphBytes = stored(store, "graphs", graphHash, "graph");
      graph = core::decodeGraph(graphBytes, "graph " + graphHash);
    }
    if (!profile) {
      if (profileBytes.empty()) profileBytes = stored(store, "profiles", profileHash, "profile");
      profile = core::decodeProfile(profileBytes, "profile " + profileHash);
    }
  }
  // A file named by hash, evicted (Note [Store eviction]) since the call was resolved.
  static std::string stored(PlanStore& store, const std::string& kind, const std::string& hash,
                            const std::string& what) {
    auto bytes = store.get(kind, hash);
    AUTOSTAGE_CHECK_AS(FormatError, bytes.has_value(), what, " ", hash,
                       " is no longer in the service's store: send the ", what, " file's bytes");
    return std::move(*bytes);
  }
};

struct PlanningCore::Settings {
  core::ClusterSpec cluster;
  decomposer::PlanOptions options;
  std::string clusterHash, optionsText;  // for the plan key
};

struct PlanningCore::InFlight {
  std::promise<proto::PlanAnswer> promise;
  std::shared_future<proto::PlanAnswer> result = promise.get_future().share();
  std::atomic<int> waiters{0};  // calls waiting for it now
};

namespace {
// How often a waiting call looks at its caller and the limit (Note [Call deadlines]).
constexpr auto kCallerPoll = std::chrono::milliseconds(20);
// Distinct cluster and option sets kept decoded (settingsOf); beyond, the memo starts again.
constexpr size_t kSettingsKept = 1024;
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

std::optional<std::string> PlanningCore::graphOfProfile(const std::string& profileHash) const {
  std::shared_lock<std::shared_mutex> lock(memoMutex_);
  auto found = graphOfProfile_.find(profileHash);
  return found == graphOfProfile_.end() ? std::nullopt : std::optional<std::string>(found->second);
}

void PlanningCore::rememberGraphOfProfile(const std::string& profileHash,
                                          const std::string& graphHash) {
  std::unique_lock<std::shared_mutex> lock(memoMutex_);
  graphOfProfile_[profileHash] = graphHash;
}

// Decoding a call's options makes a config of every option, which costs more than the rest of an
// answer from the store; so each distinct set of cluster bytes, usage and options is decoded once.
std::shared_ptr<const PlanningCore::Settings> PlanningCore::settingsOf(
    const proto::PlanCall& call) {
  std::vector<std::pair<std::string, std::string>> options(call.options().begin(),
                                                           call.options().end());
  std::sort(options.begin(), options.end());  // a protobuf map's order is not its content
  std::string id = call.cluster() + '\0' + call.usage();
  for (const auto& [key, value] : options) id += '\0' + key + '=' + value;
  {
    std::shared_lock<std::shared_mutex> lock(memoMutex_);
    auto found = settings_.find(id);
    if (found != settings_.end()) return found->second;
  }
  auto settings = std::make_shared<Settings>();
  settings->cluster = core::decodeClusterSpec(call.cluster(), "the call's cluster");
  settings->options = optionsOf(call);
  settings->clusterHash = core::fnv1aHex(core::encodeClusterSpec(settings->cluster));
  settings->optionsText = settings->options.toString();
  std::unique_lock<std::shared_mutex> lock(memoMutex_);
  if (settings_.size() >= kSettingsKept) settings_.clear();
  settings_.emplace(std::move(id), settings);
  return settings;
}

std::optional<std::string> PlanningCore::profileOfKey(const std::string& keyHash) {
  auto hash = profileKeys_.read(store_, "profile-keys", keyHash, [](const std::string& bytes) {
    return std::make_shared<const std::string>(bytes);
  });
  return hash ? std::optional<std::string>(*hash) : std::nullopt;
}

PlanningCore::Resolved PlanningCore::resolve(const proto::PlanCall& call) {
  Resolved r;
  AUTOSTAGE_CHECK_AS(ConfigError, call.batch_size() >= 1,
                     "planning call: batch_size must be at "
                     "least 1 (the global batch), got ",
                     call.batch_size());
  if (!call.graph().empty()) {
    if (auto known = knownFiles_.find("graph", call.graph())) {  // decoded before
      r.graphHash = *known;
      r.call = &call;
      // Stored again when it was evicted (Note [Store eviction]), for calls by hash.
      if (!store_.contains("graphs", r.graphHash)) store_.put("graphs", r.graphHash, call.graph());
    } else {
      r.graph = core::decodeGraph(call.graph(), "the call's graph");
      r.graphHash = r.graph->hash();
      if (!store_.contains("graphs", r.graphHash)) store_.put("graphs", r.graphHash, call.graph());
      knownFiles_.add("graph", call.graph(), r.graphHash);
    }
  } else {
    AUTOSTAGE_CHECK_AS(FormatError, !call.graph_hash().empty(),
                       "planning call without a graph: "
                       "send the graph file's bytes, or graph_hash of one the service stored");
    // Read when a plan is made (Resolved::decode): an answer from the store needs the hash only.
    AUTOSTAGE_CHECK_AS(FormatError, store_.contains("graphs", call.graph_hash()), "graph ",
                       call.graph_hash(),
                       " is not in the service's store: send the graph file's bytes");
    r.graphHash = call.graph_hash();
  }
  if (!call.profile().empty()) {
    if (auto known = knownFiles_.find("profile", call.profile())) {
      r.profileHash = *known;
      r.call = &call;
      if (!store_.contains("profiles", r.profileHash)) {  // evicted: stored again, canonical
        r.profile = core::decodeProfile(call.profile(), "the call's profile");
        store_.put("profiles", r.profileHash, core::encodeProfile(*r.profile));
      }
    } else {
      r.profile = core::decodeProfile(call.profile(), "the call's profile");
      std::string canonical = core::encodeProfile(*r.profile);  // the writer's version aside
      r.profileHash = core::fnv1aHex(canonical);
      if (!store_.contains("profiles", r.profileHash))
        store_.put("profiles", r.profileHash, canonical);
      knownFiles_.add("profile", call.profile(), r.profileHash);
      rememberGraphOfProfile(r.profileHash, r.profile->graphHash);
    }
    if (!call.profile_key().empty()) {  // written when it changes, not on every call
      const std::string keyHash = core::fnv1aHex(call.profile_key());
      if (profileOfKey(keyHash) != r.profileHash) {
        if (auto version = store_.put("profile-keys", keyHash, r.profileHash))
          profileKeys_.put(keyHash, *version, std::make_shared<const std::string>(r.profileHash),
                           static_cast<int64_t>(keyHash.size() + r.profileHash.size()));
      }
    }
  } else {
    std::string hash = call.profile_hash();
    if (hash.empty() && !call.profile_key().empty()) {
      auto known = profileOfKey(core::fnv1aHex(call.profile_key()));
      if (!known) throw NotStored("the service has no profile for this profile_key yet: send one");
      hash = *known;
      // Note [Store eviction]: a key whose profile was evicted is a key without a profile.
      if (!store_.contains("profiles", hash))
        throw NotStored("the service's profile for this profile_key (" + hash +
                        ") was evicted from its store: send one");
    } else {
      AUTOSTAGE_CHECK_AS(FormatError, !hash.empty(),
                         "planning call without a profile: send the "
                         "profile file's bytes, its profile_hash or a profile_key");
      AUTOSTAGE_CHECK_AS(FormatError, store_.contains("profiles", hash), "profile ", hash,
                         " is not in the service's store: send the profile file's bytes");
    }
    r.profileHash = hash;
  }
  auto profileGraph = graphOfProfile(r.profileHash);
  if (!profileGraph) {  // a stored profile not decoded since the service started
    r.keepFiles();
    const bool fromStore = r.profileBytes.empty();
    if (fromStore) r.profileBytes = Resolved::stored(store_, "profiles", r.profileHash, "profile");
    try {
      r.profile = core::decodeProfile(r.profileBytes, "stored profile " + r.profileHash);
    } catch (const FormatError& e) {
      if (!fromStore) throw;
      // A damaged store file: reported once and removed; the caller sends the profile again.
      core::logger("Service")->warn("{}: removed from the store", e.what());
      store_.discard("profiles", r.profileHash);
      throw NotStored(std::string("the service's stored profile ") + r.profileHash +
                      " was damaged and removed: send one");
    }
    profileGraph = r.profile->graphHash;
    rememberGraphOfProfile(r.profileHash, *profileGraph);
  }
  AUTOSTAGE_CHECK_AS(FormatError, profileGraph->empty() || *profileGraph == r.graphHash,
                     "the profile is of graph ", *profileGraph, ", not of the call's graph ",
                     r.graphHash, ": profile the graph you send");
  const std::shared_ptr<const Settings> settings = settingsOf(call);
  r.cluster = settings->cluster;
  r.options = settings->options;
  // Stored plans are found by this key across versions of the service: keep its text.
  r.planKey =
      core::fnv1aHex(r.graphHash + '\n' + r.profileHash + '\n' + settings->clusterHash + '\n' +
                     std::to_string(call.batch_size()) + '\n' + settings->optionsText);
  return r;
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

proto::WhatIfAnswer PlanningCore::whatIf(const proto::WhatIfCall& call, const CallerCheck& caller) {
  const auto limit = std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                         std::chrono::duration<double>(options_.maxPlanSeconds));
  Resolved base = resolve(call.base());
  base.decode(store_);
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
  // next unplanned point. This thread watches the caller and the limit meanwhile (it alone asks
  // the caller: a gRPC context is not asked from several threads) and, when the caller left or
  // the limit passed, lets no thread take another point (Note [Call deadlines]).
  // Points are taken under `takeMutex`, which the poller holds while it asks the caller and,
  // when the caller left, ends the sweep: no thread takes a point between the caller saying so
  // and the sweep stopping, however the threads are scheduled.
  std::atomic<int> planned{0};
  int next = 0;
  std::mutex takeMutex;
  auto take = [&] {
    std::lock_guard<std::mutex> lock(takeMutex);
    return next++;
  };
  const int threads =
      std::min<int>(answer.points_size(), std::max(1u, std::thread::hardware_concurrency()));
  std::mutex doneMutex;
  std::condition_variable done;
  int working = threads;
  auto work = [&] {
    for (int i = take(); i < answer.points_size(); i = take()) {
      planPoint(base, answer.mutable_points(i));
      ++planned;
    }
    std::lock_guard<std::mutex> lock(doneMutex);
    --working;
    done.notify_all();
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(work);
  std::exception_ptr stop;
  {
    std::unique_lock<std::mutex> lock(doneMutex);
    while (!done.wait_for(lock, kCallerPoll, [&] { return working == 0; })) {
      if (stop) continue;
      std::lock_guard<std::mutex> taking(takeMutex);
      try {
        checkCaller(caller, limit, "WhatIf", "the sweep stopped");
      } catch (const Error&) {
        stop = std::current_exception();
        next = answer.points_size();  // no thread takes another point
      }
    }
  }
  for (std::thread& t : pool) t.join();
  if (stop) {
    core::logger("Service")->info("WhatIf stopped after {} of {} point(s)", planned.load(),
                                  answer.points_size());
    std::rethrow_exception(stop);
  }
  return answer;
}

void PlanningCore::planPoint(const Resolved& base, proto::WhatIfPoint* point) {
  try {
    if (planHook_) planHook_();
    core::ClusterSpec cluster = base.cluster;
    cluster.devices = point->devices();
    cluster.devicesPerNode = std::min(std::max(1, cluster.devicesPerNode), point->devices());
    cluster.memoryPerDevice = static_cast<int64_t>(core::gibToBytes(point->device_memory_gib()));
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
      // Not a client's call: not counted, and not limited.
      planResolved(resolve(call), call.batch_size(), {},
                   std::chrono::steady_clock::time_point::max(), /*counted=*/false);
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
    s.set_waiting_for_worker(waitingForSlot_);
  }
  s.set_store_dir(store_.directory());
  s.set_store_evictions(store_.evictions());
  s.set_store_max_bytes(store_.maxBytes());
  return s;
}

}  // namespace autostage::service
