#pragma once
// Gathering the full model state from the ranks that hold it (checkpoints).
//
// Note [Gathering the state]
// Every rank imported the whole module, so every rank knows every parameter's and buffer's shape,
// dtype and state_dict key; only the holders of a tensor (the replicas of the stages that read
// it) have its current value. For each PARAM input of the graph, in graph order, the lowest rank
// holding it broadcasts its tensor to the world; a tensor no stage reads (never updated) comes
// from rank 0's module. Every rank therefore ends with the same full state, keyed like the
// original module's state_dict, loadable by the plain, unwrapped model. Collective over the world;
// it costs one model's worth of memory on every rank.

#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "comm/backend.h"
#include "core/deployment.h"
#include "core/torchscript/importer.h"

namespace autostage::staging {

// Copies of every graph parameter and buffer with its state_dict key, current on every rank.
std::vector<std::pair<std::string, at::Tensor>> gatherState(
    const torchscript::ImportedModel& model, const core::Deployment& deployment,
    comm::Backend& backend);

}  // namespace autostage::staging
