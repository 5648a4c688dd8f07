#include "tests/fuzz/fuzz_loaders.h"

#include <functional>
#include <map>

#include <google/protobuf/stubs/logging.h>

#include "core/cluster_spec.h"
#include "core/config.h"
#include "core/error.h"
#include "core/ir/graph.h"
#include "core/log.h"
#include "core/proto/cluster_file.h"
#include "core/proto/deployment_file.h"
#include "core/proto/file_format.h"
#include "core/proto/graph_file.h"
#include "core/proto/profile_file.h"
#include "decomposer/plan.h"
#include "service/planning_core.h"

namespace autostage::fuzz {
namespace {

using core::Graph;

void expect(bool ok, const std::string& what) {
  if (!ok) throw FuzzFinding(what);
}

// The text form round-trips: parse(toString(g)) prints the same text.
void loadIrText(const std::string& bytes) {
  Graph g = Graph::parse(bytes);
  g.verify();
  std::string text = g.toString();
  expect(Graph::parse(text).toString() == text, "IR text does not round-trip:\n" + text);
  (void)g.hash();
}

// Envelope bytes as written by writeFramedFile (any kind: a foreign kind is a FormatError).
void loadFramed(const std::string& bytes) {
  core::decodeFramed(bytes, core::kGraphFileKind, core::kGraphFormatVersion, "fuzz input");
}

// The protobuf targets take the payload and frame it with a correct hash, so mutations reach
// the message decoding and validation instead of stopping at the hash check.
void loadGraphFile(const std::string& payload) {
  Graph g = core::decodeGraph(
      core::encodeFramed(core::kGraphFileKind, core::kGraphFormatVersion, payload));
  std::string text = g.toString();
  expect(core::decodeGraph(core::encodeGraph(g)).toString() == text,
         "graph file does not round-trip:\n" + text);
}

void loadProfileFile(const std::string& payload) {
  core::GraphProfile p = core::decodeProfile(
      core::encodeFramed(core::kProfileFileKind, core::kProfileFormatVersion, payload));
  core::decodeProfile(core::encodeProfile(p));
}

void loadDeploymentFile(const std::string& payload) {
  core::Deployment d = core::decodeDeployment(
      core::encodeFramed(core::kDeploymentFileKind, core::kDeploymentFormatVersion, payload));
  std::string encoded = core::encodeDeployment(d);
  expect(core::encodeDeployment(core::decodeDeployment(encoded)) == encoded,
         "deployment does not round-trip");
  (void)core::describeMismatch(d, core::DeploymentKey{});
}

void loadClusterProto(const std::string& payload) {
  core::ClusterSpec spec = core::decodeClusterSpec(
      core::encodeFramed(core::kClusterFileKind, core::kClusterFormatVersion, payload));
  expect(spec.nodes() >= 1, "validated cluster spec has no nodes");
  (void)spec.toString();
}

void loadClusterToml(const std::string& text) {
  core::ClusterSpec spec = core::ClusterSpec::fromToml(text, "fuzz input");
  expect(spec.nodes() >= 1, "validated cluster spec has no nodes");
  (void)spec.toString();
}

void loadConfigToml(const std::string& text) {
  core::Config config;
  config.applyToml(text, "fuzz input");
  (void)config.toString();
}

// A request that parses and validates is planned when it is small enough to plan quickly.
void loadPlanRequest(const std::string& text) {
  decomposer::PlanRequest request = decomposer::PlanRequest::parse(text);
  request.validate();
  const auto& o = request.options;
  bool small = request.blocks.size() <= 6 && request.devices <= 8 && o.maxPipeline <= 8 &&
               request.batchSize <= 4096;
  if (!small) return;
  decomposer::Plan plan = decomposer::planStages(request);
  decomposer::PlanEvaluation evaluation = decomposer::evaluatePlan(request, plan);
  expect(evaluation.feasible,
         "planStages returned a plan its evaluator rejects: " + evaluation.problem);
}

// A planning service call: the bytes of a gRPC Plan request, through the service's decoding
// (Note [Planning service]: graph and profile by bytes or hash, profile key, cluster, options,
// the store). A call whose cluster and batch are small is planned; others stop before planning.
void loadPlanCall(const std::string& bytes) {
  proto::PlanCall call;
  if (!call.ParseFromString(bytes)) throw FormatError("not a PlanCall message");
  bool small = call.batch_size() <= 4096 && call.graph().size() <= (1 << 16);
  if (small) {
    core::ClusterSpec cluster = core::decodeClusterSpec(call.cluster(), "the call's cluster");
    small = cluster.devices <= 16;
  }
  service::PlanningCore core(service::PlanningOptions{});  // store in memory
  if (!small) core.setPlanHookForTesting([] { throw PlanError("fuzz: not planned (too big)"); });
  proto::PlanAnswer answer = core.plan(call);
  core::Deployment d = core::decodeDeployment(answer.deployment(), "the answer");
  expect(d.batchSize == call.batch_size(), "the answer's deployment is for another batch");
  expect(core.plan(call).from_store(), "a repeated call was not answered from the store");
}

using Loader = std::function<void(const std::string&)>;

const std::map<std::string, Loader>& loaders() {
  static const std::map<std::string, Loader> table = {
      {"ir_text", loadIrText},           {"framed", loadFramed},
      {"graph_file", loadGraphFile},     {"profile_file", loadProfileFile},
      {"deployment_file", loadDeploymentFile}, {"cluster_proto", loadClusterProto},
      {"cluster_toml", loadClusterToml}, {"config_toml", loadConfigToml},
      {"plan_request", loadPlanRequest}, {"plan_call", loadPlanCall},
  };
  return table;
}

}  // namespace

void runLoader(const std::string& target, const std::string& bytes) {
  auto it = loaders().find(target);
  if (it == loaders().end()) throw std::invalid_argument("unknown fuzz target '" + target + "'");
  try {
    it->second(bytes);
  } catch (const InternalError&) {
    throw;  // bad input must be reported as bad input, not as an autostage bug
  } catch (const Error&) {
    // rejected with a user-facing error: the expected outcome for bad input
  }
}

const std::vector<std::string>& loaderTargets() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& entry : loaders()) out.push_back(entry.first);
    return out;
  }();
  return names;
}

void quietLogging() {
  google::protobuf::SetLogHandler(nullptr);  // invalid UTF-8 in string fields logs an ERROR line
  core::globalConfig().set("log_level", "off");
  core::applyLogConfig();
}

}  // namespace autostage::fuzz
