#include "bindings/cli/saved_files.h"

#include "core/error.h"

namespace autostage::cli {

// TODO(lead, at merge): return {core::loadGraph(path), core::loadProfile(profilePath or
// path + ".profile")} from core/proto/graph_file.h and profile_file.h.
SavedModel loadSavedModel(const std::string& path, const std::string& profilePath) {
  throw UnsupportedError("--graph " + path + ": loading saved graphs and profiles is not available "
                         "in this build (core/proto/graph_file.h is not merged yet); use --synthetic");
}

// TODO(lead, at merge): core::saveDeployment(deployment, path) from core/proto/deployment_file.h.
void saveDeploymentFile(const core::Deployment& deployment, const std::string& path) {
  throw UnsupportedError("--out " + path + ": saving deployments is not available in this build "
                         "(core/proto/deployment_file.h is not merged yet)");
}

}  // namespace autostage::cli
