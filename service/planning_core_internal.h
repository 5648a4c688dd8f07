#pragma once
// The planning core's own parts (service/planning_core.h), shared by the files that implement
// it: planning_core.cpp (plans, deadlines, the store's answers), call_resolution.cpp (a call's
// files, settings and plan key) and sweeps.cpp (what-if sweeps, neighbours, background plans).
// Not for other callers.

#include <atomic>
#include <chrono>
#include <future>
#include <optional>
#include <string>

#include "core/cluster_spec.h"
#include "core/ir/graph.h"
#include "core/profile.h"
#include "decomposer/plan.h"
#include "service/plan_store.h"
#include "service/planning_core.h"

namespace autostage::service {

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


// How often a waiting call looks at its caller and the limit (Note [Call deadlines]).
constexpr auto kCallerPoll = std::chrono::milliseconds(20);

}  // namespace autostage::service
