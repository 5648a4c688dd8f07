// Writes the seed corpora of the fuzz targets from real files made by the library's own writers:
//   ninja -C build autostage_fuzz_corpus
//   build/tests/fuzz/autostage_fuzz_corpus tests/fuzz/corpus
// Regenerate when a format changes; the files are committed. Small models keep the seeds small.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "core/cluster_spec.h"
#include "core/config.h"
#include "core/proto/cluster_file.h"
#include "core/proto/deployment_file.h"
#include "core/proto/graph_file.h"
#include "core/proto/profile_file.h"
#include "decomposer/planner.h"
#include "decomposer/synthetic.h"
#include "service/plan_call.h"
#include "tests/fuzz/fuzz_loaders.h"

namespace fs = std::filesystem;
using namespace autostage;

namespace {

void write(const fs::path& root, const std::string& target, const std::string& name,
           const std::string& bytes) {
  fs::create_directories(root / target);
  std::ofstream(root / target / ("seed-" + name), std::ios::binary) << bytes;
}

core::ClusterSpec smallCluster() {
  core::ClusterSpec spec;
  spec.deviceKind = "synthetic:a100";
  spec.devices = 4;
  spec.devicesPerNode = 2;
  spec.memoryPerDevice = int64_t(16) << 30;
  return spec;
}

std::string clusterToml(const core::ClusterSpec& s, const std::string& memory) {
  std::ostringstream out;
  out << "device_kind = \"" << s.deviceKind << "\"\ndevices = " << s.devices
      << "\ndevices_per_node = " << s.devicesPerNode << "\nmemory_per_device = " << memory
      << "\nintra_node_bandwidth = 300e9\ninter_node_bandwidth = 25e9\nlatency = 5e-6\n"
      << "peak_flops = 312e12\n";
  return out.str();
}

// Every option at its default, in TOML syntax.
std::string defaultConfigToml() {
  std::ostringstream out;
  for (const core::OptionSpec& o : core::optionTable()) {
    bool quoted = o.type == core::OptionType::String;
    out << o.key << " = " << (quoted ? "\"" : "") << o.defaultValue << (quoted ? "\"" : "") << '\n';
  }
  return out.str();
}

void writeModel(const fs::path& root, const std::string& name,
                const decomposer::SyntheticModel& m) {
  write(root, "ir_text", name, m.graph.toString());
  write(root, "graph_file", name, core::toProto(m.graph).SerializeAsString());
  write(root, "profile_file", name, core::toProto(m.profile).SerializeAsString());
  write(root, "framed", name + "-graph", core::encodeGraph(m.graph));
  decomposer::PlanOptions options;
  options.maxBlocks = 6;
  decomposer::PlanResult result =
      decomposer::planGraph(m.graph, m.profile, smallCluster(), 16, options);
  write(root, "deployment_file", name, core::toProto(result.deployment).SerializeAsString());
  write(root, "plan_request", name, result.blocking.request.toText());
  proto::PlanCall call = service::makePlanCall(m.graph, m.profile, smallCluster(), 16, options);
  write(root, "plan_call", name, call.SerializeAsString());
  call.clear_profile();  // by profile key: the service has none yet
  call.set_profile_key(name + " profile key");
  write(root, "plan_call", name + "-by-key", call.SerializeAsString());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: autostage_fuzz_corpus <corpus dir>\n";
    return 2;
  }
  fuzz::quietLogging();
  fs::path root = argv[1];
  decomposer::DeviceModel device;
  writeModel(root, "mlp", decomposer::syntheticMlp({3, 16}, device));
  decomposer::TransformerShape bert{1, 32, 2, 8, 50, false, true};
  writeModel(root, "bert", decomposer::syntheticTransformer(bert, device));
  core::ClusterSpec cluster = smallCluster();
  write(root, "cluster_proto", "small", core::toProto(cluster).SerializeAsString());
  write(root, "framed", "cluster", core::encodeClusterSpec(cluster));
  write(root, "cluster_toml", "units", clusterToml(cluster, "\"16GiB\""));
  std::string bytes = std::to_string(cluster.memoryPerDevice);
  write(root, "cluster_toml", "bytes", clusterToml(cluster, bytes));
  write(root, "config_toml", "defaults", defaultConfigToml());
  write(root, "config_toml", "some", "log_level = \"warn\"\nmax_blocks = 64\nmem_margin = 0.2\n");
  for (const std::string& target : fuzz::loaderTargets())
    for (const auto& file : fs::directory_iterator(root / target)) {
      std::ifstream in(file.path(), std::ios::binary);
      std::stringstream bytes;
      bytes << in.rdbuf();
      fuzz::runLoader(target, bytes.str());  // seeds must load without findings
    }
  std::cout << "wrote seed corpora under " << root << '\n';
  return 0;
}
