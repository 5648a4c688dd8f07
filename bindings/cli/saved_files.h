#pragma once
// Loading a saved graph + profile and saving a Deployment for `autostage plan`.

#include <string>

#include "core/deployment.h"
#include "core/ir/graph.h"
#include "core/profile.h"

namespace autostage::cli {

struct SavedModel {
  core::Graph graph;
  core::GraphProfile profile;
};

// `path` names the saved IR (autostage.save_graph); its profile is read from `path` + ".profile"
// unless `profilePath` is given. Refuses a profile recorded for another graph.
SavedModel loadSavedModel(const std::string& path, const std::string& profilePath);
void saveDeploymentFile(const core::Deployment& deployment, const std::string& path);

}  // namespace autostage::cli
