// The planning core's call resolution (service/planning_core.h, Note [Planning service]): a
// call's graph and profile by bytes, hash or profile key, its cluster and options decoded once,
// and its plan key.
#include "service/planning_core.h"

#include <algorithm>
#include <shared_mutex>
#include <vector>

#include "core/error.h"
#include "core/ir/graph.h"
#include "core/log.h"
#include "core/proto/cluster_file.h"
#include "core/proto/graph_file.h"
#include "core/proto/profile_file.h"
#include "service/plan_call.h"
#include "service/planning_core_internal.h"

namespace autostage::service {
namespace {
// Distinct cluster and option sets kept decoded (settingsOf); beyond, the memo starts again.
constexpr size_t kSettingsKept = 1024;
}  // namespace

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


}  // namespace autostage::service
