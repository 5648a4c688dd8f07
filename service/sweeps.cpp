// The planning core's sweeps (service/planning_core.h, Note [Planning service]): a what-if sweep
// planned on threads of its own and watched by the calling thread (Note [Call deadlines]), and
// the neighbours' plans queued for the background thread.
#include "service/planning_core.h"

#include <algorithm>
#include <sstream>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/ir/graph.h"
#include "core/log.h"
#include "core/proto/cluster_file.h"
#include "core/proto/deployment_file.h"
#include "core/proto/graph_file.h"
#include "core/proto/profile_file.h"
#include "service/plan_call.h"
#include "service/planning_core_internal.h"

namespace autostage::service {

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
    const core::Deployment deployment = core::decodeDeployment(plan.deployment(), "a what-if plan");
    point->set_replicas(replicasOf(deployment));
    point->set_tensor_parallel(tensorParallelOf(deployment));
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


}  // namespace autostage::service
