#include "bindings/cli/saved_files.h"

#include "core/error.h"
#include "core/proto/deployment_file.h"
#include "core/proto/graph_file.h"
#include "core/proto/profile_file.h"

namespace autostage::cli {

SavedModel loadSavedModel(const std::string& path, const std::string& profilePath) {
  core::Graph graph = core::loadGraph(path);
  std::string profileFile = profilePath.empty() ? path + ".profile" : profilePath;
  core::GraphProfile profile = core::loadProfile(profileFile);
  AUTOSTAGE_CHECK_AS(FormatError, profile.graphHash == graph.hash(), "profile '", profileFile,
                     "' was measured for graph ", profile.graphHash, " but '", path, "' has hash ",
                     graph.hash(), "; profile the saved graph again or pass the matching --profile");
  return {std::move(graph), std::move(profile)};
}

void saveDeploymentFile(const core::Deployment& deployment, const std::string& path) {
  core::saveDeployment(deployment, path);
}

}  // namespace autostage::cli
