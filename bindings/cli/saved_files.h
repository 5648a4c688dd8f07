#pragma once
// Loading a saved graph + profile and saving a Deployment. The file formats are written by the
// serialization work (core/proto/graph_file.h loadGraph, profile_file.h loadProfile,
// deployment_file.h saveDeployment), which is not in this build yet: these functions throw
// UnsupportedError "not available in this build" until they are wired to those APIs.

#include <string>

#include "core/deployment.h"
#include "core/ir/graph.h"
#include "core/profile.h"

namespace autostage::cli {

struct SavedModel {
  core::Graph graph;
  core::GraphProfile profile;
};

// `path` names the saved IR; its profile is read from `path` + ".profile" unless `profilePath`.
SavedModel loadSavedModel(const std::string& path, const std::string& profilePath);
void saveDeploymentFile(const core::Deployment& deployment, const std::string& path);

}  // namespace autostage::cli
